"""For each planned case: autotune's rules, megatron-core's verdict, memory vs GPU, export round trip."""
from __future__ import annotations
import json, os, subprocess, sys, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, "/work/wt-18a")
from autotune.layouts.layout import DIMENSIONS, Layout, check
from autotune.specs.presets import load_model
from autotune.specs.hardware import ClusterSpec
from autotune.commands.from_megatron import read_user_job

WT = "/work/wt-18a"; PY = "/work/main/.venv/bin/python"
MC = os.environ.get("MC", "1") == "1"
if MC:
    from tools.rules_crosscheck import megatron_verdict

def opt(args, name):
    return args[args.index(name) + 1] if name in args else None

rows = [json.loads(l) for l in open(sys.argv[1])]
sel = set(int(x) for x in sys.argv[2].split(",")) if len(sys.argv) > 2 else None
for r in rows:
    b = r.get("best")
    if not b or (sel and r["i"] not in sel):
        continue
    a = r["args"]
    gpus = int(opt(a, "--gpus")); seq = opt(a, "--seq-len"); gbs = opt(a, "--gbs")
    gpn = opt(a, "--gpus-per-node"); gpu = opt(a, "--gpu") or opt(a, "--cluster")
    model = load_model(a[0]).with_overrides(seq_length=int(seq) if seq else None,
                                            global_batch_size=int(gbs) if gbs else None)
    cl = ClusterSpec.make(gpus, int(gpn) if gpn else None, gpu)
    lay = Layout(**{k: b[k] for k in DIMENSIONS if k in b})
    out = []
    v = check(lay, model, cl)
    if v: out.append(f"AUTOTUNE-RULES {v}")
    if MC and gpus <= 8192:
        try:
            mv = megatron_verdict(model, lay, gpus)
        except Exception as e:
            mv = f"crash {type(e).__name__}: {e}"
        if mv: out.append(f"MEGATRON {mv[:200]}")
    cap = cl.gpu.memory_gib if hasattr(cl.gpu, "memory_gib") else None
    if cap and b["peak_memory_gib"] > cap: out.append(f"MEM {b['peak_memory_gib']:.1f}>{cap}")
    mfu = b["mfu"]
    if not (0.20 <= mfu <= 0.65): out.append(f"MFU {mfu*100:.1f}%")
    # export round trip
    res = f"{os.environ.get('RES', '/tmp/sw/res')}/{r['i']}"; exp = f"{os.environ.get('EXP', '/tmp/sw/exp')}/{r['i']}.sh"
    os.makedirs(os.path.dirname(exp), exist_ok=True)
    p = subprocess.run([PY, "-m", "autotune", "export", "--results-dir", res, "-o", exp],
                       capture_output=True, text=True, cwd=WT, env={**os.environ, "PYTHONPATH": WT})
    if p.returncode:
        out.append(f"EXPORT rc={p.returncode} {p.stderr.strip()[-200:]}")
    else:
        try:
            job = read_user_job(exp, gpus=None, gpus_per_node=None, gpu=gpu)
            back = job.layout
            diffs = {k: (getattr(lay, k), getattr(back, k)) for k in DIMENSIONS
                     if getattr(lay, k) != getattr(back, k)}
            if diffs: out.append(f"ROUNDTRIP {diffs}")
            if job.model.seq_length != model.seq_length or job.model.num_layers != model.num_layers \
                    or job.model.vocab_size != model.vocab_size:
                out.append(f"ROUNDTRIP-MODEL seq {job.model.seq_length} vocab {job.model.vocab_size}")
        except Exception as e:
            out.append(f"ROUNDTRIP-ERR {type(e).__name__}: {str(e)[:200]}")
    print(r["i"], r["label"], lay.describe(), "|", "; ".join(out) or "ok", flush=True)
