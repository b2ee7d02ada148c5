"""Profile training steps of a trial on one GPU (torchrun --nproc-per-node 1) and print where the
time goes: the wall time of timed steps, the GPU kernel time by kernel family (what is left of the
wall is the GPU waiting for the host), the host time of each phase of megatron-core's MoE layer
(forward: router, dispatch, experts, combine; MoELayer's own methods, core_v0.16.1 moe_layer.py),
the host's synchronizations, and the setup phases (build, optimizer, first steps).

    torchrun --nproc-per-node 1 tools/device_profile.py trial.json OUT.txt \
        [--moe-dispatcher allgather|alltoall] [--timed-steps 6]

--moe-dispatcher replaces the token dispatcher of autotune's core config for this run only, to
compare megatron-core's dispatchers on one layout.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from autotune.megatron import core_config as core_config_module
from autotune.trials.trial import TrialSpec

_FAMILIES = (("flash/sdpa", ("flash", "fmha", "cudnn", "attention")),
             ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "sm90", "cublas")),
             ("adam", ("adam",)), ("nccl", ("nccl",)),
             ("softmax", ("softmax",)), ("layernorm", ("layer_norm", "layernorm")),
             ("permute", ("permut", "moe", "sort", "scatter", "gather", "index")),
             ("triton/compiled", ("triton",)), ("copy/cast", ("copy", "cast")),
             ("reduce", ("reduce",)), ("elementwise", ("elementwise", "vectorized")))
_MOE_PHASES = ("route", "preprocess", "dispatch", "shared_experts_compute",
               "routed_experts_compute", "combine", "postprocess")
"""MoELayer's methods in its forward, in order (core_v0.16.1 moe_layer.py)."""
_SYNC_OPS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize",
             "cudaMemcpyAsync", "aten::_local_scalar_dense", "aten::item", "aten::nonzero")


def _family(name: str) -> str:
    low = name.lower()
    for family, keys in _FAMILIES:
        if any(k in low for k in keys):
            return family
    return "other"


def _with_dispatcher(dispatcher: str) -> None:
    """core_config's transformer kwargs with another token dispatcher, for this process."""
    original = core_config_module.core_config

    @functools.wraps(original)
    def patched(model: Any, layout: Any) -> Any:
        config = original(model, layout)
        if "moe_token_dispatcher_type" in config.transformer:
            config.transformer["moe_token_dispatcher_type"] = dispatcher
        return config

    core_config_module.core_config = patched


def _range_moe_phases() -> None:
    """Each MoELayer phase inside a profiler range of its own name."""
    from megatron.core.transformer.moe.moe_layer import MoELayer

    for name in _MOE_PHASES:
        method = getattr(MoELayer, name, None)
        if method is None:
            continue

        def ranged(self: Any, *args: Any, _m: Any = method, _n: str = name, **kw: Any) -> Any:
            with torch.profiler.record_function(f"moe.{_n}"):
                return _m(self, *args, **kw)

        setattr(MoELayer, name, ranged)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("trial")
    parser.add_argument("out")
    parser.add_argument("--moe-dispatcher", choices=("allgather", "alltoall"))
    parser.add_argument("--timed-steps", type=int, default=6)
    args = parser.parse_args()
    if args.moe_dispatcher:
        _with_dispatcher(args.moe_dispatcher)
    # Imported after the patch: build binds core_config at import.
    from autotune.worker import build, train
    from autotune.worker.run import (
        configure_compiles,
        init_model_parallel,
        init_world,
        prepare_environment,
    )

    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    spec = TrialSpec.from_json(Path(args.trial).read_text())
    prepare_environment(spec)
    init_world(phases)
    configure_compiles(spec.model)
    init_model_parallel(spec, phases)
    if spec.layout.impl == "sdpa":
        from autotune.worker.attention import configure_sdpa_backends

        configure_sdpa_backends()
    phases["init"] = time.perf_counter() - t0
    t = time.perf_counter()
    config = build.transformer_config(spec)
    model = build.build_model(spec, config)
    torch.cuda.synchronize()
    phases["build model"] = time.perf_counter() - t
    t = time.perf_counter()
    optimizer = build.build_optimizer(spec, model)
    train._wire_grad_sync(spec, model, optimizer, config)
    torch.cuda.synchronize()
    phases["optimizer"] = time.perf_counter() - t
    from megatron.core.pipeline_parallel import get_forward_backward_func

    _range_moe_phases()
    batches = train.make_batches(spec, torch.device("cuda"))
    iters = [itertools.cycle(batches) for _ in model]
    fb = get_forward_backward_func()
    for i in range(3):
        t = time.perf_counter()
        train._step(spec, model, optimizer, iters, fb)
        torch.cuda.synchronize()
        phases[f"step {i + 1}"] = time.perf_counter() - t
    walls = []
    for _ in range(args.timed_steps):
        t = time.perf_counter()
        train._step(spec, model, optimizer, iters, fb)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        t = time.perf_counter()
        train._step(spec, model, optimizer, iters, fb)
        torch.cuda.synchronize()
        profiled_wall = time.perf_counter() - t
    events = prof.key_averages()
    by_family: dict[str, float] = defaultdict(float)
    host: dict[str, tuple[float, int]] = {}
    gpu = 0.0
    for e in events:
        ranged = e.key.startswith("moe.")
        if (ranged or e.key in _SYNC_OPS) and e.device_type == torch.autograd.DeviceType.CPU:
            # A range is listed twice, on the CPU and as a GPU annotation spanning its kernels:
            # the host's time is the CPU entry's (session 23's first profile took the other).
            host[e.key] = (e.cpu_time_total, e.count)
        t = getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0))
        if ranged or t <= 0 or e.device_type != torch.autograd.DeviceType.CUDA:
            continue  # the ranges' GPU annotations would count their kernels twice
        by_family[_family(e.key)] += t
        gpu += t
    walls.sort()
    median = walls[len(walls) // 2]
    dispatcher = build.transformer_config_kwargs(spec).get("moe_token_dispatcher_type", "-")
    lines = [f"trial: {spec.model.name} {spec.layout}",
             f"dispatcher: {dispatcher}",
             f"timed steps: {len(walls)}, median {median:.4f} s, min {walls[0]:.4f} s, "
             f"max {walls[-1]:.4f} s",
             f"profiled step: {profiled_wall:.4f} s wall, {gpu / 1e6:.4f} s GPU kernels "
             f"({100 * gpu / 1e6 / profiled_wall:.1f}% busy)",
             "setup (s): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()),
             "host ranges (ms in the profiled step, calls):"]
    lines += [f"  {k:<32} {v / 1e3:9.2f} ms {n:6d}" for k, (v, n) in sorted(host.items())]
    lines.append("GPU kernel time by family:")
    lines += [f"  {k:<16} {v / 1e3:9.1f} ms {100 * v / gpu:5.1f}%"
              for k, v in sorted(by_family.items(), key=lambda kv: -kv[1])]
    lines.append(events.table(sort_by="self_cuda_time_total", row_limit=25,
                              max_name_column_width=70))
    lines.append(events.table(sort_by="self_cpu_time_total", row_limit=25,
                              max_name_column_width=70))
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines[:40]), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
