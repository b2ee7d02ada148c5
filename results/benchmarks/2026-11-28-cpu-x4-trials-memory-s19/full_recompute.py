"""Every OK full-recompute trial: predicted - measured peak allocated (dA, GiB), the predicted rebuild workspace (ws) and logits at the peak stage, device-used error. `PYTHONPATH=. python full_recompute.py` from the repository root."""
import json, sys
from autotune.predict.calibration import load_trials
from autotune.predict.memory import estimate_memory, GIB
from autotune.levers.pipeline_split import chunk_layers
p = "tests/data/measured_trials.json"
raw = [t for t in json.load(open(p))["trials"] if t["status"] == "OK"]
for r, (fam, m, s, c, step, used) in zip(raw, load_trials(p)):
    if str(s.recompute) != "full": continue
    e = estimate_memory(m, s, c); pk = e.peak
    a = r.get("peak_allocated_bytes")
    L = max(chunk_layers(s, m))
    print(f"{r['source']:28s} {r['gpu'][:4]} {s.describe()[:62]:62s} L{L:3d} pp{s.pp} dA {(pk.allocated_bytes-a)/GIB:+5.2f} ws {pk.workspace_bytes/GIB:5.2f} logits {pk.logits_bytes/GIB:5.2f} used {e.peak_bytes/used-1:+.1%}")
