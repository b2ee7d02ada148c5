"""Runs the CLI sweep cases and records exit code, first stderr line, best layout."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

WT = os.environ.get("WT", "/work/wt-sweep")
IN = "/tmp/sw/in"
HF = f"{WT}/tests/data/hf"
RES = os.environ.get("RES", "/tmp/sw/res")


def cases() -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    presets = ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt-1.7b", "gpt-3.6b",
               "gpt-7.5b", "llama3-8b", "llama2-13b", "gpt-18b", "gpt-39b", "mixtral-8x7b",
               "llama3-70b", "gpt-76b", "gpt-145b", "gpt3-175b", "gpt-310b", "gpt-530b",
               "gpt-1t"]
    sim = ["--backend", "simulate"]
    for p in presets:
        out.append((f"plan {p} 8", [p, "--gpus", "8", *sim]))
    for g in (1, 3, 6, 7, 12, 24, 96, 1000, 4096):
        out.append((f"plan llama3-8b {g}", ["llama3-8b", "--gpus", str(g), *sim]))
        out.append((f"plan mixtral-8x7b {g}", ["mixtral-8x7b", "--gpus", str(g), *sim]))
    for g in (1, 3, 7, 12, 96):
        out.append((f"plan gpt2-xl {g}", ["gpt2-xl", "--gpus", str(g), *sim]))
    for g in (6, 24, 1000):
        out.append((f"plan llama3-70b {g}", ["llama3-70b", "--gpus", str(g), *sim]))
    for g in (1000, 4096):
        out.append((f"plan gpt-1t {g}", ["gpt-1t", "--gpus", str(g), *sim]))
    for f in sorted(os.listdir(HF)):
        if f.endswith(".json"):
            for g in (8, 7, 24):
                out.append((f"hf {f} {g}", [f"{HF}/{f}", "--gpus", str(g), *sim]))
    # batch and sequence
    L = ["llama3-8b", "--gpus", "8", *sim]
    for extra in (["--gbs", "100"], ["--gbs", "3"], ["--gbs", "1"], ["--gbs", "7"],
                  ["--gbs", "1000000000"], ["--gbs", "0"], ["--gbs", "-8"],
                  ["--seq-len", "1"], ["--seq-len", "3"], ["--seq-len", "1000001"],
                  ["--seq-len", "1099511627776"], ["--seq-len", "2199023255552"],
                  ["--seq-len", "0"], ["--seq-len", "131072"], ["--seq-len", "1.5"],
                  ["--gbs", "1", "--seq-len", "1"]):
        out.append(("llama3-8b 8 " + " ".join(extra), [*L, *extra]))
    out.append(("gpt2 7 gbs 64", ["gpt2", "--gpus", "7", *sim]))
    out.append(("gpt2 1 gbs 1 seq 1", ["gpt2", "--gpus", "1", "--gbs", "1", "--seq-len", "1",
                                        *sim]))
    # GPU counts and nodes
    for extra in (["--gpus", "0"], ["--gpus", "-1"], ["--gpus", "1125899906842624"],
                  ["--gpus", "8", "--nodes", "3"], ["--gpus", "8", "--nodes", "2",
                                                    "--gpus-per-node", "8"],
                  ["--gpus", "8", "--nodes", "0"], ["--gpus", "8", "--nodes", "-2"],
                  ["--gpus", "8", "--gpus-per-node", "3"], ["--gpus", "8", "--gpus-per-node",
                                                            "16"],
                  ["--gpus", "32", "--nodes", "4"], ["--gpus", "12", "--gpus-per-node", "6"],
                  ["--gpus", "8", "--gpus-per-node", "0"], ["--nodes", "2"],
                  ["--gpus", "24", "--nodes", "3", "--gpus-per-node", "8"],
                  ["--gpus", "7", "--nodes", "7"]):
        out.append(("llama3-8b " + " ".join(extra), ["llama3-8b", *extra, *sim]))
    # space files
    for f in ("space_malformed", "space_typo", "space_wrongtype", "space_negative",
              "space_emptylist", "space_float", "space_bool", "space_badimpl", "space_badenum",
              "space_list", "space_scalar", "space_pp3", "space_dupkey", "unreadable",
              "binary", "empty"):
        out.append((f"--space {f}.yaml", ["llama3-8b", "--gpus", "8", *sim, "--space",
                                          f"{IN}/{f}.yaml"]))
    for s in ("nope", f"{IN}/missing.yaml", f"{IN}/emptydir", "one-nod", "single-gpu",
              "/dev/null"):
        out.append((f"--space {s}", ["llama3-8b", "--gpus", "8", *sim, "--space", s]))
    # cluster files
    for f in ("cl_neg", "cl_badgpu", "cl_zero", "cl_str", "cl_typo", "cl_min", "cl_nan",
              "cl_3pn", "cl_ok", "empty", "space_typo", "binary"):
        out.append((f"--cluster {f}.yaml", ["llama3-8b", "--gpus", "16", *sim, "--cluster",
                                            f"{IN}/{f}.yaml"]))
    for c in ("h1000", "", "missing.yaml", "dgx-h100", "H100-80GB", "b200", "a100-40gb"):
        out.append((f"--gpu {c!r}", ["llama3-8b", "--gpus", "8", *sim, "--gpu", c]))
    # model inputs
    for m in (f"{IN}/missing.yaml", f"{IN}/empty.yaml", f"{IN}/empty.json",
              f"{IN}/hf_partial.json", f"{IN}/emptydir", f"{IN}/binary.yaml", "llama-3-8b",
              "Llama3-8B", f"{IN}/cl_ok.yaml", f"{IN}/space_typo.yaml", "/dev/zero", HF):
        out.append((f"model {m}", [m, "--gpus", "8", *sim]))
    # search options
    for extra in (["--trials", "0"], ["--time-budget", "nan"], ["--steps", "0"],
                  ["--fix", "tp=3"], ["--tp", "0"], ["--tp", "abc"], ["--pp", "1000"],
                  ["--fix", "foo=1"], ["--precision", "fp16"], ["--tp", "8", "--pp", "8"],
                  ["--sampler", "random"], ["--study", "../x"], ["--results-dir", "/dev/null"],
                  ["--calibration", f"{IN}/missing.json"], ["--calibration", f"{IN}/empty.json"],
                  ["--mbs", "3"], ["--cp", "8"], ["--ep", "2"], ["--fix", "tp="],
                  ["--trials", "1"]):
        out.append(("llama3-8b 8 " + " ".join(extra), [*L, *extra]))
    # other commands
    E = ["estimate", "llama3-8b", "--gpus", "8"]
    for extra in ([], ["--tp", "3"], ["--mbs", "0"], ["--tp", "-2"], ["--pp", "0"],
                  ["--gbs", "100"], ["--layout", f"{IN}/missing.json"],
                  ["--layout", f"{IN}/empty.json"], ["--recompute", "bogus"],
                  ["--seq-len", "1"], ["--vpp", "3", "--pp", "2"]):
        out.append(("estimate " + " ".join(extra), [*E, *extra]))
    out.append(("estimate gpus 7", ["estimate", "llama3-8b", "--gpus", "7"]))
    out.append(("estimate mixtral 7", ["estimate", "mixtral-8x7b", "--gpus", "7"]))
    X = ["export", "--results-dir"]
    out.append(("export no study", ["export", "--results-dir", f"{RES}/none", "--study",
                                    "nope"]))
    out.append(("export empty results", [*X, f"{IN}/emptydir"]))
    out.append(("export missing results", [*X, f"{IN}/missing"]))
    out.append(("export trial -1", [*X, f"{RES}/none", "--trial", "-1"]))
    out.append(("report no study", ["report", "--results-dir", f"{IN}/emptydir", "--study",
                                    "nope"]))
    out.append(("calibrate empty", ["calibrate", "--results-dir", f"{IN}/emptydir", "-o",
                                    "/tmp/sw/cal.json"]))
    out.append(("from-megatron missing", ["--from-megatron", f"{IN}/missing.sh", *sim]))
    out.append(("from-megatron empty", ["--from-megatron", f"{IN}/empty.yaml", *sim]))
    out.append(("from-megatron arith", ["--from-megatron", "/tmp/sw/arith.sh", *sim]))
    return out


def run(case: tuple[str, list[str]]) -> dict:
    name, args = case
    rd = f"{RES}/" + "".join(c if c.isalnum() else "_" for c in name)[:80]
    full = list(args)
    is_search = full[0] not in ("estimate", "export", "report", "calibrate", "models")
    if is_search:
        full += ["--results-dir", rd] if "--results-dir" not in full else []
        full += ["--json"]
    env = {**os.environ, "PYTHONPATH": WT, "COLUMNS": "200"}
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "autotune.cli", *full], capture_output=True,
                           text=True, timeout=300, env=env, cwd="/tmp/sw")
        rc, so, se = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        rc, so, se = "timeout", "", ""
    dt = time.monotonic() - t0
    best = None
    if is_search and rc == 0:
        try:
            d = json.loads(so)
            b = d["best"][0] if d.get("best") else None
            if b:
                best = (f"tp{b['tp']} pp{b['pp']} dp{b['dp']} cp{b['cp']} ep{b['ep']} "
                        f"vpp{b['vpp']} mbs{b['mbs']} gbs{b['gbs']} {b['recompute']} "
                        f"{b['impl']} fp8={b['fp8']} mfu={b['mfu']:.3f} "
                        f"peak={b['peak_memory_gib']:.1f}GiB")
        except Exception as exc:  # noqa: BLE001
            best = f"unparsed: {exc}"
    errlines = [ln for ln in se.splitlines() if ln.strip()]
    err = [ln for ln in errlines if ln.startswith("autotune: error")]
    return {"name": name, "args": args, "rc": rc, "secs": round(dt, 1),
            "traceback": "Traceback" in se,
            "stderr_lines": len(errlines), "error": err[0] if err else None,
            "stderr_tail": errlines[-3:], "best": best,
            "stdout_head": so[:300] if not is_search else None}


if __name__ == "__main__":
    todo = cases()
    sel = sys.argv[2] if len(sys.argv) > 2 else None
    if sel:
        todo = [c for c in todo if sel in c[0]]
    with ThreadPoolExecutor(int(os.environ.get("J", "2"))) as pool:
        results = list(pool.map(run, todo))
    json.dump(results, open(sys.argv[1], "w"), indent=1)
    for r in results:
        flag = "TRACEBACK " if r["traceback"] else ""
        print(f"[{r['rc']}] {flag}{r['name']} ({r['secs']}s): {r['best'] or r['error'] or r['stderr_tail']}")
