"""`autotune estimate`: one layout's memory per stage, speed, JSON, layout files, errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autotune.cli import main

ESTIMATE = ["estimate", "gpt2-xl", "--gpus", "8", "--pp", "2", "--mbs", "4"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_has_memory_speed_and_breakdown(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, *ESTIMATE, "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    for key in ("peak_memory_gib", "fits", "step_time_s", "tokens_per_s", "tflops_per_gpu",
                "mfu", "memory_breakdown_gib"):
        assert key in data, key
    assert (data["layout"]["pp"],
            data["layout"]["dp"]) == (2, 4)
    assert data["fits"] is (data["peak_memory_gib"] <= data["capacity_gib"])
    assert data["tokens_per_s"] > 0 and 0 < data["mfu"] < 1 and data["step_time_s"] > 0
    assert len(data["stages_gib"]) == 2
    assert data["peak_memory_gib"] == pytest.approx(max(s["total"] for s in data["stages_gib"]))
    assert data["predicted"] is True


@pytest.mark.parametrize(("args", "message"), [
    (["--gpus", "8", "--tp", "2"], "tp=2 must divide num_attention_heads=25"),
    (["--gpus", "5", "--pp", "5"], "pp=5 must divide num_layers=48"),
    (["--gpus", "8", "--pp", "3"], "tp=1 x pp=3 x cp=1 = 3 must divide the 8 GPUs"),
    (["--gpus", "8", "--sp"], "sequence_parallel needs tp >= 2, got tp=1"),
])
def test_invalid_layout_is_one_line_with_megatrons_reason(
        capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, out, err = run(capsys, "estimate", "gpt2-xl", *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("autotune: error: ")
    assert message in err


def test_layout_file_round_trips(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = [*ESTIMATE, "--recompute", "selective", "--distributed-optimizer", "--impl", "sdpa"]
    _, first, _ = run(capsys, *args, "--json")
    layout = tmp_path / "layout.json"
    layout.write_text(first)  # the estimate's own JSON carries "layout"
    code, second, _ = run(capsys, "estimate", "gpt2-xl", "--gpus", "8", "--layout", str(layout),
                          "--json")
    assert code == 0
    assert json.loads(second) == json.loads(first)
    # A bare layout object works too, and its values override the flags.
    layout.write_text(json.dumps({"pp": 4, "mbs": 2}))
    _, third, _ = run(capsys, *ESTIMATE, "--layout", str(layout), "--json")
    assert (json.loads(third)["layout"]["pp"], json.loads(third)["layout"]["mbs"]) == (4, 2)


@pytest.mark.parametrize(("text", "message"), [
    (None, "does not exist"),
    ("{not json", "malformed JSON"),
    ("[1, 2]", "expected a JSON object"),
])
def test_bad_layout_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                     text: str | None, message: str) -> None:
    layout = tmp_path / "layout.json"
    if text is not None:
        layout.write_text(text)
    code, out, err = run(capsys, *ESTIMATE, "--layout", str(layout))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


@pytest.mark.parametrize(("pp", "stages"), [
    (1, [0]),
    (2, [0, 1]),
    (4, [0, 1, 3]),  # first, busiest middle and last stage (memory.estimate_memory)
])
def test_text_has_one_row_per_stage_and_marks_the_peak(capsys: pytest.CaptureFixture[str],
                                                       pp: int, stages: list[int]) -> None:
    code, out, _ = run(capsys, "estimate", "gpt2-xl", "--gpus", "8", "--pp", str(pp))
    assert code == 0
    rows = [line for line in out.splitlines() if re.match(r"^\s+\d+\s+\d", line)]
    assert [int(r.split()[0]) for r in rows] == stages
    peaks = [r for r in rows if r.endswith("<- peak")]
    assert len(peaks) == 1
    stage = int(peaks[0].split()[0])
    assert f"on stage {stage}: fits" in out
    assert "tokens/s" in out and "MFU" in out and "(predicted)" in out
