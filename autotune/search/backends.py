"""Where a trial's numbers come from: the analytical models, the built-in megatron-core worker,
or Megatron-LM's pretrain_gpt.py. Each backend turns a TrialSpec into TrialMetrics."""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from autotune.errors import ConfigError, LaunchError, parse_choice
from autotune.inputs.files import usable_name
from autotune.inputs.untrusted import shown
from autotune.predict.cost import CostParams, estimate_cost
from autotune.predict.memory import MemoryParams, estimate_memory
from autotune.specs.hardware import ClusterSpec
from autotune.trials.launchers import TORCHRUN, MultiNode
from autotune.trials.protocol import WORKER
from autotune.trials.trial import TrialMetrics, TrialSpec, TrialStatus

if TYPE_CHECKING:
    from autotune.trials.pool import WarmPool
    from autotune.trials.standby import Standby

__all__ = ["CONFIRMED_COLD", "POOL_DIR", "STANDBY_DIR", "WARM_FAILURE_DIR", "Backend",
           "BackendName", "Isolation", "MegatronLMBackend", "SimulateBackend", "WorkerBackend",
           "check_checkout", "make_backend", "trial_timeout_s"]


class BackendName(enum.StrEnum):
    """Where trials run: auto (worker with GPUs, else simulate), simulate (the analytical
    models), worker (autotune's megatron-core worker) or megatron-lm (pretrain_gpt.py)."""

    AUTO = "auto"
    SIMULATE = "simulate"
    WORKER = "worker"
    MEGATRON_LM = "megatron-lm"

    @classmethod
    def parse(cls, name: str) -> BackendName:
        return parse_choice(cls, name, "backend")


class Isolation(enum.StrEnum):
    """How real trials share processes: warm (one pool of worker ranks for the whole search,
    autotune.trials.pool; started again cold after anything that leaves it in doubt) or cold (a
    launch of its own for every trial)."""

    WARM = "warm"
    COLD = "cold"

    @classmethod
    def parse(cls, name: str) -> Isolation:
        return parse_choice(cls, name, "isolation")


log = logging.getLogger(__name__)

POOL_DIR = "pool"
"""The warm pool's folder, beside the study's trials folder."""

WARM_FAILURE_DIR = "warm-failure"
"""Inside a trial's folder: what its failed run in the warm pool left (log, failure files),
kept when the trial runs again in a fresh process."""

CONFIRMED_COLD = frozenset({TrialStatus.OOM, TrialStatus.CRASH, TrialStatus.NCCL_ERROR})
"""Warm outcomes a fresh process confirms before they count: the pool's leftovers can cause
them (WorkerBackend._confirm_cold). A timeout or a hang is not retried: it already cost its
whole limit, and the pool restarts after one anyway."""

STANDBY_DIR = "standby"
"""The standby launch's folder (autotune.trials.standby), beside the study's trials folder."""

LAUNCH_OVERHEAD_S = 60.0
"""Launch, rendezvous, model build and CUDA/NCCL initialisation before the first step; the
per-trial timeout adds this to the predicted time of the steps."""


class Backend(Protocol):
    """Runs one trial."""

    @property
    def name(self) -> str: ...

    @property
    def predicted(self) -> bool:
        """True when the numbers are predictions, not measurements."""
        ...

    def run(self, spec: TrialSpec, trial_dir: Path, timeout_s: float) -> TrialMetrics: ...

    def close(self) -> None:
        """Release what the backend keeps between trials (a warm pool's processes)."""
        ...


def trial_timeout_s(predicted_step_s: float, spec: TrialSpec, factor: float = 4.0) -> float:
    """Launch overhead plus `factor` times the predicted time of every step of the trial."""
    steps = spec.warmup_steps + spec.train_steps
    return LAUNCH_OVERHEAD_S + factor * steps * max(predicted_step_s, 0.05)


