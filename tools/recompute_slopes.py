"""Memory per layer not recomputed: measured against predicted, per series of measured trials.

    PYTHONPATH=. python tools/recompute_slopes.py [--data FILE]

A series is the OK trials of tests/data/measured_trials.json that differ only in
recompute_num_layers (full recompute; one trial per count). Its slope is the least-squares
change of a peak per layer taken off recompute (per layer stored in full instead of its input):
measured (NVML device memory in use; torch's peak allocated where recorded) and predicted
(autotune.predict.memory: the peak, and the allocated bytes of the peak stage, which leave out
the CUDA context, NCCL and the allocator's reserve). What search/ladder.py extrapolates along.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.layouts.layout import Layout
from autotune.predict.calibration import row_inputs
from autotune.predict.memory import GIB, estimate_memory

__all__ = ["DATA", "Series", "main", "series_slopes"]

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "measured_trials.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class Series:
    """One series' slopes in GiB per layer not recomputed."""

    family: str
    gpu: str
    layout: str
    """The layout's label with the count as `n`."""
    counts: tuple[int, ...]
    sources: tuple[str, ...]
    used: float
    allocated: float | None
    """None where a trial has no peak_allocated_bytes."""
    predicted: float
    predicted_allocated: float
    peak_stages: tuple[int, ...]
    """The predicted peak stage per count: a series whose peak moves between stages mixes two
    stages' slopes."""

    @property
    def one_stage(self) -> bool:
        return len(set(self.peak_stages)) == 1


def _slope(counts: list[int], values: list[float]) -> float:
    # Per layer stored in full rather than recomputed: minus the slope over the count.
    return -statistics.linear_regression(counts, values).slope / GIB


def series_slopes(path: Path = DATA) -> list[Series]:
    """Every series of two counts or more, in order of family, GPU and layout."""
    groups: dict[tuple[str, str, int, int | None, str], list[dict[str, Any]]] = defaultdict(list)
    for t in json.loads(path.read_text())["trials"]:
        s = t["strategy"]
        if t["status"] != "OK" or s["recompute"] != "full" or not t.get("device_used_bytes"):
            continue
        rest = json.dumps({k: v for k, v in s.items() if k != "recompute_num_layers"},
                          sort_keys=True)
        key = (t.get("family", t["model"]), t["gpu"], t["gpus"], t.get("seq_length"), rest)
        if all(o["strategy"]["recompute_num_layers"] != s["recompute_num_layers"]
               for o in groups[key]):
            groups[key].append(t)
    out = []
    for (family, gpu, _, _, _), trials in groups.items():
        if len(trials) < 2:
            continue
        trials.sort(key=lambda t: t["strategy"]["recompute_num_layers"])
        counts, used, alloc, pred, pred_alloc, stages = [], [], [], [], [], []
        for t in trials:
            model, layout, cluster = row_inputs(t, path)
            estimate = estimate_memory(model, layout, cluster)
            counts.append(layout.recompute_num_layers)
            used.append(float(t["device_used_bytes"]))
            alloc.append(float(t.get("peak_allocated_bytes") or 0))
            pred.append(estimate.peak_bytes)
            pred_alloc.append(estimate.peak.allocated_bytes)
            stages.append(estimate.peak_stage)
        first = Layout(**trials[0]["strategy"])
        label = first.describe().replace(f"/{first.recompute_num_layers})", "/n)")
        out.append(Series(family=family, gpu=gpu, layout=f"seq {model.seq_length} {label}",
                          counts=tuple(counts), sources=tuple(t["source"] for t in trials),
                          used=_slope(counts, used),
                          allocated=_slope(counts, alloc) if all(alloc) else None,
                          predicted=_slope(counts, pred),
                          predicted_allocated=_slope(counts, pred_alloc),
                          peak_stages=tuple(stages)))
    return sorted(out, key=lambda s: (s.family, s.gpu, s.layout))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args(argv)
    print("| family | layout | counts | measured used | predicted peak | used ratio | measured "
          "allocated | predicted allocated | allocated ratio | peak stage |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s in series_slopes(args.data):
        alloc = f"{s.allocated:.3f}" if s.allocated is not None else "-"
        ratio = f"{s.predicted_allocated / s.allocated:.3f}" if s.allocated else "-"
        stage = "/".join(map(str, s.peak_stages)) if not s.one_stage else str(s.peak_stages[0])
        print(f"| {s.family}/{s.gpu} | {s.layout} | {','.join(map(str, s.counts))} | "
              f"{s.used:.3f} | {s.predicted:.3f} | {s.predicted / s.used:.3f} | {alloc} | "
              f"{s.predicted_allocated:.3f} | {ratio} | {stage} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
