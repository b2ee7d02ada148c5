"""The precision-aware optimizer lever (autotune/levers/precision_optimizer.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.errors import ConfigError
from autotune.layouts.layout import Layout, check
from autotune.levers.precision_optimizer import EXTRA_TRAFFIC_PER_PARAM, MOMENT_COPY_BYTES
from autotune.megatron.core_config import core_config
from autotune.megatron.identity import representatives, run_key
from autotune.megatron.megatron_args import megatron_lm_args, read_fields
from autotune.predict.cost import estimate_cost
from autotune.predict.memory import estimate_memory, stage_params
from autotune.search.heuristics import MEMORY_OPTIONS
from autotune.search.space import enumerate_space, load_space
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model
from tests.conftest import given_of

MODEL = load_model("gpt2-xl")
EIGHT = ClusterSpec.make(8, gpu="h100-80gb")
ONE = ClusterSpec.make(1, gpu="h100-80gb")
BASE = Layout(dp=8, gbs=64, mbs=1, impl="te", distributed_optimizer=True)
PAO = replace(BASE, precision_aware_optimizer=True)


def test_optimizer_state_halves() -> None:
    before = estimate_memory(MODEL, BASE, EIGHT).peak
    after = estimate_memory(MODEL, PAO, EIGHT).peak
    assert after.optimizer_bytes == pytest.approx(before.optimizer_bytes / 2)
    assert after.weights_bytes == before.weights_bytes
    assert after.gradients_bytes == before.gradients_bytes


def test_the_step_moves_more_bytes() -> None:
    # TE 2.11's FusedAdam copies the bf16 moments to fp32 and back around its fp32 kernel.
    before = estimate_cost(MODEL, BASE, EIGHT).optimizer_s
    after = estimate_cost(MODEL, PAO, EIGHT).optimizer_s
    assert after == pytest.approx(before * (32 + EXTRA_TRAFFIC_PER_PARAM) / 32)


L8B = load_model("tests/data/hf/llama-3.1-8b.json").with_overrides(seq_length=4096,
                                                                    global_batch_size=8)
H200 = ClusterSpec.make(1, gpu="h200")
GIB = 2**30


def _one(**fields: object) -> Layout:
    return Layout(dp=1, gbs=8, mbs=1, impl="te", distributed_optimizer=True, **fields)


def _beyond_state(model: ModelSpec, s: Layout, c: ClusterSpec) -> tuple[float, float]:
    """(what the peak stage allocates beyond its weights, gradients and optimizer state, its
    parameters per rank of the optimizer's shard)."""
    stage = estimate_memory(model, s, c).peak
    params = estimate_memory(model, replace(s, fp8="off"), c).peak.weights_bytes / 2
    beyond = stage.allocated_bytes - stage.weights_bytes - stage.gradients_bytes \
        - stage.optimizer_bytes
    return beyond, params / s.dp


def test_the_moments_step_copies_set_the_peak_where_activations_are_small() -> None:
    # Llama-3.1-8B at dp 1 on one H200 ran out of memory creating the moments in its first step
    # (results/benchmarks/2026-11-29-h200-xseg-band-s25.md): 2 + 4 + 6 + 8 = 20 B per parameter.
    s = _one(precision_aware_optimizer=True)
    beyond, params = _beyond_state(L8B, s, H200)
    assert beyond == pytest.approx(params * MOMENT_COPY_BYTES)
    assert not estimate_memory(L8B, s, H200).fits
    # With short sequences the step's copies outweigh the state it saves at dp 1 (20 B per
    # parameter against 18 B without it).
    short = L8B.with_overrides(seq_length=128)
    assert estimate_memory(short, s, H200).peak_bytes > \
        estimate_memory(short, _one(), H200).peak_bytes


SHORT = MODEL.with_overrides(seq_length=128, global_batch_size=64)
"""gpt2-xl at seq 128: the optimizer step outweighs the micro-batch's activations."""


@pytest.mark.parametrize(("fields", "copy_bytes"), [
    # FusedAdam keeps the master and reads the bf16 gradient buffer as it is (decoupled_grad).
    ({"precision_aware_optimizer": True, "grad_reduce_bf16": True}, MOMENT_COPY_BYTES),
    ({"precision_aware_optimizer": True, "grad_reduce_bf16": True, "fp8": "hybrid"},
     MOMENT_COPY_BYTES),
    # Current scaling hands the master to megatron-core, whose `.float()` copies bf16 gradients
    # (distrib_optimizer.py _copy_model_grads_to_main_grads).
    ({"precision_aware_optimizer": True, "grad_reduce_bf16": True, "fp8": "hybrid",
      "fp8_recipe": "tensorwise"}, MOMENT_COPY_BYTES + 4),
    ({"grad_reduce_bf16": True}, 4),
    ({"precision_aware_optimizer": True}, MOMENT_COPY_BYTES),
    ({"precision_aware_optimizer": True, "optimizer_offload_percent": 50}, 0),
])
@pytest.mark.parametrize("dp", [1, 8])
def test_what_lives_only_through_the_step(fields: dict[str, object], copy_bytes: int,
                                          dp: int) -> None:
    s = Layout(dp=dp, gbs=64, mbs=1, impl="te", distributed_optimizer=True, **fields)
    c = ClusterSpec.make(dp, gpu="h200")
    beyond, params = _beyond_state(SHORT, s, c)
    without, _ = _beyond_state(SHORT, replace(s, precision_aware_optimizer=False,
                                              grad_reduce_bf16=False,
                                              optimizer_offload_percent=0), c)
    assert beyond == pytest.approx(max(without, params * copy_bytes), rel=0.01)


def test_the_copies_are_per_parameter_group() -> None:
    # megatron-core steps the dense and the expert parameters as groups of their own
    # (optimizer/__init__.py _get_param_groups), and FusedAdam frees one group's copies before
    # it steps the next. Mixtral at dp 8, ep 8: the dense state sharded over 8 ranks, the
    # experts' over their data-parallel group of 1.
    model = load_model("mixtral-8x7b").with_overrides(seq_length=128, global_batch_size=64)
    c = ClusterSpec.make(8, gpu="h200")
    s = Layout(dp=8, ep=8, gbs=64, mbs=1, impl="te", distributed_optimizer=True,
               precision_aware_optimizer=True)
    stage = estimate_memory(model, s, c).peak
    dense, expert = stage_params(model, s, 0)
    beyond = stage.allocated_bytes - stage.weights_bytes - stage.gradients_bytes \
        - stage.optimizer_bytes
    assert expert > dense / 8
    assert beyond == pytest.approx(MOMENT_COPY_BYTES * expert)


@pytest.mark.parametrize(("change", "rule"), [
    ({"distributed_optimizer": False}, "pao_do"),
    ({"impl": "local"}, "pao_te"),
    ({"impl": "sdpa"}, "pao_te"),
])
def test_megatron_refuses(change: dict[str, object], rule: str) -> None:
    broken = replace(PAO, **change)  # type: ignore[arg-type]
    assert rule in {v.rule for v in check(broken, MODEL, EIGHT)}


def test_valid_with_te_and_the_distributed_optimizer() -> None:
    assert check(PAO, MODEL, EIGHT) == []


def test_flags_round_trip() -> None:
    args = megatron_lm_args(MODEL, PAO)
    assert args[args.index("--exp-avg-dtype") + 1] == "bf16"
    assert "--use-precision-aware-optimizer" in args
    assert read_fields(given_of(args))["precision_aware_optimizer"] is True
    assert read_fields(given_of(megatron_lm_args(MODEL, BASE)))["precision_aware_optimizer"] \
        is False


def test_other_dtypes_are_refused() -> None:
    args = [*megatron_lm_args(MODEL, BASE), "--use-precision-aware-optimizer"]
    with pytest.raises(ConfigError, match="bf16 moments"):
        read_fields(given_of(args))


def test_worker_keys() -> None:
    on, off = core_config(MODEL, PAO).optimizer, core_config(MODEL, BASE).optimizer
    assert (on["use_precision_aware_optimizer"], on["exp_avg_dtype"]) == (True, "bfloat16")
    assert (off["use_precision_aware_optimizer"], off["exp_avg_sq_dtype"]) == (False, "float32")


def test_one_gpu_keeps_the_distributed_optimizer_it_needs() -> None:
    """One data-parallel rank makes the distributed optimizer the same run as none, except
    where the precision-aware optimizer asserts it (autotune.megatron.identity's same-run rule)."""
    single = Layout(dp=1, gbs=8, impl="te", distributed_optimizer=True,
                    precision_aware_optimizer=True)
    plain = replace(single, precision_aware_optimizer=False)
    chosen = representatives(MODEL, [single, plain, replace(plain, distributed_optimizer=False)])
    assert chosen[single] == single and check(chosen[single], MODEL, ONE) == []
    assert chosen[plain].distributed_optimizer is False
    assert run_key(MODEL, single) != run_key(MODEL, plain)


def test_a_saving_the_seeds_may_spend() -> None:
    assert "precision_aware_optimizer" in MEMORY_OPTIONS


def test_space_offers_it_on_one_gpu() -> None:
    space = load_space("tools/spaces/optimizer-levers-1gpu.yaml")
    valid = enumerate_space(space, load_model("llama3-8b"), ONE).valid
    saving = [s for s in valid if s.precision_aware_optimizer]
    assert saving and all(s.distributed_optimizer for s in saving)


def test_the_free_block_is_needed_beside_the_micro_batches_not_beside_the_step() -> None:
    # The logits block must find room at the micro-batches' peak (memory.BLOCK_MARGIN); the
    # step's copies come after those are freed, so what they hold beyond that peak is room the
    # block had. Measured: Llama-3.2-3B at mbs 2 with FP8 tensorwise and this optimizer ran at
    # 76.7 GiB of an H100 (s8-fp8-l3b/mbs2-pao-tensorwise), predicted 76.4.
    s = Layout(dp=1, gbs=8, mbs=8, impl="te", distributed_optimizer=True)
    plain = estimate_memory(SHORT, s, H200).peak
    pao = estimate_memory(SHORT, replace(s, precision_aware_optimizer=True), H200).peak
    step_over = pao.workspace_bytes - plain.workspace_bytes
    assert step_over > 0 and plain.block_margin_bytes > 0
    assert pao.block_margin_bytes == pytest.approx(
        max(0.0, plain.block_margin_bytes - step_over))
