"""A standby rank: `python -m autotune.worker --standby DIR` makes a cold launch's imports ahead
of its trial, then waits for the one trial it runs as a cold launch.

Why: a warm-pool search ends with its leader measured in a fresh process (autotune.search.
finalists), and a fresh launch spends its first 22 s on torchrun, Python and the torch and
megatron-core imports before its first CUDA call (gpt2-xl at seq 32k on one H100: the pool's
stop to the fresh process's first context, import_s 16.65 s of it,
results/benchmarks/2026-11-27-h100-issue24-baseline.md). A standby
started with the search makes those imports while the pool starts (nothing is timed then) and
waits, so the fresh run pays only for what touches the GPU.

What keeps the trial a fresh process's: nothing before the hand-over touches a GPU. The
imports are init_world's, the ones a cold launch makes before torch.cuda.set_device; a rank
whose imports initialised CUDA (a library that asked the device at import) raises instead of
saying ready, which ends the standby, and the orchestrator launches the trial cold. Handed the
job, the rank does what `--spec --out-dir` does: prepare_environment, then run_rank (the
default group, parallel state, build, steps) with warm False; the process then exits.
"""

from __future__ import annotations

import time
from pathlib import Path

from autotune.trials.protocol import STANDBY_POLL_S, PoolJob, standby_ready_name

__all__ = ["CudaTouched", "stand_by"]


class CudaTouched(RuntimeError):
    """The standby's imports initialised CUDA: the trial must not wait in this process."""


def stand_by(standby_dir: Path, rank: int, started: float) -> tuple[PoolJob | None,
                                                                  dict[str, float]]:
    """Import, say ready, wait: the job (None: told to leave) and the phases so far, the
    imports and the wait each its own (a cold launch's import_s is what the standby hid)."""
    t0 = time.perf_counter()
    # init_world's imports, before it binds the device (autotune.worker.run).
    import torch
    import torch.distributed
    from megatron.core import parallel_state  # noqa: F401

    from autotune.worker.serve import next_job

    imported = time.perf_counter()
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        raise CudaTouched("importing torch and megatron-core initialised CUDA, so this "
                          "process cannot wait beside the warm pool; the trial runs cold")
    (standby_dir / standby_ready_name(rank)).touch()
    job = next_job(standby_dir, 0, poll_s=STANDBY_POLL_S)
    phases = {"startup_s": t0 - started, "standby_import_s": imported - t0,
              "standby_wait_s": time.perf_counter() - imported}
    return job, phases
