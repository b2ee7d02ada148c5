"""When two layouts are the same run: they give Megatron the same configuration.

A layout's key is what the trial's worker and the exported Megatron-LM command would receive
(autotune.megatron.core_config.core_config and autotune.megatron.megatron_args.megatron_lm_args),
not a list of special cases: Megatron ignores `recompute_method` and `recompute_num_layers` without
full recompute, so layouts that differ only there get one key because neither side receives them.
The search, the grid, `--dry-run`'s count of distinct runs and the duplicate records all use it.

A hand rule remains only where the configuration differs but the run provably does not
(SAME_RUN_RULES, each with its reason).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from autotune.layouts.layout import DATA_PARALLEL_OPTIONS, DIMENSIONS, Layout, with_fields
from autotune.levers import requirements
from autotune.levers.base import satisfy
from autotune.megatron.core_config import core_config
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
)


def configuration(model: ModelSpec, layout: Layout) -> tuple[Any, ...]:
    """What Megatron receives for the layout: the worker's megatron-core configuration and the
    exported command's Megatron-LM arguments, as one hashable value."""
    # Megatron-LM has no impl sdpa; the export writes Transformer Engine's spec for it
    # (megatron_args.exported_layout), and the worker's layer spec keeps the two apart.
    args = megatron_lm_args(model, exported_layout(layout), mock_data=True)
    return core_config(model, layout).signature(), tuple(args)


def run_key(model: ModelSpec, layout: Layout) -> tuple[Any, ...]:
    """Equal for two valid layouts exactly when they are the same run."""
    for rule in SAME_RUN_RULES:
        if rule.applies(layout):
            layout = rule.normalise(layout)
    return configuration(model, layout)


def _non_defaults(s: Layout) -> int:
    return sum(getattr(s, name) != dim.default for name, dim in DIMENSIONS.items())


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
