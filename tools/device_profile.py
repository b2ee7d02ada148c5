"""Profile one training step of a trial on one GPU (torchrun --nproc-per-node 1) and print where
CUDA time goes, by kernel family. Usage: torchrun ... tools/device_profile.py trial.json OUT.txt"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import torch

from autotune.trials.trial import TrialSpec
from autotune.worker import build, train
from autotune.worker.run import (
    configure_compiles,
    init_model_parallel,
    init_world,
    prepare_environment,
)

_FAMILIES = (("flash/sdpa", ("flash", "fmha", "cudnn", "attention")),
             ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "sm90", "cublas")),
             ("adam", ("adam",)), ("nccl", ("nccl",)),
             ("softmax", ("softmax",)), ("layernorm", ("layer_norm", "layernorm")),
             ("triton/compiled", ("triton",)), ("copy/cast", ("copy", "cast")),
             ("reduce", ("reduce",)), ("elementwise", ("elementwise", "vectorized")))


def _family(name: str) -> str:
    low = name.lower()
    for family, keys in _FAMILIES:
        if any(k in low for k in keys):
            return family
    return "other"


def main() -> None:
    spec = TrialSpec.from_json(Path(sys.argv[1]).read_text())
    prepare_environment(spec)
    init_world({})
    configure_compiles(spec.model)
    init_model_parallel(spec, {})
    if spec.layout.impl == "sdpa":
        from autotune.worker.attention import configure_sdpa_backends

        configure_sdpa_backends()
    config = build.transformer_config(spec)
    model = build.build_model(spec, config)
    optimizer = build.build_optimizer(spec, model)
    train._wire_grad_sync(spec, model, optimizer, config)
    from megatron.core.pipeline_parallel import get_forward_backward_func

    batches = train.make_batches(spec, torch.device("cuda"))
    import itertools

    iters = [itertools.cycle(batches) for _ in model]
    fb = get_forward_backward_func()
    for _ in range(2):
        train._step(spec, model, optimizer, iters, fb)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        train._step(spec, model, optimizer, iters, fb)
        torch.cuda.synchronize()
    events = prof.key_averages()
    by_family: dict[str, float] = defaultdict(float)
    total = 0.0
    for e in events:
        t = getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0))
        if t <= 0 or e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        by_family[_family(e.key)] += t
        total += t
    inner = build._inner_optimizers(optimizer)
    lines = [f"inner optimizer: {[type(o).__name__ for o in inner]}",
             f"fused groups: {[g.get('fused') for o in inner for g in o.param_groups]}",
             f"GPU kernel time in one step: {total / 1e3:.1f} ms"]
    lines += [f"  {k:<16} {v / 1e3:9.1f} ms {100 * v / total:5.1f}%"
              for k, v in sorted(by_family.items(), key=lambda kv: -kv[1])]
    lines.append(events.table(sort_by="self_cuda_time_total", row_limit=30,
                              max_name_column_width=70))
    Path(sys.argv[2]).write_text("\n".join(lines))
    print("\n".join(lines[:16]), flush=True)
    import os

    os._exit(0)


if __name__ == "__main__":
    main()
