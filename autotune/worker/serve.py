"""A warm pool rank: `python -m autotune.worker --serve DIR` serves trial after trial.

The process starts once (torchrun, Python, torch and megatron-core imports, the default NCCL
group) and then, for each job the orchestrator writes (autotune.trials.protocol's pool section),
sets up Megatron's parallel state for the trial's layout, builds, runs and reports exactly as a
one-trial worker does (autotune.worker.run.run_trial), and releases everything the trial made:
the model and optimizer (their last references die with run_trial's frames), Megatron's
parallel state and the process groups it created (destroy_model_parallel only forgets them;
their NCCL communicators would otherwise stay, with their buffers), cuBLAS's workspaces, the
allocator's cache and its peak statistics. torch.compile's code is kept: every function is
compiled statically per shape in cold and warm runs alike (autotune.worker.run), so a trial
runs the code a cold launch would, without compiling a shape again. MoE trials are the
exception: their expert token counts change every step, so they compile with dynamic shapes
and each starts from empty caches, as a cold launch does (run.configure_compiles). Setting up
and releasing parallel state is the pattern megatron-core's own unit tests use to run many
parallel layouts in one process (destroy_model_parallel, then initialize_model_parallel).

What cannot be undone ends the rank instead of the trial's figures: a failure other ranks may
be blocked on (anything but an out-of-memory error on a pool of one rank), or memory left
allocated after the release (POOL_LEFT_OVER_BYTES). The orchestrator then starts the pool cold.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from autotune.trials.protocol import (
    POOL_LEFT_OVER_BYTES,
    POOL_PARENT_ENV,
    POOL_POLL_S,
    POOL_STOP_NAME,
    PoolDone,
    PoolJob,
    read_pool_job,
    trial_line,
    write_pool_done,
)
from autotune.trials.trial import TrialSpec, TrialStatus

__all__ = ["clear_method_caches", "next_job", "serve", "trial_groups"]

_PARENT_CHECK_S = 1.0


def serve(pool_dir: Path, rank: int, started: float) -> None:
    """Serve jobs 0, 1, ... from `pool_dir` until its stop file appears or the orchestrator is
    gone; returns then. A trial this rank cannot recover from ends the process (never
    returns)."""
    from autotune.worker.run import init_world

    phases: dict[str, float] = {"startup_s": time.perf_counter() - started}
    local_rank = init_world(phases)
    seq = 0
    while (job := next_job(pool_dir, seq)) is not None:
        print(trial_line(seq, rank), file=sys.stderr, flush=True)
        status, serving = _serve_one(job, rank, local_rank, phases)
        if rank == 0:
            write_pool_done(pool_dir, PoolDone(seq, status, serving))
        if not serving:
            return
        phases = {}  # start-up is the first trial's alone
        seq += 1


def next_job(pool_dir: Path, seq: int, poll_s: float = POOL_POLL_S) -> PoolJob | None:
    """Job `seq` of `pool_dir` once it is written, looking every `poll_s`; None once the stop
    file appears or the orchestrator is gone (a standby waits here too)."""
    parent = _parent()
    next_check = time.monotonic() + _PARENT_CHECK_S
    while True:
        job = read_pool_job(pool_dir, seq)
        if job is not None:
            return job
        if (pool_dir / POOL_STOP_NAME).exists():
            return None
        if time.monotonic() >= next_check:
            if parent is not None and not _alive(parent):
                return None
            next_check = time.monotonic() + _PARENT_CHECK_S
        time.sleep(poll_s)


def _parent() -> int | None:
    """The orchestrator's pid when it runs on this host."""
    host, _, pid = os.environ.get(POOL_PARENT_ENV, "").rpartition(":")
    return int(pid) if pid.isdigit() and host == socket.gethostname() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _serve_one(job: PoolJob, rank: int, local_rank: int,
               phases: dict[str, float]) -> tuple[TrialStatus, bool]:
    """Run one job and release it: its status, and whether every rank can serve on."""
    import torch.distributed as dist

    from autotune.worker.report import exit_with_failure, record_failure
    from autotune.worker.run import run_trial

    groups = _process_groups()
    status = TrialStatus.OK
    try:
        spec = TrialSpec.from_json(job.spec.read_text())
        run_trial(spec, job.out_dir, local_rank, phases, warm=True)
    except BaseException as exc:  # every failure becomes a status; SystemExit included
        status = _classified(exc)
        if status is not TrialStatus.OOM or dist.get_world_size() > 1:
            # Peers may sit in a collective this rank will never join: end the pool.
            exit_with_failure(rank, exc, job.out_dir)
        record_failure(rank, exc, job.out_dir)
        # The traceback's frames hold the model and optimizer: drop them before releasing.
        traceback.clear_frames(exc.__traceback__)
        del exc
    left = _release(groups)
    serving = _all_agree(left <= POOL_LEFT_OVER_BYTES)
    print(f"[autotune pool] rank {rank} released trial {job.seq}: {left / 2**20:.1f} MiB still "
          f"allocated{'' if serving else '; the pool restarts'}", file=sys.stderr, flush=True)
    if rank == 0 and left > POOL_LEFT_OVER_BYTES:
        _log_holders()
    return status, serving


