"""Print the training loss every trial of every study under a results folder recorded: its
per-step losses where the worker kept them (FP8 against bf16, issue 26), else the last step's,
with the trial's status, clocks and step-time spread. Used to write results/benchmarks reports
from device runs: `python tools/trial_losses.py RESULTS_DIR`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from study_table import studies


def _fmt(values: list[float] | None) -> str:
    return " ".join(f"{v:.4f}" for v in values) if values else "-"


def rows(db: Path) -> list[str]:
    out = []
    for study in studies(db):
        out.append(f"## {study.study_name}")
        out.append("| # | layout | status | loss per step | last loss | step CV | SM MHz (median) "
                   "| GPU util (median) |")
        out.append("|" + "---|" * 8)
        for t in study.trials:
            r: dict[str, Any] = t.user_attrs.get("record") or {}
            if r.get("duplicate_of") is not None:
                continue
            m: dict[str, Any] = r.get("metrics") or {}
            clocks = m.get("clocks") or {}
            sm = (clocks.get("sm_mhz") or {}).get("median")
            util = (clocks.get("utilization") or {}).get("median")
            cv = m.get("step_time_cv")
            last = m.get("loss")
            out.append(
                f"| {t.number} | {r.get('strategy', '?')} | {r.get('status', t.state.name)} "
                f"| {_fmt(m.get('losses'))} | {'-' if last is None else f'{last:.4f}'} "
                f"| {'-' if cv is None else f'{cv:.3f}'} | {sm or '-'} "
                f"| {'-' if util is None else f'{util:.2f}'} |")
        out.append("")
    return out


def main(root: str) -> None:
    for db in sorted(Path(root).rglob("study.db")):
        print("\n".join(rows(db)))


if __name__ == "__main__":
    main(sys.argv[1])
