"""Session 18's H200 trials (sources s18-*) against the shipped model: step time and memory,
predicted / measured - 1, one table row each, then the medians and worst (report: ../2026-11-28-h200-near-rule-s18.md).
`PYTHONPATH=. python results/benchmarks/2026-11-28-h200-near-rule-s18/model_errors.py [PREFIX]` from the
repository root; PREFIX (default s18) picks the trials whose source starts with it (s19-x4: session 19's)."""
import json
import sys
from autotune.predict.calibration import load_trials
from autotune.predict.cost import estimate_cost
from autotune.predict.memory import estimate_memory
prefix = sys.argv[1] if len(sys.argv) > 1 else "s18"
p = "tests/data/measured_trials.json"
raw = [t for t in json.load(open(p))["trials"] if t["status"] == "OK"]
trials = load_trials(p)
assert len(raw) == len(trials)
print("| source | layout | measured step s | predicted | err | device used GiB | predicted GiB | err |")
print("|---|---|---|---|---|---|---|---|")
se, me = [], []
for r, (fam, m, s, c, step, used) in zip(raw, trials):
    if not r["source"].startswith(prefix):
        continue
    ps = estimate_cost(m, s, c).step_time_s
    pm = estimate_memory(m, s, c).peak_bytes
    se.append(ps / step - 1); me.append(pm / used - 1)
    print(f"| {r['source']} | {s.describe()} | {step:.3f} | {ps:.3f} | {ps/step-1:+.1%} | {used/2**30:.1f} | {pm/2**30:.1f} | {pm/used-1:+.1%} |")
import statistics as st
print(f"step |err| median {st.median(map(abs,se)):.1%} worst {max(map(abs,se)):.1%}; memory |err| median {st.median(map(abs,me)):.1%} worst {max(map(abs,me)):.1%}; n={len(se)}")
