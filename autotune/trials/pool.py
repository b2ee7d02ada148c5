"""A warm worker pool: one torchrun group kept for a whole search, serving trial after trial.

A cold trial pays, before its first step, for torchrun, Python, the torch and megatron-core
imports, the default NCCL group and its communicators: most of the 37-55 s a trial cost beyond
its timed steps (results/benchmarks/2026-11-21-*). The pool pays for them once. Its ranks
(`python -m autotune.worker --serve DIR`, autotune.worker.serve) take trial after trial through
files in DIR (autotune.trials.protocol's pool section); each trial is set up and released in the
ranks the way megatron-core's own tests run many layouts in one process.

For the search a pool trial is a run like any other: it returns the RunOutput a cold launch
returns, with the trial's own slice of the pool's log copied to the trial's log.txt, so
autotune.trials.metrics reads it unchanged. What leaves the pool in doubt stops it, and the next
trial starts it again (cold): a rank that failed (it exits, and torchrun stops the rest), a trial
that timed out (the pool is stopped as a timed-out cold trial is, its ranks' stacks kept), Ctrl-C,
ranks that say they cannot serve on (memory they could not free), or ranks that do not release a
trial within RELEASE_S of writing its result (the result stands: it is whole).

The ranks are an autotune.trials.rank_group.RankGroup, launched in a folder of its own at each
start (DIR/0, DIR/1, ...); that module and autotune.trials.runner are the only ones that start
processes.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from autotune.dimensions import Impl
from autotune.trials.launchers import LOG_NAME, TORCHRUN
from autotune.trials.protocol import (
    DEFAULT_NCCL_TIMEOUT_S,
    EXIT_CODES,
    POOL_LOG_NAME,
    POOL_POLL_S,
    POOL_STOP_NAME,
    RESULT_NAME,
    SPEC_NAME,
    WORKER,
    PoolDone,
    PoolJob,
    read_pool_done,
    serve_args,
    write_pool_job,
)
from autotune.trials.rank_group import RankGroup, RankGroupOwner
from autotune.trials.runner import DEFAULT_GRACE_S, RunOutput, TrialInterrupted
from autotune.trials.trial import TrialSpec, TrialStatus

log = logging.getLogger(__name__)

__all__ = ["RELEASE_S", "WarmPool"]

_REFRESH_S = 0.25
"""How often the pool's process tree is re-read at first while a trial runs (for a clean
shutdown); the interval doubles up to _REFRESH_MAX_S (below)."""
_REFRESH_MAX_S = 8.0
"""The longest interval between re-reads of the process tree while a trial runs: its ranks
were all started long before, and a walk of /proc is host time on the trial's CPUs."""
_POLL_MAX_S = 0.5
"""The longest interval between looks for a running trial's done file. The orchestrator
starts at POOL_POLL_S and backs off by half each look: a trial's steps, timed on the same
host's CPUs, should not share them with a loop that wakes 50 times a second (issue 25); a
done file is then seen at most this late, against trials of tens of seconds."""
RELEASE_S = 30.0
"""How long the ranks get to release a trial once its result is written (a few seconds in
practice: a gather, freeing, destroying the trial's groups); past it the trial's figures stand
and the pool is started again."""


