"""A torchrun group of worker ranks in a folder: the launch the warm pool and the standby share.

autotune.trials.pool (WarmPool) and autotune.trials.standby (Standby) both keep worker ranks
under one torchrun that outlives a call: started in a folder of their own with the folder's log
as their output, handed trials through files there, told to leave by a stop file, and stopped.
What they hand the ranks differs (trial after trial, or one trial made ahead); how the ranks are
started, followed, asked for their stacks and stopped does not, and is written here once. The
pieces it is made of are a cold trial's (autotune.trials.runner: the launcher's argv, the
environment, notes and stack dumps in the log; autotune.trials.proctree: the tree followed,
signalled and reaped), so a rank group stops as a cold trial does.

With autotune.trials.runner, the only modules that start processes (the pool and the standby
start theirs through it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from autotune.errors import ConfigError, LaunchError
from autotune.trials.launchers import TORCHRUN
from autotune.trials.ports import free_port
from autotune.trials.proctree import ProcessTree, become_subreaper, shutdown, wait
from autotune.trials.protocol import (
    DEFAULT_NCCL_TIMEOUT_S,
    LEAVE_WAIT_S,
    POOL_PARENT_ENV,
    STACKS_NAME,
    WORKER,
)
from autotune.trials.runner import (
    DEFAULT_GRACE_S,
    ask_for_stacks,
    launcher_argv,
    note,
    trial_env,
)
from autotune.trials.trial import TrialSpec

__all__ = ["RankGroup", "RankGroupOwner"]


class RankGroup:
    """`nproc` worker ranks on this node under one torchrun, launched in a folder (again after
    each stop, if asked: one launch at a time)."""

    def __init__(self, nproc: int, *, what: str, env: Mapping[str, str] | None = None,
                 nccl_timeout_s: int = DEFAULT_NCCL_TIMEOUT_S,
                 grace_s: float = DEFAULT_GRACE_S, launcher: Sequence[str] = TORCHRUN,
                 worker: Sequence[str] = WORKER) -> None:
        if nproc < 1:
            raise ConfigError(f"a {what} needs at least one rank, got {nproc}")
        self.what = what
        """What the ranks are, in messages: "pool", "standby"."""
        self.nproc = nproc
        self.env = trial_env(env, nccl_timeout_s=nccl_timeout_s)
        # Waiting ranks leave once the orchestrator is gone (autotune.worker.serve.next_job).
        self.env[POOL_PARENT_ENV] = f"{socket.gethostname()}:{os.getpid()}"
        self.grace_s = grace_s
        self.launcher = tuple(launcher)
        self.worker = tuple(worker)
        self.argv: tuple[str, ...] = ()
        """The last launch's command line."""
        self.pid = -1
        """torchrun's pid in the last launch; -1 before one succeeded."""
        self.returncode: int | None = None
        """torchrun's exit status once the last launch is stopped; None until then."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._tree: ProcessTree | None = None
        self._log: BinaryIO | None = None
        self._log_path = Path()

    @property
    def launched(self) -> bool:
        """The ranks were launched (and may have been stopped since)."""
        return self.pid != -1

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def check_trial(self, spec: TrialSpec, timeout_s: float) -> None:
        """A trial these ranks can run: its layout's world size is theirs, its timeout positive."""
        if spec.layout.world_size != self.nproc:
            raise ConfigError(f"the {self.what} has {self.nproc} ranks but the layout needs "
                              f"{spec.layout.world_size}")
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be positive, got {timeout_s}")

    def launch(self, folder: Path, args: Sequence[str], log_name: str) -> None:
        """Start the ranks in `folder`, emptied first (what an earlier search left there is
        stale), with `args` after the worker's command and their output in `folder/log_name`."""
        become_subreaper()
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        self.returncode = None
        argv = [*launcher_argv(self.nproc, free_port(), self.launcher), *self.worker, *args]
        self.argv = tuple(argv)
        self._log_path = folder / log_name
        self._log = self._log_path.open("wb")
        try:
            self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                          stderr=subprocess.STDOUT, cwd=folder,
                                          env=self.env, start_new_session=True)
        except OSError as exc:
            self._log.close()
            self._log = None
            raise LaunchError(f"cannot start {argv[0]}: {exc}") from exc
        self.pid = self._proc.pid
        self._tree = ProcessTree(self._proc.pid)

    def exited(self) -> bool:
        """torchrun has exited (reaped: its tree is followed from its descendants on)."""
        assert self._proc is not None and self._tree is not None, "not running: launch first"
        if self._proc.poll() is None:
            return False
        self._tree.root_reaped = True
        return True

    def refresh_tree(self) -> None:
        """Read the ranks' process tree again (for a clean stop later)."""
        assert self._tree is not None, "not running: launch first"
        self._tree.refresh()

    def wait(self, deadline: float) -> bool:
        """True when torchrun exited before `deadline` (time.monotonic()); follows the tree
        meanwhile."""
        assert self._proc is not None and self._tree is not None, "not running: launch first"
        return wait(self._proc, self._tree, deadline)

    def wait_for_exit(self) -> None:
        """Give torchrun LEAVE_WAIT_S to exit by itself (ranks told to leave, or ended by
        torchrun after one failed) before anything is signalled."""
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=LEAVE_WAIT_S)

    def note(self, line: str) -> None:
        """A line of the orchestrator's in the ranks' log."""
        if self._log is not None:
            note(self._log, line)

    def ask_for_stacks(self, trial_dir: Path) -> None:
        """As a timed-out cold trial: each rank's Python stacks, copied into the trial."""
        if self._tree is None or self._log is None:
            return
        ask_for_stacks(self._log, self._log_path, self._tree)
        for stacks in self._log_path.parent.glob(STACKS_NAME.format(rank="*")):
            with contextlib.suppress(OSError):
                shutil.copy(stacks, trial_dir / stacks.name)

    def stop(self) -> None:
        """Stop and reap whatever of the ranks still runs (SIGTERM, grace_s, SIGKILL), keep
        torchrun's exit status, close the log."""
        if self._proc is not None and self._tree is not None:
            shutdown(self._proc, self._tree, self.grace_s)
            self.returncode = self._proc.returncode
        self._proc = None
        self._tree = None
        if self._log is not None:
            self._log.close()
            self._log = None


class RankGroupOwner:
    """What an owner of a RankGroup (kept in `_ranks`) shows of it, read through: whether it
    runs, and its settings (the public attributes WarmPool and Standby had before they shared
    it)."""

    _ranks: RankGroup

    @property
    def running(self) -> bool:
        return self._ranks.running

    @property
    def nproc(self) -> int:
        return self._ranks.nproc

    @property
    def env(self) -> dict[str, str]:
        return self._ranks.env

    @property
    def grace_s(self) -> float:
        return self._ranks.grace_s

    @property
    def launcher(self) -> tuple[str, ...]:
        return self._ranks.launcher

    @property
    def worker(self) -> tuple[str, ...]:
        return self._ranks.worker
