"""FP8's host floor against a machine's bf16 host time (issue 26; report:
../2026-11-28-cpu-fp8-host-floor-s19.md). Run from the repository root:

    PYTHONPATH=. python results/benchmarks/2026-11-28-cpu-fp8-host-floor-s19/host_floor.py

1. The shipped model's step-time error on every OK trial of tests/data/measured_trials.json,
   |predicted / measured - 1| median and worst, by GPU and precision.
2. A search's refit simulated per machine: the trials of one session on one GPU kind and count
   (one machine and day) split into bf16 and FP8; the cost constants refitted to the bf16 trials
   as autotune.search.refit.refit_cost_params does (REFIT_FIELDS through fit_fields, from the
   shipped CostParams), then the same machine's FP8 trials predicted with them, against the
   shipped constants.
"""
import json
import re
import statistics as st
from collections import defaultdict
from dataclasses import replace

from autotune.predict.calibration import fit_cost_params, fit_fields, load_trials
from autotune.predict.cost import CostParams, estimate_cost
from autotune.search.refit import REFIT_FIELDS

PATH = "tests/data/measured_trials.json"
raw = [t for t in json.load(open(PATH))["trials"] if t["status"] == "OK"]
trials = load_trials(PATH)
assert len(raw) == len(trials)


def machine(t):
    m = re.match(r"(s\d+)-", t["source"])
    return f"{m.group(1) if m else 'early'}/{t['gpu']}x{t['gpus']}"


def fp8(layout):
    return layout.fp8 != "off"


def err(p, m, s, c, step):
    return estimate_cost(m, s, c, p).step_time_s / step - 1


def te_host(p):
    """The model's bf16 host time of one TE layer and micro-batch (launches + TE's modules)."""
    return p.layer_launch_s + p.te_layer_launch_s


def relative(p, base):
    """`p` with FP8's host floors (and the SP gathers' host term) scaled by the machine's bf16
    TE host time against `base`'s: the floor as a fixed multiple of that host time."""
    k = te_host(p) / te_host(base)
    return replace(p, fp8_layer_host_s=base.fp8_layer_host_s * k,
                   fp8_current_layer_host_s=base.fp8_current_layer_host_s * k,
                   fp8_sp_gather_host_s=base.fp8_sp_gather_host_s * k)


def stats(errs):
    a = [abs(e) for e in errs]
    return f"{st.median(a):.1%} / {max(a):.1%}" if a else "-"


shipped = CostParams()
by = defaultdict(list)
for r, (_, m, s, c, step, _) in zip(raw, trials, strict=True):
    e = err(shipped, m, s, c, step)
    prec = "fp8" if fp8(s) else "bf16"
    by[(r["gpu"], prec)].append(e)
    by[("all", prec)].append(e)
    by[("all", "all")].append(e)
print("## 1. Shipped model, step time |error| median / worst\n")
print("| GPU | precision | trials | median / worst |")
print("|---|---|---|---|")
for k in sorted(by):
    print(f"| {k[0]} | {k[1]} | {len(by[k])} | {stats(by[k])} |")

print("\n## 2. Refit to each machine's bf16 trials, its FP8 trials predicted\n")
groups = defaultdict(list)
for r, t in zip(raw, trials, strict=True):
    groups[machine(r)].append((r, t))
print("| machine | bf16 trials (te) | refit layer_launch_s ms | gemm_eff_max | "
      "bf16 shipped | bf16 refit | FP8 trials | FP8 shipped median / worst (signed median) | "
      "FP8 after refit median / worst (signed median) | FP8 after refit, floor relative: median / worst (signed median) |")
print("|---|---|---|---|---|---|---|---|---|---|")
allship, allrefit, allrel = [], [], []
gpu_errs = defaultdict(lambda: ([], [], []))
for g in sorted(groups):
    rows = groups[g]
    bf = [(m, s, c, step) for _, (_, m, s, c, step, _) in rows if not fp8(s)]
    f8 = [(m, s, c, step) for _, (_, m, s, c, step, _) in rows if fp8(s)]
    if not f8 or not bf:
        continue
    names = fit_fields(REFIT_FIELDS, shipped, [s for _, s, _, _ in bf])
    p = fit_cost_params(bf, names=names, start=shipped)
    te = sum(1 for _, s, _, _ in bf if s.impl == "te")
    e0 = [err(shipped, *x) for x in f8]
    e1 = [err(p, *x) for x in f8]
    e2 = [err(relative(p, shipped), *x) for x in f8]
    allship += e0
    allrefit += e1
    allrel += e2
    for acc, e in zip(gpu_errs[g.split("/")[1].split("x")[0]], (e0, e1, e2)):
        acc += e
    print(f"| {g} | {len(bf)} ({te}) | {p.layer_launch_s*1e3:.2f} | {p.gemm_efficiency_max:.3f} | "
          f"{stats([err(shipped, *x) for x in bf])} | {stats([err(p, *x) for x in bf])} | {len(f8)} | "
          f"{stats(e0)} ({st.median(e0):+.1%}) | {stats(e1)} ({st.median(e1):+.1%}) | {stats(e2)} ({st.median(e2):+.1%}) |")
