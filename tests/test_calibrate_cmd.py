from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autotune.cli import main
from autotune.predict.calibration import load_calibration
from autotune.predict.memory import MemoryParams
from autotune.trials.trial import TrialSpec
from tests.measured import DATA_PATH, trial_inputs

DATA = json.loads(DATA_PATH.read_text())


def _write_trials(root: Path, with_gpu: bool = True, sources: tuple[str, ...] = ("",)) -> int:
    """The measured trials of tests/data whose source starts with one of `sources` as trial
    folders, the way the worker leaves them."""
    count = 0
    rows = [row for row in DATA["trials"] if row["source"].startswith(sources)]
    for i, t in enumerate(rows):
        model, s, _ = trial_inputs(t)
        folder = root / "study" / "trials" / str(i)
        folder.mkdir(parents=True)
        spec = TrialSpec(model=model, layout=s, gpu_name=t["gpu"] if with_gpu else None)
        spec.write(folder / "trial.json")
        result: dict[str, Any] = {"status": t["status"], "step_time_s": t["step_time_s"],
                                  "device_used_bytes": t["device_used_bytes"]}
        (folder / "result.json").write_text(json.dumps(result))
        count += t["status"] == "OK"
    return count


def test_calibrate_fits_and_writes_a_file_estimate_accepts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One machine's trials, as calibrate is meant to be run: gpt2-large on 2 x H200 (sessions
    1-2). Over all of tests/data the fit beats the defaults on neither model, and the file
    holds the defaults (the next test); here the memory fit does and is written."""
    measured = _write_trials(tmp_path, sources=("large-", "s2-l-"))
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--results-dir", str(tmp_path), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{measured} measured trials" in printed
    assert "device memory: fitted constants kept" in printed
    cost, memory = load_calibration(out)
    assert 0 < cost.gemm_efficiency_max <= 1 and cost.layer_launch_s > 0
    assert memory != MemoryParams() and memory.cuda_context_bytes > 0
    args = ["estimate", "gpt2-large", "--gpus", "2", "--gpu", "h200", "--mbs", "32",
            "--impl", "sdpa", "--json"]
    assert main(args) == 0
    default = json.loads(capsys.readouterr().out)
    assert main([*args, "--calibration", str(out)]) == 0
    fitted = json.loads(capsys.readouterr().out)
    # Measured on 2 x H200 (tests/data, large-layouts/00): 0.422 s per step, 74.41 GiB used.
    assert abs(fitted["step_time_s"] - 0.422) <= abs(default["step_time_s"] - 0.422) + 0.02
    assert abs(fitted["peak_memory_gib"] - 74.41) < abs(default["peak_memory_gib"] - 74.41)


def test_calibrate_needs_the_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_trials(tmp_path, with_gpu=False)
    assert main(["calibrate", "--results-dir", str(tmp_path)]) == 2
    assert "pass --gpu" in capsys.readouterr().err


def test_calibrate_needs_measurements(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--results-dir", str(tmp_path)]) == 2
    assert "at least 3 measured trials, found 0" in capsys.readouterr().err


def test_a_bad_calibration_file_is_one_line(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "cal.json"
    bad.write_text("{}")
    assert main(["estimate", "gpt2", "--gpus", "1", "--calibration", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "not a calibration file" in err and len(err.strip().splitlines()) == 1


def test_a_fit_worse_than_the_defaults_is_not_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Whatever the fitter returns, the file never holds constants that predict the measured
    # trials worse than the defaults do.
    import autotune.commands.calibrate as calibrate
    from autotune.predict.cost import CostParams

    _write_trials(tmp_path)
    monkeypatch.setattr(calibrate, "fit_cost_params",
                        lambda *a, **k: CostParams(gemm_efficiency_max=0.2))
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--results-dir", str(tmp_path), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "step time: default constants kept: the fit was worse" in printed
    cost, _ = load_calibration(out)
    assert cost == CostParams()
