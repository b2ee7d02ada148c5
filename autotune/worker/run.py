"""One trial on this rank: distributed init, build, timed training, result gathered on rank 0."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.specs.flops import model_flops_per_token
from autotune.trials.protocol import (
    DEFAULT_NCCL_TIMEOUT_S,
    NCCL_EAGER_INIT_ENV,
    NCCL_TIMEOUT_ENV,
    RESULT_NAME,
    distributed_timeout_minutes,
    percentile,
    result_line,
    status_line,
    te_available,
)
from autotune.trials.trial import ClockSummary, RankResult, TrialMetrics, TrialSpec, TrialStatus

if TYPE_CHECKING:
    from autotune.specs.model import ModelSpec
    from autotune.worker.train import StepTimes

__all__ = [
    "ENV_ON_RECORD",
    "configure_allocator",
    "configure_compiles",
    "init_model_parallel",
    "init_world",
    "metrics_from_ranks",
    "prepare_environment",
    "run_rank",
    "run_trial",
    "step_losses",
    "step_time_cv",
]


def prepare_environment(spec: TrialSpec) -> None:
    """Environment that must be set before CUDA starts."""
    s = spec.layout
    if s.tp > 1 or s.cp > 1:
        # Megatron-LM requires one hardware queue so that TP/CP communication kernels are
        # scheduled in issue order ahead of the compute they overlap with.
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    # Never let NCCL use NVLink multicast (NVLS): it can take a shared host's GPUs down.
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")


def configure_allocator(expandable: bool) -> None:
    """The caching allocator's segments as the layout says (autotune.levers.allocator), set
    for this trial whatever the process inherited: a warm rank runs layouts of either kind one
    after another, and its cache was emptied after the last (autotune.worker.serve). New
    segments follow the setting from here on."""
    import torch

    from autotune.levers.allocator import option

    # torch.cuda.memory._set_allocator_settings is deprecated for this from torch 2.12.
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None) \
        or torch.cuda.memory._set_allocator_settings
    setter(option(expandable))


def init_world(phases: dict[str, float]) -> int:
    """The default process group over every rank torchrun started (once per process); returns
    this rank's local GPU index."""
    t0 = time.perf_counter()
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state  # noqa: F401  (its import cost is start-up's)

    t1 = time.perf_counter()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    # Binding the device makes NCCL create every communicator eagerly, the default group's and
    # each of Megatron's sub-groups'; unbound, a communicator is made on its first collective.
    eager = os.environ.get(NCCL_EAGER_INIT_ENV, "0") == "1"
    dist.init_process_group("nccl", timeout=timedelta(seconds=_timeout_s()),
                            device_id=torch.device("cuda", local_rank) if eager else None)
    phases.update(import_s=t1 - t0, pg_init_s=time.perf_counter() - t1)
    return local_rank


COMPILED_SHAPES_LIMIT = 64
"""Compiled versions kept per function (torch._dynamo's recompile limit, 8 by default): one per
shape a function meets, over every trial of a warm pool."""

_RECOMPILE_LIMIT_NAMES = ("recompile_limit", "cache_size_limit")  # the newer name, the older one
_dynamo_as_started: dict[str, Any] = {}
"""torch._dynamo's settings as this process started, before the first trial changed them."""
_dynamic_code_held = False
"""Whether dynamo's caches hold code compiled under an MoE trial's dynamic settings."""


