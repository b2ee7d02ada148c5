"""Values that follow from the model: a memory lever's count, resolved instead of listed.

A search space lists candidates; for some dimensions the best candidate is a function of the
rest of the layout and of the memory left, which no list can know (issue 24: a 3B Llama at
sequence 8192 on one H100 is fastest with full recompute of 10 of its 28 layers, and no list
held 10). A space marks such a dimension `derive`; the sampler picks the structure (full
recompute by block, an offload) and this module resolves the count. Each lever declares its
derivable counts (`Lever.derivable`: autotune.levers.recompute, autotune.levers.
activation_offload), with the values Megatron accepts and whether the fewest that fit is best:

- `recompute_num_layers` with `recompute: full, recompute_method: block`: the fewest layers of a
  chunk recomputed that fit. Memory falls and step time rises with each recomputed layer
  (megatron/core/transformer/transformer_block.py, _checkpointed_forward checkpoints the first n
  layers of the chunk and stores the rest in full), so the fewest that fit is the fastest.
- `recompute_num_layers` with `recompute_method: uniform`: every layer is recomputed whatever the
  group (the same time); the group size changes only what is stored, so the group of the least
  memory (a divisor of every chunk's layers, rule recompute_groups).
- `offload_layers` (Transformer Engine's layer-level CPU offload): the fewest offloaded layers
  that fit; each offloaded layer costs PCIe time.

- `first_stage_layers` / `last_stage_layers` (autotune.levers.pipeline_split), one choice of
  both, with `embedding_loss_split` where it is `derive` too: of the splits megatron-core
  accepts (TransformerConfig.__post_init__, "Uneven PP"), those of least predicted pace at
  pp's level and the one of least peak there (joint_candidates), of which the complete layout
  takes the least predicted step among those that fit (best_split), so a pp that does not
  divide the layers is reached (DeepSeek-V3's 61 at pp 16 with its MTP layer: 4 and 1 layers
  on the end stages at its planned layout).

`mbs`, `vpp` and `ep` may be listed as `divisors`: every micro-batch that divides the batch per
data-parallel rank, every interleaving that divides a stage's layers (not only powers of two),
every expert-parallel size that divides the model's experts (up to 128 for Qwen3's MoE models
across nodes, where a list up to one node's 8 would stop).

"Fit" is the memory model's peak against the device memory less the gate's measured error band
(autotune.predict.gate.memory_error_band, by GPU and allocator): the value a seed or a proposal
gets first is one the model expects to fit with a margin. The search then moves the count by
what trials measure (autotune.search.ladder): down while the measured peaks leave room, up
after an OOM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from autotune.layouts.layout import Layout, stage_layers, with_fields
from autotune.levers import LEVERS
from autotune.levers.base import Derivable
from autotune.levers.pipeline_split import chunk_sizes, common_divisors
from autotune.predict.cost import CostEstimate, estimate_cost
from autotune.predict.gate import memory_error_band
from autotune.predict.memory import MEMORY_BLIND, MemoryParams
from autotune.predict.memory_memo import MemoryMemo, peak_function
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec

__all__ = ["DERIVABLE", "DERIVE", "DIVISORS", "ENUMERABLE", "MEMORY_BLIND", "Derivable",
           "JointCandidates",
           "best_split", "divisor_values", "fewest_fitting", "joint_candidates",
           "joint_choices", "joint_dims", "least_memory", "resolve", "resolve_joint",
           "safe_limit_bytes", "values_of"]

DERIVE = "derive"
"""The space-file marker of a dimension whose value the memory model resolves."""
DIVISORS = "divisors"
"""The space-file marker of a dimension that offers every value Megatron accepts."""


def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0) if n > 0 else ()


DERIVABLE: dict[str, Derivable] = {d.name: d for lever in LEVERS for d in lever.derivable}
"""The dimensions a space may mark `derive`, each lever's in registry order."""
_LEVER_OF: dict[str, frozenset[str]] = {d.name: frozenset(e.name for e in lever.derivable)
                                        for lever in LEVERS for d in lever.derivable}
"""Each derivable dimension's lever's derivable dimensions (a joint choice's group)."""
# MEMORY_BLIND (autotune.predict.memory): no derivable count's `applies`, `values` or
# `monotone` reads those fields either, so layouts that differ only there resolve to the same
# counts (tests/test_derive.py holds both).


