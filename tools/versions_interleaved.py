"""The same layouts under two megatron-core releases, trial by trial, interleaved (issue 29).

    python tools/versions_interleaved.py MODEL GPU OUT_DIR
        --version 0.16.1=/tmp/mc016 --version 0.19.2=/tmp/mc019 [--rounds 2]
        [--deadline-s 300] [--fill] [--warmup LAYOUT] --once LAYOUT... [--repeat LAYOUT...]
    LAYOUT = comma-separated Layout fields (tools/device_layouts.py), gbs=N included

Each release is a folder that megatron-core was installed into (`pip install --target`); the
release is read from that folder's metadata. Two warm pools (autotune.trials.pool) run side by
side on the one GPU, each with its folder first on PYTHONPATH; only one holds a trial at a time,
the other waits between trials with nothing allocated but its CUDA context (which NVML's
device-wide figures of a trial, its device-used memory, count; torch's peak allocated memory,
which the comparison reads, does not). Both start at once, each with a throwaway trial
(--warmup: small, so that two fit side by side), so that neither release's first measured trial
pays for a fresh process or for the first trial of a call that Transformer Engine runs slow
(results/benchmarks/2026-11-25-h100-fp8.md).

Trials run as a grid runs them with fixed steps (tools/repeatability.py --fixed: 2 warm-up and 8
timed steps), in pairs: a layout under one release, then at once under the other. The order
swaps from one pair of a layout to its next (A B, B A, ...) and between neighbouring layouts
(A B, B A, A B, ...: never all of one release, then the other), so that a drift in the GPU's
clocks or the host's state falls on both. Round 1 runs every --once and --repeat layout,
alternating between the two lists (so that a deadline cuts both alike); rounds 2..--rounds run
the --repeat ones again; with --fill, rounds over every layout follow while pairs still fit. A
pair is started only when the deadline leaves room for both of its trials (their predicted wall
time, or the last measured one), so no trial is left without its twin.

OUT_DIR/trials.jsonl: one row per trial (tools/repeatability.py's row, plus the release, the
layout's global batch, and the peak allocated memory); tools/versions_table.py turns it into
the comparison. Trials that the memory model predicts not to fit are launched anyway.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from device_layouts import layout_fields  # tools/ is on sys.path: run as a script
from repeatability import FIXED_STEPS, FIXED_WARMUP, trial_row, trial_spec

from autotune.commands.estimate import layout_from_fields
from autotune.layouts.layout import Layout
from autotune.predict.cost import estimate_cost
from autotune.search.backends import trial_timeout_s
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model
from autotune.trials.metrics import metrics_from_run
from autotune.trials.pool import WarmPool
from autotune.trials.protocol import te_available
from autotune.trials.runner import RunOutput

GIB = 2**30
PAIR_OVERHEAD_S = 8.0
"""What a warm trial costs beyond its steps before any was measured (model build, the first
steps' compiles, the release; 3.4-6.8 s measured on H100 and H200)."""
DEFAULT_WARMUP = "gbs=4,mbs=2,impl=te"
WARMUP_TIMEOUT_S = 180.0
"""The throwaway trial's limit: it also pays for the pool's start (torchrun, the torch,
megatron-core and Transformer Engine imports; 28-34 s on H100 without TE)."""


@dataclass(frozen=True, slots=True)
class Release:
    """One megatron-core installed into a folder of its own."""

    label: str
    path: Path
    version: str

    @classmethod
    def parse(cls, text: str) -> Release:
        label, sep, folder = text.partition("=")
        if not sep or not label or not folder:
            raise argparse.ArgumentTypeError(f"--version takes LABEL=FOLDER, got {text!r}")
        path = Path(folder).resolve()
        found = [d.version for d in importlib.metadata.distributions(path=[str(path)])
                 if (d.metadata["Name"] or "").lower().replace("_", "-") == "megatron-core"]
        if len(found) != 1:
            raise argparse.ArgumentTypeError(f"{path} holds {len(found)} megatron-core "
                                             "installs, not one")
        return cls(label=label, path=path, version=found[0])

    def env(self) -> dict[str, str]:
        """The environment of this release's pool: its folder before everything else."""
        rest = os.environ.get("PYTHONPATH", "")
        return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(self.path), rest)
                                                            if p)}