@dataclass(frozen=True, slots=True)
class SimulateBackend:
    """Numbers from the analytical memory and throughput models: nothing is launched."""

    cluster: ClusterSpec
    cost_params: CostParams | None = None
    memory_params: MemoryParams | None = None
    name: str = BackendName.SIMULATE
    predicted: bool = True

    def run(self, spec: TrialSpec, trial_dir: Path, timeout_s: float) -> TrialMetrics:
        memory = estimate_memory(spec.model, spec.layout, self.cluster, self.memory_params)
        # The peak against the capacity, as the gate launches: a layout the block rule alone
        # rules out (memory.BLOCK_MARGIN) is a risk the gate runs, so a plan ranks it too.
        if memory.peak_bytes > memory.capacity_bytes:
            return TrialMetrics(status=TrialStatus.PREDICTED_OOM, predicted=True,
                                peak_allocated_bytes=int(memory.peak_bytes),
                                error=memory.explain())
        cost = estimate_cost(spec.model, spec.layout, self.cluster, self.cost_params)
        return TrialMetrics(status=TrialStatus.OK, predicted=True,
                            step_time_s=cost.step_time_s, step_time_p90_s=cost.step_time_s,
                            tokens_per_s=cost.tokens_per_s, tflops_per_gpu=cost.tflops_per_gpu,
                            mfu=cost.mfu, peak_allocated_bytes=int(memory.peak_bytes),
                            peak_reserved_bytes=int(memory.peak_bytes), loss_finite=True)

    def close(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class WorkerBackend:
    """Real training steps: autotune's megatron-core worker under torchrun, on this node or,
    with `multi`, over several nodes (srun or a torchrun rendezvous). On one node, trials run
    in a warm pool unless `isolation` is cold; over several nodes each trial is its own
    launch."""

    multi: MultiNode | None = None
    isolation: Isolation = Isolation.WARM
    name: str = BackendName.WORKER
    predicted: bool = False
    pools: dict[tuple[Path, int], WarmPool] = field(default_factory=dict, compare=False,
                                                     repr=False)
    """The warm pools started, by folder and ranks (one per search in practice)."""
    launcher: tuple[str, ...] = TORCHRUN
    """torchrun's command; tests put a double here."""
    worker: tuple[str, ...] = WORKER
    """The worker's command for cold trials."""
    pool_worker: tuple[str, ...] | None = None
    """The command a pool's ranks run (None: the same as `worker`; the pool adds --serve)."""
    standbys: dict[tuple[Path, int], Standby] = field(default_factory=dict, compare=False,
                                                      repr=False)
    """Standby launches started for a fresh run to come, by folder and ranks."""
    standby_worker: tuple[str, ...] | None = None
    """The command a standby's ranks run (None: `worker`; the standby adds --standby)."""

    def run(self, spec: TrialSpec, trial_dir: Path, timeout_s: float) -> TrialMetrics:
        from autotune.trials.metrics import metrics_from_run
        from autotune.trials.runner import run_multinode_trial

        if self.multi is not None:
            return metrics_from_run(run_multinode_trial(spec, trial_dir, self.multi,
                                                        timeout_s=timeout_s))
        if self.isolation is Isolation.COLD:
            return self._run_cold(spec, trial_dir, timeout_s)
        pool = self.pool(trial_dir, spec.layout.world_size)
        metrics = metrics_from_run(pool.run(spec, trial_dir, timeout_s))
        if metrics.status in CONFIRMED_COLD:
            return self._confirm_cold(spec, Path(trial_dir), timeout_s, pool)
        return metrics

    def run_fresh(self, spec: TrialSpec, trial_dir: Path, timeout_s: float) -> TrialMetrics:
        """Run a trial in a fresh process even where trials run warm (a finalist's cold
        repeat, autotune.search.finalists): the pools are stopped first, so that they hold no
        GPU memory, and start again on the next trial. The process is the standby started for
        it (`stand_by`) where there is one that can run it, else a launch of its own. Backends
        without this method start every trial fresh."""
        if self.multi is not None:
            return self.run(spec, trial_dir, timeout_s)
        for pool in self.pools.values():
            pool.close()
        from autotune.trials.metrics import metrics_from_run

        standby = self.standbys.pop(self._standby_key(Path(trial_dir).parent,
                                                      spec.layout.world_size), None)
        if standby is not None:
            try:
                output = standby.run(spec, trial_dir, timeout_s)
            finally:
                standby.close()
            if output is not None:
                return metrics_from_run(output)
        return self._run_cold(spec, trial_dir, timeout_s)

    def stand_by(self, trials_dir: Path, nproc: int) -> None:
        """Start now the fresh process that a later `run_fresh` of `nproc` ranks in the study
        of `trials_dir` will run in (autotune.trials.standby): its launch and imports overlap
        the search instead of adding to that run. Nothing over several nodes or with cold
        isolation, whose trials are each a launch of their own."""
        if self.multi is not None or self.isolation is Isolation.COLD:
            return
        from autotune.trials.standby import Standby

        key = self._standby_key(Path(trials_dir), nproc)
        if key in self.standbys:
            return
        standby = Standby(*key, launcher=self.launcher, worker=self.standby_worker or self.worker)
        try:
            standby.start()
        except (LaunchError, OSError) as exc:
            # Only time is at stake: the fresh run then launches as it always did, and a
            # launcher that cannot start fails the first trial with the same message.
            log.warning("no standby for the fresh run: %s", exc)
            return
        self.standbys[key] = standby

    @staticmethod
    def _standby_key(trials_dir: Path, nproc: int) -> tuple[Path, int]:
        return trials_dir.resolve().parent / STANDBY_DIR, nproc

    def _run_cold(self, spec: TrialSpec, trial_dir: Path, timeout_s: float) -> TrialMetrics:
        from autotune.trials.metrics import metrics_from_run
        from autotune.trials.runner import run_trial

        return metrics_from_run(run_trial(spec, trial_dir, timeout_s=timeout_s,
                                          launcher=self.launcher, worker=self.worker))

    def _confirm_cold(self, spec: TrialSpec, trial_dir: Path, timeout_s: float,
                      pool: WarmPool) -> TrialMetrics:
        """Run a trial that ran out of memory or crashed in the warm pool again, alone in a
        fresh process (CONFIRMED_COLD).

        A warm rank keeps what earlier trials left behind (allocator segments, library
        workspaces, loaded libraries and kernels), so its failure may be the pool's and not the
        layout's; an OOM teaches the memory gate, which then skips layouts, and a crash drops the
        layout from the search. Seen on an H100 with Transformer Engine: gpt2-xl mbs 16 with
        selective recompute ran out of memory in the pool in two searches and fit in a fresh
        process at 76.8 GiB of 79.2 (results/benchmarks/2026-11-23-h100-te-build-and-runs.md).
        Seen on 2 x H200 twice (2026-11-27, lanes and issue 30's repeat): a cp 2 layout with
        TE's fused attention crashed in the pool after sdpa trials with cuDNN's
        CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED and ran in every fresh process. The pool is
        stopped first so that it holds no memory, and starts again on the next trial; the warm
        run's files are kept aside (WARM_FAILURE_DIR)."""
        from autotune.trials.protocol import SPEC_NAME

        aside = trial_dir / WARM_FAILURE_DIR
        aside.mkdir(exist_ok=True)
        for path in trial_dir.iterdir():
            if path.is_file() and path.name != SPEC_NAME:
                path.replace(aside / path.name)
        pool.close()
        return self._run_cold(spec, trial_dir, timeout_s)

    def pool(self, trial_dir: Path, nproc: int) -> WarmPool:
        """The pool for trials in `trial_dir`'s study (results/<study>/pool), started on its
        first trial."""
        from autotune.trials.pool import WarmPool

        key = (Path(trial_dir).resolve().parent.parent / POOL_DIR, nproc)
        if key not in self.pools:
            self.pools[key] = WarmPool(*key, launcher=self.launcher,
                                       worker=self.pool_worker or self.worker)
        return self.pools[key]

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        for standby in self.standbys.values():
            standby.close()
        self.standbys.clear()


@dataclass(frozen=True, slots=True)
class MegatronLMBackend:
    """Real training steps of Megatron-LM's own pretrain_gpt.py (a checkout at `path`, or the
    .py script `path` names)."""

    path: Path
    name: str = BackendName.MEGATRON_LM
    predicted: bool = False

    def run(self, spec: TrialSpec, trial_dir: Path, timeout_s: float) -> TrialMetrics:
        from autotune.trials.metrics import metrics_from_megatron_log
        from autotune.trials.runner import run_megatron_lm_trial

        output = run_megatron_lm_trial(self.path, spec, trial_dir, timeout_s=timeout_s)
        return metrics_from_megatron_log(output, spec)

    def close(self) -> None:
        pass


def check_checkout(megatron_lm: str) -> None:
    """A search's --megatron-lm, or ConfigError in one line: empty or with a control character,
    missing, or a folder without pretrain_gpt.py. Checked on this machine, where the search
    launches it (export's --megatron-lm names a path on the machine that runs the script)."""
    from autotune.megatron.megatron_args import training_script

    usable_name(megatron_lm, "--megatron-lm")
    hint = "give a Megatron-LM checkout or the .py script to launch"
    if not Path(megatron_lm).exists():
        raise ConfigError(f"--megatron-lm {shown(megatron_lm)} does not exist ({hint})")
    if not Path(training_script(megatron_lm)).is_file():
        raise ConfigError(f"--megatron-lm {shown(megatron_lm)}: no "
                          f"{shown(training_script(megatron_lm))} ({hint})")


def make_backend(name: BackendName | str, cluster: ClusterSpec, megatron_lm: str | None = None,
                 cost_params: CostParams | None = None,
                 memory_params: MemoryParams | None = None,
                 multi: MultiNode | None = None,
                 isolation: Isolation | str = Isolation.WARM) -> Backend:
    """The backend called `name` (simulate, worker, megatron-lm)."""
    name = BackendName.parse(name)
    if name == BackendName.SIMULATE:
        return SimulateBackend(cluster, cost_params, memory_params)
    if name == BackendName.WORKER:
        return WorkerBackend(multi, Isolation.parse(isolation))
    if name == BackendName.MEGATRON_LM:
        if megatron_lm is None:
            raise ConfigError("--backend megatron-lm needs --megatron-lm PATH (a Megatron-LM "
                              "checkout)")
        check_checkout(megatron_lm)
        return MegatronLMBackend(Path(megatron_lm))
    raise ConfigError("--backend auto is resolved (commands.search) before a backend is made")
