"""Fit the MoE host terms (CostParams.moe_layer_launch_s, expert_launch_s) to session 22's 20 MoE
trials on one H200: PYTHONPATH=. python THIS_FILE [FOLDER] (FOLDER holds the trials' JSON)."""
import json, statistics, sys
from dataclasses import replace
from pathlib import Path
from autotune.layouts.layout import Layout
from autotune.predict.calibration import fit_cost_params
from autotune.predict.cost import CostParams, estimate_cost
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.presets import load_model

folder = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
rows = []
for f in sorted(folder.glob("*.json")):
    rows += json.loads(f.read_text())
samples = []
for t in rows:
    lay = Layout(**t["strategy"])
    m = load_model(t["model"]).with_overrides(global_batch_size=lay.gbs, seq_length=t["seq_length"])
    m = replace(m, rope_fusion=True)
    c = ClusterSpec(num_gpus=1, gpus_per_node=1, gpu=gpu_spec("h200"))
    samples.append((m, lay, c, t["step_time_s"]))

def errs(p):
    return [estimate_cost(m, l, c, p).step_time_s / meas - 1 for m, l, c, meas in samples]

NONE = CostParams(moe_layer_launch_s=0.0, expert_launch_s=0.0)
start = CostParams(moe_layer_launch_s=0.01, expert_launch_s=1e-4)
fits = {
    "none": NONE,
    "per expert alone": fit_cost_params(samples, names=["expert_launch_s"],
                                        start=replace(NONE, expert_launch_s=3e-4)),
    "per layer alone": fit_cost_params(samples, names=["moe_layer_launch_s"],
                                       start=replace(NONE, moe_layer_launch_s=0.01)),
    "both": fit_cost_params(samples, names=["moe_layer_launch_s", "expert_launch_s"], start=start),
}
for name, p in fits.items():
    e = [abs(x) for x in errs(p)]
    print(f"{name:18s} moe_layer_launch_s {p.moe_layer_launch_s*1e3:7.3f} ms  expert_launch_s "
          f"{p.expert_launch_s*1e3:6.3f} ms  median {statistics.median(e)*100:5.1f}%  worst {max(e)*100:5.1f}%")
print()
both = fits["both"]
for (m, l, c, meas), e0, e1 in zip(samples, errs(NONE), errs(both)):
    print(f"{m.name:26s} {l.describe():58s} {meas:.3f}  none {e0*100:+6.1f}%  both {e1*100:+6.1f}%")

print()
# Held out by call: fitted to one device call's trials, predicting the other's.
calls = {"call 2 (qwen1.5-moe-6l, -noshared)": lambda m: m.name.startswith("qwen"),
         "call 3 (moe-e8/24/64-6l)": lambda m: m.name.startswith("moe-e")}
for name, inside in calls.items():
    fit_on = [x for x in samples if inside(x[0])]
    held = [x for x in samples if not inside(x[0])]
    p = fit_cost_params(fit_on, names=["moe_layer_launch_s", "expert_launch_s"], start=start)
    e = [abs(estimate_cost(m, l, c, p).step_time_s / meas - 1) for m, l, c, meas in held]
    print(f"fitted to {name}: {p.moe_layer_launch_s*1e3:.2f} ms + {p.expert_launch_s*1e3:.3f} ms/expert;"
          f" the other call median {statistics.median(e)*100:.1f}%, worst {max(e)*100:.1f}%")