print(f"| all | | | | | | {len(allship)} | {stats(allship)} | {stats(allrefit)} | {stats(allrel)} |")
print("\nBy GPU (the FP8 trials of the machines above; bf16 predictions are the same either way:"
      " the floor prices FP8 only):\n")
print("| GPU | FP8 trials | shipped | refit, floor absolute (as shipped) | refit, floor relative |")
print("|---|---|---|---|---|")
for gpu, (e0, e1, e2) in sorted(gpu_errs.items()):
    print(f"| {gpu} | {len(e0)} | {stats(e0)} | {stats(e1)} | {stats(e2)} |")

print("\n## 3. Other measures of the machine's host speed, from its bf16 TE trials only\n")
print("(b) refit layer_launch_s alone to the machine's bf16 TE trials, every other constant "
      "shipped, FP8 floors relative; (c) FP8 floors scaled by the machine's bf16 TE trials' "
      "median measured / predicted (shipped model); (d) the FP8 floors fitted to the machine's "
      "own FP8 trials (after the refit of section 2) over its refit bf16 TE host time: the "
      "ratio a relative floor would need to be constant.\n")
print("| machine | bf16 TE trials | (b) layer_launch_s ms | (b) FP8 median / worst (signed) | "
      "(c) scale | (c) FP8 median / worst (signed) | (d) delayed floor ms | (d) current floor ms | "
      "(d) ratio delayed / current |")
print("|---|---|---|---|---|---|---|---|---|")
allb, allc = [], []
for g in sorted(groups):
    rows = groups[g]
    te = [(m, s, c, step) for _, (_, m, s, c, step, _) in rows if not fp8(s) and s.impl == "te"]
    f8 = [(m, s, c, step) for _, (_, m, s, c, step, _) in rows if fp8(s)]
    if not f8 or not te:
        continue
    pb = relative(fit_cost_params(te, names=("layer_launch_s",), start=shipped), shipped)
    eb = [err(pb, *x) for x in f8]
    scale = st.median(step / estimate_cost(m, s, c, shipped).step_time_s for m, s, c, step in te)
    pc = replace(shipped, fp8_layer_host_s=shipped.fp8_layer_host_s * scale,
                 fp8_current_layer_host_s=shipped.fp8_current_layer_host_s * scale,
                 fp8_sp_gather_host_s=shipped.fp8_sp_gather_host_s * scale)
    ec = [err(pc, *x) for x in f8]
    allb += eb
    allc += ec
    bf = [(m, s, c, step) for _, (_, m, s, c, step, _) in rows if not fp8(s)]
    p = fit_cost_params(bf, names=fit_fields(REFIT_FIELDS, shipped, [s for _, s, _, _ in bf]),
                        start=shipped)
    pd = fit_cost_params(f8, names=("fp8_layer_host_s", "fp8_current_layer_host_s"), start=p)
    print(f"| {g} | {len(te)} | {pb.layer_launch_s*1e3:.2f} | {stats(eb)} ({st.median(eb):+.1%}) | "
          f"{scale:.3f} | {stats(ec)} ({st.median(ec):+.1%}) | {pd.fp8_layer_host_s*1e3:.2f} | "
          f"{pd.fp8_current_layer_host_s*1e3:.2f} | {pd.fp8_layer_host_s/te_host(p):.2f} / "
          f"{pd.fp8_current_layer_host_s/te_host(p):.2f} |")
print(f"| all | | | {stats(allb)} | | {stats(allc)} | | | |")
print(f"\nshipped: te host {te_host(shipped)*1e3:.2f} ms, ratios "
      f"{shipped.fp8_layer_host_s/te_host(shipped):.2f} / "
      f"{shipped.fp8_current_layer_host_s/te_host(shipped):.2f}")
