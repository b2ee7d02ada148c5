"""Alpa's manual heuristics for Megatron GPT, as the study's first trials.

Zheng et al. 2022, "Alpa: Automating Inter- and Intra-Operator Parallelism for Distributed Deep
Learning", Section 8.1 describes how the authors tuned Megatron-LM by hand: (1) the largest
micro-batch that does not run out of memory; (2) the largest data-parallel degree at that
micro-batch; (3) tensor parallelism only inside a node; (4) then adjust DP and PP for the best
throughput. Here the memory model replaces their trial-and-error for (1), and (1) may spend the
memory options (recompute, offload, an uneven split) on a larger micro-batch where the cost
model predicts it pays; (3) is a validity rule (autotune.layouts.layout.RULES: tp_node); seeds are
ordered by (2), those the gate calls risky last, and then walk (4).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from autotune.layouts.layout import LAYOUT_DEFAULTS, Layout
from autotune.levers import LEVERS, requirements
from autotune.levers.base import Seed
from autotune.predict.cost import CostParams, estimate_cost
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec

__all__ = ["MEMORY_OPTIONS", "alpa_seeds", "next_smaller_mbs", "predicted_speed"]


def _mismatches(s: Layout, impl: str) -> int:
    """How far a layout's options are from Megatron practice without tuning: no recompute
    beyond what is asked, no interleaving or context parallelism, sequence parallel with tp > 1,
    and each lever at the value its module calls practice (autotune.levers: the fastest
    implementation available, the distributed optimizer and overlapped parameter gather with
    dp > 1, overlapped gradient reduce, no fused cross entropy). A field that a lever in use
    requires (the precision-aware optimizer needs the distributed optimizer) counts at that
    value."""
    ideal: dict[str, Any] = {"vpp": 1, "cp": 1, "sequence_parallel": s.tp > 1}
    for lever in LEVERS:
        if lever.practice is not None:
            ideal.update(lever.practice(s, impl))
    for requirement in requirements():
        if requirement.when(s):
            ideal.update(requirement.needs)
    return sum(getattr(s, name) != value for name, value in ideal.items())


MEMORY_OPTIONS = tuple(name for lever in LEVERS if lever.seed == Seed.MEMORY
                       for name in lever.field_names)
"""The dimensions that trade time for memory: what a seed may spend to make a micro-batch fit
(the fields of the levers whose seed role is Seed.MEMORY: the pipeline split, recompute,
activation offload, the precision-aware optimizer, the optimizer's offload)."""
_FALLBACKS = tuple(pair for lever in LEVERS for pair in lever.fallback)
"""The savings a seed spends, in order, where nothing fits without one and no cost model
ranks them (recompute selective, then full: Lever.fallback)."""


def predicted_speed(model: ModelSpec, cluster: ClusterSpec,
                    params: CostParams | None = None) -> Callable[[Layout], float]:
    """The cost model's tokens/s of a layout (remembered): how the seeds price a saving."""
    @functools.cache
    def speed(s: Layout) -> float:
        return estimate_cost(model, s, cluster, params).tokens_per_s
    return speed


def _group(s: Layout) -> tuple[int, ...]:
    return (s.tp, s.pp, s.dp, s.cp, s.ep)


def _saves_memory(s: Layout) -> bool:
    return any(getattr(s, name) != LAYOUT_DEFAULTS[name] for name in MEMORY_OPTIONS)


def alpa_seeds(valid: Sequence[Layout], fits: Callable[[Layout], bool], impl: str,
               limit: int = 6, *, speed: Callable[[Layout], float] | None = None,
               risky: Callable[[Layout], bool] | None = None) -> list[Layout]:
    """Up to `limit` layouts: per (tp, pp, dp, cp, ep) the largest useful micro-batch that fits,
    largest DP first, layouts predicted to fit only within the memory model's error band last.

    Within each group the options closest to Megatron practice that the space offers are used
    (`_mismatches`). Alpa's step (1) is carried through memory: the largest micro-batch that
    fits without a memory saving, and each larger one made to fit by the cheapest saving the
    space offers (a partial or selective recompute, an offload, an uneven split: the fitting
    layout of that micro-batch that `speed`, the predicted tokens/s, ranks first); the group's
    seed is the fastest of these, so the largest-DP group gets a seed even when nothing fits
    it without recompute. Without `speed` a saving is spent only where nothing fits without
    one (recompute none, then selective, then full), as Alpa's authors would do next. With
    `risky` (the gate's error band), each group's seed is chosen among the layouts predicted
    to fit with a margin, and a faster risky one follows every safe seed.
    """
    closest: dict[tuple[int, ...], int] = {}
    for s in valid:
        key = _group(s)
        closest[key] = min(closest.get(key, 99), _mismatches(s, impl))
    members: dict[tuple[int, ...], list[Layout]] = {}
    for s in valid:
        if _mismatches(s, impl) == closest[_group(s)] and fits(s):
            members.setdefault(_group(s), []).append(s)
    best: list[Layout] = []
    for group in members.values():
        if risky is None:
            seed = _group_seed(group, speed)
            best += [seed] if seed is not None else []
            continue
        # A layout predicted to fit only by a hair never goes first: each group's seed among
        # the layouts predicted to fit with a margin, and its seed among all of them too when
        # that one is risky (it runs after every safe seed).
        safe = _group_seed([s for s in group if not risky(s)], speed)
        bold = _group_seed(group, speed)
        best += [s for s in dict.fromkeys((safe, bold)) if s is not None]
    # Largest DP first; among equal DP, less TP (cheaper communication), then less PP.
    ordered = sorted(best, key=lambda s: (-s.dp, s.tp, s.pp, s.cp, s.ep, -s.mbs))
    if risky is not None:
        ordered = sorted(ordered, key=risky)  # stable: the DP order within safe and risky
    return ordered[:limit]


def _group_seed(members: Sequence[Layout], speed: Callable[[Layout], float] | None) \
        -> Layout | None:
    plain = [s for s in members if not _saves_memory(s)]
    base = max(plain, key=lambda s: s.mbs) if plain else None  # first in the space's order
    if speed is None:
        if base is not None:
            return base
        for name, value in _FALLBACKS:
            saved = [s for s in members if getattr(s, name) == value]
            if saved:
                return max(saved, key=lambda s: s.mbs)
        return max(members, key=lambda s: s.mbs) if members else None
    larger = [s for s in members if base is None or s.mbs > base.mbs]
    cheapest: dict[int, Layout] = {}
    for s in larger:  # per micro-batch, the saving predicted to cost least
        if s.mbs not in cheapest or speed(s) > speed(cheapest[s.mbs]):
            cheapest[s.mbs] = s
    options = ([base] if base is not None else []) + list(cheapest.values())
    if not options:
        return None
    # The fastest; among equals the larger micro-batch, then no saving (stable order).
    return max(options, key=lambda s: (speed(s), s.mbs))


def next_smaller_mbs(candidates: Sequence[int], failed_mbs: int, known_good: int | None) -> \
        int | None:
    """Bisection step after an OOM at `failed_mbs`: the middle candidate between the largest
    micro-batch known to fit (or the smallest candidate) and the failed one."""
    lower = sorted(m for m in candidates if m < failed_mbs and
                   (known_good is None or m > known_good))
    if not lower:
        return None
    return lower[len(lower) // 2]
