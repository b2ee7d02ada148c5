"""Megatron's fused vocab-parallel cross entropy (`--cross-entropy-loss-fusion`).

megatron/core/fusions/fused_cross_entropy.py, the torch.compile'd native kernels: fewer passes
over the fp32 logits than megatron/core/tensor_parallel/cross_entropy.py, at the price of one more
fp32 copy of them live at the peak (its functions return new tensors instead of subtracting the
maximum in place).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.dimensions import dimension, flag_label
from autotune.levers.base import CostState, Lever, MemoryState, Seed, evolve
from autotune.levers.flags import Flag, FlagRow, Given, Part, RunOptions

if TYPE_CHECKING:
    from autotune.layouts.layout import Layout
    from autotune.predict.cost import CostParams
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.model import ModelSpec

__all__ = ["EXTRA_BYTES_PER_ELEMENT", "FUSED_PASSES", "LEVER", "Fields"]

EXTRA_BYTES_PER_ELEMENT = 4
"""fused_cross_entropy.py: one more fp32 copy of the logits is live at the peak. Measured on an
H100, gpt2-xl mbs 16: +3.1 GiB = 16 x 1024 x 50,304 x 4 B
(results/benchmarks/2026-11-21-h100-gpt2-xl-mfu.md)."""
FUSED_PASSES = 2
"""Passes over the fp32 logits with the fused kernels, against ~4 unfused: 3.5 ms less per
16k-token micro-batch of gpt2-xl on an H100 (results/benchmarks/2026-11-21-h100-gpt2-xl-mfu.md)."""


@dataclass(frozen=True, kw_only=True)
class Fields:
    __slots__ = ()
    cross_entropy_fusion: bool = dimension(False, level=5, label=flag_label("cef"), help=(
        "Megatron's fused vocab-parallel cross entropy (`--cross-entropy-loss-fusion`, the "
        "native torch.compile'd kernels): fewer passes over the fp32 logits, one more fp32 "
        "copy of them."))


def _emit(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    # TransformerConfig fields (model_parallel_config.py), flags generated from them.
    if s.cross_entropy_fusion:
        return ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "native"]
    return []


def _read(g: Given) -> dict[str, Any]:
    return {"cross_entropy_fusion": g.has("--cross-entropy-loss-fusion")}


def _core_config(m: ModelSpec, s: Layout) -> dict[str, dict[str, Any]]:
    return {"transformer": {"cross_entropy_loss_fusion": s.cross_entropy_fusion,
                            "cross_entropy_fusion_impl": "native"}}


def _memory(m: ModelSpec, s: Layout, state: MemoryState) -> MemoryState:
    if not s.cross_entropy_fusion:
        return state
    return evolve(state, logits_bytes_per_element=state.logits_bytes_per_element
                  + EXTRA_BYTES_PER_ELEMENT)


def _cost(m: ModelSpec, s: Layout, c: ClusterSpec, p: CostParams,
          state: CostState) -> CostState:
    return evolve(state, cross_entropy_passes=FUSED_PASSES) if s.cross_entropy_fusion \
        else state


LEVER = Lever(
    name="cross_entropy",
    fields=Fields,
    flag_rows=(FlagRow(name="cross_entropy_fusion", part=Part.LAYOUT,
                       flags=(Flag("--cross-entropy-loss-fusion", takes_value=False),
                              Flag("--cross-entropy-fusion-impl")),
                       emit=_emit, read=_read),),
    core_config=_core_config,
    memory=_memory,
    cost=_cost,
    seed=Seed.PRACTICE,
    # Megatron-LM's default is off; the search, not the seed, decides whether the fused cross
    # entropy's speed is worth its memory.
    practice=lambda s, impl: {"cross_entropy_fusion": False},
)
