"""tools/replay_search.py: what a replayed launch answers (the recorded figure, else the model's
bent by the study's bias and the chosen random error)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.layouts.layout import Layout
from autotune.levers.fp8 import Fp8
from autotune.predict.cost import estimate_cost
from autotune.specs.hardware import ClusterSpec
from autotune.specs.presets import load_model
from tools.replay_search import ReplayBackend, measured_table

MODEL = load_model("gpt2-xl").with_overrides(global_batch_size=8)
CLUSTER = ClusterSpec.make(1, gpu="h200")
BF16 = Layout(mbs=8, gbs=8, impl="te")
FP8 = Layout(mbs=8, gbs=8, impl="te", fp8=Fp8.HYBRID)
SUMMARY = """## s
| # | layout | source | status | tokens/s | MFU |
|---|---|---|---|---|---|
| 0 | tp1 pp1 dp1 mbs8 te | alpa | OK | 34,299 | 35.6 |
| 1 | tp1 pp1 dp1 mbs4 te | sampler | INVALID | - | - |
| 2 | tp1 pp1 dp1 mbs8 te | sampler | OK | 99,999 | 1.0 |
"""


def test_the_table_keeps_each_layouts_first_ok_figure(tmp_path: Path) -> None:
    summary = tmp_path / "summary.txt"
    summary.write_text(SUMMARY)
    assert measured_table(summary) == {"tp1 pp1 dp1 mbs8 te": 34_299.0}


@pytest.mark.parametrize(("layout", "table", "factor"), [
    (BF16, {BF16.describe(): 34_299.0}, None),   # measured: its figure
    (BF16, {}, 0.9),                              # bf16, not measured: the model x bf16 bias
    (FP8, {}, 1.2),                               # FP8, not measured: the model x FP8 bias
])
def test_a_launch_answers_measured_else_the_biased_model(
        layout: Layout, table: dict[str, float], factor: float | None) -> None:
    replay = ReplayBackend(CLUSTER, table, fp8_factor=1.2, bf16_factor=0.9, noise=0.01)
    expected = table.get(layout.describe()) or (
        estimate_cost(MODEL, layout, CLUSTER).tokens_per_s * (factor or 1.0))
    assert replay.answer(MODEL, layout) == pytest.approx(expected)


def test_the_random_error_is_bounded_and_fixed_per_layout_and_seed() -> None:
    base = estimate_cost(MODEL, BF16, CLUSTER).tokens_per_s
    answers = {seed: ReplayBackend(CLUSTER, {}, 1.0, 1.0, 0.01, perturb=0.05,
                                   seed=seed).answer(MODEL, BF16) for seed in range(8)}
    assert all(abs(a / base - 1) <= 0.05 for a in answers.values())
    assert len(set(answers.values())) > 1
    again = ReplayBackend(CLUSTER, {}, 1.0, 1.0, 0.01, perturb=0.05, seed=3)
    assert again.answer(MODEL, BF16) == answers[3]
