"""tools/step_terms.py: a study's trials priced term by term beside their measured steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.layouts.layout import Layout
from autotune.predict.cost import estimate_cost
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.presets import load_model
from autotune.trials.trial import TrialSpec
from tools import step_terms

MODEL = load_model("gpt2-xl").with_overrides(global_batch_size=64)
CLOCKS = {"utilization": {"median": 0.7}, "power_w": {"median": 401.0},
          "sm_mhz": {"median": 1980.0}}


def _study(tmp_path: Path, trials: dict[str, tuple[Layout, dict[str, object]]]) -> Path:
    for name, (layout, result) in trials.items():
        folder = tmp_path / "study" / "trials" / name
        folder.mkdir(parents=True)
        spec = TrialSpec(model=MODEL, layout=layout, gpu_name="h200")
        (folder / "trial.json").write_text(spec.to_json())
        (folder / "result.json").write_text(json.dumps(result))
    return tmp_path / "study"


@pytest.mark.parametrize(("layout", "step_s"), [
    (Layout(dp=4, mbs=16, gbs=64, impl="te"), 0.462),
    (Layout(dp=4, mbs=8, gbs=64, impl="te", recompute="selective"), 0.965),
])
def test_row_terms_sum_to_the_prediction(tmp_path: Path, layout: Layout, step_s: float) -> None:
    study = _study(tmp_path, {"0": (layout, {"status": "OK", "step_time_s": step_s,
                                             "clocks": CLOCKS})})
    (trial,) = step_terms.study_trials(study)
    row = step_terms.row(trial)
    cost = estimate_cost(MODEL, layout, ClusterSpec(num_gpus=4, gpus_per_node=4,
                                                    gpu=gpu_spec("h200")))
    assert row["predicted_s"] == pytest.approx(cost.step_time_s)
    assert sum(row[t] for t in step_terms.TERMS) == pytest.approx(cost.step_time_s)
    assert row["error"] == pytest.approx(step_s / cost.step_time_s - 1)
    per = layout.num_microbatches * MODEL.num_layers
    assert row["measured_ms_per_layer_mb"] == pytest.approx(step_s / per * 1e3)
    assert row["launch_ms_per_layer_mb"] == pytest.approx(cost.launch_s / per * 1e3)
    assert row["util"] == 0.7


def test_study_keeps_ok_trials_in_number_order(tmp_path: Path) -> None:
    ok = (Layout(dp=4, mbs=16, gbs=64, impl="te"), {"status": "OK", "step_time_s": 0.5})
    failed = (Layout(dp=4, mbs=16, gbs=64, impl="te"), {"status": "OOM"})
    study = _study(tmp_path, {"10": ok, "2": ok, "3": failed})
    assert [t.source for t in step_terms.study_trials(study)] == ["study/2", "study/10"]


def test_markdown_has_one_row_per_trial(tmp_path: Path) -> None:
    layout = Layout(dp=4, mbs=16, gbs=64, impl="te")
    study = _study(tmp_path, {"0": (layout, {"status": "OK", "step_time_s": 0.5})})
    table = step_terms.markdown([step_terms.row(t) for t in step_terms.study_trials(study)])
    lines = table.splitlines()
    assert len(lines) == 3
    assert lines[2].startswith("| study/0 | tp1 pp1 dp4 mbs16 te |")
    assert "util" not in lines[0]  # no clocks recorded, no clock columns


@pytest.mark.parametrize("argv", [[], ["--study", "/nonexistent/study"]])
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert step_terms.main(argv) == 2
    assert capsys.readouterr().err.count("\n") == 1
