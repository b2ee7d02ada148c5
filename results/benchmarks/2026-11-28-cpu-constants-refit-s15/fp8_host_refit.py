# ruff: noqa
"""The FP8 host floors refitted to every OK FP8 trial of tests/data/measured_trials.json with every
other constant at its shipped value (as their docstrings in autotune.levers.fp8 were fitted), after
the shared bf16 constants moved (results/benchmarks/2026-11-28-cpu-constants-refit-s15.md).
From the repository root: PYTHONPATH=. python results/benchmarks/2026-11-28-cpu-constants-refit-s15/fp8_host_refit.py"""
import statistics
from autotune.predict.calibration import fit_cost_params, load_trials
from autotune.predict.cost import CostParams, estimate_cost

NAMES = ("fp8_layer_host_s", "fp8_current_layer_host_s", "fp8_sp_gather_host_s")
from autotune.levers.fp8 import Fp8
fp8 = [t for t in load_trials("tests/data/measured_trials.json") if t[2].fp8 != Fp8.OFF]
print(len(fp8), "FP8 trials")
fitted = fit_cost_params([(m, s, c, t) for _, m, s, c, t, _ in fp8], names=NAMES, start=CostParams())
for n in NAMES:
    print(f"  {n}: shipped {getattr(CostParams(), n):.6g} -> fitted {getattr(fitted, n):.6g}")
for label, p in (("shipped", CostParams()), ("fitted", fitted)):
    e = [abs(estimate_cost(m, s, c, p).step_time_s / t - 1) for _, m, s, c, t, _ in fp8]
    print(f"{label}: median {statistics.median(e):.1%} worst {max(e):.1%}")
