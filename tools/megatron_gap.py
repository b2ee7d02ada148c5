"""The Megatron-LM gap (issue 25): one layout as a worker trial and as the exported Megatron-LM
command, each for as many steps, with per-step times side by side; the GPU's clocks are logged
by the caller (tools/device_issue25.sh runs nvidia-smi every 500 ms into clocks.csv).

    python tools/megatron_gap.py MODEL GPU OUT_DIR MEGATRON_LM_SCRIPT LAYOUT
        [--steps 35] [--seq-len N]

Order: worker, Megatron-LM, worker again (A B A), so that a GPU that heats up over the run shows
as the second worker trial slowing too. Each writes its per-step times (worker: the trial's
AUTOTUNE_STEP lines; Megatron-LM: `elapsed time per iteration (ms)`), gap.md the comparison:
the median of the first and the last ten steps of each, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import time
from pathlib import Path

from device_layouts import (  # tools/ is on sys.path: run as a script
    add_seq_len,
    layout_fields,
    model_of,
)

from autotune.commands.estimate import layout_from_fields
from autotune.report.scripts import megatron_lm_script
from autotune.specs.hardware import ClusterSpec
from autotune.trials.launchers import LOG_NAME
from autotune.trials.metrics import metrics_from_run
from autotune.trials.protocol import parse_step_lines
from autotune.trials.runner import run_trial
from autotune.trials.trial import TrialSpec

_ITERATION = re.compile(
    r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([\d.]+)")


def _worker(spec: TrialSpec, trial_dir: Path) -> list[float]:
    t0 = time.monotonic()
    m = metrics_from_run(run_trial(spec, trial_dir, timeout_s=900))
    print(f"worker {trial_dir.name}: {m.status} {m.tokens_per_s} tokens/s, "
          f"{time.monotonic() - t0:.0f} s wall, clocks {m.clocks and m.clocks.describe()}",
          flush=True)
    text = (trial_dir / LOG_NAME).read_text(errors="replace")
    return [s for _, _, s in parse_step_lines(text)]


def _megatron(script: Path, log: Path) -> list[float]:
    t0 = time.monotonic()
    with log.open("wb") as f:
        rc = subprocess.call(["bash", str(script)], stdout=f, stderr=subprocess.STDOUT)
    print(f"megatron-lm: rc={rc}, {time.monotonic() - t0:.0f} s wall", flush=True)
    return [float(ms) / 1000 for _, ms in _ITERATION.findall(log.read_text(errors="replace"))]


def _row(name: str, times: list[float], tokens: int) -> str:
    if len(times) < 4:
        return f"| {name} | {len(times)} | - | - | - | - |"
    head, tail = times[2:12], times[-10:]
    first, last = statistics.median(head), statistics.median(tail)
    return (f"| {name} | {len(times)} | {first:.3f} | {last:.3f} | {last / first:.3f} | "
            f"{tokens / statistics.median(times[2:]):,.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("gpu")
    parser.add_argument("out_dir")
    parser.add_argument("megatron_lm")
    parser.add_argument("layout")
    parser.add_argument("--steps", type=int, default=35)
    add_seq_len(parser)
    args = parser.parse_args()
    model = model_of(parser, args)
    cluster = ClusterSpec.make(1, gpu=args.gpu)
    s = layout_from_fields(model, cluster, layout_fields(args.layout))
    out = Path(args.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # Fixed counts: every step is kept, none is judged away (stable_cv 0).
    spec = TrialSpec(model=model, layout=s, train_steps=args.steps - 2, warmup_steps=2,
                     gpu_peak_bf16_flops=cluster.gpu.peak_bf16_flops, gpu_name=cluster.gpu.name)
    script = out / "exported-megatron-lm.sh"
    script.write_text(megatron_lm_script(
        model, s, title=[f"issue 25 gap: {s.describe()}, {args.steps} iterations"],
        megatron_lm=args.megatron_lm, train_iters=args.steps))
    times = {"worker (before)": _worker(spec, out / "worker-1"),
             "megatron-lm": _megatron(script, out / "megatron-lm.log"),
             "worker (after)": _worker(spec, out / "worker-2")}
    (out / "steps.json").write_text(json.dumps(times, indent=1))
    tokens = s.gbs * model.seq_length
    lines = [f"# Megatron-LM gap: {model.name} {s.describe()} gbs {s.gbs}", "",
             "Step seconds: median of steps 3-12 and of the last 10; tokens/s over steps 3 on.",
             "", "| run | steps | steps 3-12 s | last 10 s | last / first | tokens/s |",
             "|---|---|---|---|---|---|", *(_row(k, v, tokens) for k, v in times.items())]
    worker = times["worker (before)"][2:] + times["worker (after)"][2:]
    mlm = times["megatron-lm"][2:]
    if worker and mlm:
        lines += ["", f"Megatron-LM / worker tokens/s: "
                  f"{statistics.median(worker) / statistics.median(mlm):.3f}"]
    text = "\n".join(lines) + "\n"
    (out / "gap.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
