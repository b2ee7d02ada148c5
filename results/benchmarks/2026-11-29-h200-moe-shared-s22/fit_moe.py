"""Fit CostParams.expert_launch_s to session 22's MoE trials (this folder's JSON, from summary.txt
by 2026-11-28-cpu-measured-s16-trials-s17/convert.py): PYTHONPATH=. python THIS_FILE."""
import json, sys, statistics
from dataclasses import replace
from autotune.layouts.layout import Layout
from autotune.predict.calibration import fit_cost_params
from autotune.predict.cost import CostParams, estimate_cost
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.presets import load_model
rows=[]
for s in ("qwen1.5-moe-6l","qwen1.5-moe-6l-noshared","moe-default"):
    rows += json.load(open(f"results/benchmarks/2026-11-29-h200-moe-shared-s22/{s}.json"))
samples=[]
for t in rows:
    lay=Layout(**t["strategy"]); m=load_model(t["model"]).with_overrides(global_batch_size=lay.gbs, seq_length=t["seq_length"])
    m=replace(m, rope_fusion=True)
    c=ClusterSpec(num_gpus=1,gpus_per_node=1,gpu=gpu_spec("h200"))
    samples.append((m,lay,c,t["step_time_s"]))
def errs(p):
    return [estimate_cost(m,l,c,p).step_time_s/meas-1 for m,l,c,meas in samples]
base=CostParams(expert_launch_s=3e-4)
NONE=CostParams(expert_launch_s=0.0)  # before: no MoE host term
fit=fit_cost_params(samples, names=["expert_launch_s"], start=base)
print("fitted expert_launch_s", fit.expert_launch_s)
bf=[x for x in samples if x[1].fp8=="off"]
fitb=fit_cost_params(bf, names=["expert_launch_s"], start=base)
print("fitted on bf16 only", fitb.expert_launch_s)
for (m,l,c,meas),e0,e1 in zip(samples, errs(NONE), errs(fit)):
    print(f"{m.name:26s} {l.describe():55s} {meas:.3f}  before {e0*100:+6.1f}%  after {e1*100:+6.1f}%")
for name,p in (("before",NONE),("after",fit),("bf16fit",fitb)):
    e=[abs(x) for x in errs(p)]; print(name, "median", round(statistics.median(e)*100,1), "worst", round(max(e)*100,1))
