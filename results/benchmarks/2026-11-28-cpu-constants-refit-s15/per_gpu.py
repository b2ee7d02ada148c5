# ruff: noqa
"""The shared cost constants fitted to each GPU type's trials alone, against the fit to all
(results/benchmarks/2026-11-28-cpu-constants-refit-s15.md): do the data ask for per-GPU defaults?
From the repository root: PYTHONPATH=. python results/benchmarks/2026-11-28-cpu-constants-refit-s15/per_gpu.py"""
import statistics
from autotune.predict.calibration import COST_FIT_FIELDS, fit_cost_params, fit_fields, load_trials
from autotune.predict.cost import CostParams, estimate_cost

trials = load_trials("tests/data/measured_trials.json")
gpus = sorted({c.gpu.name for _, _, _, c, _, _ in trials})
fits = {}
for gpu in [*gpus, "all"]:
    ts = [t for t in trials if gpu == "all" or t[3].gpu.name == gpu]
    names = fit_fields(COST_FIT_FIELDS, CostParams(), [s for _, _, s, *_ in ts])
    fits[gpu] = fit_cost_params([(m, s, c, t) for _, m, s, c, t, _ in ts], names=names)
    print(gpu, len(ts), {n: round(getattr(fits[gpu], n), 5) for n in COST_FIT_FIELDS})
print("\n| GPU | trials | median error, its own fit | the fit to all | shipped |")
print("|---|---|---|---|---|")
for gpu in gpus:
    ts = [t for t in trials if t[3].gpu.name == gpu]
    row = []
    for p in (fits[gpu], fits["all"], CostParams()):
        row.append(statistics.median(abs(estimate_cost(m, s, c, p).step_time_s / t - 1)
                                     for _, m, s, c, t, _ in ts))
    print(f"| {gpu} | {len(ts)} | " + " | ".join(f"{x:.1%}" for x in row) + " |")
