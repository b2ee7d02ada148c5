"""The NaN and Inf checks of the loss and the gradients (`--no-check-for-nan-in-loss-and-grad`).

Megatron-LM checks every micro-batch's loss (pretrain_gpt.py loss_func: two
`rerun_state_machine.validate_result` calls, NaN and Inf) and every gradient bucket before its
data-parallel reduction (training.py get_model: DistributedDataParallelConfig.check_for_nan_in_grad
= args.check_for_nan_in_loss_and_grad; megatron-core param_and_grad_buffer.py check_grads: the
bucket's norm, then the same two calls), unless the one flag turns both off. With reruns disabled,
each call tests a GPU tensor on the host (rerun_state_machine.py validate_result: `if
result_rejected:`), so the host waits for the GPU there: twice per micro-batch, and twice per
bucket in the last micro-batch's backward (with overlap_grad_reduce, from the bucket's hook) or
after the backward (without).

The checks are on by default, as in Megatron-LM, and the worker runs them as the exported command
will. NVIDIA's performance recipes turn the gradient check off (NeMo's perf scripts: "Disable local
gradient checker at non-debugging mode"); Megatron-LM has one flag for both. A safety choice, like
the numerical ones: no space offers it by default; a space lists it (`nan_checks: [true, false]`)
for users who train that way, and `--from-megatron` reads it from their command.

What they cost was measured on 2 x H200 (gpt2-xl, seq 1024, sdpa, megatron-core 0.16.1; cold
launches, 5 timed steps; results/benchmarks/2026-11-29-h200x2-nan-checks-s27.md): 2-5% of the
step where the GPU's work per micro-batch outweighs the host's (mbs 16 and 32; Llama-3.2-3B at
seq 4096) and 6-27% where the two are about equal (mbs 4 and 8 with overlap_grad_reduce; a
median of 17% over five pairs at mbs 8), most of it the gradient check; 3.7% on one GPU. The
cost model does not price them (`no_cost`), so the search measures them (`unpriced_time`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.dimensions import dimension
from autotune.levers.base import Lever, Seed
from autotune.levers.flags import Part, switch

if TYPE_CHECKING:
    from autotune.layouts.layout import Layout
    from autotune.specs.model import ModelSpec

__all__ = ["FLAG", "LEVER", "Fields"]

FLAG = "--no-check-for-nan-in-loss-and-grad"
"""Megatron-LM's one flag for both checks (arguments.py: store_false,
dest check_for_nan_in_loss_and_grad)."""


def _label(s: Layout, value: bool) -> str | None:
    return None if value else "nonan"


@dataclass(frozen=True, kw_only=True)
class Fields:
    __slots__ = ()
    nan_checks: bool = dimension(True, level=5, label=_label, help=(
        "Check every micro-batch's loss and every gradient bucket for NaN and Inf, as "
        "Megatron-LM does unless `--no-check-for-nan-in-loss-and-grad`: each check waits for "
        "the GPU (up to 27% of a host-bound multi-GPU step measured)."))


def _core_config(m: ModelSpec, s: Layout) -> dict[str, dict[str, Any]]:
    # The gradient check; the loss check is the worker's loss function's (autotune.worker.train).
    return {"ddp": {"check_for_nan_in_grad": s.nan_checks}}


LEVER = Lever(
    name="nan_checks",
    fields=Fields,
    flag_rows=(switch(FLAG, "nan_checks", Part.LAYOUT, on_means=False),),
    core_config=_core_config,
    memory=None,
    no_memory=("a check keeps a bucket's norm and two booleans, scalars on the GPU "
               "(param_and_grad_buffer.py check_grads)"),
    cost=None,
    no_cost=("the checks cost the overlap of the host's work with the GPU's across each wait, "
             "which the cost model does not represent for bf16 (its launch time is additive); "
             "measured 2-27% of a multi-GPU step with overlap_grad_reduce, not proportional "
             "to the waits (2026-11-29-h200x2-nan-checks-s27.md). Its constants were fitted "
             "mostly on trials with the checks on"),
    unpriced_time=True,
    seed=Seed.PRACTICE,
    # Megatron-LM's default; the seed keeps the user's safety net.
    practice=lambda s, impl: {"nan_checks": True},
)
