"""What a worker leaves behind: result.json on success, failure-rank<r>.json on failure.

A failing rank must end within seconds: torchrun then stops its peers, which may sit blocked in
a collective waiting for it. So a failure is written and announced first, the NCCL
communicators are aborted on a watchdog thread with a deadline, and the process leaves with
os._exit, skipping any teardown that could block.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from autotune.trials.protocol import ABORT_WAIT_ENV, EXIT_CODES, failure_name, status_line
from autotune.trials.trial import TrialStatus

__all__ = ["classify", "error_line", "exit_with_failure", "record_failure", "write_json"]

_MAX_ERROR_CHARS = 300

# Allocation failures that surface as plain RuntimeErrors from cuBLAS, cuDNN or NCCL.
_OOM_MARKERS = ("out of memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed",
                "failed to allocate")


def classify(exc: BaseException) -> TrialStatus:
    """OOM, NCCL_ERROR or CRASH for an exception raised inside a trial."""
    try:
        import torch

        if isinstance(exc, torch.cuda.OutOfMemoryError):
            return TrialStatus.OOM
        dist_errors: tuple[type[BaseException], ...] = tuple(
            cls for cls in (getattr(torch.distributed, "DistBackendError", None),
                            getattr(torch.distributed, "DistNetworkError", None))
            if cls is not None)
        if dist_errors and isinstance(exc, dist_errors):
            return TrialStatus.NCCL_ERROR
    except ImportError:
        pass
    text = str(exc).lower()
    if any(marker in text for marker in _OOM_MARKERS):
        return TrialStatus.OOM
    if "nccl" in text:
        return TrialStatus.NCCL_ERROR
    return TrialStatus.CRASH


def error_line(exc: BaseException) -> str:
    """`TypeName: last non-empty line of the message`: enough to tell failures apart."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    line = f"{type(exc).__name__}: {lines[-1]}" if lines else type(exc).__name__
    return line if len(line) <= _MAX_ERROR_CHARS else line[:_MAX_ERROR_CHARS - 3] + "..."


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically, so the runner never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _abort_communicators(wait_s: float) -> None:
    """Abort every NCCL communicator of this process, giving up after `wait_s` seconds."""

    def abort() -> None:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.distributed_c10d._abort_process_group()
        except Exception:  # best effort: the process exits next either way
            pass

    if "torch" not in sys.modules:
        return
    thread = threading.Thread(target=abort, name="autotune-abort", daemon=True)
    thread.start()
    thread.join(wait_s)


def exit_with_failure(rank: int, exc: BaseException, out_dir: Path) -> None:
    """Record the failure of this rank, abort its communicators and exit (never returns)."""
    status = record_failure(rank, exc, out_dir)
    sys.stdout.flush()
    _abort_communicators(float(os.environ.get(ABORT_WAIT_ENV, "5")))
    os._exit(EXIT_CODES[status])


def record_failure(rank: int, exc: BaseException, out_dir: Path) -> TrialStatus:
    """Write this rank's failure file, print the traceback and its status line; the status."""
    status = classify(exc)
    try:
        write_json(out_dir / failure_name(rank),
                   {"rank": rank, "status": status.value, "error": error_line(exc),
                    "traceback": traceback.format_exception(exc)[-12:]})
    except Exception as write_exc:  # a full disk must not keep the rank alive
        print(f"autotune worker: could not write the failure file: {write_exc}",
              file=sys.stderr)
    traceback.print_exception(exc, file=sys.stderr)
    print(status_line(rank, status), file=sys.stderr, flush=True)
    return status
