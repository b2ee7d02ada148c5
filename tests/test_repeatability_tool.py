"""tools/repeatability.py (issue 25 and 30's warm/cold check): the order of its passes and the
per-rank host table of its report, without a GPU."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"


@pytest.fixture
def tool(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(TOOLS))
    sys.modules.pop("repeatability", None)
    import repeatability

    return repeatability


def test_warm_and_cold_alternate_and_first_in_pool_ends_each_round(tool: Any) -> None:
    passes = tool.plan(3, 2, first=(2,))
    assert [(r, k) for r, k, _ in passes] == [(0, "warm"), (0, "cold"), (0, "first"),
                                               (1, "cold"), (1, "warm"), (1, "first")]
    assert passes[0][2] == [0, 1, 2] and passes[1][2] == [1, 2, 0]
    assert all(order == [2] for _, kind, order in passes if kind == "first")
    # In the order given: a layout always follows the same ones in its pool.
    fixed = tool.plan(3, 2, rotate=False)
    assert all(order == [0, 1, 2] for _, _, order in fixed) and len(fixed) == 4


def _row(kind: str, tokens: float, main_cpu: list[float], before: int,
         after: list[str]) -> dict[str, Any]:
    return {"kind": kind, "round": 1, "layout": "tp1 pp2 dp1 vpp2 mbs4 sdpa",
            "tokens_per_s": tokens, "step_time_cv": 0.05, "cpu_s": 1.0, "host_wall_s": 1.0,
            "steal_s": 0.0, "gc_pauses": 0, "threads": 55, "gpu_idle": 0.4, "sm_mhz_min": 1980,
            "throttled": False, "step_times_s": [1.0, 1.0], "trials_before": before,
            "after": after,
            "rank_host": [{"main_cpu_s": c, "schedule_s": 0.7, "optimizer_s": 0.05,
                           "gpu_wait_s": 0.01, "main_ctx_involuntary": 4,
                           "other_threads_cpu_s": 0.2} for c in main_cpu]}


def test_the_report_shows_each_ranks_host_per_kind_and_the_pool_position(tool: Any) -> None:
    rows = [_row("warm", 38_000, [1.8, 1.6], 2, ["tp2 sp", "dp2"]),
            _row("cold", 46_000, [1.4, 1.5], 0, []),
            _row("first", 45_000, [1.5, 1.5], 0, [])]
    text = tool.report(rows, ["tp1 pp2 dp1 vpp2 mbs4 sdpa"], ["note"])
    table = [line for line in text.splitlines() if line.startswith("| tp1 pp2")]
    assert len(table) == 4  # the warm/cold row, then warm, cold and first
    warm = next(line for line in table if "| warm |" in line)
    assert "0.900 / 0.800" in warm and "2 (tp2 sp, dp2)" in warm and "2.0 / 2.0" in warm
    first = next(line for line in table if "| first |" in line)
    assert "45,000" in first and "0 (-)" in first


@pytest.fixture
def finalists(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(TOOLS))
    for name in ("finalist_fields", "device_layouts"):
        sys.modules.pop(name, None)
    import device_layouts
    import finalist_fields

    return finalist_fields, device_layouts


@pytest.mark.parametrize("fields", [
    {"mbs": 8, "impl": "te", "recompute": "selective"},
    {"tp": 2, "sequence_parallel": True, "mbs": 4, "distributed_optimizer": True},
    {"pp": 2, "vpp": 2, "mbs": 1, "recompute": "full", "recompute_method": "block",
     "recompute_num_layers": 3},
])
def test_a_searchs_best_rows_read_back_as_the_same_layouts(finalists: Any,
                                                            fields: dict[str, Any]) -> None:
    import dataclasses
    import json

    from autotune.layouts.layout import DIMENSIONS, Layout

    tool, device_layouts = finalists
    parsed = {k: DIMENSIONS[k].parse(str(v)) for k, v in fields.items()}
    layout = dataclasses.replace(Layout(), **parsed)
    row = json.loads(json.dumps({n: getattr(layout, n) for n in DIMENSIONS}))  # as --json prints
    other = dataclasses.replace(layout, mbs=layout.mbs * 2)
    answer = {"best": [row, row, json.loads(json.dumps({n: getattr(other, n)
                                                        for n in DIMENSIONS}))]}
    texts = tool.top_layouts(answer, 2)
    assert len(texts) == 2  # the repeated row counts once
    back = dataclasses.replace(Layout(), **device_layouts.layout_fields(texts[0]))
    assert back == layout


def test_repeat_spread_tells_a_host_stretched_step_from_a_gpu_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    import json

    monkeypatch.syspath_prepend(str(TOOLS))
    sys.modules.pop("repeat_spread", None)
    import repeat_spread

    lines = []
    for step, main, cv in ((0.5, 2.0, 0.02), (0.6, 2.4, 0.02), (0.7, 2.8, 0.02)):
        # the same GPU work (0.3 s busy) each run; the host's CPU time stretches the step
        lines.append(json.dumps({"status": "OK", "layout": "mbs2", "tokens_per_s": 8192 / step,
                                 "step_time_cv": cv, "step_times_s": [step] * 4,
                                 "gpu_idle": 1 - 0.3 / step, "rank_host": [{"main_cpu_s": main}]}))
    lines.append(json.dumps({"status": "OOM", "layout": "mbs16"}))
    path = tmp_path / "trials.jsonl"
    path.write_text("\n".join(lines) + "\n")
    table = repeat_spread.runs([path])
    assert list(table) == ["trials.jsonl: mbs2"] and len(table["trials.jsonl: mbs2"]) == 3
    monkeypatch.setattr(sys, "argv", ["repeat_spread.py", str(path)])
    repeat_spread.main()
    out = capsys.readouterr().out
    assert "| 1.40 | 1.40 | 1.00 |" in out  # step and CPU stretch alike, the GPU's work does not
    # 2% step CV: only the middle run (1.9% off the mean) lies within twice its own noise
    assert "their layout's mean: 1 of 3" in out
    assert "r(step, main-thread CPU) = 1.00; r(step, GPU busy) = -" in out  # busy never varies
