"""Shortcuts in the memory model that planning time asked for, held to the long way round: a
mixed model's stages priced only where each kind has layers (memory._mixed_stages), and the
stages' layer kinds remembered by the fields that place the layers (stage_layer_kinds)."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import cluster

from autotune.layouts.layout import Layout, with_fields
from autotune.levers.pipeline_split import (
    _stage_layer_kinds,
    mix_kinds,
    stage_kind_shares,
    stage_layer_kinds,
)
from autotune.levers.recompute import acting_layout
from autotune.predict.memory import MemoryEstimate, estimate_memory
from autotune.predict.mtp_terms import add_difference, mtp_model
from autotune.specs.hardware import ClusterSpec
from autotune.specs.hf_config import read_hf_config
from autotune.specs.model import ModelSpec

HF = Path(__file__).parent / "data" / "hf"


def _hf(name: str, **fields: object) -> ModelSpec:
    return dataclasses.replace(read_hf_config(str(HF / f"{name}.json")).spec, **fields)


DEEPSEEK_V3 = _hf("deepseek-v3", seq_length=4096, global_batch_size=4096)  # 3 dense, MTP
DEEPSEEK_V2_LITE = _hf("deepseek-v2-lite", global_batch_size=512)  # 1 dense, no MTP


def _long_way(model: ModelSpec, layout: Layout, on: ClusterSpec) -> MemoryEstimate:
    """The mixed estimate as it was priced before the shortcut: every stage of a model of each
    kind and of the MTP layers' kind, mixed by the stage's shares."""
    dense_model, moe_model = model.dense_layer_model, model.moe_layer_model
    dense = estimate_memory(dense_model, acting_layout(dense_model, layout), on)
    moe = estimate_memory(moe_model, acting_layout(moe_model, layout), on)
    stages = tuple(mix_kinds(d, e, stage_kind_shares(layout, model, d.stage), stage=d.stage)
                   for d, e in zip(dense.stages, moe.stages, strict=True))
    if model.mtp_num_layers:
        kind = mtp_model(model)
        plus = estimate_memory(kind, acting_layout(kind, layout), on).stages[-1]
        minus = (moe if model.mtp_layer_is_moe else dense).stages[-1]
        last = stages[-1]
        stages = (*stages[:-1], add_difference(
            last, plus, minus, stage=last.stage, largest_block_bytes=last.largest_block_bytes,
            block_margin_bytes=last.block_margin_bytes))
    peak = max(stages, key=lambda st: st.total_bytes)
    return replace(moe, stages=stages, peak_stage=peak.stage, peak_bytes=peak.total_bytes)


def _v3(**fields: object) -> Layout:
    base: dict[str, object] = dict(pp=16, dp=64, ep=8, gbs=4096, mbs=1, impl="te",
                                   distributed_optimizer=True, recompute="full",
                                   recompute_method="block", recompute_num_layers=2)
    return Layout(**{**base, **fields})  # type: ignore[arg-type]


# Where the dense layers fall: all on the first stage (pp 16, and with 3 layers there alone),
# shared with MoE layers there (pp 4, 8), a stage of no layer's kind alone (pp 2), a stage of
# no layers at all (the even split at pp 64 leaves none); FP8, selective recompute of modules
# of one kind only, interleaving; the MTP layer's stage.
CASES = [
    (DEEPSEEK_V3, cluster(1024), _v3()),
    (DEEPSEEK_V3, cluster(1024), _v3(first_stage_layers=3, last_stage_layers=2)),
    (DEEPSEEK_V3, cluster(1024), _v3(first_stage_layers=4, last_stage_layers=1, fp8="hybrid",
                                     fp8_param_gather=True, mbs=2)),
    (DEEPSEEK_V3, cluster(1024), _v3(pp=4, dp=256, first_stage_layers=16,
                                     last_stage_layers=15)),
    (DEEPSEEK_V3, cluster(1024), _v3(pp=8, dp=128, last_stage_layers=5,
                                     recompute="selective", recompute_modules="moe_act")),
    (DEEPSEEK_V3, cluster(1024), _v3(pp=2, dp=512, first_stage_layers=30, vpp=1,
                                     expandable_segments=True)),
    (DEEPSEEK_V3, cluster(1024), _v3(pp=64, dp=16)),
    (DEEPSEEK_V2_LITE, cluster(64), Layout(pp=4, dp=16, ep=8, gbs=512, mbs=1, vpp=3,
                                           impl="te")),  # type: ignore[arg-type]
    (DEEPSEEK_V2_LITE, cluster(64), Layout(pp=2, dp=32, ep=4, gbs=512, mbs=2,
                                           recompute="selective",  # type: ignore[arg-type]
                                           recompute_modules="core_attn+mlp")),  # type: ignore[arg-type]
    (DEEPSEEK_V2_LITE, cluster(64), Layout(dp=64, ep=8, gbs=512, mbs=1)),
]


IDS = [f"{model.name} {s.describe()}" for model, _, s in CASES]


@pytest.mark.parametrize(("model", "on", "s"), CASES, ids=IDS)
def test_a_mixed_estimate_is_the_weighted_mean_of_every_kinds_stages(
        model: ModelSpec, on: ClusterSpec, s: Layout) -> None:
    """Bit for bit (repr: -0.0 and 0.0 apart), including the stages of one kind alone, which
    the shortcut takes from that kind's model without the mean."""
    assert model.has_dense_layers
    shortcut, long_way = estimate_memory(model, s, on), _long_way(model, s, on)
    assert shortcut == long_way
    assert repr(shortcut) == repr(long_way)


@pytest.mark.parametrize(("model", "s"), [(m, s) for m, _, s in CASES], ids=IDS)
def test_the_kinds_remembered_by_the_split_are_the_layouts_own(model: ModelSpec,
                                                               s: Layout) -> None:
    """Layouts apart only in fields that place no layer share the answer; each field that
    does place them moves it where the layout's own computation moves it."""
    assert stage_layer_kinds(s, model) == _stage_layer_kinds(s, model)
    for other in (with_fields(s, mbs=2 * s.mbs), with_fields(s, fp8="hybrid"),
                  with_fields(s, ep=1), with_fields(s, recompute="none")):
        assert stage_layer_kinds(other, model) == stage_layer_kinds(s, model)
    for name, value in (("pp", 2 * s.pp), ("vpp", 2 * s.vpp),
                        ("first_stage_layers", s.first_stage_layers + 1),
                        ("last_stage_layers", s.last_stage_layers + 1),
                        ("embedding_loss_split", not s.embedding_loss_split)):
        other = with_fields(s, **{name: value})
        try:
            own = _stage_layer_kinds(other, model)
        except (ValueError, IndexError):  # a split megatron-core refuses: nothing to place
            continue
        assert stage_layer_kinds(other, model) == own, name
    # Another model of the same layer count but other kinds never reads this one's answer.
    all_moe = dataclasses.replace(model, moe_layer_freq=1)
    assert stage_layer_kinds(s, all_moe) == _stage_layer_kinds(s, all_moe)
    if any(dense for dense, _ in _stage_layer_kinds(s, model)):  # some layer is placed
        assert stage_layer_kinds(s, all_moe) != stage_layer_kinds(s, model)
