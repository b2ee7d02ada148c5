"""Print every trial of every study under a results folder: layout, status, measured against
predicted, and launch overhead. Used to write results/benchmarks reports from device runs."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import optuna

GIB = 2**30


def studies(db: Path) -> Iterator[optuna.Study]:
    """Every study of one SQLite file, in the order Optuna lists them."""
    url = f"sqlite:///{db}"
    for summary in optuna.get_all_study_summaries(url):
        yield optuna.load_study(study_name=summary.study_name, storage=url)


def rows(db: Path, timed_steps: int) -> list[str]:
    out = []
    for study in studies(db):
        out.append(f"## {study.study_name}")
        out.append("| # | layout | source | status | tokens/s | MFU | step s | peak alloc GiB | "
                   "peak reserved GiB | device used GiB | predicted GiB | mem err % | "
                   "predicted tokens/s | tok err % | wall s | overhead s |")
        out.append("|" + "---|" * 16)
        for t in study.trials:
            r = t.user_attrs.get("record") or {}
            m = r.get("metrics") or {}
            if r.get("duplicate_of") is not None:
                continue
            peak = m.get("peak_allocated_bytes")
            reserved = m.get("peak_reserved_bytes")
            pred = r.get("predicted_peak_bytes")
            tok, ptok = m.get("tokens_per_s"), r.get("predicted_tokens_per_s")
            step = m.get("step_time_s")
            wall = m.get("wall_time_s")
            # Launch overhead as the benchmark reports define it: wall time minus timed steps
            # (their sum where the worker reports it: adaptive timing runs fewer).
            timed = m.get("timed_s") or (step * timed_steps if step else None)
            overhead = wall - timed if wall is not None and timed else None

            def f(v: float | None, fmt: str) -> str:
                return "-" if v is None else format(v, fmt)

            used = m.get("device_used_bytes")
            # The model predicts what the GPU must hold (allocator reserve, CUDA context, NCCL):
            # NVML's device memory in use when known, else the allocator's reserve.
            actual = used or reserved
            mem_err = (pred - actual) / actual * 100 if pred and actual else None
            tok_err = (ptok - tok) / tok * 100 if ptok and tok else None
            out.append(
                f"| {t.number} | {r.get('strategy', '?')} | {r.get('source', '')} | "
                f"{r.get('status', t.state.name)} | {f(tok, ',.0f')} | "
                f"{f(m.get('mfu') and m['mfu'] * 100, '.1f')} | {f(step, '.3f')} | "
                f"{f(peak and peak / GIB, '.2f')} | {f(reserved and reserved / GIB, '.2f')} | "
                f"{f(used and used / GIB, '.2f')} | "
                f"{f(pred and pred / GIB, '.2f')} | {f(mem_err, '+.1f')} | {f(ptok, ',.0f')} | "
                f"{f(tok_err, '+.1f')} | {f(wall, '.1f')} | {f(overhead, '.1f')} |")
    return out


def main() -> None:
    root = Path(sys.argv[1])
    timed_steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    for db in sorted(root.glob("*/study.db")):
        print("\n".join(rows(db, timed_steps)))
        print()


if __name__ == "__main__":
    main()
