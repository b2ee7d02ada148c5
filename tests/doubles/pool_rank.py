"""Test double of a warm pool rank (`python -m autotune.worker --serve DIR`): serves the jobs
the pool writes, through autotune.trials.protocol's pool functions, without torch. What each trial
does is read from its layout's micro-batch size:

| mbs | the trial                                                              |
|-----|------------------------------------------------------------------------|
| 3   | runs out of memory and recovers (failure files, done: OOM, serving)    |
| 4   | crashes: the rank writes its failure file and exits 4                  |
| 5   | hangs (a collective that never completes)                              |
| 6   | succeeds, but the ranks cannot serve on (done: serving false), exit 0  |
| 7   | succeeds (result.json), then hangs in its release                      |
| any | succeeds: rank 0 writes result.json (with every rank's pid) and done   |

Each rank announces its start as the worker does and writes its stacks on STACKS_SIGNAL; every
rank writes `pid-<seq>-rank<r>` into the trial's folder, so a test can tell warm from cold.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from rank_double import announce, write_failure  # tests/doubles/ is this script's sys.path[0]

from autotune.trials.protocol import (
    POOL_POLL_S,
    POOL_STOP_NAME,
    RESULT_NAME,
    PoolDone,
    read_pool_job,
    trial_line,
    write_pool_done,
)
from autotune.trials.trial import StopReason, TrialMetrics, TrialSpec, TrialStatus

pool_dir = Path(sys.argv[sys.argv.index("--serve") + 1])
rank = announce(pool_dir)


def fail(out_dir: Path, status: TrialStatus) -> None:
    write_failure(out_dir, rank, status)


seq = 0
while True:
    job = read_pool_job(pool_dir, seq)
    if job is None:
        if (pool_dir / POOL_STOP_NAME).exists():
            sys.exit(0)
        time.sleep(POOL_POLL_S)
        continue
    print(trial_line(seq, rank), file=sys.stderr, flush=True)
    spec = TrialSpec.from_json(job.spec.read_text())
    (job.out_dir / f"pid-{seq}-rank{rank}").write_text(str(os.getpid()))
    mbs = spec.layout.mbs
    status, serving = TrialStatus.OK, mbs != 6
    if mbs == 3:
        fail(job.out_dir, TrialStatus.OOM)
        status = TrialStatus.OOM
    elif mbs == 4:
        fail(job.out_dir, TrialStatus.CRASH)
        sys.exit(4)
    elif mbs == 5:
        while True:
            time.sleep(3600)
    if mbs not in (3, 4, 5) and rank == 0:
        metrics = TrialMetrics(status=TrialStatus.OK, step_time_s=0.5, step_time_p90_s=0.5,
                               tokens_per_s=1000.0, peak_allocated_bytes=1 << 30,
                               peak_reserved_bytes=1 << 30, loss_finite=True, timed_steps=5,
                               warmup_s=1.0, timed_s=2.5, stop_reason=StopReason.STABLE,
                               warm=True)
        (job.out_dir / RESULT_NAME).write_text(json.dumps(metrics.to_dict()))
    if mbs == 7:
        while True:  # destroying a group whose peers never join
            time.sleep(3600)
    if rank == 0:
        # The worker's ranks agree (an all-reduce) before rank 0 says done; here rank 0 waits
        # for every rank's pid file, written after its trial line.
        world = int(os.environ.get("WORLD_SIZE", "1"))
        while len(list(job.out_dir.glob(f"pid-{seq}-rank*"))) < world:
            time.sleep(POOL_POLL_S)
        write_pool_done(pool_dir, PoolDone(seq, status, serving))
    if not serving:
        sys.exit(0)
    seq += 1
