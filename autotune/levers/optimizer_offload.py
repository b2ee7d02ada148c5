"""megatron-core's optimizer CPU offload: part of Adam's state and its step on the host.

megatron-core 0.16.1, optimizer/__init__.py and optimizer/cpu_offloading/hybrid_optimizer.py:
with `optimizer_cpu_offload` the HybridDeviceOptimizer moves the first `optimizer_offload_
fraction` of each rank's (distributed-optimizer shard of) parameters to pinned host memory and
steps them with torch's AdamW on the CPU; the rest steps on the GPU. It updates in fp32
(`param_update_in_fp32=True`): every parameter gets an fp32 copy on its device, and the moments
are fp32 whatever the precision-aware optimizer's dtypes. Each step copies the offloaded part's
gradients to the host and its updated parameters back (what runs, and its price: `_cost`).
Megatron-LM's arguments.py:
"The optimizer cpu offload must be used in conjunction with `--use-precision-aware-optimizer`",
and `--optimizer-offload-fraction` defaults to 1.0 there (OptimizerConfig's default is 0.0), so
the export always writes it. The field is a percentage, so that a value is exact in labels,
run keys and Optuna's storage.

A space may mark it `derive` (autotune.search.derive): with the precision-aware optimizer, the
fewest percent whose predicted peak fits. GPU memory falls and the step's host time rises with
every offloaded percent (`_memory`, `_cost`), so the fewest that fits is the fastest. It is
the memory lever of last resort: the search adds it where nothing else fits
(autotune.search.last_resort).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.dimensions import dimension, unless_default
from autotune.errors import ConfigError
from autotune.levers.base import (
    CostState,
    Derivable,
    Lever,
    MemoryState,
    Requires,
    Rule,
    Seed,
    evolve,
)
from autotune.levers.flags import Flag, FlagRow, Given, Part, RunOptions

if TYPE_CHECKING:
    from autotune.layouts.layout import Layout
    from autotune.predict.cost import CostParams
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.model import ModelSpec

__all__ = [
    "CPU_STEP_BYTES_PER_PARAM",
    "D2H_BYTES_PER_PARAM",
    "GPU_BYTES_PER_PARAM",
    "H2D_BYTES_PER_PARAM",
    "HOST_BYTES_PER_PARAM",
    "LEVER",
    "STAGING_BYTES_PER_PARAM",
    "Constants",
    "Fields",
    "host_s_per_param",
]

GPU_BYTES_PER_PARAM = 12
"""The GPU part: an fp32 copy of each parameter (param_update_in_fp32) and fp32 Adam moments."""
HOST_BYTES_PER_PARAM = 18
"""The host part, per offloaded parameter (hybrid_optimizer.py _get_sub_optimizer_param_groups
and _set_sub_optimizer_grads): the pinned bf16 clone (2 B), its fp32 copy (4 B), the pinned
fp32 gradient (4 B) and fp32 Adam moments (8 B)."""
CPU_STEP_BYTES_PER_PARAM = 28
"""Host memory traffic of the CPU AdamW step per parameter, one pass: megatron-core builds it
with `fused=True` in its parameter groups (optimizer/__init__.py, optimizer_defaults), so
torch.optim.AdamW runs torch._fused_adamw_'s CPU kernel (torch >= 2.4), which reads the fp32
parameter, gradient, m and v (16 B) and writes parameter, m and v (12 B) in one loop."""
D2H_BYTES_PER_PARAM = 4
"""Gradient to the host per offloaded parameter: the fp32 main gradient (grad_reduce_in_fp32,
autotune.megatron.core_config) copied into a pinned fp32 buffer (hybrid_optimizer.py
_set_sub_optimizer_grads, pin_cpu_grads): a DMA at the host link's pinned rate."""
H2D_BYTES_PER_PARAM = 4
"""Parameter back to the GPU per offloaded parameter: the fp32 host copy (`.float()` of the
pinned bf16 clone, hybrid_optimizer.py _get_sub_optimizer_param_groups: pageable, not pinned)
copied into the bf16 GPU parameter with non_blocking=True, which torch's copy_kernel_cuda
(aten/src/ATen/native/cuda/Copy.cu) moves as fp32 and casts on the GPU."""
STAGING_BYTES_PER_PARAM = 8
"""Host copy of that pageable fp32 parameter into the CUDA driver's pinned staging buffer
(read 4 B, write 4 B), done by the calling thread while the DMA drains it (CUDA Runtime API
docs, "API synchronization behavior": from pageable host memory the driver stages the copy
into pinned memory and returns once the pageable buffer has been copied to the staging
memory)."""
PCIE_BYTES_PER_PARAM = D2H_BYTES_PER_PARAM + H2D_BYTES_PER_PARAM
"""Over the host link per offloaded parameter and step, both directions."""


