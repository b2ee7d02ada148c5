"""What every worker-rank test double does alike (pool_rank.py, standby_rank.py): announce its
start as the worker does, write its stacks on STACKS_SIGNAL into its folder, and report a failed
trial through the failure file and status line the orchestrator reads."""

from __future__ import annotations

import faulthandler
import json
import os
import socket
import sys
from pathlib import Path
from typing import TextIO

from autotune.trials.protocol import (
    STACKS_NAME,
    STACKS_SIGNAL,
    failure_name,
    started_line,
    status_line,
)
from autotune.trials.trial import TrialStatus

__all__ = ["announce", "write_failure"]

_stacks: list[TextIO] = []
"""The stacks files, kept open for faulthandler for the process's life."""


def announce(folder: Path) -> int:
    """This rank's number, after its started line and its stacks registration in `folder`."""
    rank = int(os.environ.get("RANK", "0"))
    stacks = (folder / STACKS_NAME.format(rank=rank)).open("w")
    _stacks.append(stacks)
    faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True)
    print(started_line(rank, pid=os.getpid(), host=socket.gethostname()), file=sys.stderr,
          flush=True)
    return rank


def write_failure(out_dir: Path, rank: int, status: TrialStatus) -> None:
    """The failure file and status line of a trial that ended with `status` on `rank`."""
    (out_dir / failure_name(rank)).write_text(json.dumps(
        {"rank": rank, "status": status.value, "error": f"double: {status.value}",
         "traceback": []}))
    print(status_line(rank, status), file=sys.stderr, flush=True)
