"""Session 16's measured trials as tests/data/measured_trials.json entries (session 17):
`PYTHONPATH=. python results/benchmarks/2026-11-28-cpu-measured-s16-trials-s17/convert.py` from the
repository root prints them (JSON list); the layout labels are parsed and checked to print again.
`convert.py FOLDER PREFIX MODEL FAMILY GPU GPUS SEQ GBS [ROPE_FUSION]` prints one search's trials
(FOLDER/summary.txt; step times from its table where FOLDER has no trials.json), with
"rope_fusion": true when ROPE_FUSION is 1 (trials measured from session 17 on)."""
import json, re, sys
from pathlib import Path
from autotune.layouts.layout import DIMENSIONS, LAYOUT_DEFAULTS, Layout

GIB = 2**30
FLAGS = {}
for name, dim in DIMENSIONS.items():
    if isinstance(dim.default, bool) and dim.label is not None:
        FLAGS[dim.label(Layout(), True)] = name

def parse(label: str, gbs: int) -> dict:
    f = {}
    for tok in label.split():
        m = re.fullmatch(r"(tp|pp|dp|cp|ep|vpp|mbs)(\d+)", tok)
        if m:
            f[m[1]] = int(m[2]); continue
        if tok in FLAGS:
            f[FLAGS[tok]] = True; continue
        if tok in ("te", "sdpa", "local"):
            f["impl"] = tok; continue
        m = re.fullmatch(r"rc=(selective|full)(?:\((\w+)/(\d+)\)|\(([\w+]+)\))?", tok)
        if m:
            f["recompute"] = m[1]
            if m[2]:
                f["recompute_method"], f["recompute_num_layers"] = m[2], int(m[3])
            if m[4]:
                f["recompute_modules"] = m[4]
            continue
        m = re.fullmatch(r"fp8=(\w+)(?:/(\w+))?", tok)
        if m:
            f["fp8"] = m[1]; f["fp8_recipe"] = m[2] or "delayed"; continue
        raise SystemExit(f"unknown token {tok!r} in {label!r}")
    f["gbs"] = gbs
    layout = Layout(**f)
    assert layout.describe() == label, (layout.describe(), label)
    return {k: (str(v) if not isinstance(v, (bool, int)) else v)
            for k, v in ((n, getattr(layout, n)) for n in DIMENSIONS)}

def rows(summary: Path):
    for line in summary.read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 16 and cells[0].isdigit():
            yield cells

def entry(source, model, family, gpu, gpus, seq, strategy, status, step, used_gib, alloc_gib, guard=None):
    e = {"source": source, "model": model, "family": family, "gpu": gpu, "gpus": gpus,
         "seq_length": seq, "strategy": strategy, "status": status, "step_time_s": step,
         "device_used_bytes": round(used_gib * GIB), "peak_allocated_bytes": round(alloc_gib * GIB)}
    if guard:
        e["loss_guard"] = guard
    return e

def from_search(folder, prefix, model, family, gpu, gpus, seq, gbs, rope_fusion=False):
    trials = folder / "trials.json"
    tps = ({str(r["trial"]): r["tokens_per_s"] for r in json.loads(trials.read_text())}
           if trials.exists() else {})
    out = []
    for c in rows(folder / "summary.txt"):
        n, label, status = c[0], c[1], c[3]
        if status not in ("OK", "DIVERGED"):
            continue
        step = gbs * seq / tps[n] if tps else float(c[6])
        assert abs(step - float(c[6])) < 0.0006, (n, step, c[6])
        e = entry(f"{prefix}/{n}", model, family, gpu, gpus, seq, parse(label, gbs), "OK",
                  step, float(c[9]), float(c[7]),
                  guard="DIVERGED" if status == "DIVERGED" else None)
        if rope_fusion:
            e["rope_fusion"] = True
        out.append(e)
    return out

if len(sys.argv) > 1:
    folder, prefix, model, family, gpu, gpus, seq, gbs, *rest = sys.argv[1:]
    json.dump(from_search(Path(folder), prefix, model, family, gpu, int(gpus), int(seq), int(gbs),
                          rest[:1] == ["1"]), sys.stdout, indent=1)
    sys.exit(0)
B = Path("results/benchmarks")
new = []
f30 = B / "2026-11-28-h200x4-issue30-s16"
rec = json.loads((f30 / "recipe-hand.txt").read_text().splitlines()[0])
new.append(entry("s16-l8b4-recipe/0", "llama3-8b", "llama3-8b", "h200", 4, 8192,
                 parse(rec["layout"], rec["gbs"]), rec["status"], rec["step_time_s"],
                 rec["device_used_gib"], rec["peak_allocated_gib"]))
new += from_search(f30, "s16-l8b4-search", "llama3-8b", "llama3-8b", "h200", 4, 8192, 32)
new += from_search(B / "2026-11-28-h200-fp8-follow-s16", "s16-l3b-fp8follow",
                   "tests/data/hf/llama-3.2-3b.json", "llama-3b", "h200", 1, 4096, 16)
json.dump(new, sys.stdout, indent=1)