@dataclass(frozen=True, slots=True)
class Case:
    """A layout to compare and the list it came from."""

    layout: Layout
    repeat: bool

    @property
    def key(self) -> str:
        """The layout's label with its global batch (labels leave the batch out)."""
        return f"gbs{self.layout.gbs} {self.layout.describe()}"


def schedule(once: list[Case], repeat: list[Case], rounds: int) -> list[tuple[int, Case]]:
    """(round, case) in the order they run: round 1 alternates the two lists, later rounds
    hold the repeated cases."""
    first: list[Case] = []
    for i in range(max(len(once), len(repeat))):
        first += [c[i] for c in (once, repeat) if i < len(c)]
    return [(1, c) for c in first] + [(r, c) for r in range(2, rounds + 1) for c in repeat]


def pair_order(releases: tuple[Release, Release], case: int, runs: int) -> tuple[Release, Release]:
    """The order of a case's pair: A B and B A in turn, pair after pair of the same layout, and
    starting the other way for every other layout (`case`: its place in round 1)."""
    return releases if (case + runs) % 2 == 0 else (releases[1], releases[0])


def estimated_wall_s(model: ModelSpec, s: Layout, cluster: ClusterSpec,
                     measured: dict[str, float], key: str) -> float:
    """A trial's wall time: the last one measured for the layout, else the model's steps
    (doubled: host-bound layouts run slower than predicted) plus PAIR_OVERHEAD_S."""
    if key in measured:
        return measured[key]
    step = estimate_cost(model, s, cluster).step_time_s
    return 2 * (FIXED_WARMUP + FIXED_STEPS) * step + PAIR_OVERHEAD_S


