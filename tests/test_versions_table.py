"""tools/versions_table.py: the verdicts of the two-release comparison (issue 29) on made-up rows
of tools/versions_interleaved.py's trials.jsonl."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tools.versions_table import read, table

A, B = "0.16.1", "0.19.2"


def _row(release: str, key: str, tokens: float | None, *, cv: float = 0.01, idle: float = 0.05,
         status: str = "OK", kind: str = "warm") -> dict[str, Any]:
    return {"kind": kind, "release": release, "key": key, "status": status,
            "tokens_per_s": tokens, "step_time_cv": cv if tokens else None,
            "timed_steps": 8 if tokens else None, "gpu_idle": idle, "sm_mhz_min": 1980,
            "peak_allocated_gib": 46.7 if tokens else None}


def _verdicts(rows: list[dict[str, Any]]) -> tuple[dict[str, str], bool]:
    text, ok = table([A, B], rows, 3.0)
    lines = [line for line in text.splitlines() if line.startswith("| gbs")]
    return {line.split(" | ")[0][2:]: line.split(" | ")[-1].rstrip(" |") for line in lines}, ok


@pytest.mark.parametrize(("rows", "verdict", "ok"), [
    # 1.5% apart: within.
    ([_row(A, "gbs64 k", 75000), _row(B, "gbs64 k", 76125)], "within", True),
    # 6.2% apart with 0.5% step spreads over 8 steps: a difference.
    ([_row(A, "gbs64 k", 21000, cv=0.005), _row(B, "gbs64 k", 19700, cv=0.005)], "DIFFERS",
     False),
    # 3.1% apart, but two runs each that spread 4-6%: within the noise.
    ([_row(A, "gbs64 k", 10800, cv=0.05), _row(A, "gbs64 k", 11500, cv=0.05),
      _row(B, "gbs64 k", 12000, cv=0.05), _row(B, "gbs64 k", 11000, cv=0.05)], "noise", True),
    # Another ending under one release.
    ([_row(A, "gbs64 k", 50000), _row(B, "gbs64 k", None, status="CRASH")],
     "STATUS (OK vs CRASH)", False),
    # Failed alike under both: nothing compared, and so no pass.
    ([_row(A, "gbs64 k", None, status="CRASH"), _row(B, "gbs64 k", None, status="CRASH")],
     "unmeasured (CRASH vs CRASH)", False),
])
def test_verdicts(rows: list[dict[str, Any]], verdict: str, ok: bool) -> None:
    assert _verdicts(rows) == ({"gbs64 k": verdict}, ok)


def test_gpu_bound_layouts_are_counted_apart() -> None:
    rows = [_row(A, "gbs64 bound", 75000), _row(B, "gbs64 bound", 75500),
            _row(A, "gbs16 host", 10000, idle=0.6), _row(B, "gbs16 host", 10100, idle=0.6)]
    text, ok = table([A, B], rows, 3.0)
    assert ok
    assert text.rstrip().endswith("GPU-bound (busy >= 0.9): 1 within.")


def test_the_pools_first_trials_are_left_out(tmp_path: Path) -> None:
    rows = [_row(A, "gbs4 warm", 100, kind="warmup"), _row(B, "gbs4 warm", 10, kind="warmup"),
            _row(A, "gbs64 k", 75000), _row(B, "gbs64 k", 75000)]
    (tmp_path / "trials.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "plan.json").write_text(json.dumps({"releases": [[B, B, "/b"], [A, A, "/a"]]}))
    releases, read_rows = read(tmp_path / "trials.jsonl")
    assert releases == [B, A]  # plan.json's order, not the rows'
    assert {r["key"] for r in read_rows} == {"gbs64 k"}