class WarmPool(RankGroupOwner):
    """`nproc` worker ranks on this node, started on the first trial and kept (the module)."""

    def __init__(self, root: Path, nproc: int, *, env: Mapping[str, str] | None = None,
                 nccl_timeout_s: int = DEFAULT_NCCL_TIMEOUT_S,
                 grace_s: float = DEFAULT_GRACE_S, launcher: Sequence[str] = TORCHRUN,
                 worker: Sequence[str] = WORKER) -> None:
        self._ranks = RankGroup(nproc, what="pool", env=env, nccl_timeout_s=nccl_timeout_s,
                                grace_s=grace_s, launcher=launcher, worker=worker)
        self.root = Path(root).resolve()
        self.starts = 0
        """How many times the pool was started (the first trial's start included)."""
        self._dir = self.root
        self._seq = 0
        self._impls: set[Impl] = set()
        """The implementations the running ranks have run trials with (since their start)."""
        self._told_kept = False
        """Whether the user was told that a trial's ranks kept memory (once per pool)."""

    def run(self, spec: TrialSpec, trial_dir: Path, timeout_s: float) -> RunOutput:
        """Run one trial in the pool (starting it when it is not running)."""
        self._ranks.check_trial(spec, timeout_s)
        trial_dir = Path(trial_dir).resolve()
        trial_dir.mkdir(parents=True, exist_ok=True)
        spec.write(trial_dir / SPEC_NAME)
        start = time.monotonic()
        if self.running and _fresh_ranks_for(spec.layout.impl, self._impls):
            self._ranks.note(f"[autotune] starting the ranks again: the first {Impl.TE} trial "
                             f"after {Impl.SDPA} trials runs in fresh ranks (cuDNN)")
            self.close()
        if not self.running:
            self._ranks.stop()  # reap what a pool that died while idle left
            self._start()
        self._impls.add(Impl(spec.layout.impl))
        log_path = self._dir / POOL_LOG_NAME
        offset = log_path.stat().st_size if log_path.exists() else 0
        seq = self._seq
        self._seq += 1
        (trial_dir / RESULT_NAME).unlink(missing_ok=True)  # only this run's result counts
        write_pool_job(self._dir, PoolJob(seq, trial_dir / SPEC_NAME, trial_dir))
        pid, argv = self._ranks.pid, self._ranks.argv
        done, timed_out, interrupted = self._wait(seq, start + timeout_s,
                                                  trial_dir / RESULT_NAME)
        wall_s = time.monotonic() - start
        if timed_out or interrupted:
            self._ranks.note(f"[autotune] {'timed out' if timed_out else 'interrupted'} after "
                             f"{wall_s:.1f} s; stopping the pool (grace {self.grace_s:g} s)")
            try:
                if timed_out:
                    self._ranks.ask_for_stacks(trial_dir)
            except KeyboardInterrupt:
                interrupted = True
            finally:
                self._ranks.stop()
        elif done is None or not done.serving:
            # A rank failed (torchrun ends the rest), or the ranks cannot go on and leave:
            # let torchrun exit by itself before anything is signalled.
            if done is not None and done.status is TrialStatus.OK and not self._told_kept:
                # Said once: a layout that keeps memory does so on every trial, and each then
                # pays a cold start (on 4 x H200, 23-40 s instead of 5: session 19).
                self._told_kept = True
                log.warning("the warm pool starts again after %s: its ranks kept GPU memory "
                            "after releasing the trial (its log.txt names what holds it); each "
                            "such trial costs a cold start", trial_dir)
            self._ranks.wait_for_exit()
            self._ranks.stop()
        returncode = self._returncode(done)
        output = RunOutput(argv=argv, pid=pid, returncode=returncode,
                           timed_out=timed_out, interrupted=interrupted, wall_time_s=wall_s,
                           log_path=_copy_slice(log_path, offset, trial_dir / LOG_NAME),
                           trial_dir=trial_dir)
        if interrupted:
            raise TrialInterrupted(output)
        return output

    def close(self) -> None:
        """Tell the ranks to exit, then stop whatever is left of the pool."""
        if self.running:
            (self._dir / POOL_STOP_NAME).touch()
            self._ranks.wait_for_exit()
        self._ranks.stop()

    def __enter__(self) -> WarmPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals -----------------------------------------------------------------------

    def _start(self) -> None:
        self._dir = self.root / str(self.starts)
        self.starts += 1
        self._seq = 0
        self._impls = set()
        # A folder of an earlier search's pool is emptied: its jobs are stale.
        self._ranks.launch(self._dir, serve_args(self._dir), POOL_LOG_NAME)

    def _wait(self, seq: int, deadline: float,
              result: Path) -> tuple[PoolDone | None, bool, bool]:
        """(done, timed_out, interrupted): the trial's done file, or why there is none. A
        trial whose result is written but whose ranks do not release it within RELEASE_S
        counts as done (its figures are whole) with ranks that cannot serve on."""
        refresh = 0.0
        refresh_s = _REFRESH_S
        poll_s = POOL_POLL_S
        result_at: float | None = None
        try:
            while True:
                done = read_pool_done(self._dir, seq)
                if done is not None:
                    return done, False, False
                if self._ranks.exited():
                    # A done file written just before the exit still counts.
                    return read_pool_done(self._dir, seq), False, False
                now = time.monotonic()
                if result_at is None and result.exists():
                    result_at = now
                if result_at is not None and now >= result_at + RELEASE_S:
                    self._ranks.note(f"[autotune] the trial's result is written but its ranks "
                                     f"did not release it within {RELEASE_S:g} s; the pool "
                                     "restarts")
                    return PoolDone(seq, TrialStatus.OK, serving=False), False, False
                if now >= deadline:
                    return None, True, False
                if now >= refresh:
                    self._ranks.refresh_tree()
                    refresh = now + refresh_s
                    refresh_s = min(2 * refresh_s, _REFRESH_MAX_S)
                # Never past the deadline or the release limit: those are decided on time.
                limit = result_at + RELEASE_S if result_at is not None else deadline
                time.sleep(max(0.0, min(poll_s, limit - now)))
                poll_s = min(1.5 * poll_s, _POLL_MAX_S)
        except KeyboardInterrupt:
            # The pool is in its own session, so the terminal's Ctrl-C reached only us.
            return None, False, True

    def _returncode(self, done: PoolDone | None) -> int:
        """The trial's exit code as a cold launch would have it: 0 for a trial that ended
        well, its status's code for one the ranks recovered from, else the pool's own."""
        if done is not None:
            return 0 if done.status is TrialStatus.OK else EXIT_CODES.get(done.status, 4)
        if self._ranks.returncode is not None:
            return self._ranks.returncode
        return -1


def _fresh_ranks_for(impl: str, impls_run: set[Impl]) -> bool:
    """Whether a trial of `impl` must start in fresh ranks, given the implementations the
    running ranks have run.

    Transformer Engine's fused attention failed with cuDNN's
    CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED four times out of four where it was first used in a
    rank that had already run sdpa trials (PyTorch's attention, which takes cuDNN's own kernels
    on Hopper), and never where te ran first in its process or followed a te trial there:
    2 x H200 on 2026-11-27 (cp 2), one H100 three times on 2026-11-28
    (results/benchmarks/2026-11-28-h100-issue25-repeat-s15.md; Megatron-LM#1882 reports the error
    in Megatron-LM itself). The search ran such a trial again cold (CONFIRMED_COLD); starting the
    ranks again first costs one start instead of a crash and a cold launch."""
    return impl == Impl.TE and Impl.SDPA in impls_run and Impl.TE not in impls_run


def _copy_slice(log_path: Path, offset: int, to: Path) -> Path:
    """The pool log from `offset` on, as the trial's own log."""
    try:
        with log_path.open("rb") as src, to.open("wb") as dst:
            src.seek(offset)
            shutil.copyfileobj(src, dst)
    except OSError:
        to.touch()
    return to
