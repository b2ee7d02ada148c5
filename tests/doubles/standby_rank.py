"""Test double of a standby rank (`python -m autotune.worker --standby DIR`): waits for its one
job through autotune.trials.protocol's standby functions, without torch, then runs it. What
the wait and the trial do:

| environment / mbs              | what the rank does                                          |
|--------------------------------|-------------------------------------------------------------|
| STANDBY_DOUBLE_IMPORT_S=<s>    | "imports" for that long before it says ready                |
| STANDBY_DOUBLE_CUDA=1          | its imports touched CUDA: a failure file, exit 4, no ready  |
| mbs 4                          | the trial crashes: failure file, exit 4                     |
| mbs 5                          | the trial hangs                                             |
| any other mbs                  | the trial succeeds: rank 0 writes result.json (warm false)  |

Each rank announces its start as the worker does, writes its stacks on STACKS_SIGNAL and
writes `pid-rank<r>` into the standby's folder at its start and into the trial's folder when it
runs it, so a test can tell that the trial ran in the process started ahead.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from rank_double import announce, write_failure  # tests/doubles/ is this script's sys.path[0]

from autotune.trials.protocol import STANDBY_POLL_S, standby_ready_name, status_line
from autotune.trials.trial import StopReason, TrialMetrics, TrialSpec, TrialStatus
from autotune.worker.serve import next_job

standby_dir = Path(sys.argv[sys.argv.index("--standby") + 1])
rank = announce(standby_dir)
(standby_dir / f"pid-rank{rank}").write_text(str(os.getpid()))


def fail(out_dir: Path, status: TrialStatus) -> None:
    write_failure(out_dir, rank, status)
    sys.exit(4)


time.sleep(float(os.environ.get("STANDBY_DOUBLE_IMPORT_S", "0")))
if os.environ.get("STANDBY_DOUBLE_CUDA") == "1":
    fail(standby_dir, TrialStatus.CRASH)
(standby_dir / standby_ready_name(rank)).touch()
job = next_job(standby_dir, 0, poll_s=STANDBY_POLL_S / 10)  # a test need not wait half seconds
if job is None:
    sys.exit(0)
spec = TrialSpec.from_json(job.spec.read_text())
(job.out_dir / f"pid-rank{rank}").write_text(str(os.getpid()))
if spec.layout.mbs == 4:
    fail(job.out_dir, TrialStatus.CRASH)
if spec.layout.mbs == 5:
    while True:
        time.sleep(3600)
if rank == 0:
    metrics = TrialMetrics(status=TrialStatus.OK, step_time_s=0.5, step_time_p90_s=0.5,
                           tokens_per_s=1000.0, peak_allocated_bytes=1 << 30,
                           peak_reserved_bytes=1 << 30, loss_finite=True, timed_steps=3,
                           warmup_s=1.0, timed_s=1.5, stop_reason=StopReason.STABLE,
                           warm=False)
    (job.out_dir / "result.json").write_text(json.dumps(metrics.to_dict()))
print(status_line(rank, TrialStatus.OK), file=sys.stderr, flush=True)
