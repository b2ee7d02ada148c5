"""megatron-core's optimizer CPU offload: part of Adam's state and its step on the host.

megatron-core 0.16.1, optimizer/__init__.py and optimizer/cpu_offloading/hybrid_optimizer.py:
with `optimizer_cpu_offload` the HybridDeviceOptimizer moves the first `optimizer_offload_
fraction` of each rank's (distributed-optimizer shard of) parameters to pinned host memory and
steps them with torch's AdamW on the CPU; the rest steps on the GPU. It updates in fp32
(`param_update_in_fp32=True`): every parameter gets an fp32 copy on its device, and the moments
are fp32 whatever the precision-aware optimizer's dtypes. Each step copies the offloaded part's
gradients to the host and its updated parameters back. Megatron-LM's arguments.py:
"The optimizer cpu offload must be used in conjunction with `--use-precision-aware-optimizer`",
and `--optimizer-offload-fraction` defaults to 1.0 there (OptimizerConfig's default is 0.0), so
the export always writes it. The field is a percentage, so that a value is exact in labels,
run keys and Optuna's storage.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from autotune.dimensions import dimension, unless_default
from autotune.errors import ConfigError
from autotune.levers.base import CostState, Lever, MemoryState, Requires, Rule, Seed
from autotune.levers.flags import Flag, FlagRow, Given, Part, RunOptions

if TYPE_CHECKING:
    from autotune.layouts.layout import Layout
    from autotune.predict.cost import CostParams
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.model import ModelSpec

__all__ = [
    "CPU_STEP_BYTES_PER_PARAM",
    "GPU_BYTES_PER_PARAM",
    "HOST_BYTES_PER_PARAM",
    "LEVER",
    "PCIE_BYTES_PER_PARAM",
    "Constants",
    "Fields",
]

GPU_BYTES_PER_PARAM = 12
"""The GPU part: an fp32 copy of each parameter (param_update_in_fp32) and fp32 Adam moments."""
HOST_BYTES_PER_PARAM = 18
"""The host part, per offloaded parameter (hybrid_optimizer.py _get_sub_optimizer_param_groups
and _set_sub_optimizer_grads): the pinned bf16 clone (2 B), its fp32 copy (4 B), the pinned
fp32 gradient (4 B) and fp32 Adam moments (8 B)."""
CPU_STEP_BYTES_PER_PARAM = 28
"""Host memory traffic of torch's AdamW per parameter: read parameter, gradient, m, v (16 B),
write parameter, m, v (12 B)."""
PCIE_BYTES_PER_PARAM = 8
"""Over the host link per offloaded parameter and step: the fp32 gradient down (4 B) and the
fp32 parameter up (4 B, copied into the bf16 parameter on the GPU)."""


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
    cpu_optimizer_bytes_per_s: float = 20e9
    """Host memory bandwidth one rank's CPU AdamW step streams at. An estimate, not yet
    measured: a two-socket H100 host's DDR5 (8 channels x 4800 MT/s x 8 B = 307 GB/s a socket,
    datasheet) shared by 8 ranks is ~75 GB/s a rank at best; a quarter of that is assumed for
    torch's CPU kernels. `autotune calibrate` may fit it once trials with the offload ran."""


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
    return replace(state, optimizer_bytes_per_param=GPU_BYTES_PER_PARAM * (1 - f),
                   host_bytes_per_param=state.host_bytes_per_param + HOST_BYTES_PER_PARAM * f)


def _cost(m: ModelSpec, s: Layout, c: ClusterSpec, p: CostParams,
          state: CostState) -> CostState:
    f = _fraction(s)
    if not f:
        return state
    # Without --overlap-cpu-optimizer-d2h-h2d (not set) the copies and the CPU step run one
    # after the other on the step's critical path (hybrid_optimizer.py step: the d2h stream is
    # the current stream); the GPU part steps fp32 state as without the precision-aware
    # optimizer.
    pcie = c.gpu.pcie_bytes_per_s * p.pcie_efficiency
    host_s = PCIE_BYTES_PER_PARAM / pcie + CPU_STEP_BYTES_PER_PARAM / p.cpu_optimizer_bytes_per_s
    return replace(state, optimizer_bytes_per_param=p.optimizer_bytes_per_param * (1 - f),
                   optimizer_host_s_per_param=state.optimizer_host_s_per_param + f * host_s)


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
)
