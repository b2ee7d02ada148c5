# ruff: noqa
"""tools/fit_constants.py's leave-one-family-out fit with some COST_FIT_FIELDS held at a value
(removed from every fold's fit). From the repository root:
    PYTHONPATH=. python results/benchmarks/2026-11-28-cpu-constants-refit-s15/cv_hold.py NAME=VALUE,..."""
import sys
from dataclasses import replace
import autotune.predict.calibration as cal
from autotune.predict.cost import CostParams

hold = {k: float(v) for k, v in (kv.split("=") for kv in sys.argv[1].split(",") if kv)}
cal.COST_FIT_FIELDS = tuple(n for n in cal.COST_FIT_FIELDS if n not in hold)
start = replace(CostParams(), **hold)
trials = cal.load_trials("tests/data/measured_trials.json")
cv = cal.cross_validate(trials, start_cost=start)
print("| family | trials | held-out step time: median / worst | in-sample | shipped |")
print("|---|---|---|---|---|")
for f in cv.families:
    print(f"| {f.family} | {f.trials} | {f.step_median:.1%} / {f.step_worst:.1%} | {f.step_in_sample:.1%} | {f.step_shipped:.1%} |")
print("held:", hold)
names = cal.fit_fields(cal.COST_FIT_FIELDS, start, [t[2] for t in trials])
for n in names:
    print(f"  CostParams.{n} = {getattr(cv.cost, n):.6g}")
