"""The worker <-> orchestrator contract.

autotune's worker (`python -m autotune.worker`, one process per GPU under torchrun) and the
orchestrator that launches it and reads what it left (runner, metrics, backends, calibrate,
export, report) meet only through the trial's folder, the log, the exit code and the
environment. Everything both sides must spell alike is defined here once: the file names, the
lines a rank prints, the exit codes, the environment variables, and the helpers both compute.

Pure: no torch, no optuna, no I/O. The worker imports it before torch.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import signal
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from autotune.trials.trial import TrialStatus

__all__ = [
    "ABORT_WAIT_ENV",
    "DEFAULT_NCCL_TIMEOUT_S",
    "EXIT_CODES",
    "FAILURE_GLOB",
    "FAILURE_PREFIX",
    "LEAVE_WAIT_S",
    "NCCL_EAGER_INIT_ENV",
    "NCCL_TIMEOUT_ENV",
    "POOL_LEFT_OVER_BYTES",
    "POOL_LOG_NAME",
    "POOL_PARENT_ENV",
    "POOL_POLL_S",
    "POOL_STOP_NAME",
    "RANK_MARKERS",
    "RESULT_MARKER",
    "RESULT_NAME",
    "SDPA_BACKEND_ENV",
    "SPEC_NAME",
    "STACKS_NAME",
    "STACKS_SIGNAL",
    "STANDBY_POLL_S",
    "STANDBY_READY_PREFIX",
    "STARTED_MARKER",
    "STATUS_MARKER",
    "STEP_MARKER",
    "TRIAL_MARKER",
    "WORKER",
    "PoolDone",
    "PoolJob",
    "distributed_timeout_minutes",
    "exit_status",
    "failure_name",
    "parse_status_lines",
    "parse_step_lines",
    "percentile",
    "read_pool_done",
    "read_pool_job",
    "result_line",
    "serve_args",
    "standby_args",
    "standby_ready_name",
    "started_line",
    "started_ranks",
    "status_line",
    "step_line",
    "te_available",
    "trial_line",
    "worker_args",
    "write_pool_done",
    "write_pool_job",
]

# --- How the worker is started ----------------------------------------------------------------

WORKER: tuple[str, ...] = ("-m", "autotune.worker")
"""The worker as torchrun's training script (torchrun adds the interpreter)."""


def worker_args(trial_dir: Path | str) -> list[str]:
    """The worker's own arguments for a trial in `trial_dir`: its spec and where it writes."""
    return ["--spec", str(Path(trial_dir) / SPEC_NAME), "--out-dir", str(trial_dir)]


def serve_args(pool_dir: Path | str) -> list[str]:
    """The worker's own arguments to serve trials as a warm pool rank (see the pool section)."""
    return ["--serve", str(pool_dir)]


def standby_args(standby_dir: Path | str) -> list[str]:
    """The worker's own arguments to stand by for one cold trial (see the standby section)."""
    return ["--standby", str(standby_dir)]


# --- Files in a trial's folder ----------------------------------------------------------------

SPEC_NAME = "trial.json"
"""The TrialSpec: written by the orchestrator, read by every rank (--spec)."""
RESULT_NAME = "result.json"
"""TrialMetrics of a finished trial plus the worker's extras, written by global rank 0."""
FAILURE_PREFIX = "failure-rank"
FAILURE_GLOB = f"{FAILURE_PREFIX}*.json"
"""Every rank's failure file (failure_name) in a trial's folder."""
STACKS_NAME = "stacks-rank{rank}.txt"
"""Where a worker rank writes the Python stack of every thread when it gets STACKS_SIGNAL."""
STACKS_SIGNAL = signal.SIGUSR1
"""Sent by the runner to each started rank of a trial that timed out, before stopping it, so the
trial folder says where every rank was blocked (faulthandler, which works inside C calls)."""


def failure_name(rank: int) -> str:
    """The file a failing rank writes: {"rank", "status", "error", "traceback"}."""
    return f"{FAILURE_PREFIX}{rank}.json"


# --- Lines a rank prints (to stderr, into the trial's log) ------------------------------------

STARTED_MARKER = "AUTOTUNE_STARTED"
"""First line of each worker rank: `AUTOTUNE_STARTED rank=R pid=P host=H` (pid and host only
when the rank can write its stacks on STACKS_SIGNAL)."""
STATUS_MARKER = "AUTOTUNE_STATUS"
"""Last line of each rank: `AUTOTUNE_STATUS rank=R status=S`, S a TrialStatus value."""
RESULT_MARKER = "AUTOTUNE_RESULT"
"""Rank 0's summary once result.json is written: median step time and phase timings."""
STEP_MARKER = "AUTOTUNE_STEP"
"""Rank 0, after each step: `AUTOTUNE_STEP n=N phase=warmup|timed s=SECONDS` (the phase the
step was run as; a warm-up step may still be counted as timed once the trial has answered)."""
TRIAL_MARKER = "AUTOTUNE_TRIAL"
"""First line of each rank's trial in a warm pool: `AUTOTUNE_TRIAL seq=N rank=R`."""
RANK_MARKERS: tuple[str, ...] = (STARTED_MARKER, STATUS_MARKER, RESULT_MARKER, STEP_MARKER,
                                 TRIAL_MARKER)
