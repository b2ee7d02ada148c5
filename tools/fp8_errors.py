"""Every measured FP8 trial's predicted against measured step time, what the misses go with, and
how far any model could come (issue 26).

    PYTHONPATH=. python tools/fp8_errors.py [--data FILE]

For each OK trial of tests/data/measured_trials.json that runs FP8 it prints the cost model's
step time with the shipped constants, its error, and its error held out: the constants the FP8
trials fit (autotune.levers.fp8.MEASURED_FIT) fitted to the other families' FP8 trials, every
other constant as shipped (autotune.predict.calibration.held_out_step_errors). Beside them, what
a miss may go with: the recipe, the micro-batch, the GEMM size x (autotune.specs.flops.gemm_size),
the GPU's share of the step (the prediction without TE's host floor, over the measured time:
below 1, the model holds the step host-bound) and the measured milliseconds per layer and
micro-batch. Then the signed errors' medians by each of those, and the layouts measured more
than once: the spread between their runs is a floor under any model's worst error (no one
prediction comes closer to both of two runs t1 < t2 than (t2 - t1) / (t2 + t1)).

Last, the sequence-parallel host term (autotune.levers.fp8.Constants.fp8_sp_gather_host_s),
which only tensorwise and blockwise trials with sequence parallelism fit, all of one family so
far: the leave-one-family-out column gives them the shipped value (in sample). Its held-out
figure is by recipe instead: the constant fitted to the other recipe's trials alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.levers.fp8 import MEASURED_FIT, Fp8, Fp8Recipe
from autotune.predict.calibration import (
    Trial,
    fit_cost_params,
    held_out_step_errors,
    load_trials,
)
from autotune.predict.cost import CostParams, estimate_cost
from autotune.specs.flops import gemm_size

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "measured_trials.json"


def _rows(data: Path) -> list[dict[str, Any]]:
    raw = [t for t in json.loads(data.read_text())["trials"] if t["status"] == "OK"]
    trials = load_trials(data)  # the OK trials, in the file's order
    keep = [i for i, t in enumerate(trials) if t[2].fp8 != Fp8.OFF]
    fp8 = [trials[i] for i in keep]
    held = held_out_step_errors(fp8, MEASURED_FIT)
    shipped = CostParams()
    no_floor = replace(shipped, **{n: 0.0 for n in MEASURED_FIT})
    rows = []
    for i, (family, m, s, c, step, _), out in zip(keep, fp8, held, strict=True):
        predicted = estimate_cost(m, s, c, shipped).step_time_s
        rows.append(
            {
                "source": raw[i]["source"],
                "family": family,
                "recipe": str(s.fp8_recipe),
                "mbs": s.mbs,
                "x": gemm_size(m, s),
                "hidden": m.hidden_size,
                "day": raw[i]["source"].split("-", 1)[0],
                "gpu_share": estimate_cost(m, s, c, no_floor).step_time_s / step,
                "ms_per_layer": step / (s.num_microbatches * m.num_layers) * 1e3,
                "measured": step,
                "predicted": predicted,
                "error": predicted / step - 1,
                "held_out": out,
                "key": (family, repr(s)),
            }
        )
    return rows


def _summary(errors: list[float]) -> str:
    a = [abs(e) for e in errors]
    return f"median {statistics.median(a):.1%}, worst {max(a):.1%}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args(argv)
    rows = _rows(args.data)
    print(
        "| trial | family | recipe | mbs | x | GPU share | ms per layer·mb | measured s | "
        "predicted s | error | held out |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['source']} | {r['family']} | {r['recipe']} | {r['mbs']} | {r['x']:.0f} | "
            f"{r['gpu_share']:.2f} | {r['ms_per_layer']:.2f} | {r['measured']:.3f} | "
            f"{r['predicted']:.3f} | {r['error']:+.1%} | {r['held_out']:+.1%} |"
        )
    print(
        f"\n{len(rows)} FP8 trials. Shipped constants: {_summary([r['error'] for r in rows])}"
        f"; held out (leave-one-family-out, {', '.join(MEASURED_FIT)}): "
        f"{_summary([r['held_out'] for r in rows])}."
    )
    print("\n| by | value | trials | median signed error | median held out |")
    print("|---|---|---|---|---|")
    for by in ("recipe", "family", "mbs", "day"):
        groups: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            groups[r[by]].append(r)
        for value, group in sorted(groups.items(), key=lambda kv: str(kv[0])):
            print(
                f"| {by} | {value} | {len(group)} | "
                f"{statistics.median(r['error'] for r in group):+.1%} | "
                f"{statistics.median(r['held_out'] for r in group):+.1%} |"
            )
    print("\n| layout measured more than once | runs: step s | spread | best any model can do |")
    print("|---|---|---|---|")
    floor = 0.0
    repeats: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        repeats[r["key"]].append(r)
    for group in repeats.values():
        if len(group) < 2:
            continue
        times = sorted(r["measured"] for r in group)
        best = (times[-1] - times[0]) / (times[-1] + times[0])
        floor = max(floor, best)
        runs = ", ".join(f"{r['source']}: {r['measured']:.3f}" for r in group)
        print(
            f"| {group[0]['family']} {group[0]['recipe']} mbs {group[0]['mbs']} | {runs} | "
            f"{times[-1] / times[0] - 1:.1%} | ±{best:.1%} |"
        )
    print(
        f"\nNo model predicts every FP8 trial within {floor:.1%}: the widest pair of runs of "
        "one layout."
    )
    _sp_term(args.data)
    return 0


SP_TERM = "fp8_sp_gather_host_s"


def _sp_term(data: Path) -> None:
    """The sequence-parallel host term's trials: their error without the term, with it as
    shipped, and with it fitted to the other recipe's trials only (held out by recipe)."""
    sp = [
        t
        for t in load_trials(data)
        if t[2].fp8 != Fp8.OFF
        and t[2].sequence_parallel
        and t[2].tp > 1
        and t[2].fp8_recipe in (Fp8Recipe.TENSORWISE, Fp8Recipe.BLOCKWISE)
    ]
    if not sp:
        return

    def fit(ts: list[Trial]) -> float:
        samples = [(m, s, c, step) for _, m, s, c, step, _ in ts]
        return float(getattr(fit_cost_params(samples, names=(SP_TERM,)), SP_TERM))

    shipped = CostParams()
    without = replace(shipped, **{SP_TERM: 0.0})
    print(
        f"\n{SP_TERM}: shipped {getattr(shipped, SP_TERM) * 1e3:.3f} ms, fitted to these "
        f"{len(sp)} trials {fit(sp) * 1e3:.3f} ms\n"
    )
    print(
        "| family | tp | recipe | measured s | without the term | shipped | held out by recipe |"
    )
    print("|---|---|---|---|---|---|---|")
    for family, m, s, c, step, _ in sp:
        others = [u for u in sp if u[2].fp8_recipe != s.fp8_recipe]
        held = "-"
        if others:
            refit = replace(shipped, **{SP_TERM: fit(others)})
            held = f"{estimate_cost(m, s, c, refit).step_time_s / step - 1:+.1%}"
        before = estimate_cost(m, s, c, without).step_time_s / step - 1
        after = estimate_cost(m, s, c, shipped).step_time_s / step - 1
        print(
            f"| {family} | {s.tp} + sp | {s.fp8_recipe} | {step:.3f} | {before:+.1%} | "
            f"{after:+.1%} | {held} |"
        )


if __name__ == "__main__":
    sys.exit(main())
