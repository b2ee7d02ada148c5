"""Pairs of measured trials that differ only in the FP8 recipe (delayed vs tensorwise): the
model counted the same bytes for both until session 19; measured peak allocated, per token and
layer. `PYTHONPATH=. python recipe_pairs.py` from the repository root."""
import json
from collections import defaultdict
from autotune.predict.calibration import load_trials
from autotune.predict.memory import estimate_memory, GIB
from autotune.levers.pipeline_split import chunk_layers
p = "tests/data/measured_trials.json"
raw = [t for t in json.load(open(p))["trials"] if t["status"] == "OK"]
g = defaultdict(dict)
for r, (fam, m, s, c, step, used) in zip(raw, load_trials(p)):
    st = r["strategy"]
    if st.get("fp8", "off") == "off" or not r.get("peak_allocated_bytes"): continue
    key = (r.get("family", r["model"]), r["gpu"], r["gpus"], r.get("seq_length"),
           json.dumps({k: v for k, v in st.items() if k != "fp8_recipe"}, sort_keys=True))
    g[key].setdefault(st.get("fp8_recipe", "delayed"), (r, m, s, c))
print("| delayed | tensorwise | layout | measured alloc tensorwise - delayed GiB | predicted | B per token and layer (measured) | in hidden sizes |")
print("|---|---|---|---|---|---|---|")
for key, d in g.items():
    if "delayed" in d and "tensorwise" in d:
        (rd, m, sd, c), (rt, _, st_, _) = d["delayed"], d["tensorwise"]
        md = (rt["peak_allocated_bytes"] - rd["peak_allocated_bytes"]) / GIB
        pd = (estimate_memory(m, st_, c).peak.allocated_bytes - estimate_memory(m, sd, c).peak.allocated_bytes) / GIB
        L = sum(chunk_layers(sd, m)) * sd.vpp // sd.vpp
        layers = max(chunk_layers(sd, m)) * sd.vpp
        tokens = sd.mbs * m.seq_length / sd.cp
        per = md * GIB / layers / tokens
        print(f"| {rd['source']} | {rt['source']} | {sd.describe().replace('fp8=hybrid ', '')} | {md:+.2f} | {pd:+.2f} | {per:+.0f} | {per / (m.hidden_size / sd.tp):+.2f} |")
