"""The memory estimates a plan shares (autotune.predict.memory_memo): one per memory_key, the
enumeration's read by the gate. A key that missed a field the memory model reads would hand one
layout another's estimate: a silent wrong answer, which these tests look for field by field."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from conftest import cluster

from autotune.layouts.layout import DIMENSIONS, Layout, with_fields
from autotune.predict.gate import MemoryGate
from autotune.predict.memory import (
    MEMORY_BLIND,
    MemoryEstimate,
    MemoryParams,
    estimate_memory,
    memory_key,
)
from autotune.predict.memory_memo import MemoryMemo, peak_function
from autotune.search.derive import best_split, joint_candidates, resolve, safe_limit_bytes
from autotune.search.space import enumerate_space, load_space, space_from_mapping
from autotune.specs.hardware import ClusterSpec
from autotune.specs.hf_config import read_hf_config
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model
from tests.conftest import another_value

HF = Path(__file__).parent / "data" / "hf"
GPT2_XL = load_model("gpt2-xl")
MIXTRAL = load_model("mixtral-8x7b")


def _deepseek_v3() -> ModelSpec:
    # Dense and MoE layers, MLA and an MTP layer: every part of the memory model.
    spec = read_hf_config(str(HF / "deepseek-v3.json")).spec
    return dataclasses.replace(spec, seq_length=4096, global_batch_size=4096)


DEEPSEEK_V3 = _deepseek_v3()

# A layout of each model on its GPUs with the levers whose fields the cases move turned on
# (TE for FP8, full block recompute for its count, the distributed optimizer).
BASES: dict[str, tuple[ModelSpec, ClusterSpec, Layout]] = {
    "gpt2-xl": (GPT2_XL, cluster(8), Layout(
        dp=8, gbs=64, mbs=2, impl="te", distributed_optimizer=True,  # type: ignore[arg-type]
        recompute="full", recompute_method="block",  # type: ignore[arg-type]
        recompute_num_layers=12)),
    "mixtral": (MIXTRAL, cluster(64), Layout(
        tp=2, pp=4, dp=8, ep=8, gbs=256, mbs=1, impl="te",  # type: ignore[arg-type]
        sequence_parallel=True, distributed_optimizer=True, recompute="full",  # type: ignore[arg-type]
        recompute_method="block", recompute_num_layers=4)),  # type: ignore[arg-type]
    "deepseek-v3": (DEEPSEEK_V3, cluster(1024), Layout(
        pp=16, dp=64, ep=8, gbs=4096, mbs=1, impl="te", last_stage_layers=1,  # type: ignore[arg-type]
        first_stage_layers=4, distributed_optimizer=True, recompute="full",  # type: ignore[arg-type]
        recompute_method="block", recompute_num_layers=2)),  # type: ignore[arg-type]
}

# Fields the memory model reads, each to a value that moves the estimate of every base (with
# the fields both layouts take first): the allocator, FP8 and its weights, the derived counts,
# the micro-batch, the optimizer's.
MOVED: list[tuple[str, object, dict[str, object]]] = [
    ("expandable_segments", True, {}),
    ("fp8", "hybrid", {}),
    ("fp8_param_gather", True, {"fp8": "hybrid"}),
    ("recompute_num_layers", 1, {}),
    ("offload_layers", 4, {"recompute": "none"}),  # TE's offload prices no layout with recompute
    ("optimizer_offload_percent", 50, {}),
    ("precision_aware_optimizer", True, {}),
    ("mbs", 4, {}),
    ("distributed_optimizer", False, {}),
    ("cross_entropy_fusion", True, {}),
]


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize(("name", "value", "both"), MOVED, ids=[n for n, _, _ in MOVED])
def test_layouts_apart_in_a_field_memory_reads_never_share_an_estimate(
        base: str, name: str, value: object, both: dict[str, object]) -> None:
    model, on, s = BASES[base]
    s = with_fields(s, **both)
    other = with_fields(s, **{name: value})
    memo = MemoryMemo(model, on)
    first = memo.estimate(s)
    second = memo.estimate(other)
    assert len(memo) == 2
    assert first == estimate_memory(model, s, on)
    assert second == estimate_memory(model, other, on)
    assert second != first, "the case must move the estimate"
    assert memo.estimate(s) is first and memo.peak_bytes(other) == second.peak_bytes


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("name", sorted(DIMENSIONS))
def test_a_memory_blind_field_alone_shares_the_estimate(base: str, name: str) -> None:
    """Every field: the second layout reuses the first's estimate exactly where the field is
    MEMORY_BLIND, and whatever it reuses or makes is estimate_memory's own answer."""
    model, on, s = BASES[base]
    other = with_fields(s, **{name: another_value(name, getattr(s, name))})
    memo = MemoryMemo(model, on)
    memo.estimate(s)
    assert memo.estimate(other) == estimate_memory(model, other, on)
    assert (len(memo) == 1) == (name in MEMORY_BLIND), name




