"""SHA-256 digests of simulated plans, to hold two versions of autotune to byte-identical plans
(a change that only makes planning faster must not move a figure).

    PYTHONPATH=TREE python tools/plan_digest.py OUT_DIR [CASE ...]

For each case (CASES, or the names given) the plan runs as `python -m autotune ARGS
--backend simulate --json` with the Python running this script and a fresh results directory;
OUT_DIR/CASE.json is its JSON, the results directory replaced by a placeholder, and
OUT_DIR/CASE.trials.json every trial of the study as Optuna stored it (parameters, values,
attributes: the predicted peaks and step times of the layouts not in the JSON's table). One
line per case: the two digests and the plan's seconds. Compare two trees' lines, or
`diff -r` their OUT_DIRs. tools/plan_snapshot.py compares more (the dry run, the export) of
presets at fewer sizes.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from plan_snapshot import _trials  # tools/ is on the path of a script run from it

_ROOT = Path(__file__).resolve().parent.parent
_H100 = str(_ROOT / "search_spaces" / "clusters" / "dgx-h100.yaml")


def _hf(name: str) -> str:
    return str(_ROOT / "tests" / "data" / "hf" / f"{name}.json")


CASES: dict[str, tuple[str, ...]] = {
    "deepseek-v3-1024": (_hf("deepseek-v3"), "--gpus", "1024", "--gpu", _H100,
                         "--seq-len", "4096", "--gbs", "4096"),
    "gpt-1t-3072": ("gpt-1t", "--gpus", "3072"),
    "llama3-8b-8": ("llama3-8b", "--gpus", "8"),
    "gpt2-xl-1": ("gpt2-xl", "--gpus", "1"),
    "mixtral-8x7b-64": ("mixtral-8x7b", "--gpus", "64", "--gpus-per-node", "8"),
    "qwen3-30b-a3b-16": (_hf("qwen3-30b-a3b"), "--gpus", "16", "--gpu", _H100),
    "llama-3.1-405b-1024": (_hf("llama-3.1-405b"), "--gpus", "1024", "--gpu", _H100),
}
"""Plan name: the model and GPU arguments (the plans of the README's planning-time rows and
one of each kind of model: dense, MoE, MoE with MLA and MTP)."""


def digest(name: str, out: Path) -> str:
    """Run case `name`, write its two files under `out`, return its line."""
    with tempfile.TemporaryDirectory(prefix="plan-digest-") as work:
        start = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "autotune", *CASES[name], "--backend", "simulate", "--json",
             "--results-dir", work],
            capture_output=True, text=True, check=False)
        seconds = time.monotonic() - start
        if done.returncode != 0:
            raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr}")
        plan = done.stdout.replace(work, "RESULTS")
        study = json.loads(done.stdout)
        storage = study["storage"]
        trials = json.dumps(_trials(storage, study["study"]), indent=1, sort_keys=True,
                            default=repr).replace(work, "RESULTS")
    (out / f"{name}.json").write_text(plan)
    (out / f"{name}.trials.json").write_text(trials + "\n")
    sums = [hashlib.sha256(text.encode()).hexdigest()[:16] for text in (plan, trials + "\n")]
    return f"{name} plan {sums[0]} trials {sums[1]} {seconds:.1f} s"


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[2:] or CASES:
        if name not in CASES:
            raise SystemExit(f"unknown case {name}; known: {', '.join(CASES)}")
        print(digest(name, out), flush=True)


if __name__ == "__main__":
    main()
