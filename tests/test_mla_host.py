"""Multi-Latent Attention's host time (CostParams.mla_layer_launch_s) against autotune's first MLA
trials on a GPU (tests/data/measured_mla_trials.json, session 23)."""

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

DATA = Path(__file__).parent / "data" / "measured_mla_trials.json"
TRIALS = load_trials(DATA)
DENSE = [t for t in TRIALS if not t[1].is_moe]
"""The trials the term is fitted to; the MoE ones are held out (the MoE host terms' spread)."""
ROOT = Path(__file__).parent.parent


def _errors(params: CostParams, trials: list[Any]) -> list[float]:
    return [estimate_cost(m, s, c, params).step_time_s / step - 1
            for _, m, s, c, step, _ in trials]


def test_the_trials_are_mla_dense_and_moe() -> None:
    assert len(TRIALS) == 7 and len(DENSE) == 5
    assert all(m.multi_latent_attention for _, m, *_ in TRIALS)
    sources = [t["source"] for t in json.loads(DATA.read_text())["trials"]]
    assert all(src.startswith("s23-mla") for src in sources)


def test_the_term_is_what_the_trials_fit() -> None:
    samples = [(m, s, c, step) for _, m, s, c, step, _ in DENSE]
    start = dataclasses.replace(CostParams(), mla_layer_launch_s=0.01)
    fitted = fit_cost_params(samples, names=["mla_layer_launch_s"], start=start)
    assert fitted.mla_layer_launch_s == pytest.approx(CostParams().mla_layer_launch_s, rel=0.02)


def test_without_it_small_micro_batches_are_predicted_far_too_fast() -> None:
    without = _errors(dataclasses.replace(CostParams(), mla_layer_launch_s=0.0), DENSE)
    shipped = _errors(CostParams(), DENSE)
    assert max(without) < 0 and min(without) < -0.25      # all fast, mbs 1 by over 25%
    assert max(abs(e) for e in shipped) < 0.11
    assert statistics.median(abs(e) for e in shipped) < 0.05


def test_held_out_moe_trials() -> None:
    errors = _errors(CostParams(), [t for t in TRIALS if t[1].is_moe])
    assert len(errors) == 2 and min(abs(e) for e in errors) < 0.05 and max(errors) < 0.35


@pytest.mark.parametrize("fp8", ["off", "hybrid"])
def test_the_host_time_is_per_mla_layer_and_micro_batch(fp8: str) -> None:
    # Host-bound (mbs 1): each layer and micro-batch pays the term once, FP8's host floor
    # included (the floor is a plain layer's host time; MLA's comes on top).
    model = load_model(str(ROOT / "tools" / "shapes" / "mla-dense-6l.yaml"))
    cluster = ClusterSpec(num_gpus=1, gpus_per_node=1, gpu=gpu_spec("h200"))
    layout = Layout(mbs=1, gbs=8, impl="te", fp8=fp8)
    off = dataclasses.replace(CostParams(), mla_layer_launch_s=0.0)
    on = dataclasses.replace(off, mla_layer_launch_s=1e-2)
    added = (estimate_cost(model, layout, cluster, on).step_time_s
             - estimate_cost(model, layout, cluster, off).step_time_s)
    per_step = layout.num_microbatches * model.num_layers
    assert added == pytest.approx(per_step * 1e-2, rel=0.05)


def test_a_model_without_mla_pays_nothing() -> None:
    model = load_model("llama3-8b")
    cluster = ClusterSpec(num_gpus=8, gpus_per_node=8, gpu=gpu_spec("h100-80gb"))
    layout = Layout(tp=2, dp=4, mbs=1, gbs=64, sequence_parallel=True, impl="te")
    times = {estimate_cost(model, layout, cluster,
                           dataclasses.replace(CostParams(), mla_layer_launch_s=v)).step_time_s
             for v in (0.0, 0.1)}
    assert len(times) == 1
