"""Test double of torchrun for one node: `fake_torchrun.py --nproc-per-node N [launcher options]
SCRIPT ARGS...` starts N copies of `python SCRIPT ARGS` with RANK, LOCAL_RANK and WORLD_SIZE set,
each in its own session as torchrun does, and, as torchrun does, stops the others when one
fails and exits 1 (0 when every rank exits 0). SIGTERM is passed on to the ranks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

argv = sys.argv[1:]
nproc = int(argv[argv.index("--nproc-per-node") + 1])
i = 0
while argv[i].startswith("--"):
    i += 2  # every launcher option the runner writes takes one value
command = [sys.executable, *argv[i:]]
ranks = [subprocess.Popen(command, start_new_session=True,
                          env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r),
                               "WORLD_SIZE": str(nproc)})
         for r in range(nproc)]


def stop(*_: object) -> None:
    for rank in ranks:
        if rank.poll() is None:
            rank.terminate()
    for rank in ranks:
        rank.wait()
    sys.exit(1)


signal.signal(signal.SIGTERM, stop)
while True:
    codes = [rank.poll() for rank in ranks]
    if any(code not in (None, 0) for code in codes):
        stop()
    if all(code == 0 for code in codes):
        sys.exit(0)
    time.sleep(0.02)
