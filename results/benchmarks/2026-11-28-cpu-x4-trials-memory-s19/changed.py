"""Every OK measured trial whose memory prediction a model change moves, before and after.
`PYTHONPATH=. python changed.py save FILE` with the old model checked out records its figures;
`PYTHONPATH=. python changed.py show FILE` with the new one prints the table (report: ../2026-11-28-cpu-x4-trials-memory-s19.md)."""
import json, sys
from autotune.predict.calibration import load_trials
from autotune.predict.memory import estimate_memory, GIB
p = "tests/data/measured_trials.json"
raw = [t for t in json.load(open(p))["trials"] if t["status"] == "OK"]
out = {}
for r, (fam, m, s, c, step, used) in zip(raw, load_trials(p)):
    e = estimate_memory(m, s, c)
    out[r["source"]] = (s.describe(), r["gpu"], used, r.get("peak_allocated_bytes"), e.peak_bytes, e.peak.allocated_bytes, e.fits)
if sys.argv[1] == "save":
    json.dump(out, open(sys.argv[2] if len(sys.argv) > 2 else "/tmp/before.json", "w")); sys.exit()
before = json.load(open(sys.argv[2] if len(sys.argv) > 2 else "/tmp/before.json"))
print("| source | GPU | layout | device used GiB | predicted before | err | after | err | peak allocated GiB | predicted before | after | fits before -> after |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for k, (d, g, used, alloc, pk, pa, fits) in out.items():
    b = before[k]
    if abs(b[4] - pk) < 1e6: continue
    a = f"{alloc/GIB:.2f} | {b[5]/GIB:.2f} | {pa/GIB:.2f}" if alloc else "- | - | -"
    print(f"| {k} | {g} | {d} | {used/GIB:.2f} | {b[4]/GIB:.2f} | {b[4]/used-1:+.1%} | {pk/GIB:.2f} | {pk/used-1:+.1%} | {a} | {b[6]} -> {fits} |")
