"""Join the trials of the same layouts measured under two megatron-core releases.

    python tools/versions_table.py LABEL_A RESULTS_A LABEL_B RESULTS_B [--within PCT]

Each RESULTS folder holds the studies of one release (tools/device_issue29.sh runs the same grid
under 0.16.1 and 0.19.x); layouts are matched by their label. Prints a markdown table (tokens/s,
peak allocated memory, their differences) and exits 1 when a layout measured under both differs
in tokens/s by more than --within percent (default 3) or has another status.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import optuna

GIB = 2**30


def measured(results: Path) -> dict[str, dict[str, Any]]:
    """layout label -> {status, tokens_per_s, peak_gib, steps} over every study in `results`."""
    out: dict[str, dict[str, Any]] = {}
    for db in sorted(results.glob("*/study.db")):
        url = f"sqlite:///{db}"
        for summary in optuna.get_all_study_summaries(url):
            study = optuna.load_study(study_name=summary.study_name, storage=url)
            for t in study.trials:
                r = t.user_attrs.get("record") or {}
                if not r or r.get("duplicate_of") is not None:
                    continue
                m = r.get("metrics") or {}
                peak = m.get("peak_allocated_bytes")
                out[r.get("strategy", "?")] = {
                    "status": r.get("status", t.state.name),
                    "tokens_per_s": m.get("tokens_per_s"),
                    "peak_gib": peak / GIB if peak else None}
    return out


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("label_a")
    cli.add_argument("results_a", type=Path)
    cli.add_argument("label_b")
    cli.add_argument("results_b", type=Path)
    cli.add_argument("--within", type=float, default=3.0)
    args = cli.parse_args()
    a, b = measured(args.results_a), measured(args.results_b)
    print(f"| layout | {args.label_a} status | {args.label_b} status | {args.label_a} tok/s | "
          f"{args.label_b} tok/s | diff % | {args.label_a} peak GiB | {args.label_b} peak GiB |")
    print("|---|---|---|---|---|---|---|---|")
    bad = []

    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for label in sorted(a.keys() | b.keys()):
        x, y = a.get(label, {}), b.get(label, {})
        tx, ty = x.get("tokens_per_s"), y.get("tokens_per_s")
        diff = (ty - tx) / tx * 100 if tx and ty else None
        if x.get("status") != y.get("status") or (diff is not None and abs(diff) > args.within):
            bad.append(label)
        print(f"| {label} | {x.get('status', '-')} | {y.get('status', '-')} | {f(tx, ',.0f')} | "
              f"{f(ty, ',.0f')} | {f(diff, '+.1f')} | {f(x.get('peak_gib'), '.2f')} | "
              f"{f(y.get('peak_gib'), '.2f')} |")
    both = sum(1 for k in a.keys() & b.keys()
               if a[k].get("tokens_per_s") and b[k].get("tokens_per_s"))
    print(f"\n{both} layouts measured under both; beyond {args.within}% or another status: "
          f"{', '.join(bad) or 'none'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
