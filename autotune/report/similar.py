"""Layouts a top-10 table shows as one row: the same run, or the same layout but for
noise-level options whose figures are within noise of each other.

A plan of gpt2-xl on 8 GPUs filled its top ten with `tp1 pp1 dp8 mbs8` under five recompute
variants, optimizer and attention choices, all within 1.5% of each other: one answer, ten rows.
Rows are grouped when
- Megatron runs them alike (autotune.megatron.identity.run_key: the same configuration), or
- they differ only in NOISE_DIMENSIONS (the options of recompute's enumeration level:
  recompute, offload, optimizer, overlap, implementation) and their tokens/s are within
  TOKENS_TOLERANCE and their peak memory within PEAK_TOLERANCE of the group's first row.
Each group is compared with its first (fastest) row only, so groups never chain.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from autotune.layouts.layout import DIMENSIONS, SEARCHED, Layout
from autotune.trials.trial import DEFAULT_STABLE_CV

__all__ = ["NOISE_DIMENSIONS", "PEAK_TOLERANCE", "TOKENS_TOLERANCE", "similar_groups"]

T = TypeVar("T")

_OPTIONS_LEVEL = SEARCHED["recompute"].level
NOISE_DIMENSIONS: tuple[str, ...] = tuple(name for name, d in SEARCHED.items()
                                          if d.level == _OPTIONS_LEVEL)
"""Options that leave the parallel layout and the micro-batch as they are: the enumeration
level of recompute (autotune.dimensions.LEVELS). Precision (FP8, the level after it) is not
one: it changes the numbers a step computes."""
TOKENS_TOLERANCE = 2 * DEFAULT_STABLE_CV
"""Relative difference of tokens/s that is noise: two measured figures each known to within
the timing's stable_cv (1%) may differ by 2% for nothing, and a plan cannot tell them apart
either, the cost model's median tokens/s error on measured trials being 2.3-3.9% (README)."""
PEAK_TOLERANCE = 0.02
"""Relative difference of peak memory: the memory model's median error on measured trials is
1.4-1.8% (README, results/benchmarks/*model-accuracy*)."""

_STRUCTURE = tuple(name for name in DIMENSIONS if name not in NOISE_DIMENSIONS)

Figures = tuple[float | None, float | None]


def _close(a: float | None, b: float | None, tolerance: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= tolerance * max(abs(a), abs(b))


def similar_groups(items: Sequence[T], *, layout: Callable[[T], Layout],
                   figures: Callable[[T], Figures],
                   run_key: Callable[[Layout], Hashable] | None = None,
                   limit: int | None = None) -> list[list[T]]:
    """`items` (best first: tokens/s falling) grouped as the module says, each group in the
    order given and the groups in the order of their first item. `figures`: (tokens/s, peak
    bytes); `run_key`: a layout's run identity, where the model is known. With `limit`, the
    first `limit` groups only: the walk ends once no later item can come within tolerance of
    one of them (a plan holds tens of thousands of trials)."""
    groups: list[list[T]] = []
    heads: list[Figures] = []
    by_structure: dict[tuple[object, ...], list[int]] = {}
    by_key: dict[Hashable, int] = {}
    for item in items:
        tokens, peak = figures(item)
        full = limit is not None and len(groups) >= limit
        if full and (tokens is None or not any(
                h is not None and tokens >= h * (1 - TOKENS_TOLERANCE) for h, _ in heads)):
            break  # falling tokens/s: nothing after this joins a group shown
        s = layout(item)
        structure = tuple(getattr(s, name) for name in _STRUCTURE)
        key = run_key(s) if run_key is not None else None
        joined = by_key.get(key) if key is not None else None
        if joined is None and tokens is not None:
            joined = next((i for i in by_structure.get(structure, ())
                           if _close(tokens, heads[i][0], TOKENS_TOLERANCE)
                           and _close(peak, heads[i][1], PEAK_TOLERANCE)), None)
        if joined is not None:
            groups[joined].append(item)
            if key is not None:
                by_key.setdefault(key, joined)
        elif not full:
            by_structure.setdefault(structure, []).append(len(groups))
            if key is not None:
                by_key[key] = len(groups)
            groups.append([item])
            heads.append((tokens, peak))
    return groups
