"""The precision-aware optimizer: Adam's moments in bf16, the master weights as bf16 remainders.

megatron-core 0.16.1 (optimizer/optimizer_config.py, optimizer/__init__.py, distrib_optimizer.py):
with `use_precision_aware_optimizer`, Transformer Engine's FusedAdam holds the master weights
(`master_weights=True`, `master_weight_dtype` fp32) and the moments in `exp_avg_dtype` /
`exp_avg_sq_dtype`; the distributed optimizer then keeps no fp32 copy of its shard
(`shard_main_param = None`). With TE >= 2.1 and bf16 parameters FusedAdam stores only the 16 low
bits of each fp32 master weight (`store_param_remainders`, the bf16 parameter holds the high
16). autotune uses it with bf16 moments and fp32 main gradients and parameters
(`--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16`): 2 + 2 + 2 = 6 bytes of optimizer state per
parameter instead of 12. megatron-core asserts the distributed optimizer and Adam
(OptimizerConfig.__post_init__) and raises without TE's FusedAdam ("requires FusedAdam from
TransformerEngine"); Megatron-LM's arguments.py names the flags.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.dimensions import Impl, dimension, flag_label
from autotune.errors import ConfigError
from autotune.levers.base import CostState, Lever, MemoryState, Requires, Rule, Seed, evolve
from autotune.levers.flags import Flag, FlagRow, Given, Part, RunOptions

if TYPE_CHECKING:
    from autotune.layouts.layout import Layout
    from autotune.predict.cost import CostParams
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.model import ModelSpec

__all__ = ["LEVER", "SAVED_BYTES_PER_PARAM", "SAVED_TRAFFIC_PER_PARAM", "Fields"]

SAVED_BYTES_PER_PARAM = 6
"""Optimizer state per parameter: fp32 master (4 B) -> its 16-bit remainder (2 B), fp32 Adam
moments (4 + 4 B) -> bf16 (2 + 2 B)."""
SAVED_TRAFFIC_PER_PARAM = 10
"""HBM traffic of the Adam step per parameter: reading and writing master, m and v moves 12 B
less each way (24 -> 12), and rebuilding the master from its remainder reads the bf16 parameter
again (+2 B): 10 B less of autotune.predict.cost.CostParams.optimizer_bytes_per_param's 32. A byte
count, not a measurement."""


@dataclass(frozen=True, kw_only=True)
class Fields:
    __slots__ = ()
    precision_aware_optimizer: bool = dimension(False, level=5, label=flag_label("pao"), help=(
        "megatron-core's precision-aware optimizer with bf16 Adam moments "
        "(`--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16`): 6 "
        "instead of 12 bytes of optimizer state per parameter; needs the distributed "
        "optimizer and Transformer Engine."))



def _emit(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    if not s.precision_aware_optimizer:
        return []
    return ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16",
            "--exp-avg-sq-dtype", "bf16"]


def _read(g: Given) -> dict[str, Any]:
    if not g.has("--use-precision-aware-optimizer"):
        return {"precision_aware_optimizer": False}
    # arguments.py defaults every dtype to fp32; autotune models the bf16 moments only.
    given = {name: g.text(name, "fp32") for name in (
        "--exp-avg-dtype", "--exp-avg-sq-dtype", "--main-grads-dtype", "--main-params-dtype")}
    wanted = {"--exp-avg-dtype": "bf16", "--exp-avg-sq-dtype": "bf16",
              "--main-grads-dtype": "fp32", "--main-params-dtype": "fp32"}
    if given != wanted:
        listed = " ".join(f"{k} {v}" for k, v in given.items())
        raise ConfigError(f"{g.source}: --use-precision-aware-optimizer with {listed}: autotune "
                          "models it with bf16 moments and fp32 main grads and params only")
    return {"precision_aware_optimizer": True}


def _core_config(m: ModelSpec, s: Layout) -> dict[str, dict[str, Any]]:
    on = s.precision_aware_optimizer
    # OptimizerConfig's fields; every dtype stays fp32 unless the optimizer is on (its
    # __post_init__ asserts so).
    return {"optimizer": {"use_precision_aware_optimizer": on,
                          "exp_avg_dtype": "bfloat16" if on else "float32",
                          "exp_avg_sq_dtype": "bfloat16" if on else "float32"}}


def _memory(m: ModelSpec, s: Layout, state: MemoryState) -> MemoryState:
    if not s.precision_aware_optimizer:
        return state
    return evolve(state, optimizer_bytes_per_param=state.optimizer_bytes_per_param
                  - SAVED_BYTES_PER_PARAM)


def _cost(m: ModelSpec, s: Layout, c: ClusterSpec, p: CostParams,
          state: CostState) -> CostState:
    if not s.precision_aware_optimizer:
        return state
    return evolve(state, optimizer_bytes_per_param=state.optimizer_bytes_per_param
                  - SAVED_TRAFFIC_PER_PARAM)


def _needs_te(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # OptimizerConfig.__post_init__: "--use-precision-aware-optimizer requires FusedAdam from
    # TransformerEngine" (a RuntimeError without TE); before that, even with the optimizer's
    # CPU offload, it calls is_te_min_version("2.1.0"), which fails without TE in 0.16.1 (0.19
    # reads a missing TE as 0.0.0 and lets the offload through: megatron_versions.V0_19).
    # autotune's marker for an installed TE is impl te (the search drops te where TE is absent).
    if s.precision_aware_optimizer and s.impl != Impl.TE:
        return (f"precision_aware_optimizer needs Transformer Engine's FusedAdam (impl=te), "
                f"got impl={s.impl}")
    return None


LEVER = Lever(
    name="precision_optimizer",
    fields=Fields,
    rules=(Rule("pao_te", 5, "the precision-aware optimizer needs TE's FusedAdam", _needs_te),),
    # OptimizerConfig.__post_init__: "--use-precision-aware-optimizer only supported with
    # distributed optimizer".
    requires=(Requires(name="pao_do", level=5,
                       summary="the precision-aware optimizer needs the distributed optimizer",
                       needs=(("distributed_optimizer", True),),
                       when=lambda s: s.precision_aware_optimizer,
                       message=lambda s, unmet: f"precision_aware_optimizer needs {unmet}"),),
    flag_rows=(FlagRow(name="precision_aware_optimizer", part=Part.LAYOUT,
                       flags=(Flag("--use-precision-aware-optimizer", takes_value=False),
                              Flag("--exp-avg-dtype"), Flag("--exp-avg-sq-dtype"),
                              Flag("--main-grads-dtype"), Flag("--main-params-dtype")),
                       emit=_emit, read=_read),),
    core_config=_core_config,
    memory=_memory,
    cost=_cost,
    seed=Seed.MEMORY,
)
