"""A standby launch: the cold launch of a trial made ahead of the trial, up to its first CUDA call.

A warm-pool search measures its leader once more in a fresh process before it stops
(autotune.search.finalists): the pool is stopped, and a cold launch pays again for torchrun,
Python and the torch and megatron-core imports. For gpt2-xl at seq 32k on one H100, 22 s of its
51.3 s passed between the pool's stop and the fresh process's first CUDA context (17.3 s of
them its own start-up and imports: results/benchmarks/2026-11-27-h100-issue24-baseline.md;
11.8 s of imports on one H200, 2026-11-27-h200x4-lanes). A Standby starts that launch when the
search starts, while the pool
starts too and nothing is timed: its ranks (`python -m autotune.worker --standby DIR`,
autotune.worker.standby) make those imports, say they are ready, and wait, touching no GPU. The
fresh run then hands it the trial (`run`), which it runs as `--spec --out-dir` would and exits:
the trial is a fresh process's, only sooner.

If the standby cannot stand by (a rank's imports initialised CUDA: it ends before it is ready),
or is gone by then, `run` returns None and the caller launches the trial cold as before. A
standby runs at most one trial; `close` stops one that was never used.

The ranks are an autotune.trials.rank_group.RankGroup, launched once; that module and
autotune.trials.runner are the only ones that start processes.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from autotune.errors import LaunchError
from autotune.trials.launchers import LOG_NAME, TORCHRUN
from autotune.trials.protocol import (
    DEFAULT_NCCL_TIMEOUT_S,
    POOL_POLL_S,
    POOL_STOP_NAME,
    SPEC_NAME,
    WORKER,
    PoolJob,
    standby_args,
    standby_ready_name,
    write_pool_job,
)
from autotune.trials.rank_group import RankGroup, RankGroupOwner
from autotune.trials.runner import DEFAULT_GRACE_S, RunOutput, TrialInterrupted
from autotune.trials.trial import TrialSpec

__all__ = ["STANDBY_LOG_NAME", "Standby"]

STANDBY_LOG_NAME = "log.txt"
"""The standby's whole output, in its folder; copied to the trial's log once it has run."""


class Standby(RankGroupOwner):
    """`nproc` worker ranks under one torchrun in `root`, started ahead of one cold trial."""

    def __init__(self, root: Path, nproc: int, *, env: Mapping[str, str] | None = None,
                 nccl_timeout_s: int = DEFAULT_NCCL_TIMEOUT_S,
                 grace_s: float = DEFAULT_GRACE_S, launcher: Sequence[str] = TORCHRUN,
                 worker: Sequence[str] = WORKER) -> None:
        self._ranks = RankGroup(nproc, what="standby", env=env, nccl_timeout_s=nccl_timeout_s,
                                grace_s=grace_s, launcher=launcher, worker=worker)
        self.root = Path(root).resolve()
        self.used = False
        """Handed a trial (or closed): a standby runs one trial at most."""

    @property
    def ready(self) -> bool:
        """Every rank has made its imports with CUDA untouched and waits for the trial."""
        return self.running and all((self.root / standby_ready_name(r)).exists()
                                    for r in range(self.nproc))

    def start(self) -> None:
        """Launch the ranks (they import and wait); once."""
        if self._ranks.launched or self.used:
            raise LaunchError("a standby is started once")
        # An earlier search's standby folder is emptied: its files are stale.
        self._ranks.launch(self.root, standby_args(self.root), STANDBY_LOG_NAME)

    def run(self, spec: TrialSpec, trial_dir: Path, timeout_s: float) -> RunOutput | None:
        """Run `spec` in the standby as a cold launch would, within `timeout_s` of now (the
        wait for the ranks to be ready included); None when it cannot (it ended before it was
        ready, or was used): then nothing was run, and the caller launches the trial cold."""
        self._ranks.check_trial(spec, timeout_s)
        if self.used or not self._ranks.launched:
            return None
        self.used = True
        trial_dir = Path(trial_dir).resolve()
        trial_dir.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        deadline = start + timeout_s
        timed_out = interrupted = False
        try:
            # Still importing: wait, it is sooner than a launch of its own.
            while not self.ready:
                if not self.running or time.monotonic() >= deadline:
                    self._ranks.note("[autotune] the standby was not ready: the trial runs cold")
                    self._ranks.stop()
                    return None
                time.sleep(POOL_POLL_S)
            spec.write(trial_dir / SPEC_NAME)
            write_pool_job(self.root, PoolJob(0, trial_dir / SPEC_NAME, trial_dir))
            timed_out = not self._ranks.wait(deadline)
        except KeyboardInterrupt:
            interrupted = True
        if timed_out or interrupted:
            self._ranks.note(f"[autotune] {'timed out' if timed_out else 'interrupted'} after "
                             f"{time.monotonic() - start:.1f} s; stopping the process tree "
                             f"(grace {self.grace_s:g} s)")
            try:
                if timed_out:
                    self._ranks.ask_for_stacks(trial_dir)
            except KeyboardInterrupt:
                interrupted = True
        self._ranks.stop()
        assert self._ranks.returncode is not None  # the ranks ran until stop() reaped them
        output = RunOutput(argv=self._ranks.argv, pid=self._ranks.pid,
                           returncode=self._ranks.returncode,
                           timed_out=timed_out, interrupted=interrupted,
                           wall_time_s=time.monotonic() - start,
                           log_path=_copy(self.root / STANDBY_LOG_NAME, trial_dir / LOG_NAME),
                           trial_dir=trial_dir)
        if interrupted:
            raise TrialInterrupted(output)
        return output

    def close(self) -> None:
        """Stop a standby that is still there: waiting ranks leave on the stop file, ranks
        still importing are signalled."""
        self.used = True
        if self.ready:
            (self.root / POOL_STOP_NAME).touch()
            self._ranks.wait_for_exit()
        self._ranks.stop()

    def __enter__(self) -> Standby:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _copy(log_path: Path, to: Path) -> Path:
    """The standby's log (its imports, then the trial) as the trial's log."""
    try:
        shutil.copy(log_path, to)
    except OSError:
        to.touch()
    return to
