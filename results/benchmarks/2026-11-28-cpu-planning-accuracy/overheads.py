# ruff: noqa
"""Analysis script of results/benchmarks/2026-11-28-cpu-planning-accuracy.md (run from the repository root with PYTHONPATH=.)."""
import json, statistics
from collections import defaultdict
from autotune.predict.calibration import load_trials
from autotune.predict.memory import estimate_memory, MemoryParams, _nccl_groups
P='tests/data/measured_trials.json'
raw=[t for t in json.load(open(P))['trials'] if t['status']=='OK']
trials=load_trials(P)
G=2**30
mp=MemoryParams()
rows=defaultdict(list)
for r,(f,m,s,c,st,used) in zip(raw,trials):
    e=estimate_memory(m,s,c,mp)
    pk=[x for x in e.stages if x.stage==e.peak_stage][0]
    alloc_pred=pk.total_bytes-pk.overhead_bytes
    pa=r.get('peak_allocated_bytes')
    rows[f].append((used/G, e.peak_bytes/G, alloc_pred/G, (pa or 0)/G, pk.overhead_bytes/G, _nccl_groups(s,m), c.num_gpus))
for f,v in sorted(rows.items()):
    ov_meas=[u-pa for u,p,ap,pa,o,g,n in v if pa]
    ov_pred=[o for u,p,ap,pa,o,g,n in v if pa]
    err=[p/u-1 for u,p,ap,pa,o,g,n in v]
    aerr=[ap/pa-1 for u,p,ap,pa,o,g,n in v if pa]
    print(f"{f:22s} n={len(v):3d} used {statistics.median([x[0] for x in v]):6.1f} err med {statistics.median(err):+.1%} alloc err med {statistics.median(aerr) if aerr else float('nan'):+.1%}  overhead meas med {statistics.median(ov_meas) if ov_meas else float('nan'):5.2f} pred med {statistics.median(ov_pred) if ov_pred else float('nan'):5.2f} groups {sorted(set(x[5] for x in v))} gpus {sorted(set(x[6] for x in v))}")
import numpy as np
X=[];y=[];lab=[]
for r,(f,m,s,c,st,used) in zip(raw,trials):
    pa=r.get('peak_allocated_bytes')
    if not pa: continue
    e=estimate_memory(m,s,c,mp)
    pk=[x for x in e.stages if x.stage==e.peak_stage][0]
    X.append([1,_nccl_groups(s,m),pa/G, pk.largest_block_bytes/G, c.gpu.name=='h200']); y.append((used-pa)/G); lab.append(f)
X=np.array(X,float);y=np.array(y)
for cols,name in [([0,1],'const+groups'),([0,1,2],'+alloc'),([0,1,3],'+block'),([0,1,2,3],'+alloc+block'),([0,1,4],'+h200')]:
    sol,res,*_=np.linalg.lstsq(X[:,cols],y,rcond=None)
    r=y-X[:,cols]@sol
    print(name, np.round(sol,3), 'rms',round(float(np.sqrt((r**2).mean())),3))