@dataclass(frozen=True, kw_only=True)
class Fields:
    __slots__ = ()
    optimizer_offload_percent: int = dimension(
        0, level=5, label=unless_default("oo", 0), minimum=0, help=(
            "Percent of the optimizer state and step moved to the CPU (`--optimizer-cpu-"
            "offload --optimizer-offload-fraction`, megatron-core's HybridDeviceOptimizer); "
            "0: none. Needs the precision-aware optimizer."))


@dataclass(frozen=True, kw_only=True)
class Constants:
    __slots__ = ()
    cpu_optimizer_bytes_per_s: float = 18.4e9
    """Host memory bytes per second that one CPU core streams through the offloaded step (the
    fused AdamW kernel and the staging copy of the parameters). One core: the runner starts
    every rank with OMP_NUM_THREADS=1 (autotune.trials.runner._DEFAULT_ENV), so the CPU
    kernels run on the rank's main thread, and the measured trials show it: the process's CPU
    time over the timed steps equals their wall time (25.3 s in 25.1 s at 50%, 41.9 s in 41.6 s
    at 100%). One core's rate is set by its outstanding cache-line misses, not by the socket's
    DDR5 (~300 GB/s), so it holds while 8 ranks step at once. Fitted (least squares on log
    step time, every other constant as shipped) to the three offload trials of
    tests/data/measured_trials.json (s10-optim/2, /3, /6: Llama-3.2-3B, seq 8192, one H200, 50%
    and 100% offloaded, with and without full recompute; results/benchmarks/2026-11-28-cpu-
    optimizer-offload-cost.md). A check off the GPU host: torch 2.13's fused CPU AdamW on one
    core of a cloud Xeon streams 17.2 GB/s (1.62 ns per parameter, same report).
    `autotune calibrate` fits it again to a machine's own offload trials."""


def _fraction(s: Layout) -> float:
    return s.optimizer_offload_percent / 100


