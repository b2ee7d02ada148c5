"""Gradients accumulated and reduced in bf16 (autotune.levers.grad_reduce, --grad-reduce-in-bf16):
the gradient buffer and the reduction's bytes halve; the optimizer step's fp32 copy of its shard
counts only where it outweighs the micro-batches' memory; the flag both ways; megatron-core's
DDP config."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from autotune.layouts.layout import Layout
from autotune.megatron.core_config import core_config
from autotune.megatron.megatron_args import megatron_lm_args
from autotune.megatron.megatron_command import megatron_layout, read_megatron_command
from autotune.predict.cost import estimate_cost
from autotune.predict.memory import estimate_memory
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.presets import load_model

H100 = gpu_spec("h100-80gb")


@pytest.mark.parametrize(("model", "gpus", "layout"), [
    ("gpt2-xl", 8, Layout(dp=8, mbs=4, gbs=64, impl="te")),
    ("llama3-8b", 8, Layout(tp=2, dp=4, mbs=1, gbs=64, sequence_parallel=True, impl="te",
                            distributed_optimizer=True)),
    ("mixtral-8x7b", 32, Layout(tp=2, pp=4, dp=4, ep=4, mbs=1, gbs=64, sequence_parallel=True,
                                impl="te", distributed_optimizer=True)),
])
def test_the_gradient_buffer_halves(model: str, gpus: int, layout: Layout) -> None:
    m, c = load_model(model), ClusterSpec(num_gpus=gpus, gpus_per_node=8, gpu=H100)
    fp32 = estimate_memory(m, layout, c).stages
    bf16 = estimate_memory(m, replace(layout, grad_reduce_bf16=True), c).stages
    for a, b in zip(fp32, bf16, strict=True):
        assert b.gradients_bytes == pytest.approx(a.gradients_bytes / 2)
        assert (b.weights_bytes, b.optimizer_bytes, b.activations_bytes) == \
            (a.weights_bytes, a.optimizer_bytes, a.activations_bytes)
        # The step's fp32 copy of the shard (4 B a parameter: a third of the 12 B of optimizer
        # state) counts only where it outweighs the micro-batches' memory, freed by then: the
        # dense models' activations outweigh it; Mixtral's experts, unsharded at an
        # expert-data-parallel size of 1, outweigh one micro-batch's on the last stage.
        copy = b.optimizer_bytes / 3
        assert b.workspace_bytes == pytest.approx(
            max(a.workspace_bytes, copy - b.activations_bytes - b.logits_bytes))
    assert (max(b.workspace_bytes for b in bf16) > 0) == (model == "mixtral-8x7b")


def test_the_steps_fp32_copy_counts_where_activations_are_small() -> None:
    # One GPU, a short sequence: the fp32 copy of every gradient (4 B a parameter, no
    # distributed optimizer to shard it) outweighs one micro-batch's activations.
    m = load_model("gpt2-xl").with_overrides(seq_length=128, global_batch_size=1)
    c = ClusterSpec(num_gpus=1, gpus_per_node=1, gpu=H100)
    s = Layout(mbs=1, gbs=1, impl="te", grad_reduce_bf16=True)
    stage = estimate_memory(m, s, c).stages[0]
    params = stage.gradients_bytes / 2
    assert stage.workspace_bytes + stage.activations_bytes + stage.logits_bytes == \
        pytest.approx(4 * params)


def test_the_gradient_reduction_moves_half_the_bytes() -> None:
    m, c = load_model("gpt2-xl"), ClusterSpec(num_gpus=8, gpus_per_node=8, gpu=H100)
    s = Layout(dp=8, mbs=4, gbs=64, impl="te")  # no overlap: the whole reduction is exposed
    fp32 = estimate_cost(m, s, c).dp_comm_s
    bf16 = estimate_cost(m, replace(s, grad_reduce_bf16=True), c).dp_comm_s
    assert bf16 == pytest.approx(fp32 / 2, rel=0.01)  # less the fixed latency per collective


def test_the_flag_both_ways(tmp_path: Path) -> None:
    m = load_model("gpt2-xl")
    on = Layout(dp=2, mbs=4, gbs=64, impl="te", grad_reduce_bf16=True)
    args = megatron_lm_args(m, on)
    assert "--grad-reduce-in-bf16" in args
    assert "--grad-reduce-in-bf16" not in megatron_lm_args(m, replace(on, grad_reduce_bf16=False))
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc-per-node 2 pretrain_gpt.py " + " ".join(args) + "\n")
    command = read_megatron_command(str(script))
    assert megatron_layout(command, 2).grad_reduce_bf16
    assert "--grad-reduce-in-bf16" not in command.unmodeled  # modelled: no warning line


@pytest.mark.parametrize("on", [False, True])
def test_megatron_cores_ddp_config_takes_it(on: bool) -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.distributed import DistributedDataParallelConfig

    ddp = dict(core_config(load_model("gpt2-xl"),
                           Layout(dp=2, mbs=4, gbs=64, grad_reduce_bf16=on)).ddp)
    assert ddp["grad_reduce_in_fp32"] is (not on)
    assert DistributedDataParallelConfig(**ddp).grad_reduce_in_fp32 is (not on)