def configure_compiles(model: ModelSpec) -> str:
    """How torch.compile treats shapes in this trial: "static" or "dynamic". Call at the start
    of every trial, cold or warm.

    megatron-core compiles its fused functions (jit_fuser, torch.compile). By default dynamo
    recompiles a function for dynamic shapes once it meets a second shape, and falls back to
    eager code after 8 recompiles: in a warm pool, where trial after trial brings new shapes,
    later trials would then run other code than a cold launch of the same layout. So in a dense
    model each shape gets its own static compile, in cold and warm runs alike, and the compiled
    code of a shape met before is reused (a warm pool's saving).

    An MoE model's experts take a token count that changes every step by design: SequentialMLP
    (the local and sdpa specs) runs megatron-core's weighted swiglu (fused_bias_swiglu's
    weighted_swiglu and weighted_swiglu_back, the same in 0.16.1 and 0.19.2) on each expert's
    tokens, and TEGroupedMLP on all of a rank's expert tokens, a count that varies with ep > 1.
    Statically, every new count is a compile: megatron-core 0.16.1's weighted_bias_swiglu_impl
    on the counts of three steps of 2 layers x 4 experts x 4 micro-batches compiled 82 times on
    the CPU (233 s), against 4 times (13 s) with dynamo's defaults; the tiny MoE GPU trial took
    31 s a step with the GPU idle (results/benchmarks/2026-11-28-h100-issue29-s13.md). An MoE
    trial therefore runs under the settings the process started with, as a Megatron-LM process
    does, and starts from empty caches, so that a warm trial compiles what a cold launch does.
    """
    global _dynamic_code_held
    import torch._dynamo

    config = torch._dynamo.config
    names = ["automatic_dynamic_shapes"] + [n for n in _RECOMPILE_LIMIT_NAMES
                                            if hasattr(config, n)]
    if not _dynamo_as_started:
        _dynamo_as_started.update({n: getattr(config, n) for n in names})
    dynamic = model.is_moe
    if dynamic or _dynamic_code_held:
        torch._dynamo.reset()  # no code or shape history of an earlier trial
    _dynamic_code_held = dynamic
    static = {n: COMPILED_SHAPES_LIMIT for n in names} | {"automatic_dynamic_shapes": False}
    for name, value in (_dynamo_as_started if dynamic else static).items():
        setattr(config, name, value)
    return "dynamic" if dynamic else "static"


def _timeout_s() -> float:
    return float(os.environ.get(NCCL_TIMEOUT_ENV, str(DEFAULT_NCCL_TIMEOUT_S)))


def init_model_parallel(spec: TrialSpec, phases: dict[str, float]) -> None:
    """Megatron's parallel state for the trial's layout, and its seeds."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    t0 = time.perf_counter()
    s = spec.layout
    world = dist.get_world_size()
    if world != s.world_size:
        raise RuntimeError(f"torchrun started {world} ranks but the layout needs "
                           f"dp={s.dp} x tp={s.tp} x pp={s.pp} x cp={s.cp} = {s.world_size}")
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=s.tp,
        pipeline_model_parallel_size=s.pp,
        virtual_pipeline_model_parallel_size=s.vpp if s.vpp > 1 else None,
        context_parallel_size=s.cp,
        expert_model_parallel_size=s.ep,
        distributed_timeout_minutes=distributed_timeout_minutes(_timeout_s()),
        # Gloo groups serve only checkpointing; creating them costs launch time.
        create_gloo_process_groups=False,
    )
    torch.manual_seed(spec.seed)
    model_parallel_cuda_manual_seed(spec.seed)
    phases["mp_init_s"] = time.perf_counter() - t0


def metrics_from_ranks(spec: TrialSpec, steps: StepTimes, ranks: list[dict[str, Any]],
                       phases_s: dict[str, float], *, warm: bool,
                       code_paths: dict[str, str] | None = None) -> dict[str, Any]:
    """result.json: TrialMetrics.to_dict() plus the worker's phase timings and `code_paths`,
    which implementation ran where the installed packages decide it (configure_compiles,
    autotune.worker.build.grad_clip_code)."""
    import statistics

    m, s = spec.model, spec.layout
    times_s = steps.times_s
    median = statistics.median(times_s)
    tokens = s.gbs * m.seq_length
    tflops = model_flops_per_token(m) * tokens / median / s.world_size / 1e12
    losses = [r["loss"] for r in ranks if r["loss"] is not None]
    rank_results = tuple(RankResult(rank=r["rank"],
                                    peak_allocated_bytes=r["peak_allocated_bytes"],
                                    peak_reserved_bytes=r["peak_reserved_bytes"],
                                    device_used_bytes=r["device_used_bytes"])
                         for r in sorted(ranks, key=lambda r: r["rank"]))
    used = [r.device_used_bytes for r in rank_results if r.device_used_bytes is not None]
    clocks = ClockSummary.merge([ClockSummary.from_dict(r["clocks"]) for r in ranks
                                 if r.get("clocks")])
    metrics = TrialMetrics(
        status=TrialStatus.OK,
        step_time_s=median,
        step_time_p90_s=percentile(times_s, 0.9),
        tokens_per_s=tokens / median,
        tflops_per_gpu=tflops,
        mfu=tflops * 1e12 / spec.gpu_peak_bf16_flops,
        peak_allocated_bytes=max(r.peak_allocated_bytes for r in rank_results),
        peak_reserved_bytes=max(r.peak_reserved_bytes for r in rank_results),
        device_used_bytes=max(used) if used else None,
        loss_finite=bool(losses) and all(_finite(x) for x in losses),
        ranks=rank_results,
        timed_steps=len(times_s),
        warmup_s=sum(steps.timing.warmup_s),
        timed_s=sum(times_s),
        stop_reason=steps.timing.reason,
        warm=warm,
        step_time_cv=step_time_cv(times_s),
        clocks=clocks,
        losses=step_losses(ranks),
    )
    data = metrics.to_dict()
    data["step_times_s"] = list(times_s)
    outside = [r["outside_torch_at_start_bytes"] for r in ranks
               if r.get("outside_torch_at_start_bytes") is not None]
    data["outside_torch_at_start_bytes"] = max(outside) if outside else None
    data["warmup_step_times_s"] = list(steps.timing.warmup_s)
    data["loss"] = sum(losses) / len(losses) if losses else None
    data["worker_phases_s"] = phases_s
    data["code_paths"] = dict(code_paths or {})
    # Each rank's host during the timed steps (tools/repeatability.py reads them).
    data["host"] = [r.get("host") for r in sorted(ranks, key=lambda r: r["rank"])]
    # Each rank's process as the trial started (process_state): warm against cold.
    data["process"] = [r.get("process") for r in sorted(ranks, key=lambda r: r["rank"])]
    return data


def step_losses(ranks: list[dict[str, Any]]) -> tuple[float | None, ...]:
    """Each step's loss over the ranks that hold one (the last pipeline stage's data-parallel
    ranks, which see the same batches: their mean), None for a step whose loss was not finite
    (JSON has no NaN): TrialMetrics.losses."""
    series = [r["losses"] for r in ranks if r.get("losses")]
    if not series:
        return ()
    out: list[float | None] = []
    for step in zip(*series, strict=False):
        if any(x is None or not _finite(x) for x in step):
            out.append(None)
        else:
            out.append(sum(step) / len(step))
    return tuple(out)


def step_time_cv(times_s: tuple[float, ...] | list[float]) -> float | None:
    """The timed steps' relative standard deviation (TrialMetrics.step_time_cv)."""
    import statistics

    if len(times_s) < 2:
        return None
    mean = statistics.fmean(times_s)
    return statistics.pstdev(times_s) / mean if mean > 0 else None


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


