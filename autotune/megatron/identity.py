"""When two layouts are the same run: they give Megatron the same configuration.

A layout's key is what the trial's worker and the exported Megatron-LM command would receive
(autotune.megatron.core_config.core_config and autotune.megatron.megatron_args.megatron_lm_args),
not a list of special cases: Megatron ignores `recompute_method` and `recompute_num_layers` without
full recompute, so layouts that differ only there get one key because neither side receives them.
The search, the grid, `--dry-run`'s count of distinct runs and the duplicate records all use it.

A hand rule remains only where the configuration differs but the run provably does not
(SAME_RUN_RULES, each with its reason).

`configuration` is the definition; `run_key` gives the same grouping from the layout's fields
(issue 24: building the configuration of each of 142,562 layouts took half of a gpt-1t plan).
Every field is something Megatron receives, except where a lever declares it unread
(`Lever.unread`: recompute's method and layer count without full recompute, ...), so the key
is the layout with those set to their defaults. tests/test_identity.py holds the two to the
same grouping over every shipped space and many presets and GPU counts.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from autotune.layouts.layout import (
    DATA_PARALLEL_OPTIONS,
    DIMENSIONS,
    LAYOUT_DEFAULTS,
    Layout,
    with_fields,
)
from autotune.levers import LEVERS, requirements
from autotune.levers.base import satisfy
from autotune.megatron.core_config import core_config
from autotune.megatron.environment import run_environment
from autotune.megatron.megatron_args import exported_layout, megatron_lm_args
from autotune.specs.model import ModelSpec

__all__ = ["SAME_RUN_RULES", "SameRunRule", "configuration", "representatives", "run_key"]


@dataclass(frozen=True, slots=True)
class SameRunRule:
    """Layouts whose configurations differ but whose runs do not: `applies` says when,
    `normalise` gives the layout they all run as."""

    name: str
    reason: str
    applies: Callable[[Layout], bool]
    normalise: Callable[[Layout], Layout]


SAME_RUN_RULES: tuple[SameRunRule, ...] = (
    SameRunRule(
        "one data-parallel rank",
        "megatron-core's DDP reduces gradients, and its distributed optimizer shards state, over "
        "the data-parallel group with context parallelism (dp x cp ranks); expert parameters use "
        "the expert-data-parallel group, dp x cp / ep ranks, never more. With one such rank the "
        "distributed optimizer and the overlap flags have nothing to shard or overlap: the same "
        "kernels, memory and communication. A field another lever requires stays (the "
        "precision-aware optimizer asserts the distributed optimizer whatever the ranks).",
        lambda s: s.dp * s.cp == 1,
        lambda s: satisfy(with_fields(s, **dict.fromkeys(DATA_PARALLEL_OPTIONS, False)),
                          requirements())),
    SameRunRule(
        "the embedding and loss split at pp 2",
        "With embedding_loss_split and two pipeline ranks without interleaving, each rank holds "
        "(num_layers + 2) / 2 - 1 = num_layers / 2 layers, the even split's (megatron-core "
        "get_num_layers_to_build): the same stages, memory and time; only the flags differ.",
        lambda s: s.embedding_loss_split and s.pp == 2 and s.vpp == 1,
        lambda s: with_fields(s, embedding_loss_split=False)),
)


def configuration(model: ModelSpec, layout: Layout) -> tuple[Any, ...]:
    """What Megatron receives for the layout: the worker's megatron-core configuration and the
    exported command's Megatron-LM arguments and the run's environment (the allocator's), as one
    hashable value."""
    # Megatron-LM has no impl sdpa; the export writes Transformer Engine's spec for it
    # (megatron_args.exported_layout), and the worker's layer spec keeps the two apart.
    args = megatron_lm_args(model, exported_layout(layout), mock_data=True)
    env = tuple(sorted(run_environment(layout).items()))
    return core_config(model, layout).signature(), tuple(args), env


_FIELDS = operator.attrgetter(*DIMENSIONS)
"""Every field of a layout, in field order, as a tuple."""
_UNREAD = tuple((list(DIMENSIONS).index(u.name), u.when, LAYOUT_DEFAULTS[u.name])
                for lever in LEVERS for u in lever.unread)
"""(position among the fields, when Megatron leaves it unread, the value the key puts there)."""


def run_key(model: ModelSpec, layout: Layout) -> tuple[Any, ...]:
    """Equal for two valid layouts of `model` exactly when they are the same run: the grouping
    of `configuration` (after the hand rules), from the fields Megatron reads."""
    for rule in SAME_RUN_RULES:
        if rule.applies(layout):
            layout = rule.normalise(layout)
    values = _FIELDS(layout)
    unread = [(i, default) for i, when, default in _UNREAD if when(layout)]
    if not unread:
        return values
    key = list(values)
    for i, default in unread:
        key[i] = default
    return tuple(key)


_DEFAULTS = tuple(LAYOUT_DEFAULTS.values())


def _non_defaults(s: Layout) -> int:
    # map over two tuples: called for every member of a run of several layouts (2.5 million
    # field comparisons in a gpt-1t plan), a generator of getattr calls took seconds.
    return sum(map(operator.ne, _FIELDS(s), _DEFAULTS))


def representatives(model: ModelSpec, layouts: Iterable[Layout]) -> dict[Layout, Layout]:
    """Each valid layout -> the one layout of its run that a search launches: of the layouts
    with its key, the one with the fewest non-default options (first in order on a tie), with
    the hand rules applied (so its label says what really runs)."""
    groups: dict[tuple[Any, ...], list[Layout]] = {}
    for s in layouts:
        groups.setdefault(run_key(model, s), []).append(s)
    chosen: dict[Layout, Layout] = {}
    for members in groups.values():
        rep = members[0] if len(members) == 1 else min(members, key=_non_defaults)
        for rule in SAME_RUN_RULES:
            if rule.applies(rep):
                rep = rule.normalise(rep)
        for s in members:
            chosen[s] = rep
    return chosen