"""Lines only a worker rank that started prints."""
_STEP_LINE = re.compile(rf"{STEP_MARKER} n=(\d+) phase=(\w+) s=([0-9.]+)")

_STARTED_LINE = re.compile(rf"{STARTED_MARKER} rank=(\d+) pid=(\d+) host=(\S+)")
_STATUS_LINE = re.compile(rf"{STATUS_MARKER} rank=(\d+) status=([A-Z_]+)")


def started_line(rank: int, *, pid: int | None = None, host: str | None = None) -> str:
    """The first line of a rank; pid and host (both or neither) once STACKS_SIGNAL is safe."""
    where = f" pid={pid} host={host}" if pid is not None and host is not None else ""
    return f"{STARTED_MARKER} rank={rank}{where}"


def started_ranks(log_text: str, host: str) -> dict[int, int]:
    """rank -> pid of every worker rank on `host` that announced its start, with a stack
    handler, in a trial's log (the log of a multi-node trial holds other hosts' ranks too)."""
    return {int(m[1]): int(m[2]) for m in _STARTED_LINE.finditer(log_text) if m[3] == host}


def status_line(rank: int, status: TrialStatus) -> str:
    return f"{STATUS_MARKER} rank={rank} status={status.value}"


def parse_status_lines(text: str) -> Iterator[tuple[int, TrialStatus]]:
    """(rank, status) of every status line in a log; an unknown status is skipped."""
    for m in _STATUS_LINE.finditer(text):
        try:
            yield int(m.group(1)), TrialStatus(m.group(2))
        except ValueError:
            continue


def step_line(n: int, phase: str, step_s: float) -> str:
    return f"{STEP_MARKER} n={n} phase={phase} s={step_s:.4f}"


def parse_step_lines(text: str) -> list[tuple[int, str, float]]:
    """(n, phase, seconds) of every step line in a log, in order."""
    return [(int(m[1]), m[2], float(m[3])) for m in _STEP_LINE.finditer(text)]


def trial_line(seq: int, rank: int) -> str:
    return f"{TRIAL_MARKER} seq={seq} rank={rank}"


def result_line(median_s: float, phases_s: Mapping[str, float]) -> str:
    phases = " ".join(f"{k}={v:.1f}" for k, v in phases_s.items())
    return f"{RESULT_MARKER} median_s={median_s:.4f} phases={phases}"


# --- The warm pool ---------------------------------------------------------------------------
# `python -m autotune.worker --serve DIR` under one torchrun: the ranks stay up between trials.
# The orchestrator (autotune.trials.pool) writes DIR/job-<seq>.json for trial seq = 0, 1, ...;
# every rank polls for it, runs the trial into the job's out_dir exactly as a one-trial worker
# would (trial.json, result.json, failure files), releases it, and rank 0 writes
# DIR/done-<seq>.json once every rank has. A rank that cannot serve on (a failure other ranks may
# be blocked on, memory it could not free) exits instead, and the orchestrator starts the pool
# again.

POOL_LOG_NAME = "log.txt"
"""The pool's whole output, in its folder; each trial's slice is copied to the trial's log."""
POOL_STOP_NAME = "stop"
"""Its presence in the pool's folder tells idle ranks to exit."""
LEAVE_WAIT_S = 5.0
"""How long ranks told to leave (the stop file, a failure, ranks that cannot go on) get to exit
with torchrun before they are signalled: the warm pool's and the standby's alike."""
POOL_POLL_S = 0.02
"""How often an idle rank looks for the next job, and the orchestrator for the done file."""
POOL_PARENT_ENV = "AUTOTUNE_POOL_PARENT"
"""`HOST:PID` of the orchestrator that started the pool: an idle rank on that host exits once
the orchestrator is gone (killed outright, it could not stop the pool), so no rank holds a GPU
for nobody."""
POOL_LEFT_OVER_BYTES = 64 * 2**20
"""A rank still holding more GPU memory than this after releasing a trial does not serve on:
the next trial's peak would count it (a cold launch starts from nothing)."""


def _job_path(pool_dir: Path, seq: int) -> Path:
    return Path(pool_dir) / f"job-{seq}.json"


def _done_path(pool_dir: Path, seq: int) -> Path:
    return Path(pool_dir) / f"done-{seq}.json"


