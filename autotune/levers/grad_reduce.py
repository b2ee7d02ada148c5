"""Gradients accumulated and reduced in bf16 (`--grad-reduce-in-bf16`).

Megatron-LM with `--bf16` accumulates the main gradients and reduces them across data-parallel
ranks in fp32 (arguments.py: accumulate_allreduce_grads_in_fp32, which sets megatron-core's
DistributedDataParallelConfig.grad_reduce_in_fp32); `--grad-reduce-in-bf16` keeps them in bf16
instead (core_v0.16.1 arguments.py, validate_args). NVIDIA's published performance recipes all
run that way (Megatron-Bridge perf_recipes/_common.py: grad_reduce_in_fp32 = False). Per
parameter it halves the gradient buffer (4 -> 2 B) and the bytes each gradient reduction moves;
the optimizer then works on an fp32 copy of its shard's gradients
(megatron-core distrib_optimizer.py _copy_model_grads_to_main_grads: `.float()`, a copy only
of a bf16 buffer; without the distributed optimizer Float16OptimizerWithFloat16Params copies
them all). That copy lives from the optimizer step to the next step's zero_grad (set_to_none),
when the micro-batches' activations are freed: the memory model counts it where it outweighs
them (MemoryState.step_bytes_per_param), not on top of them. The precision-aware optimizer
without FP8 (or with delayed scaling) makes no copy: its FusedAdam reads the buffer's shard as
the `decoupled_grad` it is (autotune.levers.precision_optimizer.decoupled_grads).

A numerical choice, like FP8: the gradients of the micro-batches are summed in bf16. No space
offers it by default; a space lists it (`grad_reduce_bf16: [false, true]`) for users who train
that way, and `--from-megatron` reads it from their command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.dimensions import dimension, flag_label
from autotune.levers.base import CostState, Lever, MemoryState, Seed, evolve
from autotune.levers.flags import Part, switch
from autotune.levers.precision_optimizer import decoupled_grads

if TYPE_CHECKING:
    from autotune.layouts.layout import Layout
    from autotune.predict.cost import CostParams
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.model import ModelSpec

__all__ = ["BF16_GRAD_BYTES", "FP32_GRAD_COPY_BYTES", "LEVER", "Fields"]

BF16_GRAD_BYTES = 2
"""Bytes per parameter of the gradient buffer (and of what its reduction moves) in bf16."""
FP32_GRAD_COPY_BYTES = 4
"""The optimizer's fp32 copy of its shard's gradients, per local-shard parameter, during the
optimizer step."""
GRAD_COPY_TRAFFIC = 2
"""HBM traffic of the Adam step per local-shard parameter that the copy adds: it reads the
bf16 gradient (2 B) and writes the fp32 copy the step then reads in place of the fp32 buffer
(4 B in, 4 B out: the step's own read is unchanged): +2 + 4 - 4 B. A byte count."""


@dataclass(frozen=True, kw_only=True)
class Fields:
    __slots__ = ()
    grad_reduce_bf16: bool = dimension(False, level=5, label=flag_label("gbf16"), help=(
        "Accumulate and reduce the gradients in bf16 (`--grad-reduce-in-bf16`; Megatron-LM's "
        "default with --bf16 is fp32): half the gradient buffer and the data-parallel "
        "reduction's bytes, an fp32 copy of the optimizer's shard; as NVIDIA's performance "
        "recipes run."))


def _core_config(m: ModelSpec, s: Layout) -> dict[str, dict[str, Any]]:
    # Megatron-LM: grad_reduce_in_fp32 = accumulate_allreduce_grads_in_fp32 = not this flag.
    return {"ddp": {"grad_reduce_in_fp32": not s.grad_reduce_bf16}}


def _memory(m: ModelSpec, s: Layout, state: MemoryState) -> MemoryState:
    if not s.grad_reduce_bf16:
        return state
    copy = 0 if decoupled_grads(s) else FP32_GRAD_COPY_BYTES
    return evolve(state, main_grad_bytes=BF16_GRAD_BYTES,
                  step_bytes_per_param=state.step_bytes_per_param + copy)


def _cost(m: ModelSpec, s: Layout, c: ClusterSpec, p: CostParams,
          state: CostState) -> CostState:
    if not s.grad_reduce_bf16:
        return state
    copy = 0 if decoupled_grads(s) else GRAD_COPY_TRAFFIC
    return evolve(state, main_grad_bytes=BF16_GRAD_BYTES,
                  optimizer_bytes_per_param=state.optimizer_bytes_per_param + copy)


LEVER = Lever(
    name="grad_reduce",
    fields=Fields,
    flag_rows=(switch("--grad-reduce-in-bf16", "grad_reduce_bf16", Part.LAYOUT),),
    core_config=_core_config,
    memory=_memory,
    cost=_cost,
    seed=Seed.PRACTICE,
    # Megatron-LM's default is fp32; the seed keeps the user's numerics.
    practice=lambda s, impl: {"grad_reduce_bf16": False},
)