def run_rank(spec: TrialSpec, out_dir: Path, started: float | None = None, *,
             phases: dict[str, float] | None = None) -> None:
    """Run this rank's part of one trial in a process of its own (a cold launch); rank 0
    writes <out_dir>/result.json. Raises on failure.

    `started` is the perf_counter() at the worker's entry, to report the start-up cost;
    `phases`, what came before (a standby's imports and wait, autotune.worker.standby).
    """
    t0 = time.perf_counter()
    _check_impl(spec)
    phases = dict(phases or {})
    if started is not None:
        phases["startup_s"] = t0 - started
    local_rank = init_world(phases)
    run_trial(spec, out_dir, local_rank, phases, warm=False)


ENV_ON_RECORD = ("CUDA_", "NCCL_", "TORCH_", "PYTORCH_", "OMP_", "MKL_", "NVSHMEM_",
                 "CUBLAS", "CUDNN", "NVTE_", "TRITON_", "LD_PRELOAD", "MALLOC_")
"""The prefixes of the environment variables a trial's record keeps, per rank: what a warm
pool rank and a cold launch must share (issue 30)."""

_earlier_trials: list[str] = []
"""The layouts this process ran before the current trial, in order (a warm pool's ranks)."""


def process_state(spec: TrialSpec) -> dict[str, Any]:
    """This rank's process as a trial starts, for the warm/cold comparison (issue 30): the
    trials it ran before, the environment CUDA, NCCL and torch read, the CPUs it may run on,
    torch's thread counts and allocator settings, the process groups still registered, what
    dynamo has compiled so far, the live Python objects and the threads by name. Read before
    the trial's parallel state is made; costs tens of milliseconds (the gc walk), none of them
    inside a timed step."""
    import gc

    import torch
    import torch.distributed.distributed_c10d as c10d

    from autotune.worker.host import thread_names, thread_table

    state: dict[str, Any] = {
        "trials_before": len(_earlier_trials),
        "after": _earlier_trials[-3:],
        "pid": os.getpid(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_ON_RECORD)},
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "process_groups": len(c10d._world.pg_map),
        "gc_objects": len(gc.get_objects()),
        "gc_frozen": gc.get_freeze_count(),
        "threads": thread_names(thread_table()),
    }
    with contextlib.suppress(AttributeError, OSError):
        cpus = sorted(os.sched_getaffinity(0))
        state["cpus"] = f"{len(cpus)}: {cpus[0]}-{cpus[-1]}" if cpus else "0"
    with contextlib.suppress(Exception):
        state["allocator"] = torch.cuda.get_allocator_backend()
    with contextlib.suppress(Exception):
        from torch._dynamo.utils import counters

        state["dynamo_graphs"] = int(counters["stats"]["unique_graphs"])
    _earlier_trials.append(spec.layout.describe())
    return state