def _log_holders() -> None:
    """Name in the pool's log what keeps the leftover alive (autotune.worker.holders); the
    diagnosis never stops the pool from restarting cleanly."""
    from autotune.worker.holders import describe_holders, find_holders

    try:
        lines = describe_holders(find_holders("cuda", min_bytes=POOL_LEFT_OVER_BYTES))
    except Exception as exc:  # a diagnosis, not a trial: its own failure is only reported
        lines = [f"could not walk the references: {type(exc).__name__}: {exc}"]
    for line in lines or ["no Python object reaches a tensor on the GPU"]:
        print(f"[autotune pool] left over: {line}", file=sys.stderr, flush=True)


def _classified(exc: BaseException) -> TrialStatus:
    from autotune.worker.report import classify

    return classify(exc)


def _process_groups() -> list[Any]:
    """Every process group of this process (the default one included), in the order they were
    made: the same on every rank, since making a group is collective."""
    import torch.distributed.distributed_c10d as c10d

    return list(c10d._world.pg_map)


def trial_groups(before: list[Any], now: list[Any]) -> list[Any]:
    """The groups a trial made, in the order it made them. They are destroyed in that order on
    every rank: destroying an NCCL group finalizes its communicator with the group's other
    ranks, so ranks that went through them in different orders (a set's) wait for each other
    forever. Seen on 2 x H200: the second trial of a pool hung in destroy_process_group."""
    known = {id(g) for g in before}
    return [g for g in now if id(g) not in known]


# Where Transformer Engine keeps its FP8 state: quantization.py since TE 2.9, fp8.py before
# (from 2.9 on a deprecated alias of the same class).
_TE_FP8_STATE_MODULES = (
    "transformer_engine.pytorch.quantization",
    "transformer_engine.pytorch.fp8",
)


def reset_fp8_state() -> bool:
    """Forget Transformer Engine's process-wide FP8 state (True when there was a TE to reset).

    TE keeps, per process, the amax buffers of every FP8 module it saw and the group it reduces
    them over (FP8GlobalStateManager). A trial's modules and groups die with it; TE's buffers do
    not: the next FP8 trial's autocast reduces the dead trial's amaxes over a destroyed group.
    Seen on 2 x H200: every tensorwise trial after a delayed one in the pool crashed with
    "Process group ... is not initialized in the world group map", and its buffers held the
    dead model's tensors. A cold launch starts with a fresh manager; reset() gives the next
    trial the same. TE is only looked up, never imported: a pool without it has nothing to
    reset."""
    for name in _TE_FP8_STATE_MODULES:
        manager = getattr(sys.modules.get(name), "FP8GlobalStateManager", None)
        if manager is not None:
            manager.reset()
            return True
    return False


_METHOD_CACHE_OWNERS = ("megatron.core", "transformer_engine")
"""Packages whose classes may cache a method with functools.lru_cache, keyed by `self`."""


def clear_method_caches(packages: tuple[str, ...] = _METHOD_CACHE_OWNERS) -> int:
    """Empty every functools.lru_cache that a class of `packages` holds as a method; the number
    of caches emptied.

    Such a cache is keyed by its call's arguments, `self` among them, and lives on the class: it
    keeps the trial's instances alive after the trial. megatron-core's RotaryEmbedding.forward is
    one (lru_cache(maxsize=32)). With the distributed optimizer's overlapped param gather, DDP
    hangs a forward pre-hook on every module, the rotary embedding's too, whose closure holds DDP
    and with it the model, gradients and optimizer: on 2 x H200 (session 19) each rank kept
    36 GiB of a Llama-3.2-3B trial at dp 2 and the pool restarted after every such trial; on
    4 x H200, 67 GiB of llama3-8b (autotune.worker.holders named the chain). A cold launch starts
    with empty caches; this gives the next trial the same. Module-level caches are left alone:
    their keys are plain values, and some hold process-wide resources (NCCL memory pools)."""
    emptied = 0
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(packages):
            continue
        for owner in list(vars(module).values()):
            if not isinstance(owner, type) or owner.__module__ != name:
                continue
            for attr in vars(owner).values():
                if callable(getattr(attr, "cache_clear", None)) and hasattr(attr, "cache_info"):
                    attr.cache_clear()
                    emptied += 1
    return emptied


def _release(before: list[Any]) -> int:
    """Free what the trial made (the module's list); the bytes still allocated after."""
    import gc

    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    reset_fp8_state()
    clear_method_caches()
    for group in trial_groups(before, _process_groups()):
        with contextlib.suppress(Exception):  # already gone, or aborted: nothing left to free
            dist.destroy_process_group(group)
    gc.collect()
    torch.cuda.synchronize()
    # cuBLAS keeps a workspace per handle and stream in the caching allocator (tens of MiB on
    # Hopper); a cold launch starts without one and counts it in its peak, so must the next
    # trial here.
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return int(torch.cuda.memory_allocated())


def _all_agree(mine: bool) -> bool:
    """True when every rank says so (one all-reduce over the default group); it also keeps
    rank 0 from announcing the trial done before every rank has released it."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if mine else 0], dtype=torch.int32, device="cuda")
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())
