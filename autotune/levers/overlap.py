"""Overlapping the data-parallel communication with the backward and forward passes.

megatron-core's DistributedDataParallel reduces gradients bucket by bucket as the backward pass
produces them (overlap_grad_reduce) and, with the distributed optimizer, all-gathers each
bucket's updated parameters just before the next forward pass needs them
(overlap_param_gather); distributed_data_parallel_config.py, param_and_grad_buffer.py. What the
passes do not hide, and the last bucket, stay exposed (autotune.predict.cost._dp_exposed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.dimensions import dimension, flag_label
from autotune.levers.base import CostState, Lever, Requires, Seed, evolve
from autotune.levers.flags import Part, switch

if TYPE_CHECKING:
    from autotune.layouts.layout import Layout
    from autotune.predict.cost import CostParams
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.model import ModelSpec

__all__ = ["LEVER", "Fields"]


@dataclass(frozen=True, kw_only=True)
class Fields:
    __slots__ = ()
    overlap_grad_reduce: bool = dimension(False, level=5, label=flag_label("ogr"), help=(
        "Overlap the gradient reduce-scatter/all-reduce with the backward pass."))
    overlap_param_gather: bool = dimension(False, level=5, label=flag_label("opg"), help=(
        "Overlap the distributed optimizer's parameter all-gather with the forward pass."))


def _core_config(m: ModelSpec, s: Layout) -> dict[str, dict[str, Any]]:
    return {"ddp": {
        "overlap_grad_reduce": s.overlap_grad_reduce,
        "overlap_param_gather": s.overlap_param_gather,
        # Megatron-LM's --align-param-gather defaults on and validate_args keeps it only with
        # the interleaved schedule (arguments.py: align_param_gather needs vpp > 1).
        "align_param_gather": s.overlap_param_gather and s.vpp > 1,
    }}


def _cost(m: ModelSpec, s: Layout, c: ClusterSpec, p: CostParams,
          state: CostState) -> CostState:
    return evolve(state, overlap_grad_reduce=s.overlap_grad_reduce,
                  overlap_param_gather=s.overlap_param_gather)


def _opg_message(s: Layout, unmet: str) -> str:
    return f"overlap_param_gather needs {unmet}"


LEVER = Lever(
    name="overlap",
    fields=Fields,
    # Megatron-LM arguments.py: "--overlap-param-gather only supported with distributed
    # optimizer" and it requires --overlap-grad-reduce.
    requires=(Requires(name="opg_do", level=5,
                       summary="overlap_param_gather needs the distributed optimizer",
                       needs=(("distributed_optimizer", True), ("overlap_grad_reduce", True)),
                       when=lambda s: s.overlap_param_gather, message=_opg_message),),
    flag_rows=(switch("--overlap-grad-reduce", "overlap_grad_reduce", Part.LAYOUT),
               switch("--overlap-param-gather", "overlap_param_gather", Part.LAYOUT)),
    core_config=_core_config,
    memory=None,
    no_memory=("the buckets overlap communicates are the gradient and parameter buffers that "
               "exist either way (param_and_grad_buffer.py); the memory model prices no "
               "difference and the measured peaks showed none above the model's band "
               "(docs/DESIGN.md's warm-pool table: 66.04 vs 66.07 GiB)"),
    cost=_cost,
    seed=Seed.PRACTICE,
    # Megatron practice: overlap the gradient reduce always, the parameter gather with dp > 1
    # (where the distributed optimizer is on).
    practice=lambda s, impl: {"overlap_grad_reduce": True, "overlap_param_gather": s.dp > 1},
)