@pytest.mark.parametrize(("model", "other_model", "on", "other_on", "params", "other_params"), [
    (GPT2_XL, MIXTRAL, cluster(8), cluster(8), None, None),
    (GPT2_XL, GPT2_XL, cluster(8), cluster(16), None, None),
    (GPT2_XL, GPT2_XL, cluster(8), cluster(8, gpu="h200"), None, None),
    (GPT2_XL, GPT2_XL, cluster(8), cluster(8), None, MemoryParams(fragmentation=0.2)),
], ids=["model", "count", "device", "constants"])
def test_a_memo_of_another_model_cluster_or_constants_is_refused(
        model: ModelSpec, other_model: ModelSpec, on: ClusterSpec, other_on: ClusterSpec,
        params: MemoryParams | None, other_params: MemoryParams | None) -> None:
    memo = MemoryMemo(model, on, params)
    assert memo.serves(model, on, params)
    # Equal objects built apart are served too (a search's config rebuilds none, a test may).
    assert memo.serves(dataclasses.replace(model), dataclasses.replace(on), params)
    assert not memo.serves(other_model, other_on, other_params)
    with pytest.raises(ValueError, match="memo"):
        MemoryGate(other_model, other_on, params=other_params, memo=memo)
    with pytest.raises(ValueError, match="memo"):
        peak_function(other_model, other_on, other_params, memo)
    s = Layout(dp=8, gbs=64, recompute="full", recompute_method="block")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="memo"):
        resolve(s, ("recompute_num_layers",), other_model, other_on, limit_bytes=1e12,
                params=other_params, memo=memo)


# Spaces small enough to enumerate in a test, each with a derived count (and for DeepSeek-V3
# the derived pipeline split and FP8, whose counts the enumeration may raise).
_DSV3 = dict(tp=[1], pp=[16], cp=[1], vpp=[1], ep=[8], sequence_parallel=[False], mbs=[1, 2],
             recompute=["full"], recompute_method=["block"], recompute_num_layers=["derive"],
             distributed_optimizer=[True], overlap_param_gather=[False, True], impl=["te"],
             fp8=["off", "hybrid"], fp8_param_gather=[False, True],
             first_stage_layers=["derive"], last_stage_layers=["derive"],
             expandable_segments=[False, True])
SPACES = {
    "gpt2-xl-8": (GPT2_XL, cluster(8), None),
    "mixtral-16": (MIXTRAL, cluster(16), dict(tp=[1, 2], pp=[2, 4], cp=[1], vpp=[1], ep=[4, 8],
                                              mbs=[1], impl=["te"], fp8=["off", "hybrid"])),
    "deepseek-v3-1024": (DEEPSEEK_V3, cluster(1024), _DSV3),
}


def _space(name: str) -> tuple[ModelSpec, ClusterSpec, object]:
    model, on, narrowed = SPACES[name]
    if narrowed is None:
        return model, on, load_space()
    candidates = {d: list(v) for d, v in load_space().candidates.items()}
    candidates.update(narrowed)
    return model, on, space_from_mapping(candidates, "test")


@pytest.mark.parametrize("name", SPACES)
def test_the_gate_reads_the_enumerations_estimates_and_decides_alike(name: str) -> None:
    """A plan's gate is handed the enumeration's memo (SpaceSummary.memory): every estimate it
    reads there is estimate_memory's, each decision is that of a gate of its own, a layout the
    enumeration estimated costs the gate no estimate, and what the gate estimates itself is not
    kept for good (it asks each layout once)."""
    model, on, space = _space(name)
    summary = enumerate_space(space, model, on)  # type: ignore[arg-type]
    memo = summary.memory
    assert memo is not None and memo.serves(model, on, None) and len(memo) > 0
    known = set(memo._estimates)
    shared = MemoryGate(model, on, memo=memo)
    own = MemoryGate(model, on)
    valid = summary.valid[:: max(1, len(summary.valid) // 150)]
    assert valid
    made = 0

    def counting(*args: Any, **kwargs: Any) -> MemoryEstimate:
        nonlocal made
        made += 1
        return estimate_memory(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("autotune.predict.memory_memo.estimate_memory", counting)
        for s in valid:
            before = made
            assert shared.estimate(s) == estimate_memory(model, s, on)
            if memory_key(s) in known:
                assert made == before, "the enumeration's estimate is read, not made again"
            assert len(memo) == len(known)
    for s in valid:
        assert shared.decide(s, checked=True) == own.decide(s, checked=True)


def test_the_enumeration_answers_alike_with_its_memo_and_without() -> None:
    """The derived counts and the split chosen with the shared memo are those of estimating each
    layout anew (derive's functions without a memo)."""
    model, on, _ = _space("deepseek-v3-1024")
    limit = safe_limit_bytes(on)
    s = Layout(pp=16, dp=64, ep=8, gbs=4096, mbs=1, impl="te",  # type: ignore[arg-type]
               distributed_optimizer=True, recompute="full",  # type: ignore[arg-type]
               recompute_method="block")  # type: ignore[arg-type]
    split = ("first_stage_layers", "last_stage_layers")
    memo = MemoryMemo(model, on)
    for _ in range(2):  # the second time from the memo
        kept = joint_candidates(s, split, model, on, limit_bytes=limit, memo=memo)
        assert kept == joint_candidates(s, split, model, on, limit_bytes=limit)
        options = [resolve(c, ("recompute_num_layers",), model, on, limit_bytes=limit,
                           memo=memo) for c in kept.tied]
        assert options == [resolve(c, ("recompute_num_layers",), model, on, limit_bytes=limit)
                           for c in kept.tied]
        assert best_split(options, model, on, limit_bytes=limit, memo=memo) == \
            best_split(options, model, on, limit_bytes=limit)
    assert len(memo) > 0

