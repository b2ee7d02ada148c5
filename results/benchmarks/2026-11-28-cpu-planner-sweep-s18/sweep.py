"""Planner sweep: runs each case with --backend simulate --json; records rc, time, best layout."""
from __future__ import annotations
import json, os, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor

WT = os.environ.get("WT", "/work/wt-18a")
PY = "/work/main/.venv/bin/python"
HF = "/tmp/hf"; THF = f"{WT}/tests/data/hf"
RES = os.environ.get("RES", "/tmp/sw/res")
SIM = ["--backend", "simulate"]

def cases():
    out = []
    def add(label, args): out.append((label, args))
    counts = [1, 2, 3, 6, 12, 24, 48, 96, 1000, 1024, 4096, 8192]
    for m in ["llama3-8b", "llama3-70b", "mixtral-8x7b", f"{HF}/qwen2.5-7b.json",
              f"{HF}/qwen2.5-72b.json", f"{HF}/mixtral-8x22b.json", f"{THF}/llama-3.1-405b.json"]:
        for g in counts:
            add(f"{os.path.basename(m)} {g}", [m, "--gpus", str(g)])
    for g in (1000, 1024, 4096, 8192):
        add(f"gpt-1t {g}", ["gpt-1t", "--gpus", str(g)])
    # batches that divide where the default does not
    for m in ["llama3-8b", f"{HF}/qwen2.5-14b.json", "mixtral-8x7b"]:
        for g, b in ((3, 384), (6, 384), (12, 384), (24, 384), (48, 1536), (96, 1536), (1000, 2000)):
            add(f"{os.path.basename(m)} {g} gbs{b}", [m, "--gpus", str(g), "--gbs", str(b)])
    for g in (12, 24, 96):
        add(f"llama3-8b {g} gpn4 gbs384", ["llama3-8b", "--gpus", str(g), "--gpus-per-node", "4", "--gbs", "384"])
    # every config at 8 and 64
    for f in sorted(os.listdir(HF)):
        for g in (1, 8, 64):
            add(f"{f} {g}", [f"{HF}/{f}", "--gpus", str(g)])
    # long sequences
    for m in [f"{THF}/llama-3.1-8b.json", f"{HF}/qwen2.5-7b.json", "llama3-70b"]:
        for s in (32768, 131072):
            for g in (8, 64):
                add(f"{os.path.basename(m)} {g} seq{s}", [m, "--gpus", str(g), "--seq-len", str(s), "--gbs", "64"])
    # clusters and GPUs
    for c in ("dgx-h100", "dgx-b200", "pcie-a100"):
        for m, g in (("llama3-8b", 16), ("llama3-70b", 64), ("mixtral-8x7b", 64)):
            add(f"{m} {g} cluster {c}", [m, "--gpus", str(g), "--cluster", c])
    for gpu in ("h200", "a100-80gb", "a100-40gb"):
        for m, g in (("llama3-8b", 8), ("llama3-70b", 64), (f"{HF}/qwen2.5-32b.json", 32)):
            add(f"{os.path.basename(m)} {g} gpu {gpu}", [m, "--gpus", str(g), "--gpu", gpu])
    # presets at counts
    for p in ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt-1.7b", "gpt-3.6b", "gpt-7.5b",
              "llama2-13b", "gpt-18b", "gpt-39b", "gpt-76b", "gpt-145b", "gpt3-175b", "gpt-310b", "gpt-530b"]:
        for g in (2, 64, 512):
            add(f"{p} {g}", [p, "--gpus", str(g)])
    return out

