# ruff: noqa
"""tools/fit_constants.py's cross-validation with more cost constants fitted, and start values
(results/benchmarks/2026-11-28-cpu-attention-dropout.md). Run from the repository root:

    PYTHONPATH=. python results/benchmarks/2026-11-28-cpu-attention-dropout/cv.py EXTRA [START]

EXTRA: comma-separated CostParams fields fitted besides COST_FIT_FIELDS and
ATTENTION_FIT_FIELDS; START: field=value pairs, comma-separated, for the fit's start; a name written =name is held at its value, not
fitted."""

import sys
from dataclasses import replace

from autotune.predict.calibration import (
    ATTENTION_FIT_FIELDS,
    COST_FIT_FIELDS,
    cross_validate,
    load_trials,
)
from autotune.predict.cost import CostParams, estimate_cost

extra = tuple(f for f in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if f)
start = dict(kv.rsplit("=", 1) for kv in (sys.argv[2] if len(sys.argv) > 2 else "").split(",") if kv)
fixed = {k.lstrip("=") for k in start if k.startswith("=")}
start = {k.lstrip("="): v for k, v in start.items()}
trials = load_trials("tests/data/measured_trials.json")
cv = cross_validate(trials, start_cost=replace(CostParams(), **{k: float(v) for k, v in
                                                               start.items()}),
                    extra_cost=tuple(n for n in (*ATTENTION_FIT_FIELDS, *extra)
                                     if n not in fixed))
print("| family | trials | held-out step: median / worst | in-sample | shipped |")
for f in cv.families:
    print(f"| {f.family} | {f.trials} | {f.step_median:.1%} / {f.step_worst:.1%} | "
          f"{f.step_in_sample:.1%} | {f.step_shipped:.1%} |")
print({n: round(getattr(cv.cost, n), 5) for n in (*COST_FIT_FIELDS, *ATTENTION_FIT_FIELDS,
                                                  *extra)})
pair = [t for t in trials if t[1].name.startswith("llama-1b") and t[2].gbs == 4]
(_, m0, s0, c0, t0, _), (_, m1, s1, c1, t1, _) = sorted(pair, key=lambda t: t[4])
p0 = estimate_cost(m0, s0, c0, cv.cost).step_time_s
p1 = estimate_cost(m1, s1, c1, cv.cost).step_time_s
print(f"dropout pair (fit to all): measured {t0:.3f} -> {t1:.3f} s ({t1 / t0 - 1:+.1%}), "
      f"predicted {p0:.3f} -> {p1:.3f} s ({p1 / p0 - 1:+.1%})")
