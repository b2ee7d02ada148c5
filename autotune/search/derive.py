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

`mbs`, `vpp` and `ep` may be listed as `divisors`: every micro-batch that divides the batch per
data-parallel rank, every interleaving that divides a stage's layers (not only powers of two),
every expert-parallel size that divides the model's experts (up to 128 for Qwen3's MoE models
across nodes, where a list up to one node's 8 would stop).

"Fit" is the memory model's peak against the device memory less the gate's measured error band
(autotune.predict.gate.MEMORY_ERROR_BAND): the value a seed or a proposal gets first is one the
model expects to fit with a margin. The search then moves the count by what trials measure
(autotune.search.ladder): down while the measured peaks leave room, up after an OOM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from autotune.layouts.layout import Layout, stage_layers, with_fields
from autotune.levers import LEVERS
from autotune.levers.base import Derivable
from autotune.levers.pipeline_split import common_divisors
from autotune.predict.gate import DEFAULT_ERROR_BAND, MEMORY_ERROR_BAND
from autotune.predict.memory import MEMORY_BLIND, MemoryParams, estimate_memory
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec

__all__ = ["DERIVABLE", "DERIVE", "DIVISORS", "ENUMERABLE", "MEMORY_BLIND", "Derivable",
           "divisor_values",
           "fewest_fitting", "least_memory", "resolve", "safe_limit_bytes", "values_of"]

DERIVE = "derive"
"""The space-file marker of a dimension whose value the memory model resolves."""
DIVISORS = "divisors"
"""The space-file marker of a dimension that offers every value Megatron accepts."""


def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0) if n > 0 else ()


DERIVABLE: dict[str, Derivable] = {d.name: d for lever in LEVERS for d in lever.derivable}
"""The dimensions a space may mark `derive`, each lever's in registry order."""
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
                     band: float | None = None) -> float:
    """The peak a resolved value may be predicted at: the capacity (the device's memory, or
    what the gate has learned) less the memory model's measured error band on this GPU."""
    if band is None:
        band = MEMORY_ERROR_BAND.get(cluster.gpu.name, DEFAULT_ERROR_BAND)
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


def resolve(s: Layout, dims: Iterable[str], model: ModelSpec, cluster: ClusterSpec, *,
            limit_bytes: float, params: MemoryParams | None = None,
            floor: Mapping[str, int] | None = None) -> Layout:
    """`s` with each derived dimension in `dims` resolved: where the lever applies, the fewest
    (monotone) or least-memory value whose predicted peak is within `limit_bytes`, at least
    `floor[dim]` (a value that ran out of memory moves the floor above it); where it does not
    apply, its default, so that layouts Megatron runs alike stay alike."""
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
            return estimate_memory(model, with_fields(base, **{dim: value}), cluster,
                                   params).peak_bytes

        if lever.monotone(s):
            value = fewest_fitting(values, peak, limit_bytes)
        else:
            value = least_memory(values, peak)
        s = with_fields(s, **{dim: value})
    return s
