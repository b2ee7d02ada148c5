"""The memory levers of last resort: what a search adds where nothing else fits.

An 8B model trained on one GPU is a common start (Llama-3.1-8B at sequence 4096 on one H200:
18 B of weights, gradients and Adam state per parameter, 150 GB before any activation).
Recompute, FP8 and the precision-aware optimizer alone leave it over the device's memory;
megatron-core's optimizer CPU offload (autotune.levers.optimizer_offload: part of Adam's state
and step on the host, with the precision-aware optimizer and so the distributed optimizer)
fits it, at the host's price. The default space leaves that lever out: it is slow, it doubles
the layouts a plan of thousands of GPUs ranks, and any layout that fits without it is faster.
So it is offered only where the space predicts nothing to fit, the offloaded percent derived
from the memory model (the fewest that fits), and the search says so in one line.

A space the user wrote, or a pin of one of these dimensions, is theirs: never widened. The
widened space is a study of its own (default names hash the space; a name the user gave gets
LAST_RESORT_SUFFIX).
"""

from __future__ import annotations

from dataclasses import replace

from autotune.dimensions import Impl
from autotune.search.derive import DERIVE
from autotune.search.space import SearchSpace

__all__ = ["LAST_RESORT", "LAST_RESORT_SUFFIX", "widened_for_memory"]

LAST_RESORT_SUFFIX = "-offload"
"""A study named by the user (`--study NAME`) continues in the widened space as NAME-offload:
the study NAME keeps the space it was searched over (resuming it checks that)."""

LAST_RESORT: dict[str, tuple[object, ...]] = {
    "distributed_optimizer": (True,),
    "precision_aware_optimizer": (True,),
    "optimizer_offload_percent": (DERIVE,),
}
"""The candidates each dimension gains: the offload needs the precision-aware optimizer
(Megatron-LM arguments.py), which needs the distributed optimizer (megatron-core
OptimizerConfig) and Transformer Engine's FusedAdam."""


def widened_for_memory(space: SearchSpace) -> SearchSpace | None:
    """`space` with LAST_RESORT's candidates added beside its own; None where it offers them
    all already, where the user chose one of those dimensions (a space file of theirs, a pin),
    or where it runs no Transformer Engine layer (the precision-aware optimizer needs TE's
    FusedAdam)."""
    if space.chosen & set(LAST_RESORT) or Impl.TE not in space.candidates.get("impl", ()):
        return None
    candidates = dict(space.candidates)
    for dim, extra in LAST_RESORT.items():
        have = candidates.get(dim, ())
        candidates[dim] = have + tuple(v for v in extra if v not in have)
    if candidates == space.candidates:
        return None
    return replace(space, candidates=candidates,
                   source=f"{space.source} + the optimizer's CPU offload (nothing else fits)")
