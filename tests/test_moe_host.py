"""The MoE layer's host time (CostParams.moe_layer_launch_s, and expert_launch_s per local expert)
against autotune's first measured MoE trials of real layers (tests/data/measured_moe_trials.json,
session 22)."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from autotune.layouts.layout import Layout
from autotune.predict.calibration import fit_cost_params, load_trials
from autotune.predict.cost import CostParams, estimate_cost
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.presets import load_model

DATA = Path(__file__).parent / "data" / "measured_moe_trials.json"
TRIALS = load_trials(DATA)


SOURCES = [t["source"] for t in json.loads(DATA.read_text())["trials"]]
FITTED = [t for t, src in zip(TRIALS, SOURCES, strict=True) if src.startswith("s22-")]
"""The trials the host terms were fitted to (session 22); later ones are held out."""
HELD_OUT = [t for t, src in zip(TRIALS, SOURCES, strict=True) if not src.startswith("s22-")]


def _errors(params: CostParams, trials: list[Any] = TRIALS) -> list[float]:
    return [abs(estimate_cost(m, s, c, params).step_time_s / step - 1)
            for _, m, s, c, step, _ in trials]


def test_the_trials_span_expert_counts_and_the_shared_expert() -> None:
    assert len(FITTED) == 21 and len(TRIALS) == 23 and all(m.is_moe for _, m, *_ in TRIALS)
    assert {m.num_experts for _, m, *_ in TRIALS} == {8, 24, 60, 64}
    assert {bool(m.moe_shared_expert_intermediate_size) for _, m, *_ in TRIALS} == {True, False}


def test_the_host_terms_are_what_the_trials_fit() -> None:
    # Fitted together, every other constant shipped, from a start away from the shipped values.
    samples = [(m, s, c, step) for _, m, s, c, step, _ in FITTED]
    start = dataclasses.replace(CostParams(), moe_layer_launch_s=0.02, expert_launch_s=1e-4)
    fitted = fit_cost_params(samples, names=["moe_layer_launch_s", "expert_launch_s"],
                             start=start)
    shipped = CostParams()
    assert fitted.moe_layer_launch_s == pytest.approx(shipped.moe_layer_launch_s, rel=0.02)
    assert fitted.expert_launch_s == pytest.approx(shipped.expert_launch_s, rel=0.02)


def test_without_them_every_moe_trial_is_predicted_far_too_fast() -> None:
    # The host issues an MoE layer's work (TE's GroupedLinear above all: the profile in
    # 2026-11-29-h200-moe-dispatcher-s23.md) slower than the GPU runs it: without the terms
    # the model is 32-80% fast on every trial; with them median 14.5%, worst 46.5%, on one
    # host kind: the trust line still calls MoE out of range.
    without = _errors(dataclasses.replace(CostParams(), moe_layer_launch_s=0.0,
                                          expert_launch_s=0.0))
    shipped = _errors(CostParams())
    assert min(without) > 0.3 and statistics.median(without) > 0.5
    assert statistics.median(shipped) < 0.16 and max(shipped) < 0.5


def test_held_out_trials_stay_within_the_spread_of_hosts() -> None:
    # Session 23's two trials, not fitted: the Qwen layer at mbs 4 within 4%; the 64-expert
    # model at mbs 4 measured 0.821 s against session 22's 0.596 s for the same layout on
    # another machine, predicted 0.585 s (29% fast): the host's spread the trust line names.
    errors = _errors(CostParams(), HELD_OUT)
    assert len(HELD_OUT) == 2 and min(errors) < 0.05 and max(errors) < 0.35


@pytest.mark.parametrize(("ep", "share"), [(1, 1.0), (2, 0.5), (8, 0.125)])
def test_the_host_time_follows_the_local_experts(ep: int, share: float) -> None:
    # Expert parallelism spreads the experts: each rank issues the work of num_experts / ep.
    model = load_model("mixtral-8x7b")
    cluster = ClusterSpec(num_gpus=8, gpus_per_node=8, gpu=gpu_spec("h100-80gb"))
    layout = Layout(tp=1, pp=1, ep=ep, mbs=1, gbs=64)

    def launch(params: CostParams) -> float:
        return estimate_cost(model, layout, cluster, params).launch_s

    off = dataclasses.replace(CostParams(), moe_layer_launch_s=0.0, expert_launch_s=0.0)
    one = dataclasses.replace(off, expert_launch_s=1e-3)
    layer = dataclasses.replace(off, moe_layer_launch_s=1e-2)
    per_step = layout.num_microbatches * model.num_layers
    assert launch(one) - launch(off) == pytest.approx(per_step * 1e-3 * 8 * share, rel=1e-6)
    # The per-layer part does not depend on ep.
    assert launch(layer) - launch(off) == pytest.approx(per_step * 1e-2, rel=1e-6)