def cases2():
    out = []
    def add(label, args): out.append((label, args))
    for g in (1024, 4096, 8192):
        add(f"llama-3.1-405b {g}", [f"{THF}/llama-3.1-405b.json", "--gpus", str(g)])
    add("llama-3.1-405b 576 gbs1152", [f"{THF}/llama-3.1-405b.json", "--gpus", "576", "--gbs", "1152"])
    for c in ("dgx-h100", "dgx-b200", "pcie-a100"):
        for m, g in (("llama3-8b", 16), ("llama3-70b", 64), ("mixtral-8x7b", 64)):
            add(f"{m} {g} cluster {c}", [m, "--gpus", str(g), "--cluster", c])
    for m, g in (("llama3-8b", 8192), (f"{HF}/qwen2.5-7b.json", 4096), (f"{HF}/qwen2.5-7b.json", 8192)):
        add(f"{os.path.basename(m)} {g} (tie re-run)", [m, "--gpus", str(g)])
    # bf16 only: MFU against the bf16 peak with bf16 GEMMs
    for m, g, extra in (("llama3-8b", 8, []), ("llama3-8b", 64, []), ("llama3-70b", 64, []),
                        ("llama3-70b", 1024, []), ("mixtral-8x7b", 64, []), (f"{HF}/qwen2.5-7b.json", 8, []),
                        (f"{HF}/qwen2.5-32b.json", 32, []), (f"{HF}/qwen2.5-72b.json", 128, []),
                        (f"{HF}/mixtral-8x22b.json", 128, []), (f"{HF}/yi-34b.json", 64, []),
                        (f"{THF}/llama-3.1-405b.json", 1024, []), ("gpt3-175b", 1024, []),
                        ("gpt-1t", 3072, []), (f"{HF}/llama-3.2-1b.json", 8, []),
                        (f"{HF}/qwen2.5-0.5b.json", 8, []), (f"{THF}/llama-3.1-8b.json", 64, ["--seq-len", "131072", "--gbs", "64"]),
                        (f"{HF}/qwen3-14b.json", 16, []), (f"{HF}/hermes-2-mistral-7b.json", 8, [])):
        add(f"{os.path.basename(m)} {g} bf16 {' '.join(extra)}", [m, "--gpus", str(g), "--precision", "bf16", *extra])
    return out

def run(i, label, args):
    res = f"{RES}/{i}"
    cmd = [PY, "-m", "autotune", *args, *SIM, "--json", "--results-dir", res]
    t = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=WT,
                           env={**os.environ, "PYTHONPATH": WT})
        rc, so, se = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        rc, so, se = "timeout", "", ""
    dt = time.time() - t
    row = {"i": i, "label": label, "args": args, "rc": rc, "s": round(dt, 1),
           "traceback": "Traceback" in se, "stderr": se.strip().splitlines()[-3:] if se.strip() else []}
    try:
        d = json.loads(so)
        b = d["best"][0] if d.get("best") else None
        row["gpu"] = d.get("gpu"); row["valid"] = d.get("valid_layouts"); row["gpn"] = d.get("gpus_per_node")
        row["best"] = b
        row["all_best"] = d.get("best")
    except Exception:
        pass
    return row

if __name__ == "__main__":
    cs = cases2() if os.environ.get("SET") == "2" else cases()
    if len(sys.argv) > 2:
        sel = set(int(x) for x in sys.argv[2].split(","))
        cs2 = [(i, l, a) for i, (l, a) in enumerate(cs) if i in sel]
    else:
        cs2 = [(i, l, a) for i, (l, a) in enumerate(cs)]
    outf = sys.argv[1]
    with ThreadPoolExecutor(int(os.environ.get("J", "2"))) as ex, open(outf, "w") as f:
        for row in ex.map(lambda c: run(*c), cs2):
            f.write(json.dumps(row) + "\n"); f.flush()
            b = row.get("best")
            print(row["i"], row["label"], row["rc"], row["s"], "TB" if row["traceback"] else "",
                  (row["stderr"][-1][:150] if row["stderr"] and row["rc"] else "") ,
                  {k: b[k] for k in ("tp","pp","dp","cp","ep","vpp","mbs","recompute","fp8","peak_memory_gib","mfu")} if b else "", flush=True)
