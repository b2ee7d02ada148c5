"""Finding and stopping a trial's process tree, for autotune.trials.runner (and
autotune.trials.rank_group, the pool's and the standby's ranks, started the same way).

This module is part of their job: it follows the tree they started, signals it (SIGTERM,
SIGKILL) and reaps it. It starts none.

torchrun starts each worker with `start_new_session=True` (torch/distributed/elastic/
multiprocessing/subprocess_handler), so the workers are not in torchrun's process group: killing
that group alone would orphan them. The tree is therefore followed while the trial runs
(psutil reads the process table: parent, start time, state) and every process group in it is
signalled; on Linux the orchestrator also becomes a child subreaper (prctl
PR_SET_CHILD_SUBREAPER) so orphaned trial processes become its children and can be reaped,
instead of lingering as zombies under a container init that never reaps.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import psutil

__all__ = ["ProcessTree", "become_subreaper", "shutdown", "wait"]

logger = logging.getLogger(__name__)

_POLL_S = 0.25
"""How often the runner re-reads the process tree while a trial runs."""
_REAP_S = 5.0
"""After SIGKILL, how long to wait for the kernel to release every process of the trial."""


def wait(proc: subprocess.Popen[bytes], tree: ProcessTree, deadline: float) -> bool:
    """True when the process exited before `deadline`; follows the tree meanwhile."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        try:
            proc.wait(timeout=min(_POLL_S, remaining))
        except subprocess.TimeoutExpired:
            tree.refresh()
        else:
            tree.root_reaped = True
            return True


def shutdown(proc: subprocess.Popen[bytes], tree: ProcessTree, grace_s: float) -> None:
    """SIGTERM whatever of the tree still runs, wait `grace_s`, SIGKILL the rest, reap."""
    tree.refresh()
    if proc.poll() is None or tree.running():
        tree.signal(signal.SIGTERM)
        end = time.monotonic() + grace_s
        try:
            while time.monotonic() < end:
                if proc.poll() is not None:
                    tree.root_reaped = True
                tree.reap()
                if proc.returncode is not None and not tree.running():
                    break
                time.sleep(0.05)
        except KeyboardInterrupt:
            pass  # a second Ctrl-C: skip the rest of the grace period, kill now
        if proc.poll() is None or tree.running():
            tree.signal(signal.SIGKILL)
    proc.wait()
    tree.root_reaped = True
    end = time.monotonic() + _REAP_S
    while tree.present() and time.monotonic() < end:
        tree.signal(signal.SIGKILL)
        tree.reap()
        time.sleep(0.02)
    if tree.present():
        logger.warning("processes of trial %d outlived SIGKILL: %s", proc.pid,
                       sorted(tree.present()))


_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def become_subreaper() -> None:
    """Adopt orphaned descendants (Linux), so a killed trial leaves no unreaped zombies."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: orphans go to init, as without us
        logger.debug("prctl(PR_SET_CHILD_SUBREAPER) unavailable")


@dataclass(frozen=True, slots=True)
class _Proc:
    pid: int
    ppid: int
    pgrp: int
    start: float
    """Start time (psutil's create_time): with the pid, identifies a process across pid
    reuse."""
    zombie: bool


def _scan() -> dict[int, _Proc]:
    """Every process this user can see, by pid."""
    procs: dict[int, _Proc] = {}
    for proc in psutil.process_iter(["ppid", "create_time", "status"]):
        info = proc.info  # a process that exited meanwhile is left out; AccessDenied: None
        if info["ppid"] is None or info["create_time"] is None:
            continue
        try:
            # psutil has no process group; the kernel answers for zombies too.
            pgrp = os.getpgid(proc.pid)
        except OSError:
            continue  # exited between the listing and here
        procs[proc.pid] = _Proc(proc.pid, info["ppid"], pgrp, info["create_time"],
                                info["status"] == psutil.STATUS_ZOMBIE)
    return procs


class ProcessTree:
    """The processes a trial started: its root, the root's group, and every descendant seen."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.root_reaped = False
        """Set once Popen reaped the root: its pid may be reused, so walks stop starting there."""
        self.known: dict[int, float] = {}
        """pid -> start time of every process seen in the tree (root excluded)."""
        self._procs: dict[int, _Proc] = {}
        self.refresh()

    def refresh(self) -> None:
        procs = _scan()
        self._procs = procs
        ours = {p.pid for p in self._members()}
        if not self.root_reaped:
            ours.add(self.root)
        children: dict[int, list[int]] = {}
        for p in procs.values():
            children.setdefault(p.ppid, []).append(p.pid)
        frontier = list(ours)
        while frontier:
            for child in children.get(frontier.pop(), ()):
                if child not in ours:
                    ours.add(child)
                    frontier.append(child)
        # Processes that stayed in the trial's group after their parent died are ours too.
        ours |= {p.pid for p in procs.values() if p.pgrp == self.root}
        for pid in ours - {self.root}:
            self.known.setdefault(pid, procs[pid].start)

    def _members(self) -> list[_Proc]:
        """Known processes still in the process table (zombies included), pid reuse excluded."""
        return [p for pid, start in self.known.items()
                if (p := self._procs.get(pid)) is not None and p.start == start]

    def running(self) -> bool:
        return any(not p.zombie for p in self._members())

    def present(self) -> set[int]:
        self.refresh()
        return {p.pid for p in self._members()}

    def signal(self, sig: signal.Signals) -> None:
        self.refresh()
        members = self._members()
        own_group = os.getpgrp()
        groups = {p.pgrp for p in members}
        if not self.root_reaped:
            groups.add(self.root)
        for group in groups - {own_group, 0, 1}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
        for p in members:  # also those that moved into a group of their own after the scan
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p.pid, sig)

    def reap(self) -> None:
        """waitpid the orphans we adopted as subreaper; the root is Popen's to reap."""
        me = os.getpid()
        self.refresh()
        for p in self._members():
            if p.ppid == me and p.pid != self.root:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(p.pid, os.WNOHANG)
