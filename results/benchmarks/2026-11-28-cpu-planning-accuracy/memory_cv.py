# ruff: noqa
"""Analysis script of results/benchmarks/2026-11-28-cpu-planning-accuracy.md (run from the repository root with PYTHONPATH=.)."""
import sys, statistics
from dataclasses import replace
import autotune.predict.calibration as cal
from autotune.predict.memory import MemoryParams, estimate_memory
names=tuple(sys.argv[1].split(','))
start=eval(sys.argv[2]) if len(sys.argv)>2 else {}
trials=cal.load_trials('tests/data/measured_trials.json')
st=replace(MemoryParams(),**start)
def fit(ts): return cal.fit_memory_params([(m,s,c,u) for _,m,s,c,_,u in ts],names=names,start=st)
allp=fit(trials)
def errs(ts,p): return [estimate_memory(m,s,c,p).peak_bytes/u-1 for _,m,s,c,_,u in ts]
tot=[]
for fam in sorted({t[0] for t in trials}):
    held=[t for t in trials if t[0]==fam]
    p=fit([t for t in trials if t[0]!=fam])
    e=errs(held,p); a=[abs(x) for x in e]; ins=[abs(x) for x in errs(held,allp)]; sh=[abs(x) for x in errs(held,MemoryParams())]
    tot.append(statistics.median(a))
    print(f"| {fam} | {len(held)} | {statistics.median(a):.1%} / {max(a):.1%} | {statistics.median(ins):.1%} | {statistics.median(sh):.1%} | signed med {statistics.median(e):+.1%}")
print('sum of held-out medians', round(sum(tot)*100,1), 'worst median', round(max(tot)*100,1))
print({n: getattr(allp,n) for n in names})
