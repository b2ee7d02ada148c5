"""Join the trials of the same layouts measured under two megatron-core releases.

    python tools/versions_table.py TRIALS_JSONL [--within PCT]

TRIALS_JSONL is tools/versions_interleaved.py's trials.jsonl: one row per trial, with its
release, its layout's key (the label with its global batch) and its measurements. Prints a
markdown table, one line per layout: each release's mean tokens/s over its runs, the difference,
its standard error, the GPU's busy share and the peak allocated memory, and a verdict:
- `within` when the means differ by at most --within percent (default 3);
- `noise` when they differ by more, but by less than twice the difference's standard error
  (the runs' spread over the square root of their number; with one run, the timed steps'
  coefficient of variation over the square root of their number, which leaves out the
  run-to-run spread and so understates it);
- `DIFFERS` otherwise, `STATUS` when a layout ended differently under the two, and
  `unmeasured` when it has no tokens/s under one of them (both failed alike).
Exits 1 when any layout DIFFERS or has another STATUS, or none was measured under both. The
throwaway first trials of the pools (kind "warmup") are left out.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GPU_BOUND = 0.9
"""The GPU's busy share (1 - NVML idle, median over the timed steps) from which a layout counts
as GPU-bound: where the issue judges the 3% criterion."""


@dataclass(frozen=True, slots=True)
class Side:
    """One layout's runs under one release."""

    tokens: tuple[float, ...]
    statuses: tuple[str, ...]
    cvs: tuple[float, ...]
    steps: tuple[int, ...]

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.tokens) if self.tokens else None

    @property
    def spread(self) -> float | None:
        """The runs' relative standard deviation (None with fewer than two)."""
        if len(self.tokens) < 2:
            return None
        return statistics.stdev(self.tokens) / statistics.fmean(self.tokens)

    @property
    def rel_se(self) -> float | None:
        """The relative standard error of the mean (see the module's docstring)."""
        if self.spread is not None:
            return self.spread / math.sqrt(len(self.tokens))
        if self.cvs and self.steps and self.steps[0]:
            return self.cvs[0] / math.sqrt(self.steps[0])
        return None


def read(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """The releases in the order they first appear (plan.json's, when it is beside the file),
    and the measured rows."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("kind") != "warmup"]
    plan = path.parent / "plan.json"
    if plan.exists():
        releases = [r[0] for r in json.loads(plan.read_text())["releases"]]
    else:
        releases = list(dict.fromkeys(r["release"] for r in rows))
    return releases, rows


def side(rows: list[dict[str, Any]]) -> Side:
    ok = [r for r in rows if r.get("tokens_per_s")]
    return Side(tokens=tuple(r["tokens_per_s"] for r in ok),
                statuses=tuple(sorted({r.get("status") or "?" for r in rows})),
                cvs=tuple(r["step_time_cv"] for r in ok if r.get("step_time_cv") is not None),
                steps=tuple(r["timed_steps"] for r in ok if r.get("timed_steps")))


def verdict(a: Side, b: Side, within: float) -> tuple[str, float | None, float | None]:
    """(verdict, difference of b against a in percent, its standard error in percent)."""
    if a.statuses != b.statuses:
        return "STATUS", None, None
    if a.mean is None or b.mean is None:
        return "unmeasured", None, None
    diff = (b.mean / a.mean - 1) * 100
    se = (math.hypot(a.rel_se, b.rel_se) * 100
          if a.rel_se is not None and b.rel_se is not None else None)
    if abs(diff) <= within:
        return "within", diff, se
    if se is not None and abs(diff) <= 2 * se:
        return "noise", diff, se
    return "DIFFERS", diff, se


def table(releases: list[str], rows: list[dict[str, Any]], within: float) -> tuple[str, bool]:
    """The markdown comparison and whether every layout is within or noise."""
    a_name, b_name = releases[:2]

    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [f"| layout | {a_name} tok/s (runs) | {b_name} tok/s (runs) | diff % | SE % | "
             f"runs spread {a_name} / {b_name} | worst step CV | GPU busy | SM MHz min | "
             f"peak GiB {a_name} / {b_name} | verdict |", "|" + "---|" * 11]
    counts: dict[str, int] = {}
    bound: dict[str, int] = {}
    keys = list(dict.fromkeys(r["key"] for r in rows))
    for key in keys:
        mine = [r for r in rows if r["key"] == key]
        a = side([r for r in mine if r["release"] == a_name])
        b = side([r for r in mine if r["release"] == b_name])
        word, diff, se = verdict(a, b, within)
        idle = [r["gpu_idle"] for r in mine if r.get("gpu_idle") is not None]
        busy = 1 - statistics.median(idle) if idle else None
        counts[word] = counts.get(word, 0) + 1
        if busy is not None and busy >= GPU_BOUND:
            bound[word] = bound.get(word, 0) + 1
        peaks = [max((r["peak_allocated_gib"] for r in mine if r["release"] == name
                      and r.get("peak_allocated_gib")), default=None)
                 for name in (a_name, b_name)]
        mhz = min((r["sm_mhz_min"] for r in mine if r.get("sm_mhz_min")), default=None)
        cv = max((r["step_time_cv"] for r in mine if r.get("step_time_cv") is not None),
                 default=None)
        status = "" if a.statuses == ("OK",) == b.statuses else \
            f" ({'/'.join(a.statuses)} vs {'/'.join(b.statuses)})"
        lines.append(
            f"| {key} | {f(a.mean, ',.0f')} ({len(a.tokens)}) | {f(b.mean, ',.0f')} "
            f"({len(b.tokens)}) | {f(diff, '+.1f')} | {f(se, '.1f')} | "
            f"{f(a.spread, '.1%')} / {f(b.spread, '.1%')} | {f(cv, '.3f')} | "
            f"{f(busy, '.2f')} | {f(mhz, '.0f')} | {f(peaks[0], '.2f')} / {f(peaks[1], '.2f')} "
            f"| {word}{status} |")
    compared = len(keys) - counts.get("STATUS", 0) - counts.get("unmeasured", 0)
    ok = compared > 0 and not counts.get("DIFFERS") and not counts.get("STATUS")

    def summary(c: dict[str, int]) -> str:
        return ", ".join(f"{n} {w}" for w, n in sorted(c.items())) or "none"

    lines += ["", f"{len(keys)} layouts; {summary(counts)} (within: |diff| <= {within:g}%; "
              f"noise: beyond it, but within 2 SE). GPU-bound (busy >= {GPU_BOUND:g}): "
              f"{summary(bound)}."]
    return "\n".join(lines) + "\n", ok


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("trials", type=Path, help="tools/versions_interleaved.py's trials.jsonl")
    cli.add_argument("--within", type=float, default=3.0)
    args = cli.parse_args()
    releases, rows = read(args.trials)
    if len(releases) < 2:
        sys.exit(f"{args.trials}: rows of {len(releases)} release(s), need two")
    text, ok = table(releases, rows, args.within)
    print(text, end="")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
