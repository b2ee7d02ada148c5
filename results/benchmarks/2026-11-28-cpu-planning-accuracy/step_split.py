# ruff: noqa
"""Analysis script of results/benchmarks/2026-11-28-cpu-planning-accuracy.md (run from the repository root with PYTHONPATH=.)."""
import json,sys, numpy as np
from dataclasses import replace
from collections import defaultdict
from autotune.predict.calibration import load_trials
from autotune.predict.cost import estimate_cost, CostParams
from autotune.specs.activations import dropout_rate
P='tests/data/measured_trials.json'
raw=[t for t in json.load(open(P))['trials'] if t['status']=='OK']
trials=load_trials(P)
cp=CostParams()
rows=defaultdict(list)
for r,(f,m,s,c,st,used) in zip(raw,trials):
    if s.impl=='local': continue
    if str(s.fp8) not in ('none','Fp8.NONE') and s.fp8: 
        pass
    e=estimate_cost(m,s,c,cp)
    e2=estimate_cost(m,s,c,replace(cp,flash_attention_efficiency=1e6))
    att=e.step_time_s-e2.step_time_s
    rows[f].append((e2.step_time_s,att,st,str(s.fp8)))
for f,v in sorted(rows.items()):
    v=[x for x in v if x[3] in ('off','Fp8.OFF')]
    if not v: continue
    A=np.array([[x[0],x[1]] for x in v]); y=np.array([x[2] for x in v])
    attsh=A[:,1]/(A.sum(1))
    if len(v)>=3 and attsh.max()-attsh.min()>0.1:
        sol=np.linalg.lstsq(A/y[:,None],np.ones(len(y)),rcond=None)[0]
        print(f"{f:22s} n={len(v):3d} att {attsh.min():.0%}-{attsh.max():.0%} a(rest)={sol[0]:.2f} b(att)={sol[1]:.2f}")
    else:
        print(f"{f:22s} n={len(v):3d} att {attsh.min():.0%}-{attsh.max():.0%} overall meas/pred={np.median(y/A.sum(1)):.2f}")
