"""Second batch: valid inputs that should plan, and commands over a real study."""
import json, os, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, "/tmp/sw")
from sweep import run  # noqa: E402

S = ["--backend", "simulate"]
ST = "/tmp/sw/res/y"  # a study made by the sweep (llama3-8b on 8, simulate)
def cases():
    c = [
        ("plan llama3-8b 7 --gbs 448", ["llama3-8b", "--gpus", "7", "--gbs", "448", *S]),
        ("plan llama3-8b 6 --gpus-per-node 6 --gbs 384", ["llama3-8b", "--gpus", "6", "--gpus-per-node", "6", "--gbs", "384", *S]),
        ("plan llama3-8b 12 --gpus-per-node 4 --gbs 384", ["llama3-8b", "--gpus", "12", "--gpus-per-node", "4", "--gbs", "384", *S]),
        ("plan mixtral-8x7b 24 --gbs 384", ["mixtral-8x7b", "--gpus", "24", "--gbs", "384", *S]),
        ("plan llama3-70b 24 --gbs 384", ["llama3-70b", "--gpus", "24", "--gbs", "384", *S]),
        ("plan llama3-8b 96 --gbs 384", ["llama3-8b", "--gpus", "96", "--gbs", "384", *S]),
        ("plan llama3-70b 1000 --gbs 1000", ["llama3-70b", "--gpus", "1000", "--gbs", "1000", *S]),
        ("plan gpt2 3 --gbs 63", ["gpt2", "--gpus", "3", "--gbs", "63", *S]),
        ("plan gpt2-xl 12 --gpus-per-node 4", ["gpt2-xl", "--gpus", "12", "--gpus-per-node", "4", *S]),
        ("plan qwen3-8b 7 --gbs 448", ["/work/wt-sweep/tests/data/hf/qwen3-8b.json", "--gpus", "7", "--gbs", "448", *S]),
        ("plan mixtral 16 a100-40gb", ["mixtral-8x7b", "--gpus", "16", "--gpu", "a100-40gb", *S]),
        ("plan llama3-8b 8 --space single-gpu", ["llama3-8b", "--gpus", "1", "--space", "single-gpu", *S]),
        ("plan llama3-8b 2 --space two-gpu", ["llama3-8b", "--gpus", "2", "--space", "two-gpu", *S]),
        ("plan llama3-8b 4 --space four-gpu", ["llama3-8b", "--gpus", "4", "--space", "four-gpu", *S]),
        ("plan pcie-a100 cluster 8", ["llama3-8b", "--gpus", "8", "--cluster", "/work/wt-sweep/search_spaces/clusters/pcie-a100.yaml", *S]),
        ("resume nonexistent", ["llama3-8b", "--gpus", "8", "--resume", "--study", "nope", *S]),
        ("resume with another space", ["llama3-8b", "--gpus", "8", "--space", "one-node", "--study", "llama3-8b-8gpu-h100-80gb-simulate-caf310eb", "--results-dir", ST, "--resume", *S]),
        ("export --trial -1", ["export", "--results-dir", ST, "--trial", "-1"]),
        ("export --trial 99999", ["export", "--results-dir", ST, "--trial", "99999"]),
        ("export --format bogus", ["export", "--results-dir", ST, "--format", "bogus"]),
        ("export -o folder", ["export", "--results-dir", ST, "-o", "/tmp/sw/in/emptydir"]),
        ("export -o missing dir", ["export", "--results-dir", ST, "-o", "/tmp/sw/nodir/x.sh"]),
        ("export --nodes 3", ["export", "--results-dir", ST, "--nodes", "3"]),
        ("export --nodes 2", ["export", "--results-dir", ST, "--nodes", "2", "--format", "slurm"]),
        ("export --megatron-version 0.1", ["export", "--results-dir", ST, "--megatron-version", "0.1"]),
        ("export --megatron-version abc", ["export", "--results-dir", ST, "--megatron-version", "abc"]),
        ("export --model other", ["export", "--results-dir", ST, "--model", "gpt2"]),
        ("export --train-iters 0", ["export", "--results-dir", ST, "--train-iters", "0"]),
        ("export --from-megatron missing", ["export", "--results-dir", ST, "--from-megatron", "/tmp/sw/in/missing.sh"]),
        ("export --study typo", ["export", "--results-dir", ST, "--study", "llama3-8b-8gpu"]),
        ("export --format json ok", ["export", "--results-dir", ST, "--format", "json"]),
        ("report ok", ["report", "--results-dir", ST]),
        ("report --model missing", ["report", "--results-dir", ST, "--model", "/tmp/sw/in/missing.yaml"]),
        ("estimate --layout export + other gpus", ["estimate", "--layout", "/tmp/sw/layout.json", "--gpus", "16"]),
        ("estimate --layout export + other model", ["estimate", "gpt2", "--layout", "/tmp/sw/layout.json"]),
        ("calibrate -o folder", ["calibrate", "--results-dir", ST, "-o", "/tmp/sw/in/emptydir"]),
        ("models extra arg", ["models", "extra"]),
        ("no args search flags only", ["--gpus", "8"]),
        ("mistyped command", ["estimat", "gpt2", "--gpus", "8"]),
        ("--version", ["--version"]),
    ]
    return c

if __name__ == "__main__":
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, cases()))
    json.dump(results, open(sys.argv[1], "w"), indent=1)
    for r in results:
        flag = "TRACEBACK " if r["traceback"] else ""
        print(f"[{r['rc']}] {flag}{r['name']} ({r['secs']}s): {r['best'] or r['error'] or r['stderr_tail']}")
