"""The cross_entropy_fusion dimension: the same choice in the space, the memory and cost models,
Megatron-LM's flags and the worker's TransformerConfig."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.layouts.layout import Layout
from autotune.megatron.megatron_args import flag_names, megatron_lm_args
from autotune.predict.cost import estimate_cost
from autotune.predict.memory import estimate_memory
from autotune.search.space import enumerate_space, space_from_mapping
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.model import padded_vocab_size
from autotune.specs.presets import load_model

XL = load_model("gpt2-xl")
H100 = ClusterSpec(num_gpus=1, gpus_per_node=1, gpu=gpu_spec("h100-80gb"))
H200X4 = ClusterSpec(num_gpus=4, gpus_per_node=4, gpu=gpu_spec("h200"))


@pytest.mark.parametrize(("layout", "cluster"), [
    (Layout(mbs=16, gbs=64, impl="sdpa"), H100),
    (Layout(tp=2, dp=2, mbs=8, gbs=64, sequence_parallel=True, impl="sdpa"), H200X4),
    (Layout(pp=2, dp=2, mbs=4, gbs=64, impl="sdpa"), H200X4),
])
def test_fusion_adds_one_fp32_logits_copy_on_the_last_stage_only(layout: Layout,
                                                                  cluster: ClusterSpec) -> None:
    off = estimate_memory(XL, layout, cluster)
    on = estimate_memory(XL, replace(layout, cross_entropy_fusion=True), cluster)
    extra = (layout.mbs * XL.seq_length * padded_vocab_size(XL, layout.tp) / layout.tp
             * 4)
    last = layout.pp - 1
    for stage, (a, b) in enumerate(zip(off.stages, on.stages, strict=True)):
        assert b.logits_bytes - a.logits_bytes == pytest.approx(extra if stage == last else 0)


def test_the_measured_difference_at_gpt2_xl_mbs16() -> None:
    # 74.2 - 71.1 GiB peak allocated (results/benchmarks/2026-11-21-h100-gpt2-xl-mfu.md).
    s = Layout(mbs=16, gbs=64, impl="sdpa")
    gib = 2**30
    delta = (estimate_memory(XL, replace(s, cross_entropy_fusion=True), H100).stages[0]
             .logits_bytes - estimate_memory(XL, s, H100).stages[0].logits_bytes) / gib
    assert delta == pytest.approx(3.1, abs=0.1)


def test_fusion_is_predicted_slightly_faster() -> None:
    s = Layout(mbs=16, gbs=128, impl="sdpa")
    off = estimate_cost(XL, s, H100).tokens_per_s
    on = estimate_cost(XL, replace(s, cross_entropy_fusion=True), H100).tokens_per_s
    assert 1.0 < on / off < 1.02  # measured: +0.9% at gbs 128


@pytest.mark.parametrize("on", [False, True])
def test_megatron_lm_flags(on: bool) -> None:
    args = megatron_lm_args(XL, Layout(cross_entropy_fusion=on, gbs=64))
    assert ("--cross-entropy-loss-fusion" in flag_names(args)) is on
    if on:
        assert args[args.index("--cross-entropy-fusion-impl") + 1] == "native"


def test_space_dimension_doubles_the_layouts_and_labels_them() -> None:
    space = space_from_mapping({"mbs": [4, 8], "impl": ["sdpa"],
                                "cross_entropy_fusion": [False, True]}, "test")
    valid = enumerate_space(space, XL, H100).valid
    assert len(valid) == 4
    assert sum(s.cross_entropy_fusion for s in valid) == 2
    assert {s.describe().endswith("cef sdpa") for s in valid} == {False, True}


def test_worker_config_follows_the_layout() -> None:
    pytest.importorskip("torch")
    from autotune.trials.trial import TrialSpec
    from autotune.worker.build import transformer_config_kwargs

    for on in (False, True):
        kw = transformer_config_kwargs(TrialSpec(model=XL, layout=Layout(
            mbs=4, gbs=64, cross_entropy_fusion=on)))
        assert kw["cross_entropy_loss_fusion"] is on
        assert kw["cross_entropy_fusion_impl"] == "native"
