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
import math
import re
import signal
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from autotune.trial import TrialStatus

__all__ = [
    "ABORT_WAIT_ENV",
    "DEFAULT_NCCL_TIMEOUT_S",
    "EXIT_CODES",
    "FAILURE_GLOB",
    "FAILURE_PREFIX",
    "NCCL_EAGER_INIT_ENV",
    "NCCL_TIMEOUT_ENV",
    "RANK_MARKERS",
    "RESULT_MARKER",
    "RESULT_NAME",
    "SDPA_BACKEND_ENV",
    "SPEC_NAME",
    "STACKS_NAME",
    "STACKS_SIGNAL",
    "STARTED_MARKER",
    "STATUS_MARKER",
    "WORKER",
    "distributed_timeout_minutes",
    "exit_status",
    "failure_name",
    "parse_status_lines",
    "percentile",
    "result_line",
    "started_line",
    "started_ranks",
    "status_line",
    "te_available",
    "worker_args",
]

# --- How the worker is started ----------------------------------------------------------------

WORKER: tuple[str, ...] = ("-m", "autotune.worker")
"""The worker as torchrun's training script (torchrun adds the interpreter)."""


def worker_args(trial_dir: Path | str) -> list[str]:
    """The worker's own arguments for a trial in `trial_dir`: its spec and where it writes."""
    return ["--spec", str(Path(trial_dir) / SPEC_NAME), "--out-dir", str(trial_dir)]


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
RANK_MARKERS: tuple[str, ...] = (STARTED_MARKER, STATUS_MARKER, RESULT_MARKER)
"""Lines only a worker rank that started prints."""

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


def result_line(median_s: float, phases_s: Mapping[str, float]) -> str:
    phases = " ".join(f"{k}={v:.1f}" for k, v in phases_s.items())
    return f"{RESULT_MARKER} median_s={median_s:.4f} phases={phases}"


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