def _write_atomic(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _read(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True, slots=True)
class PoolJob:
    """Trial `seq` of a pool: its spec file and the folder its results go to."""

    seq: int
    spec: Path
    out_dir: Path


@dataclass(frozen=True, slots=True)
class PoolDone:
    """How trial `seq` ended in the pool: its status, and whether the ranks serve on."""

    seq: int
    status: TrialStatus
    serving: bool


def write_pool_job(pool_dir: Path, job: PoolJob) -> None:
    _write_atomic(_job_path(pool_dir, job.seq),
                  {"seq": job.seq, "spec": str(job.spec), "out_dir": str(job.out_dir)})


def read_pool_job(pool_dir: Path, seq: int) -> PoolJob | None:
    """Job `seq` once it is written whole; None before."""
    data = _read(_job_path(pool_dir, seq))
    if data is None:
        return None
    return PoolJob(seq, Path(str(data["spec"])), Path(str(data["out_dir"])))


def write_pool_done(pool_dir: Path, done: PoolDone) -> None:
    _write_atomic(_done_path(pool_dir, done.seq),
                  {"seq": done.seq, "status": done.status.value, "serving": done.serving})


def read_pool_done(pool_dir: Path, seq: int) -> PoolDone | None:
    data = _read(_done_path(pool_dir, seq))
    if data is None:
        return None
    try:
        status = TrialStatus(str(data["status"]))
    except (KeyError, ValueError):
        status = TrialStatus.CRASH
    return PoolDone(seq, status, bool(data.get("serving", False)))


# --- A standby launch ------------------------------------------------------------------------
# `python -m autotune.worker --standby DIR` under one torchrun, started before the one cold trial
# it runs (a finalist's fresh run, autotune.trials.standby). Each rank makes the imports a cold
# launch makes before its first CUDA call, writes DIR/ready-rank<r> only while CUDA is still
# untouched, and waits for DIR/job-0.json (write_pool_job), the stop file (POOL_STOP_NAME) or
# the orchestrator's end (POOL_PARENT_ENV), looking every STANDBY_POLL_S. Handed the job, it
# runs the trial exactly as `--spec --out-dir` does, then exits with that launch's exit code.

STANDBY_READY_PREFIX = "ready-rank"
STANDBY_POLL_S = 0.5
"""How often a waiting standby rank looks for its job. It waits while other trials are timed on
the same host, so it wakes twice a second, not fifty times (issue 25: host time the timed steps
share); the hand-over is then at most this late, against the 22 s of launch it saved."""


def standby_ready_name(rank: int) -> str:
    """The file a standby rank writes once its imports are done and CUDA is untouched."""
    return f"{STANDBY_READY_PREFIX}{rank}"


# --- Exit codes -------------------------------------------------------------------------------

EXIT_CODES: Mapping[TrialStatus, int] = {
    TrialStatus.OOM: 3, TrialStatus.CRASH: 4, TrialStatus.NCCL_ERROR: 4}
"""A failed rank's exit code by status (0: OK; 2: bad arguments, from argparse)."""


def exit_status(returncode: int) -> TrialStatus | None:
    """The status a worker's exit code stands for, the first in EXIT_CODES when several share
    it: 4 says only that a rank failed (CRASH); the failure files and the log tell an NCCL error
    apart. None for any code not in the table."""
    return next((status for status, code in EXIT_CODES.items() if code == returncode), None)


# --- Environment variables the worker reads ---------------------------------------------------

NCCL_TIMEOUT_ENV = "AUTOTUNE_NCCL_TIMEOUT_S"
"""Collective timeout in seconds: the runner sets it on every trial, the worker passes it to
init_process_group and Megatron's sub-groups."""
DEFAULT_NCCL_TIMEOUT_S = 120
"""Short, so that a blocked collective fails the trial fast."""
NCCL_EAGER_INIT_ENV = "AUTOTUNE_NCCL_EAGER_INIT"
"""`1`: the worker binds its device at init_process_group, so NCCL creates every communicator
up front instead of on its first collective."""
ABORT_WAIT_ENV = "AUTOTUNE_ABORT_WAIT_S"
"""Seconds a failing rank waits for its NCCL communicators to abort before it exits."""
SDPA_BACKEND_ENV = "AUTOTUNE_SDPA_BACKEND"
"""Which fused kernel impl "sdpa" may use: auto, flash, cudnn or efficient."""


# --- Helpers both sides compute ---------------------------------------------------------------

def te_available() -> bool:
    """Transformer Engine is importable (checked without importing it, which loads torch)."""
    return importlib.util.find_spec("transformer_engine") is not None


def distributed_timeout_minutes(timeout_s: float) -> int:
    """A timeout in seconds as the whole minutes that Megatron takes (Megatron-LM's
    `--distributed-timeout-minutes`, megatron-core's initialize_model_parallel): round up, at
    least 1."""
    return max(1, math.ceil(timeout_s / 60))


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 1]."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
