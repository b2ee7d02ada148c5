"""The distributed optimizer (ZeRO-1): Adam's state sharded over the data-parallel ranks.

megatron-core's DistributedOptimizer (megatron/core/optimizer/distrib_optimizer.py; docs
api-guide/dist_optimizer.md) keeps the fp32 master weights and both Adam moments of 1/d of the
parameters on each of the d data-parallel ranks (dp x cp for dense parameters, the expert-data-
parallel group for experts): 6 + 12/d bytes per parameter instead of 18 (Rajbhandari et al.
2020, "ZeRO", Section 5.1, P_os). The gradients are reduce-scattered instead of all-reduced and
the updated parameters all-gathered, the same volume (Patarasuk & Yuan 2009), and each rank's
Adam step covers its shard only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.dimensions import dimension, flag_label
from autotune.levers.base import CostState, Lever, MemoryState, Seed, evolve
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
    distributed_optimizer: bool = dimension(False, level=5, label=flag_label("do"), help=(
        "Shard the optimizer state over the data-parallel ranks."))


def _core_config(m: ModelSpec, s: Layout) -> dict[str, dict[str, Any]]:
    # Megatron-LM's --use-distributed-optimizer sets both (arguments.py; training.py get_model
    # builds DistributedDataParallelConfig, get_megatron_optimizer reads OptimizerConfig's).
    return {"ddp": {"use_distributed_optimizer": s.distributed_optimizer},
            "optimizer": {"use_distributed_optimizer": s.distributed_optimizer}}


def _memory(m: ModelSpec, s: Layout, state: MemoryState) -> MemoryState:
    if not s.distributed_optimizer:
        return state
    # Dense parameters shard over the dp x cp group, experts over the expert-data-parallel
    # group (parallel_state: the distributed optimizer's groups, with context parallelism).
    return evolve(state, dense_shard=s.dp * s.cp, expert_shard=s.expert_dp)


def _cost(m: ModelSpec, s: Layout, c: ClusterSpec, p: CostParams,
          state: CostState) -> CostState:
    if not s.distributed_optimizer:
        return state
    # Reduce-scatter of the gradients and all-gather of the parameters instead of one
    # all-reduce (autotune.predict.cost._dp_exposed); Adam over the local shard only.
    return evolve(state, dp_sharded=True, dense_shard=s.dp * s.cp, expert_shard=s.expert_dp)


LEVER = Lever(
    name="distributed_optimizer",
    fields=Fields,
    flag_rows=(switch("--use-distributed-optimizer", "distributed_optimizer", Part.LAYOUT),),
    core_config=_core_config,
    memory=_memory,
    cost=_cost,
    seed=Seed.PRACTICE,
    # Megatron practice: shard whenever there is more than one data-parallel rank.
    practice=lambda s, impl: {"distributed_optimizer": s.dp > 1},
)