def _emit(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    if not s.optimizer_offload_percent:
        return []
    return ["--optimizer-cpu-offload", "--optimizer-offload-fraction", f"{_fraction(s):g}"]


def _read(g: Given) -> dict[str, Any]:
    if not g.has("--optimizer-cpu-offload"):
        return {"optimizer_offload_percent": 0}
    fraction = g.number("--optimizer-offload-fraction", 1.0)  # Megatron-LM's default
    percent = round(fraction * 100)
    if not 0 <= fraction <= 1 or abs(percent - fraction * 100) > 1e-6:
        raise ConfigError(f"{g.source}: --optimizer-offload-fraction {fraction} must be a "
                          "whole percentage between 0 and 1 (autotune offers 0.01 steps)")
    return {"optimizer_offload_percent": percent}


def _core_config(m: ModelSpec, s: Layout) -> dict[str, dict[str, Any]]:
    return {"optimizer": {"optimizer_cpu_offload": s.optimizer_offload_percent > 0,
                          "optimizer_offload_fraction": _fraction(s)}}


def _memory(m: ModelSpec, s: Layout, state: MemoryState) -> MemoryState:
    f = _fraction(s)
    if not f:
        return state
    # Replaces what the levers before it set: the HybridDeviceOptimizer keeps fp32 state for
    # its GPU part too (the precision-aware optimizer's bf16 moments do not reach it).
    return evolve(state, optimizer_bytes_per_param=GPU_BYTES_PER_PARAM * (1 - f),
                   host_bytes_per_param=state.host_bytes_per_param + HOST_BYTES_PER_PARAM * f,
                   step_group_bytes_per_param=0.0)


def host_s_per_param(c: ClusterSpec, p: CostParams) -> float:
    """Seconds per offloaded parameter that a step spends on the host and its link, one after
    the other (what `_cost` prices; hybrid_optimizer.py HybridDeviceOptimizer.step with
    overlap_cpu_optimizer_d2h_h2d off, megatron-core's and Megatron-LM's default):
    1. the gradients' D2H copy, queued on the compute stream after the backward; the CPU waits
       for it (d2h_event.synchronize) -- a pinned DMA at the host link's rate;
    2. the CPU AdamW step, one fused pass over 28 B per parameter on one core;
    3. the post-step hook's H2D copy of the updated parameters from pageable memory: the
       calling thread copies them into the driver's staging buffer while the DMA drains it, so
       it takes the longer of the host copy and the link.
    The GPU's own part (1 - f of the shard) is queued before the CPU waits, so it runs during
    step 2; the model still adds it (optimizer_bytes_per_param), a few milliseconds at most."""
    pcie = c.gpu.pcie_bytes_per_s * p.pcie_efficiency
    core = p.cpu_optimizer_bytes_per_s
    return (D2H_BYTES_PER_PARAM / pcie + CPU_STEP_BYTES_PER_PARAM / core
            + max(STAGING_BYTES_PER_PARAM / core, H2D_BYTES_PER_PARAM / pcie))


def _cost(m: ModelSpec, s: Layout, c: ClusterSpec, p: CostParams,
          state: CostState) -> CostState:
    f = _fraction(s)
    if not f:
        return state
    # The GPU part steps fp32 state as without the precision-aware optimizer; the offloaded
    # part's copies and CPU step are on the step's critical path (host_s_per_param).
    return evolve(state, optimizer_bytes_per_param=p.optimizer_bytes_per_param * (1 - f),
                   optimizer_host_s_per_param=state.optimizer_host_s_per_param
                   + f * host_s_per_param(c, p))


def _percent(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    if s.optimizer_offload_percent > 100:
        return (f"optimizer_offload_percent={s.optimizer_offload_percent} must be at most 100 "
                "(a fraction of the optimizer state)")
    return None


LEVER = Lever(
    name="optimizer_offload",
    fields=Fields,
    rules=(Rule("offload_percent", 5, "optimizer_offload_percent is at most 100", _percent),),
    # Megatron-LM arguments.py validate_args: "The optimizer cpu offload must be used in
    # conjunction with `--use-precision-aware-optimizer`".
    requires=(Requires(name="offload_pao", level=5,
                       summary="the optimizer's CPU offload needs the precision-aware optimizer",
                       needs=(("precision_aware_optimizer", True),),
                       when=lambda s: s.optimizer_offload_percent > 0,
                       message=lambda s, unmet: f"optimizer_offload_percent="
                                                f"{s.optimizer_offload_percent} needs {unmet}"),),
    flag_rows=(FlagRow(name="optimizer_offload_percent", part=Part.LAYOUT,
                       flags=(Flag("--optimizer-cpu-offload", takes_value=False),
                              Flag("--optimizer-offload-fraction")),
                       emit=_emit, read=_read),),
    core_config=_core_config,
    memory=_memory,
    cost=_cost,
    seed=Seed.MEMORY,
    constants=Constants,
    # Only beside the precision-aware optimizer (offload_pao), the fewest whole percent.
    derivable=(Derivable(name="optimizer_offload_percent",
                         applies=lambda s, m: s.precision_aware_optimizer,
                         values=lambda s, m: tuple(range(1, 101)),
                         monotone=lambda s: True, off=0,
                         rules=("offload_percent", "offload_pao")),),
)
