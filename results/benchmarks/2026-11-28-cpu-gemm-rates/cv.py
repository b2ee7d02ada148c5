# ruff: noqa
"""Leave-one-family-out step-time cross-validation (tools/fit_constants.py's, step time only) with
constants held or added, on the measured GEMM rates or on the old single efficiency
(results/benchmarks/2026-11-28-cpu-gemm-rates.md). From the repository root:

    PYTHONPATH=. python results/benchmarks/2026-11-28-cpu-gemm-rates/cv.py NAME [--old] \
        [--also F,...] [--hold F=V,...] [--start F=V,...]

--old-bf16: as --old for bf16, FP8's speed-up still measured; --old: the layers' GEMMs at CostParams.gemm_efficiency_max's saturating efficiency on every GPU
(the form before autotune.specs.gemm_rates); --also: CostParams fields fitted besides
COST_FIT_FIELDS and the levers'; --hold: fields held at a value (removed from the fit; gemm_rate_scale=1 held
turns the measured rates on at the sweep's rate); --start gemm_rate_scale=1 turns them on with
the scale fitted;
--start: fields' start values. Writes NAME.txt (table) and NAME.json (per-trial held-out
signed errors) beside this file."""

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import autotune.predict.calibration as cal
import autotune.specs.gemm_rates as gr
from autotune.predict.cost import CostParams, estimate_cost

HERE = Path(__file__).resolve().parent
DATA = Path("tests/data/measured_trials.json")

ap = argparse.ArgumentParser()
ap.add_argument("name")
ap.add_argument("--old", action="store_true")
ap.add_argument("--old-bf16", action="store_true")
ap.add_argument("--also", default="")
ap.add_argument("--hold", default="")
ap.add_argument("--start", default="")
a = ap.parse_args()


def pairs(text: str) -> dict[str, float]:
    return {k: float(v) for k, v in (kv.split("=") for kv in text.split(",") if kv)}


if a.old:
    gr.GEMM_RATES.clear()
    gr.mean_rate.cache_clear()
if a.old_bf16:
    # bf16 GEMMs at the one saturating efficiency on every GPU; FP8's speed-up still the
    # measured ratio where swept (autotune.levers.fp8.layer_gemm_speedup)
    import autotune.predict.cost as cost_module
    from autotune.specs.flops import gemm_efficiency, gemm_size

    def old_rates(model, s, gpu, prm):
        rate = gpu.peak_bf16_flops * gemm_efficiency(gemm_size(model, s), prm)
        return rate, rate, rate

    cost_module._gemm_rates = old_rates
hold = pairs(a.hold)
start = replace(CostParams(), **hold, **pairs(a.start))
also = tuple(n for n in a.also.split(",") if n)
trials = cal.load_trials(DATA)
sources = [t["source"] for t in json.loads(DATA.read_text())["trials"] if t["status"] == "OK"]
assert len(sources) == len(trials)


def names(ts):
    return tuple(n for n in (*cal.COST_FIT_FIELDS, *cal.gemm_rate_fields(start), *also,
                             *cal.lever_fit_fields([s for _, _, s, *_ in ts])) if n not in hold)


def fit(ts):
    return cal.fit_cost_params([(m, s, c, t) for _, m, s, c, t, _ in ts], names=names(ts),
                               start=start)


def err(p, m, s, c, t):
    return estimate_cost(m, s, c, p).step_time_s / t - 1


all_p = fit(trials)
rows, per_trial = [], {}
for fam in sorted({t[0] for t in trials}):
    idx = [i for i, t in enumerate(trials) if t[0] == fam]
    p = fit([t for t in trials if t[0] != fam])
    e = [err(p, *trials[i][1:5]) for i in idx]
    e_in = [err(all_p, *trials[i][1:5]) for i in idx]
    for i, x, y in zip(idx, e, e_in):
        per_trial[sources[i]] = {"family": fam, "held_out": x, "in_sample": y,
                                 "measured_s": trials[i][4]}
    rows.append((fam, len(idx), statistics.median(map(abs, e)), max(map(abs, e)),
                 statistics.median(map(abs, e_in))))
out = [f"# {a.name}: {' '.join(sys.argv[1:])}",
       "| family | trials | held-out step: median / worst | in-sample |", "|---|---|---|---|"]
out += [f"| {f} | {n} | {med:.1%} / {worst:.1%} | {ins:.1%} |" for f, n, med, worst, ins in rows]
fitted = {n: round(getattr(all_p, n), 5) for n in names(trials)}
out.append(f"fitted to all: {fitted}")
text = "\n".join(out)
print(text)
(HERE / f"{a.name}.txt").write_text(text + "\n")
(HERE / f"{a.name}.json").write_text(json.dumps(
    {"args": sys.argv[1:], "families": rows, "fitted": fitted, "trials": per_trial},
    indent=1) + "\n")
