"""Test double of a worker that hangs (a collective that never completes): sleeps forever.

Like autotune's worker it announces its start with its pid and writes its stacks to
--out-dir/stacks-rank0.txt on the runner's STACKS_SIGNAL (when --out-dir is given);
--claim-pid P announces pid P instead of its own (a process outside the trial)."""

from __future__ import annotations

import faulthandler
import os
import socket
import sys
import time
from pathlib import Path

from autotune.trials.protocol import STACKS_NAME, STACKS_SIGNAL, STARTED_MARKER


def wait_for_a_collective_that_never_completes() -> None:
    while True:
        time.sleep(3600)


if "--out-dir" in sys.argv:
    out_dir = Path(sys.argv[sys.argv.index("--out-dir") + 1])
    stacks = (out_dir / STACKS_NAME.format(rank=0)).open("w")
    faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True)
    claimed = (sys.argv[sys.argv.index("--claim-pid") + 1] if "--claim-pid" in sys.argv
               else os.getpid())
    print(f"{STARTED_MARKER} rank=0 pid={claimed} host={socket.gethostname()}", file=sys.stderr,
          flush=True)
print("waiting for a collective that never completes", flush=True)
wait_for_a_collective_that_never_completes()
