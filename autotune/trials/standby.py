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

With autotune.trials.runner and autotune.trials.pool, the only modules that start processes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from autotune.errors import ConfigError, LaunchError
from autotune.trials.launchers import LOG_NAME, TORCHRUN
from autotune.trials.ports import free_port
from autotune.trials.proctree import ProcessTree, become_subreaper, shutdown, wait
from autotune.trials.protocol import (
    DEFAULT_NCCL_TIMEOUT_S,
    LEAVE_WAIT_S,
    POOL_PARENT_ENV,
    POOL_POLL_S,
    POOL_STOP_NAME,
    SPEC_NAME,
    STACKS_NAME,
    WORKER,
    PoolJob,
    standby_args,
    standby_ready_name,
    write_pool_job,
)
from autotune.trials.runner import (
    DEFAULT_GRACE_S,
    RunOutput,
    TrialInterrupted,
    ask_for_stacks,
    launcher_argv,
    note,
    trial_env,
)
from autotune.trials.trial import TrialSpec

__all__ = ["STANDBY_LOG_NAME", "Standby"]

STANDBY_LOG_NAME = "log.txt"
"""The standby's whole output, in its folder; copied to the trial's log once it has run."""


class Standby:
    """`nproc` worker ranks under one torchrun in `root`, started ahead of one cold trial."""

    def __init__(self, root: Path, nproc: int, *, env: Mapping[str, str] | None = None,
                 nccl_timeout_s: int = DEFAULT_NCCL_TIMEOUT_S,
                 grace_s: float = DEFAULT_GRACE_S, launcher: Sequence[str] = TORCHRUN,
                 worker: Sequence[str] = WORKER) -> None:
        if nproc < 1:
            raise ConfigError(f"a standby needs at least one rank, got {nproc}")
        self.root = Path(root).resolve()
        self.nproc = nproc
        self.env = trial_env(env, nccl_timeout_s=nccl_timeout_s)
        # Waiting ranks leave once the orchestrator is gone (autotune.worker.serve.next_job).
        self.env[POOL_PARENT_ENV] = f"{socket.gethostname()}:{os.getpid()}"
        self.grace_s = grace_s
        self.launcher = tuple(launcher)
        self.worker = tuple(worker)
        self._proc: subprocess.Popen[bytes] | None = None
        self._tree: ProcessTree | None = None
        self._log: BinaryIO | None = None
        self._argv: tuple[str, ...] = ()
        self.used = False
        """Handed a trial (or closed): a standby runs one trial at most."""

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def ready(self) -> bool:
        """Every rank has made its imports with CUDA untouched and waits for the trial."""
        return self.running and all((self.root / standby_ready_name(r)).exists()
                                    for r in range(self.nproc))

    def start(self) -> None:
        """Launch the ranks (they import and wait); once."""
        if self._proc is not None or self.used:
            raise LaunchError("a standby is started once")
        become_subreaper()
        if self.root.exists():  # an earlier search's standby folder: its files are stale
            shutil.rmtree(self.root)
        self.root.mkdir(parents=True)
        argv = [*launcher_argv(self.nproc, free_port(), self.launcher), *self.worker,
                *standby_args(self.root)]
        self._argv = tuple(argv)
        self._log = (self.root / STANDBY_LOG_NAME).open("wb")
        try:
            self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                          stderr=subprocess.STDOUT, cwd=self.root,
                                          env=self.env, start_new_session=True)
        except OSError as exc:
            self._log.close()
            self._log = None
            raise LaunchError(f"cannot start {argv[0]}: {exc}") from exc
        self._tree = ProcessTree(self._proc.pid)

    def run(self, spec: TrialSpec, trial_dir: Path, timeout_s: float) -> RunOutput | None:
        """Run `spec` in the standby as a cold launch would, within `timeout_s` of now (the
        wait for the ranks to be ready included); None when it cannot (it ended before it was
        ready, or was used): then nothing was run, and the caller launches the trial cold."""
        if spec.layout.world_size != self.nproc:
            raise ConfigError(f"the standby has {self.nproc} ranks but the layout needs "
                              f"{spec.layout.world_size}")
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be positive, got {timeout_s}")
        if self.used or self._proc is None or self._tree is None:
            return None
        self.used = True
        proc, tree = self._proc, self._tree
        trial_dir = Path(trial_dir).resolve()
        trial_dir.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        deadline = start + timeout_s
        timed_out = interrupted = False
        try:
            # Still importing: wait, it is sooner than a launch of its own.
            while not self.ready:
                if not self.running or time.monotonic() >= deadline:
                    self._note("[autotune] the standby was not ready: the trial runs cold")
                    self._stop()
                    return None
                time.sleep(POOL_POLL_S)
            spec.write(trial_dir / SPEC_NAME)
            write_pool_job(self.root, PoolJob(0, trial_dir / SPEC_NAME, trial_dir))
            timed_out = not wait(proc, tree, deadline)
        except KeyboardInterrupt:
            interrupted = True
        if timed_out or interrupted:
            self._note(f"[autotune] {'timed out' if timed_out else 'interrupted'} after "
                       f"{time.monotonic() - start:.1f} s; stopping the process tree "
                       f"(grace {self.grace_s:g} s)")
            try:
                if timed_out:
                    self._ask_for_stacks(trial_dir)
            except KeyboardInterrupt:
                interrupted = True
        self._stop()
        output = RunOutput(argv=self._argv, pid=proc.pid, returncode=proc.returncode,
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
            if self._proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=LEAVE_WAIT_S)
        self._stop()

    def __enter__(self) -> Standby:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals -----------------------------------------------------------------------

    def _ask_for_stacks(self, trial_dir: Path) -> None:
        if self._tree is None or self._log is None:
            return
        ask_for_stacks(self._log, self.root / STANDBY_LOG_NAME, self._tree)
        for stacks in self.root.glob(STACKS_NAME.format(rank="*")):
            with contextlib.suppress(OSError):
                shutil.copy(stacks, trial_dir / stacks.name)

    def _note(self, line: str) -> None:
        if self._log is not None:
            note(self._log, line)

    def _stop(self) -> None:
        """Stop and reap whatever of the standby still runs."""
        if self._proc is not None and self._tree is not None:
            shutdown(self._proc, self._tree, self.grace_s)
        if self._log is not None:
            self._log.close()
            self._log = None


def _copy(log_path: Path, to: Path) -> Path:
    """The standby's log (its imports, then the trial) as the trial's log."""
    try:
        shutil.copy(log_path, to)
    except OSError:
        to.touch()
    return to
