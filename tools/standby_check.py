"""Does a standby make a GPU process before its hand-over? (issue 24, on the device machine)

    python tools/standby_check.py ROOT [NPROC] [WAIT_S]

Starts an autotune.trials.standby.Standby of NPROC ranks (default 1) in ROOT with this
process's environment (put Transformer Engine on PYTHONPATH to check its imports too), samples
`nvidia-smi --query-compute-apps` every second until every rank says it is ready (or WAIT_S,
default 120, passes, or the standby ends), then closes it. Prints one line per sample and a
verdict: `ready after X s; GPU processes of the standby before the hand-over: none` or the pids.
The standby's ranks check torch.cuda.is_initialized() themselves (autotune.worker.standby);
this check is the driver's view of the same question, which also sees a context that a library
made without torch knowing.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from autotune.trials.proctree import ProcessTree
from autotune.trials.standby import STANDBY_LOG_NAME, Standby


def _compute_pids() -> set[int]:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False).stdout
    return {int(tok) for tok in out.split() if tok.strip().isdigit()}


def main() -> int:
    root = Path(sys.argv[1])
    nproc = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    wait_s = float(sys.argv[3]) if len(sys.argv) > 3 else 120.0
    standby = Standby(root, nproc)
    t0 = time.monotonic()
    standby.start()
    assert standby._ranks.launched  # started above
    tree = ProcessTree(standby._ranks.pid)
    seen: set[int] = set()
    while True:
        elapsed = time.monotonic() - t0
        ours = tree.present() | {tree.root}
        on_gpu = _compute_pids()
        seen |= on_gpu & ours
        print(f"{elapsed:6.1f} s ready={standby.ready} running={standby.running} "
              f"standby pids={sorted(ours)} gpu pids={sorted(on_gpu)}", flush=True)
        if standby.ready or not standby.running or elapsed > wait_s:
            break
        time.sleep(1.0)
    ready = standby.ready
    time.sleep(3.0)  # a context made late by an import thread would show now
    seen |= _compute_pids() & (tree.present() | {tree.root})
    standby.close()
    log = (root / STANDBY_LOG_NAME).read_text(errors="replace")
    print("--- standby log (tail)")
    print("\n".join(log.splitlines()[-15:]))
    verdict = ("ready" if ready else "NOT ready") + f" after {elapsed:.1f} s; GPU processes " \
        f"of the standby before the hand-over: {sorted(seen) if seen else 'none'}"
    print(verdict)
    return 0 if ready and not seen else 1


if __name__ == "__main__":
    sys.exit(main())