def _mbs_values(s: Layout, m: ModelSpec) -> tuple[int, ...]:
    # num_microbatches_calculator.py: mbs x dp must divide the global batch.
    return _divisors(s.gbs // s.dp) if s.gbs % s.dp == 0 else ()


def _vpp_values(s: Layout, m: ModelSpec) -> tuple[int, ...]:
    if s.pp < 2:
        return (1,)
    # get_num_layers_to_build: every stage's layers divisible by the virtual stages.
    return common_divisors(stage_layers(s, m))


def _ep_values(s: Layout, m: ModelSpec) -> tuple[int, ...]:
    # moe_layer.py: the experts split evenly over the expert-parallel ranks; a dense model has
    # none to split. The GPU count's own rule (ep_world) is the layout rules'.
    return _divisors(m.num_experts) if m.is_moe and m.num_experts else (1,)


ENUMERABLE: dict[str, Callable[[Layout, ModelSpec], tuple[int, ...]]] = {
    "mbs": _mbs_values,
    "vpp": _vpp_values,
    "ep": _ep_values,
}
"""The dimensions a space may mark `divisors`: their values for a partial layout (the fields of
lower enumeration levels set)."""


def divisor_values(dim: str, partial: Layout, model: ModelSpec) -> tuple[int, ...]:
    """Every value of `dim` that Megatron accepts with `partial`'s lower-level fields."""
    return ENUMERABLE[dim](partial, model)


def values_of(dim: str, s: Layout, model: ModelSpec) -> tuple[int, ...]:
    """The values `dim` may take for `s` (empty where the lever does not apply)."""
    lever = DERIVABLE[dim]
    return lever.values(s, model) if lever.applies(s, model) else ()


def safe_limit_bytes(cluster: ClusterSpec, capacity_bytes: float | None = None,
                     band: float | None = None, *, expandable: bool = False) -> float:
    """The peak a resolved value may be predicted at: the capacity (the device's memory, or
    what the gate has learned) less the memory model's measured error band on this GPU, with
    the layout's allocator (`expandable`: expandable segments, autotune.levers.allocator)."""
    if band is None:
        band = memory_error_band(cluster.gpu.name, expandable)
    capacity = cluster.gpu.memory_bytes if capacity_bytes is None else capacity_bytes
    return capacity * (1 - band)


def fewest_fitting(values: Sequence[int], peak_of: Callable[[int], float],
                   limit_bytes: float) -> int:
    """The first of `values` whose peak is at most `limit_bytes` (peaks fall along `values`),
    by bisection; the last value when none fits (the gate then says why it cannot run)."""
    lo, hi = 0, len(values) - 1
    if peak_of(values[hi]) > limit_bytes:
        return values[hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if peak_of(values[mid]) <= limit_bytes:
            hi = mid
        else:
            lo = mid + 1
    return values[lo]


def least_memory(values: Sequence[int], peak_of: Callable[[int], float]) -> int:
    """The first of `values` (ascending) of least peak, scanned until the peak rises.

    The one non-monotone derived value is uniform recompute's group size n: a chunk of L
    layers stores ceil(L / n) group inputs and rebuilds one group of n layers
    (levers/recompute.full_recompute_chunk; megatron-core transformer_block.py
    _checkpointed_forward), so a stage's peak is a x L / n + b x n + c over the divisors n of
    L that uniform allows: convex in n, as is the largest of the stages' peaks. Its values
    fall to the least and rise after it, and the scan stops at the first rise instead of
    pricing every divisor (a gpt-1t plan on 3072 GPUs: 172,316 memory estimates, 194,424
    before).
    tests/test_derive.py holds it to the full scan's answer."""
    best, best_peak = values[0], peak_of(values[0])
    last = best_peak
    for value in values[1:]:
        current = peak_of(value)
        if current < best_peak:
            best, best_peak = value, current
        elif current > last:
            break
        last = current
    return best


PACE_TIE = 1e-6
"""Paces (or step times) within this fraction of each other are the cost model's tie (splits
that move layers only between stages faster than the slowest: the same pipeline); the least
peak wins."""


def joint_choices(s: Layout, dims: Iterable[str], model: ModelSpec) -> tuple[dict[str, Any], ...]:
    """Every joint choice of `dims` (their Derivable.joint: pipeline_split.split_choices) that
    Megatron accepts for `s`'s other fields; none where the lever does not apply."""
    dims = tuple(dims)
    lead = next(DERIVABLE[d] for d in dims if DERIVABLE[d].joint is not None)
    assert lead.joint is not None
    return lead.joint(s, model, frozenset(dims)) if lead.applies(s, model) else ()


class JointCandidates(NamedTuple):
    """The joint choices a level keeps (joint_candidates)."""

    tied: tuple[Layout, ...]
    """Those of least pace, by peak: the first is resolve_joint's answer."""
    roomiest: Layout | None
    """The choice of least peak of all, where it is not among `tied`."""


def joint_candidates(s: Layout, dims: Iterable[str], model: ModelSpec, cluster: ClusterSpec,
                     *, limit_bytes: float, params: MemoryParams | None = None,
                     memo: MemoryMemo | None = None) -> JointCandidates:
    """`s` with each joint choice of `dims` (their Derivable.joint: the pipeline split) that
    its level keeps: of the choices Megatron accepts, those whose predicted peak is within
    `limit_bytes` (every one where none is); of those, the ones of least pace (within
    PACE_TIE), the slowest stage's predicted time for one micro-batch (estimate_cost's
    pace_s: each stage's time from its own layers, the output layer and loss on the last; the
    stages run in lock-step at the slowest one's pace, Narayanan et al. 2021, Section 2.2),
    ordered by their peak (each stage's memory from its own layers, the embedding and the most
    micro-batches in flight on the first), then as listed (the even split before any other);
    after them the choice of least peak of all, where it is not among them (a layout whose
    deeper fields leave no room for the fastest may fit with it). Where no choice exists, `s`
    with each field at its default alone: the rule pp_layers then says why the layout cannot
    be.

    Why by time and not by memory alone: where pp does not divide the layers (DeepSeek-V3's
    61 at pp 16) some stage must hold a layer more or less, and which one decides the pace;
    where it does, an uneven split still pays where the output layer makes the last stage the
    slowest. Why the pace and not the whole step here: the choices are made at pp's and vpp's
    level, where the deeper fields (ep, the micro-batch, recompute, the distributed optimizer,
    FP8) are still at their defaults, and the step's data-parallel and optimizer terms there
    (every expert's gradients on each rank at ep 1) would rank the splits by the end stages'
    weights. Why several: the choices that tie on the pace there differ in how the end
    stages are loaded below the middle stages' pace, which the deeper fields rank (ep 8 and
    FP8 shrink a layer's time, not the output layer's or the MTP layer's logits: DeepSeek-V3
    with its MTP layer at pp 16 ties 3 + 2 and 4 + 1 layers on the end stages at the level's
    defaults, and its planned layout runs 4 + 1 11% faster). The enumeration keeps them and
    takes the best at the whole layout (best_split). Only these: weighing every choice at
    every complete layout was 20x the enumeration's time (DeepSeek-V3 on 1,024 GPUs: 24
    choices at pp 4), so a choice neither tied nor the roomiest here is not weighed there
    (llama3-8b at pp 2 without recompute on 8 H100: the even split does not fit at mbs 1, the
    roomiest, 14 + 18 layers, does, and another split that fits is predicted 5% faster).
    `memo`: the estimates of `model` on `cluster` with `params` to read and add to (none
    remembered where None; the same in resolve_joint, resolve and best_split)."""
    dims = tuple(dims)
    choices = joint_choices(s, dims, model)
    if not choices:
        return JointCandidates((with_fields(s, **{d: DERIVABLE[d].off for d in dims}),), None)
    # Choices that give every rank the same layers are the same run (at pp 2 the embedding/
    # loss split is the even one; autotune.megatron.identity): the first listed stands for
    # them, so that no deeper field picks between them by a rounding of the models.
    runs: dict[tuple[tuple[int, ...], ...], Layout] = {}
    for c in choices:
        layout = with_fields(s, **c)
        runs.setdefault(chunk_sizes(layout, model), layout)
    layouts = list(runs.values())
    if len(layouts) == 1:
        return JointCandidates((layouts[0],), None)
    peak_of = peak_function(model, cluster, params, memo)
    peaks = [peak_of(c) for c in layouts]
    paces = [estimate_cost(model, c, cluster).pace_s for c in layouts]
    fitting = [i for i, p in enumerate(peaks) if p <= limit_bytes] or list(range(len(layouts)))
    fastest = min(paces[i] for i in fitting)
    tied = [i for i in fitting if paces[i] <= fastest * (1 + PACE_TIE)]
    roomiest = min(range(len(layouts)), key=lambda i: (peaks[i], i))
    kept = sorted(tied, key=lambda i: (peaks[i], i))
    return JointCandidates(tuple(layouts[i] for i in kept),
                           None if roomiest in kept else layouts[roomiest])


def resolve_joint(s: Layout, dims: Iterable[str], model: ModelSpec, cluster: ClusterSpec, *,
                  limit_bytes: float, params: MemoryParams | None = None,
                  memo: MemoryMemo | None = None) -> Layout:
    """`s` with the joint choice of `dims` made at its own level: the first of
    joint_candidates (the least pace, then the least peak, then the first listed). For the
    same reason as the pace, the peak there is the most the deeper fields leave: a choice
    that fits there fits with each, and where none fits the least peak among the fastest lets
    their savings reach furthest. The enumeration takes the best of the candidates again once
    the deeper fields are set (best_split)."""
    return joint_candidates(s, dims, model, cluster, limit_bytes=limit_bytes,
                            params=params, memo=memo).tied[0]


def best_split(layouts: Sequence[Layout], model: ModelSpec, cluster: ClusterSpec, *,
               limit_bytes: float, params: MemoryParams | None = None,
               memo: MemoryMemo | None = None,
               costs: dict[Layout, CostEstimate] | None = None) -> Layout:
    """Of `layouts` (one layout with each of its joint_candidates, every other field set), the
    one of least predicted step time (estimate_cost's step_time_s: the pace over the
    micro-batches and the bubble, the data-parallel and optimizer terms of the largest
    stage) among those whose peak is within `limit_bytes`; then the least peak, then the first
    listed. Where none fits, the least peak: the gate then says why it cannot run. `costs`,
    where given, takes the cost estimate of the layout returned where one
    was made (a plan's ranking prices it again otherwise). Estimated only where the choice is
    open: one layout is returned as it is."""
    if len(layouts) == 1:
        return layouts[0]
    peak_of = peak_function(model, cluster, params, memo)
    peaks = [peak_of(c) for c in layouts]
    fitting = [i for i, p in enumerate(peaks) if p <= limit_bytes]
    if not fitting:
        return layouts[min(range(len(layouts)), key=lambda i: (peaks[i], i))]
    if len(fitting) == 1:
        return layouts[fitting[0]]
    estimates = {i: estimate_cost(model, layouts[i], cluster) for i in fitting}
    fastest = min(e.step_time_s for e in estimates.values())
    tied = [i for i in fitting if estimates[i].step_time_s <= fastest * (1 + PACE_TIE)]
    best = min(tied, key=lambda i: (peaks[i], i))
    if costs is not None:
        costs[layouts[best]] = estimates[best]
    return layouts[best]


def joint_dims(dims: Iterable[str]) -> tuple[str, ...]:
    """The dimensions of `dims` that resolve_joint chooses together: those with a
    Derivable.joint (the end stages' counts) and their lever's other derived fields among
    `dims` (embedding_loss_split); empty where none has a joint choice, each alone then."""
    dims = tuple(dims)
    joint = [d for d in dims if DERIVABLE[d].joint is not None]
    if not joint:
        return ()
    return tuple(d for d in dims if DERIVABLE[d].joint is not None or d in _LEVER_OF[joint[0]])


def resolve(s: Layout, dims: Iterable[str], model: ModelSpec, cluster: ClusterSpec, *,
            limit_bytes: float, params: MemoryParams | None = None,
            floor: Mapping[str, int] | None = None, memo: MemoryMemo | None = None) -> Layout:
    """`s` with each derived dimension in `dims` resolved: where the lever applies, the fewest
    (monotone) or least-memory value whose predicted peak is within `limit_bytes`, at least
    `floor[dim]` (a value that ran out of memory moves the floor above it); where it does not
    apply, its default, so that layouts Megatron runs alike stay alike. The dimensions of a
    joint choice (the pipeline split's end stages) are resolved together by resolve_joint,
    with the embedding/loss split among them where it is in `dims` too."""
    dims = tuple(dims)
    together = joint_dims(dims)
    if together:
        s = resolve_joint(s, together, model, cluster, limit_bytes=limit_bytes, params=params,
                          memo=memo)
        dims = tuple(d for d in dims if d not in together)
    peak_of = peak_function(model, cluster, params, memo)
    for dim in dims:
        lever = DERIVABLE[dim]
        values = values_of(dim, s, model)
        if not values:
            s = with_fields(s, **{dim: lever.off})
            continue
        low = (floor or {}).get(dim)
        if low is not None:
            values = tuple(v for v in values if v >= low) or values[-1:]

        def peak(value: int, dim: str = dim, base: Layout = s) -> float:
            return peak_of(with_fields(base, **{dim: value}))

        if lever.monotone(s):
            value = fewest_fitting(values, peak, limit_bytes)
        else:
            value = least_memory(values, peak)
        s = with_fields(s, **{dim: value})
    return s