def _check_impl(spec: TrialSpec) -> None:
    if spec.layout.impl == "te" and not te_available():
        raise RuntimeError("impl=te needs transformer-engine, which is not installed")


def run_trial(spec: TrialSpec, out_dir: Path, local_rank: int, phases: dict[str, float], *,
              warm: bool) -> None:
    """One trial on a rank whose default process group is up: parallel state, build, steps,
    the result gathered and written by rank 0. Raises on failure. What it builds is freed when
    it returns (or raises) and its frames are gone; autotune.worker.serve releases the rest."""
    import torch
    import torch.distributed as dist

    from autotune.worker import build, train
    from autotune.worker.clocks import nvml_device_used_bytes
    from autotune.worker.report import write_json

    t0 = time.perf_counter()
    _check_impl(spec)
    configure_allocator(spec.layout.expandable_segments)
    code_paths = {"compiled_shapes": configure_compiles(spec.model)}
    # What the process holds outside torch's allocator before this trial (CUDA context, NCCL,
    # loaded kernels; NVML's figure less torch's reserve): in a warm pool it grew from 3.5 to
    # 7.0-7.6 GiB over a 4-GPU search and stood at 3.4 GiB in a fresh process
    # (results/benchmarks/2026-11-27-h200x4-issue30-s12.md), so a warm trial's device-used
    # figure carries what earlier trials left. On record, per rank, to tell the two apart.
    process = process_state(spec)
    used_at_start = nvml_device_used_bytes(local_rank)
    outside_at_start = None if used_at_start is None else \
        used_at_start - int(torch.cuda.memory_reserved())
    init_model_parallel(spec, phases)
    rank = dist.get_rank()
    if spec.layout.impl == "sdpa":
        from autotune.worker.attention import configure_sdpa_backends

        configure_sdpa_backends()
    t_init = time.perf_counter()
    config = build.transformer_config(spec)
    model = build.build_model(spec, config)
    optimizer = build.build_optimizer(spec, model)
    code_paths["grad_clip"] = build.grad_clip_code()
    t_build = time.perf_counter()
    steps = train.train(spec, model, optimizer, config)
    t_train = time.perf_counter()

    mine = {"rank": rank, "loss": steps.loss, "losses": list(steps.step_losses),
            "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
            "device_used_bytes": nvml_device_used_bytes(local_rank),
            "outside_torch_at_start_bytes": outside_at_start,
            "clocks": None if steps.clocks is None else steps.clocks.to_dict(),
            "host": steps.host, "process": process}
    gathered: list[Any] = [None] * dist.get_world_size() if rank == 0 else []
    dist.gather_object(mine, gathered if rank == 0 else None, dst=0)
    phases.update(init_s=t_init - t0, build_s=t_build - t_init, train_s=t_train - t_build,
                  warmup_s=sum(steps.timing.warmup_s), timed_s=sum(steps.times_s))
    if rank == 0:
        write_json(out_dir / RESULT_NAME,
                   metrics_from_ranks(spec, steps, gathered, phases, warm=warm,
                                      code_paths=code_paths))
        print(result_line(steps.median_s, phases), file=sys.stderr, flush=True)
    print(status_line(rank, TrialStatus.OK), file=sys.stderr, flush=True)
