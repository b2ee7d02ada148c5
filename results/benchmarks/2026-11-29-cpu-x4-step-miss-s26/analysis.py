"""Session 26 helper h26c: the grouped errors and the host-floor what-if of
results/benchmarks/2026-11-29-cpu-x4-step-miss-s26.md (analysis only; nothing here is shipped).

    tar xzf results/benchmarks/2026-11-29-h200x4-issue30-s26/gpt2-xl/results.tgz -C /tmp/s26
    tar xzf results/benchmarks/2026-11-27-h200x4-lanes/lanes-trials.tgz -C /tmp/s10
    PYTHONPATH=. python results/benchmarks/2026-11-29-cpu-x4-step-miss-s26/analysis.py \
        /tmp/s26/r_xl4/xl4-s26 /tmp/s10/all4/r/xl4-default
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path
from typing import Any

from autotune.predict.cost import estimate_cost
from tools import step_terms

DATA = Path("tests/data/measured_trials.json")
BEFORE_CHECKS = ("xl-4gpu/", "large-2gpu-search/", "large-layouts/", "s2-", "s3-")
"""Sources measured before the worker kept Megatron-LM's NaN/Inf checks (commit e5fc1ef,
2026-11-23): sessions 1-3."""

H_BF16_1RANK = 5.67e-3
"""Session 10's one-GPU lane on the same machine kind, gpt2-xl mbs 8 te, host-bound (NVML
utilization 0.70): seconds per layer and micro-batch."""


def _rows(trials: list[step_terms.Measured]) -> list[dict[str, Any]]:
    out = []
    for t in trials:
        s = t.layout
        out.append(step_terms.row(t) | {"gpus": t.cluster.num_gpus, "pp": s.pp, "tp": s.tp,
                                         "dp_sync": s.dp * s.cp > 1 and s.overlap_grad_reduce})
    return out


def _show(title: str, rows: list[dict[str, Any]]) -> None:
    errors = [r["error"] * 100 for r in rows]
    if errors:
        print(f"| {title} | {len(errors)} | {statistics.median(errors):+.1f} | "
              f"{min(errors):+.1f} .. {max(errors):+.1f} |")


def groups(extra: list[step_terms.Measured]) -> None:
    rows = _rows(list(step_terms.data_trials(DATA, 1)) + extra)
    pp1 = [r for r in rows if r["pp"] == 1]

    def host_bound(r: dict[str, Any]) -> bool:
        return r["measured_ms_per_layer_mb"] > 1.5 * r["gpu_ms_per_layer_mb"]

    def before(r: dict[str, Any]) -> bool:
        return r["source"].startswith(BEFORE_CHECKS)

    print("| pp 1 trials | n | median err % | range |\n|---|---|---|---|")
    for gpus in (1, 2, 4):
        _show(f"{gpus} GPU(s), host-bound", [r for r in pp1 if r["gpus"] == gpus and host_bound(r)])
        _show(f"{gpus} GPU(s), GPU-bound",
              [r for r in pp1 if r["gpus"] == gpus and not host_bound(r)])
    multi = [r for r in pp1 if r["gpus"] > 1 and host_bound(r)]
    _show("multi-GPU host-bound, sessions 1-3, tp 1",
          [r for r in multi if before(r) and r["tp"] == 1])
    _show("multi-GPU host-bound, sessions 1-3, tp 2", [r for r in multi if before(r) and r["tp"] > 1])
    _show("multi-GPU host-bound, later, overlapped grad sync over dp x cp",
          [r for r in multi if not before(r) and r["dp_sync"]])
    _show("multi-GPU host-bound, later, otherwise",
          [r for r in multi if not before(r) and not r["dp_sync"]])


def _host_floor(t: step_terms.Measured) -> float:
    """A one-rank host time per layer and micro-batch: the bf16 TE lane's, FP8's shipped floors
    (autotune.levers.fp8), CP's ring (CostParams.cp_ring_step_host_s x cp)."""
    s = t.layout
    if str(s.fp8) == "off":
        h = H_BF16_1RANK
    else:
        h = 8.38e-3 if str(s.fp8_recipe) == "delayed" else 8.81e-3
    return max(h, s.cp * 3.6e-3) if s.cp > 1 else h


def _floored(t: step_terms.Measured, factor: float) -> float:
    c = estimate_cost(t.model, t.layout, t.cluster)
    n = t.layout.num_microbatches * t.model.num_layers
    return max(c.step_time_s, n * factor * _host_floor(t) + c.optimizer_s + c.overhead_s
               + c.dp_comm_s)


def what_if(fit: list[step_terms.Measured], held: list[step_terms.Measured]) -> None:
    best = min(range(100, 250), key=lambda f: sum(
        math.log(t.step_s / _floored(t, f / 100)) ** 2 for t in fit))
    factor = best / 100
    print(f"\nfactor fitted to the first study: {factor}")
    for name, trials in (("fitted", fit), ("held out", held)):
        errors = [t.step_s / _floored(t, factor) - 1 for t in trials]
        print(f"{name}: " + " ".join(f"{e * 100:+.0f}" for e in errors)
              + f"  median |err| {statistics.median(abs(e) for e in errors) * 100:.1f}%")


def main() -> None:
    s26, s10 = (list(step_terms.study_trials(Path(p))) for p in sys.argv[1:3])
    groups(s26 + s10)
    what_if(s26, s10)


if __name__ == "__main__":
    main()
