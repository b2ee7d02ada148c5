"""Memory errors of the model over every OK measured trial of tests/data/measured_trials.json,
grouped by GPU, precision, recompute and micro-batch: device used (NVML), predicted / measured - 1,
and peak allocated (torch) where recorded, predicted - measured in GiB.
`PYTHONPATH=. python memory_groups.py [LABEL [PREFIXES]]` from the repository root; LABEL
block-no-rebuild patches a variant tried in session 7 (no rebuild for block with layers left
stored); PREFIXES (comma-separated) also prints those trials one by one."""
import json, sys, statistics as st
from collections import defaultdict
from autotune.predict.calibration import load_trials
from autotune.predict.memory import estimate_memory, GIB
import autotune.levers.recompute as rc
VARIANT = sys.argv[1] if len(sys.argv) > 1 else "shipped"
if VARIANT == "block-no-rebuild":
    orig = rc.full_recompute_chunk
    def patched(layers, *, method, num_layers, full, layer_input):
        stored, rebuild = orig(layers, method=method, num_layers=num_layers, full=full, layer_input=layer_input)
        if method == "block" and min(num_layers, layers) < layers:
            rebuild = 0.0
        return stored, rebuild
    rc.full_recompute_chunk = patched
p = "tests/data/measured_trials.json"
raw = [t for t in json.load(open(p))["trials"] if t["status"] == "OK"]
trials = load_trials(p)
g = defaultdict(list)
rows = []
for r, (fam, m, s, c, step, used) in zip(raw, trials):
    e = estimate_memory(m, s, c)
    prec = "bf16" if str(s.fp8) == "off" else f"fp8-{s.fp8_recipe}"
    rec = str(s.recompute) + ("(" + str(s.recompute_method) + ")" if str(s.recompute) == "full" else "")
    mb = "mbs1" if s.mbs == 1 else "mbs>=2"
    alloc = r.get("peak_allocated_bytes")
    ue = e.peak_bytes / used - 1
    ae = (e.peak.allocated_bytes - alloc) / GIB if alloc else None
    g[(r["gpu"], prec if prec=="bf16" else "fp8", rec.split("(")[0], mb)].append((ue, ae))
    rows.append((r["source"], ue, ae))
print(f"variant {VARIANT}")
print("| GPU | precision | recompute | mbs | n | used err median | used err min..max | n alloc | alloc err GiB median | alloc err min..max |")
print("|---|---|---|---|---|---|---|---|---|---|")
for k in sorted(g):
    v = g[k]; u = [x for x, _ in v]; a = [y for _, y in v if y is not None]
    ast = f"{st.median(a):+.2f} | {min(a):+.2f}..{max(a):+.2f}" if a else "- | -"
    print(f"| {' | '.join(k)} | {len(v)} | {st.median(u):+.1%} | {min(u):+.1%}..{max(u):+.1%} | {len(a)} | {ast} |")
u = [x for _, x, _ in rows]
print(f"all: n={len(u)} |used err| median {st.median(map(abs,u)):.2%} worst {max(map(abs,u)):.2%}")
if len(sys.argv) > 2:
    for s_, ue, ae in rows:
        if any(s_.startswith(x) for x in sys.argv[2].split(",")):
            print(f"{s_:34s} used {ue:+.1%} alloc {ae if ae is None else round(ae,2)}")
