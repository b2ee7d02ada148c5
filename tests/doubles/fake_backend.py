"""A scripted Backend for CPU tests of the search loop: outcomes are functions the test controls.

`FakeBackend` measures nothing: a layout runs out of memory when its "true" memory (the memory
model's prediction times `underestimate`) exceeds `true_capacity_bytes`, or when `oom` says so;
tokens/s come from `tokens`. Every layout it is asked to run is recorded in `calls`.
`predicted` is False, so the loop uses real SQLite storage with heartbeats.

Also importable from a subprocess (the killed-process test): put tests/ on sys.path.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from autotune.layouts.layout import Layout
from autotune.predict.memory import estimate_memory
from autotune.search.space import SearchSpace, space_from_mapping
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model
from autotune.trials.trial import TrialMetrics, TrialSpec, TrialStatus

GIB = 2**30

SMALL_SPACE: dict[str, list[object]] = {
    "tp": [1, 2], "pp": [1, 2], "mbs": [1, 2, 4, 8, 16],
    "sequence_parallel": [False, True], "distributed_optimizer": [False, True],
    "overlap_grad_reduce": [True], "overlap_param_gather": [False, True],
    "recompute": ["none"], "impl": ["sdpa"],
}
"""90 valid layouts of gpt2-medium on 4 GPUs; predicted peaks from 3.5 to 25 GiB."""


def small_space(**overrides: list[object]) -> SearchSpace:
    return space_from_mapping({**SMALL_SPACE, **overrides}, "test-space")


def small_cluster(num_gpus: int = 4, memory_gib: float = 12.0) -> ClusterSpec:
    """A100-40GB figures with `memory_gib` of memory, so some layouts are predicted not to fit."""
    gpu = replace(gpu_spec("a100-40gb"), memory_bytes=int(memory_gib * GIB))
    return ClusterSpec(num_gpus=num_gpus, gpus_per_node=num_gpus, gpu=gpu)


def small_model() -> ModelSpec:
    return load_model("gpt2-medium")


def default_tokens(s: Layout) -> float:
    """More data parallelism and larger micro-batches are faster; pipelines pay a bubble."""
    return 1000.0 * s.dp * (1 + 0.1 * s.mbs) / (1 + 0.2 * (s.pp - 1)) * (1.05 if
                                                                        s.distributed_optimizer
                                                                        else 1.0)


@dataclass
class FakeBackend:
    """Runs nothing; answers from the functions it was given and records what it was asked."""

    cluster: ClusterSpec
    true_capacity_bytes: float | None = None
    """Real memory: a trial whose true peak exceeds this runs out of memory (None: never)."""
    underestimate: float = 1.0
    """True peak = predicted peak x this."""
    oom: Callable[[Layout], bool] = lambda s: False
    tokens: Callable[[Layout], float] = default_tokens
    block_on_call: int | None = None
    """The call (1-based) that blocks forever, until the process is killed."""
    started_marker: Path | None = None
    """Written when the blocking call starts."""
    interrupt_on_call: int | None = None
    """The call (1-based) that raises KeyboardInterrupt, as Ctrl-C would."""
    delay_s: float = 0.0
    """Seconds each run takes, so that workers sharing a study overlap (tests/test_postgres.py)."""
    launch_log: Path | None = None
    """Each run appends `<pid> <layout>` here before it starts: the launches of all processes."""
    calls: list[Layout] = field(default_factory=list)
    name: str = "fake"
    predicted: bool = False
    closed: int = 0
    """How many times the search closed the backend (once, at its end)."""

    def true_peak_bytes(self, spec: TrialSpec) -> float:
        predicted = estimate_memory(spec.model, spec.layout, self.cluster).peak_bytes
        return predicted * self.underestimate

    def close(self) -> None:
        self.closed += 1

    def run(self, spec: TrialSpec, trial_dir: Path, timeout_s: float) -> TrialMetrics:
        s = spec.layout
        self.calls.append(s)
        n = len(self.calls)
        if self.launch_log is not None:
            # One short O_APPEND write per launch: lines of concurrent workers never interleave.
            with self.launch_log.open("a") as f:
                f.write(f"{os.getpid()} {s.describe()}\n")
        if n == self.block_on_call:
            if self.started_marker is not None:
                self.started_marker.write_text(s.describe())
            while True:
                time.sleep(60)
        if n == self.interrupt_on_call:
            raise KeyboardInterrupt
        time.sleep(self.delay_s)
        peak = self.true_peak_bytes(spec)
        over = self.true_capacity_bytes is not None and peak > self.true_capacity_bytes
        if over or self.oom(s):
            return TrialMetrics(status=TrialStatus.OOM, error="CUDA out of memory (fake)",
                                peak_allocated_bytes=int(peak))
        tokens = self.tokens(s)
        step = s.gbs * spec.model.seq_length / tokens
        return TrialMetrics(status=TrialStatus.OK, step_time_s=step, step_time_p90_s=step,
                            tokens_per_s=tokens, tflops_per_gpu=100.0, mfu=0.3,
                            peak_allocated_bytes=int(peak), peak_reserved_bytes=int(peak),
                            loss_finite=True)


def main(argv: list[str]) -> None:
    """`python fake_backend.py RESULTS_DIR MARKER TRIALS`: a search whose third launched trial
    blocks until the process is killed (the killed-process resume test)."""
    from no_fsync import sqlite_without_fsync  # run as a script: this folder is on sys.path

    from autotune.search import SearchConfig, run_search

    sqlite_without_fsync()  # as in the test process
    results_dir, marker, trials = Path(argv[0]), Path(argv[1]), int(argv[2])
    cluster = small_cluster()
    backend = FakeBackend(cluster, block_on_call=3, started_marker=marker)
    run_search(SearchConfig(model=small_model(), cluster=cluster, space=small_space(),
                            backend=backend, results_dir=results_dir, study_name="killed",
                            sampler="tpe", n_trials=trials))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
