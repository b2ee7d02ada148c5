"""The precision-aware optimizer: Adam's moments in bf16, the master weights as bf16 remainders.

megatron-core 0.16.1 (optimizer/optimizer_config.py, optimizer/__init__.py, distrib_optimizer.py):
with `use_precision_aware_optimizer`, Transformer Engine's FusedAdam holds the master weights
(`master_weights=True`, `master_weight_dtype` fp32) and the moments in `exp_avg_dtype` /
`exp_avg_sq_dtype`; the distributed optimizer then keeps no fp32 copy of its shard
(`shard_main_param = None`). With TE >= 2.1 and bf16 parameters FusedAdam stores only the 16 low
bits of each fp32 master weight (`store_param_remainders`, the bf16 parameter holds the high
16). autotune uses it with bf16 moments and fp32 main gradients and parameters
(`--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16`): 2 + 2 + 2 = 6 bytes of optimizer state per
parameter instead of 12. Inside the step the moments are not used in bf16: FusedAdam.step (TE
2.11 transformer_engine/pytorch/optimizers/fused_adam.py, `unscaled_lists`) makes an fp32 copy
of each bf16 moment (`get_unscaled_state`: `.float()`) for every parameter of a parameter group,
runs the fp32 kernel over the group, writes the moments back and frees the copies: 8 B per
parameter of the group, only during the step, when the micro-batches' activations are freed.
The step's peak is then 2 + 4 + 6 + 8 = 20 B per parameter at dp 1, 2 B more than without the
optimizer (18 B): it saves memory only where the activations' peak is above the step's. Seen on
one H200 (results/benchmarks/2026-11-29-h200-xseg-band-s25.md): Llama-3.1-8B at dp 1 ran out of
memory creating the moments in its first step, predicted at 113.6 GiB without this copy.
megatron-core asserts the distributed optimizer and Adam
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
from autotune.levers.fp8 import Fp8, Fp8Recipe

if TYPE_CHECKING:
    from autotune.layouts.layout import Layout
    from autotune.predict.cost import CostParams
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.model import ModelSpec

__all__ = ["EXTRA_TRAFFIC_PER_PARAM", "LEVER", "MCORE_MASTER_BYTES", "MCORE_MASTER_TRAFFIC",
           "MOMENT_COPY_BYTES",
           "SAVED_BYTES_PER_PARAM", "Fields", "decoupled_grads"]

SAVED_BYTES_PER_PARAM = 6
"""Optimizer state per parameter: fp32 master (4 B) -> its 16-bit remainder (2 B), fp32 Adam
moments (4 + 4 B) -> bf16 (2 + 2 B)."""
MOMENT_COPY_BYTES = 8
"""FusedAdam.step's fp32 copies of the two bf16 moments, per parameter of the parameter group
being stepped (module docstring): they live only inside the step."""
MCORE_MASTER_BYTES = 2
"""Optimizer bytes per parameter where megatron-core, not FusedAdam, keeps the master weights
(decoupled_grads False: an fp32 shard_main_param, 4 B, instead of the 2-byte remainder)."""
MCORE_MASTER_TRAFFIC = 2
"""The step's HBM traffic per parameter that megatron-core's fp32 master adds: it moves 2 B
more each way than FusedAdam's remainder (+4), which is no longer rebuilt from the bf16
parameter (-2)."""
EXTRA_TRAFFIC_PER_PARAM = 22
"""HBM traffic of the Adam step per parameter beyond autotune.predict.cost.CostParams.
optimizer_bytes_per_param's 32 (fp32 master and moments): FusedAdam.step's fp32 copies of the
bf16 moments (read 2 + 2, write 4 + 4: 12 B), its kernel over the remainders (read the fp32
gradient 4, the bf16 parameter and its remainder 2 + 2, the fp32 copies 4 + 4; write the
parameter, the remainder and the copies 2 + 2 + 4 + 4: 28 B), the moments written back (read
4 + 4, write 2 + 2: 12 B), and the gradient-norm read (2 B): 54 B, 22 more. A byte count, not a
measurement: the bf16 moments move fewer bytes only in a kernel that reads them directly, which
TE 2.11's FusedAdam does not have."""


def decoupled_grads(s: Layout) -> bool:
    """Whether FusedAdam keeps the master weights and reads the gradient buffer in place
    (megatron-core 0.16.1 OptimizerConfig.use_precision_aware_optimizer_no_fp8_or_ds_fp8): the
    precision-aware optimizer without FP8, with FP8's delayed scaling, or with the optimizer's
    CPU offload. Otherwise megatron-core keeps an fp32 master shard (distrib_optimizer.py
    shard_main_param) and the optimizer reads `.float()` of the gradients
    (_copy_model_grads_to_main_grads), a copy where they are bf16 (autotune.levers.grad_reduce)."""
    return s.precision_aware_optimizer and (
        s.fp8 == Fp8.OFF or s.fp8_recipe == Fp8Recipe.DELAYED
        or s.optimizer_offload_percent > 0)


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
    master = 0 if decoupled_grads(s) else MCORE_MASTER_BYTES
    return evolve(state, optimizer_bytes_per_param=state.optimizer_bytes_per_param
                  - SAVED_BYTES_PER_PARAM + master,
                  step_group_bytes_per_param=state.step_group_bytes_per_param
                  + MOMENT_COPY_BYTES)


def _cost(m: ModelSpec, s: Layout, c: ClusterSpec, p: CostParams,
          state: CostState) -> CostState:
    if not s.precision_aware_optimizer:
        return state
    master = 0 if decoupled_grads(s) else MCORE_MASTER_TRAFFIC
    return evolve(state, optimizer_bytes_per_param=state.optimizer_bytes_per_param
                  + EXTRA_TRAFFIC_PER_PARAM + master)


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
