# ruff: noqa
"""Analysis script of results/benchmarks/2026-11-28-cpu-planning-accuracy.md (run from the repository root with PYTHONPATH=.)."""
import sys, json
import autotune.predict.calibration as cal
from autotune.predict.cost import CostParams
from dataclasses import replace
extra=sys.argv[1].split(',') if len(sys.argv)>1 and sys.argv[1] else []
start=eval(sys.argv[2]) if len(sys.argv)>2 else {}
cal.COST_FIT_FIELDS=(*cal.COST_FIT_FIELDS,*extra)
trials=cal.load_trials('tests/data/measured_trials.json')
cv=cal.cross_validate(trials, start_cost=replace(CostParams(),**start))
for f in cv.families:
    print(f"| {f.family} | {f.trials} | {f.step_median:.1%} / {f.step_worst:.1%} | {f.step_in_sample:.1%} | {f.step_shipped:.1%} |")
print({n: round(getattr(cv.cost,n),5) for n in cal.COST_FIT_FIELDS})
