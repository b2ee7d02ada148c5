"""Where the spread between runs of one layout comes from, from tools/repeatability.py's records.

    python3 tools/repeat_spread.py TRIALS.jsonl...

Per layout (over every OK run, warm, cold and first alike): the runs' relative standard deviation
against the median step CV within a run (what a search takes as a one-run figure's noise), and the
slowest over the fastest run in step time, in the main threads' CPU seconds per step and in the
GPU's busy seconds per step (step × NVML utilization). Then, over all runs, each figure over its
layout's mean: how many runs lie within twice their own step CV of the mean (the search's
NOISE_MARGIN), and Pearson's r of step time with main-thread CPU time and with GPU-busy time: the
host is the cause where the first is high and the second is not (issue 25).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from autotune.search.stop_rule import NOISE_MARGIN


def runs(paths: list[Path]) -> dict[str, list[dict[str, float]]]:
    """Per layout (file and layout label), each OK run's figures."""
    out: dict[str, list[dict[str, float]]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            r: dict[str, Any] = json.loads(line)
            if r.get("status") != "OK" or not r.get("step_times_s"):
                continue
            steps = r["step_times_s"]
            step = statistics.fmean(steps)
            ranks = r.get("rank_host") or []
            main = statistics.fmean(h["main_cpu_s"] for h in ranks) / len(steps) if ranks else 0.0
            out.setdefault(f"{path.name}: {r['layout']}", []).append({
                "tokens": r["tokens_per_s"], "cv": r.get("step_time_cv") or 0.0, "step": step,
                "main": main, "busy": step * (1 - (r.get("gpu_idle") or 0.0))})
    return out


def _r(x: list[float], y: list[float]) -> str:
    """Pearson's r to two places, or `-` where either series does not vary (r is undefined)."""
    if len(set(x)) < 2 or len(set(y)) < 2:
        return "-"
    return f"{statistics.correlation(x, y):.2f}"


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]]
    if not paths:
        raise SystemExit(__doc__.split("\n\n")[1].strip())
    table = runs(paths)
    print("| layout | runs | RSD between runs | median step CV | step slowest/fastest | "
          "main CPU, same runs | GPU busy, same runs |")
    print("|---|---|---|---|---|---|---|")
    inside = total = 0
    rel: dict[str, list[float]] = {"step": [], "main": [], "busy": []}
    for name, rs in table.items():
        tokens = [r["tokens"] for r in rs]
        mean = statistics.fmean(tokens)
        rsd = statistics.stdev(tokens) / mean if len(rs) > 1 else 0.0
        slow, fast = max(rs, key=lambda r: r["step"]), min(rs, key=lambda r: r["step"])
        ratio = {k: slow[k] / fast[k] if fast[k] else float("nan") for k in rel}
        print(f"| {name} | {len(rs)} | {rsd:.1%} | {statistics.median(r['cv'] for r in rs):.1%} "
              f"| {ratio['step']:.2f} | {ratio['main']:.2f} | {ratio['busy']:.2f} |")
        inside += sum(abs(r["tokens"] / mean - 1) <= NOISE_MARGIN * r["cv"] for r in rs)
        total += len(rs)
        for k in rel:
            m = statistics.fmean(r[k] for r in rs)
            rel[k] += [r[k] / m if m else 1.0 for r in rs]
    print()
    print(f"runs within {NOISE_MARGIN:g} x their own step CV of their layout's mean: "
          f"{inside} of {total}")
    if total > 2:
        print(f"r(step, main-thread CPU) = {_r(rel['step'], rel['main'])}; "
              f"r(step, GPU busy) = {_r(rel['step'], rel['busy'])}")


if __name__ == "__main__":
    main()