class Runner:
    """The two pools, the rows and the deadline."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, releases: tuple[Release, Release],
                 out: Path, deadline: float) -> None:
        self.model, self.cluster, self.releases, self.out = model, cluster, releases, out
        self.deadline = deadline
        self.pools = {r.label: WarmPool(out / f"pool-{r.label}", 1, env=r.env())
                      for r in releases}
        self.rows: list[dict[str, Any]] = []
        self.walls: dict[str, float] = {}
        self.trials = 0
        self.log = (out / "trials.jsonl").open("w")
        self._lock = threading.Lock()  # the two pools' first trials run in threads

    def run(self, release: Release, case: Case, round_: int, *, kind: str = "warm",
            steps: tuple[int, int] = (FIXED_WARMUP, FIXED_STEPS)) -> dict[str, Any]:
        spec = replace(trial_spec(self.model, case.layout, self.cluster, True),
                       warmup_steps=steps[0], train_steps=steps[1])
        predicted = estimate_cost(self.model, case.layout, self.cluster).step_time_s
        limit = WARMUP_TIMEOUT_S if kind == "warmup" else trial_timeout_s(predicted, spec)
        timeout = max(30.0, min(limit, self.deadline - time.monotonic()))
        with self._lock:
            self.trials += 1
            trial_dir = self.out / (f"{self.trials:02d}-{release.label}-r{round_}-"
                                    + case.key.replace(" ", "_"))
        t0 = time.monotonic()
        run: RunOutput = self.pools[release.label].run(spec, trial_dir, timeout)
        wall = time.monotonic() - t0
        metrics = metrics_from_run(run)
        peak = metrics.peak_allocated_bytes
        row = {**trial_row(kind, round_, case.layout, trial_dir, wall, metrics),
               "release": release.label, "megatron_core": release.version, "key": case.key,
               "gbs": case.layout.gbs, "repeat": case.repeat,
               "peak_allocated_gib": peak / GIB if peak else None,
               "pool_starts": self.pools[release.label].starts}
        with self._lock:
            if kind == "warm":
                self.walls[case.key] = wall
            self.rows.append(row)
            self.log.write(json.dumps(row) + "\n")
            self.log.flush()
            print(json.dumps({k: row[k] for k in ("kind", "release", "round", "key", "status",
                                                  "tokens_per_s", "step_time_cv", "gpu_idle")}),
                  flush=True)
        return row

    def warm_up(self, case: Case) -> None:
        """Both pools started at once, each with one short throwaway trial."""
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(lambda r: self.run(r, case, 0, kind="warmup", steps=(1, 1)),
                          self.releases))

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="append", required=True, type=Release.parse,
                        metavar="LABEL=FOLDER", help="a release and its folder (twice)")
    parser.add_argument("--once", nargs="+", default=[], metavar="LAYOUT",
                        help="layouts measured once under each release (GPU-bound ones)")
    parser.add_argument("--repeat", nargs="*", default=[], metavar="LAYOUT",
                        help="layouts measured --rounds times under each release")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--deadline-s", type=float, default=300.0,
                        help="no pair is started that would end later than this")
    parser.add_argument("--fill", action="store_true",
                        help="after the rounds, more rounds of every layout while time is left")
    parser.add_argument("--warmup", default=DEFAULT_WARMUP, metavar="LAYOUT",
                        help=f"the throwaway trial of each pool (default {DEFAULT_WARMUP}; "
                             "impl te becomes sdpa without Transformer Engine)")
    parser.add_argument("model")
    parser.add_argument("gpu")
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args()
    start = time.monotonic()
    if len(args.version) != 2:
        parser.error(f"give --version twice, got {len(args.version)}")
    releases: tuple[Release, Release] = (args.version[0], args.version[1])
    model = load_model(args.model)
    cluster = ClusterSpec.make(1, gpu=args.gpu)
    out = args.out_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    notes = [f"{args.model} on 1 x {args.gpu}; releases "
             + ", ".join(f"{r.label} (megatron-core {r.version} from {r.path})"
                         for r in releases)]
    has_te = te_available()

    def cases(texts: list[str], repeat: bool) -> list[Case]:
        kept = [t for t in texts if has_te or "impl=te" not in t]
        if len(kept) < len(texts):
            notes.append("Transformer Engine is not installed: left out "
                         + " ".join(t for t in texts if t not in kept))
        return [Case(layout_from_fields(model, cluster, layout_fields(t)), repeat)
                for t in kept]

    once, repeat = cases(args.once, False), cases(args.repeat, True)
    warm = args.warmup if has_te else args.warmup.replace("impl=te", "impl=sdpa")
    (out / "plan.json").write_text(json.dumps({
        "releases": [[r.label, r.version, str(r.path)] for r in releases],
        "once": [c.key for c in once], "repeat": [c.key for c in repeat],
        "rounds": args.rounds, "deadline_s": args.deadline_s, "warmup": warm}, indent=1))
    runner = Runner(model, cluster, releases, out, start + args.deadline_s)
    skipped: list[str] = []
    try:
        runner.warm_up(Case(layout_from_fields(model, cluster, layout_fields(warm)), False))
        plan = schedule(once, repeat, args.rounds)
        fill_round = args.rounds + 1
        ran = 0  # pairs run in the current fill round
        pairs: dict[str, int] = {}  # pairs run per layout
        place = {c.key: i for i, (_, c) in enumerate(schedule(once, repeat, 1))}
        while plan:
            round_, case = plan.pop(0)
            need = 2 * estimated_wall_s(model, case.layout, cluster, runner.walls, case.key)
            if time.monotonic() + need > runner.deadline:
                if round_ <= args.rounds:  # what a fill round leaves out is no shortfall
                    skipped.append(f"round {round_} {case.key} (needs ~{need:.0f} s)")
                continue
            for release in pair_order(releases, place[case.key], pairs.get(case.key, 0)):
                runner.run(release, case, round_)
            pairs[case.key] = pairs.get(case.key, 0) + 1
            ran += 1
            if not plan and args.fill and ran:
                plan = [(fill_round, c) for c in once + repeat]
                fill_round += 1
                ran = 0
    finally:
        runner.close()
    notes.append(f"wall {time.monotonic() - start:.0f} s, {runner.trials} trials (2 of them "
                 "the pools' throwaway first trials)")
    if skipped:
        notes.append("not run, past --deadline-s: " + "; ".join(skipped))
    (out / "notes.txt").write_text("\n".join(notes) + "\n")
    print("\n".join(notes))


if __name__ == "__main__":
    main()
