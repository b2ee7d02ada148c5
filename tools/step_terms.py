"""The cost model's step time term by term beside the measured step, for a study's trials or for
tests/data/measured_trials.json (session 26: why gpt2-xl on 4 x H200 ran 13-68% slower than
predicted; results/benchmarks/2026-11-29-cpu-x4-step-miss-s26.md).

    PYTHONPATH=. python tools/step_terms.py --study STUDY_DIR   # trials/N/{trial,result}.json
    PYTHONPATH=. python tools/step_terms.py --data tests/data/measured_trials.json --min-gpus 2

One row per OK trial, with the shipped constants (autotune.predict.cost.estimate_cost): the
measured and predicted step, the error as the search's tables give it (predicted tokens/s over
measured, minus one: positive is optimistic), each term of the prediction (CostEstimate), and
the step per layer and micro-batch of a stage measured against the model's GPU work per layer
and micro-batch (compute and the collectives on the critical path) and its host launch time.
Where a study's result.json has them, the GPU's NVML utilization, power and SM clock (medians
over the timed steps): a step far above the GPU's work at a low power is waiting for the host.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.layouts.layout import Layout
from autotune.predict.calibration import row_inputs
from autotune.predict.cost import CostEstimate, estimate_cost
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.model import ModelSpec
from autotune.trials.trial import TrialSpec

TERMS = ("compute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "dp_comm_s",
         "bubble_s", "optimizer_s", "overhead_s", "launch_s")
"""CostEstimate's time terms, in its order; step_time_s is their sum (plus offload_s)."""


@dataclass(frozen=True, slots=True)
class Measured:
    """One OK trial as run: its inputs, its step and (from a study) its GPU's clocks."""

    source: str
    model: ModelSpec
    layout: Layout
    cluster: ClusterSpec
    step_s: float
    clocks: dict[str, Any] | None = None


def study_trials(study: Path) -> Iterator[Measured]:
    """The OK trials of a study folder (trials/N/trial.json and result.json), by trial number."""
    for trial_dir in sorted((study / "trials").iterdir(), key=lambda p: (len(p.name), p.name)):
        spec_path, result_path = trial_dir / "trial.json", trial_dir / "result.json"
        if not (spec_path.is_file() and result_path.is_file()):
            continue
        result = json.loads(result_path.read_text())
        if result.get("status") != "OK":
            continue
        spec = TrialSpec.from_json(spec_path.read_text())
        if spec.gpu_name is None:
            continue  # a study's trial names its GPU; without it nothing here can price it
        world = spec.layout.world_size
        cluster = ClusterSpec(num_gpus=world, gpus_per_node=world, gpu=gpu_spec(spec.gpu_name))
        yield Measured(source=f"{study.name}/{trial_dir.name}", model=spec.model,
                       layout=spec.layout, cluster=cluster, step_s=float(result["step_time_s"]),
                       clocks=result.get("clocks"))


def data_trials(data: Path, min_gpus: int) -> Iterator[Measured]:
    """The OK trials of a measured_trials.json on at least `min_gpus` GPUs, as the tests read
    them (autotune.predict.calibration.row_inputs)."""
    for t in json.loads(data.read_text())["trials"]:
        if t["status"] != "OK" or t["gpus"] < min_gpus:
            continue
        model, layout, cluster = row_inputs(t, data)
        yield Measured(source=t["source"], model=model, layout=layout, cluster=cluster,
                       step_s=float(t["step_time_s"]))


def row(trial: Measured) -> dict[str, Any]:
    """One trial's figures: the prediction's terms, its error, and per layer and micro-batch the
    measured step against the model's GPU work and host launch time (milliseconds)."""
    s = trial.layout
    cost: CostEstimate = estimate_cost(trial.model, s, trial.cluster)
    # A stage's layer count times its micro-batches: what one host thread launches per step.
    per = s.num_microbatches * trial.model.num_layers / s.pp
    gpu = cost.compute_s + cost.tp_comm_s + cost.cp_comm_s + cost.ep_comm_s + cost.pp_comm_s
    out: dict[str, Any] = {
        "source": trial.source, "layout": s.describe(), "m": s.num_microbatches,
        "measured_s": trial.step_s, "predicted_s": cost.step_time_s,
        "error": trial.step_s / cost.step_time_s - 1,
        **{name: getattr(cost, name) for name in TERMS},
        "measured_ms_per_layer_mb": trial.step_s / per * 1e3,
        "gpu_ms_per_layer_mb": gpu / per * 1e3,
        "launch_ms_per_layer_mb": cost.launch_s / per * 1e3,
    }
    if trial.clocks:
        out.update(util=trial.clocks["utilization"]["median"],
                   power_w=trial.clocks["power_w"]["median"],
                   sm_mhz=trial.clocks["sm_mhz"]["median"])
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (seconds to 3 places, errors in %)."""
    terms = [t.removesuffix("_s") for t in TERMS]
    clocks = any("util" in r for r in rows)
    head = ["trial", "layout", "m", "measured s", "predicted s", "err %", *terms,
            "meas ms/layer-mb", "GPU ms/layer-mb", "launch ms/layer-mb"]
    if clocks:
        head += ["util", "W", "SM MHz"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["source"], r["layout"], str(r["m"]), f"{r['measured_s']:.3f}",
                 f"{r['predicted_s']:.3f}", f"{r['error'] * 100:+.1f}",
                 *(f"{r[t]:.3f}" for t in TERMS), f"{r['measured_ms_per_layer_mb']:.2f}",
                 f"{r['gpu_ms_per_layer_mb']:.2f}", f"{r['launch_ms_per_layer_mb']:.2f}"]
        if clocks:
            cells += ([f"{r['util']:.2f}", f"{r['power_w']:.0f}", f"{r['sm_mhz']:.0f}"]
                      if "util" in r else ["-"] * 3)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", type=Path, action="append", default=[],
                        help="a study folder holding trials/N/trial.json and result.json")
    parser.add_argument("--data", type=Path, help="a measured_trials.json")
    parser.add_argument("--min-gpus", type=int, default=1,
                        help="with --data: only trials on at least this many GPUs")
    args = parser.parse_args(argv)
    if not args.study and args.data is None:
        print("step_terms: give --study DIR or --data FILE", file=sys.stderr)
        return 2
    missing = [p for p in [*args.study, args.data] if p is not None and not p.exists()]
    if missing:
        print(f"step_terms: not found: {missing[0]}", file=sys.stderr)
        return 2
    trials: list[Measured] = []
    for study in args.study:
        trials.extend(study_trials(study))
    if args.data is not None:
        trials.extend(data_trials(args.data, args.min_gpus))
    print(markdown([row(t) for t in trials]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
