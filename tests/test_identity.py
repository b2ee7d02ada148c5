"""A layout's identity (autotune.megatron.identity): layouts are the same run exactly when they
give Megatron the same configuration, checked over every shipped space and preset."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import pytest

from autotune.dimensions import Impl, Recompute
from autotune.layouts.layout import DATA_PARALLEL_OPTIONS, SEARCHED, Layout
from autotune.megatron.identity import SAME_RUN_RULES, configuration, representatives, run_key
from autotune.search.space import SearchSpace, enumerate_space, load_space
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.presets import list_presets, load_model
from tests.conftest import all_dimensions_layouts

SPACES = Path(__file__).resolve().parents[1] / "search_spaces"
GPUS_FOR_SPACE = {"default.yaml": (8,), "one-node.yaml": (8,), "four-gpu.yaml": (4,),
                  "two-gpu.yaml": (2,), "single-gpu.yaml": (1,)}
"""Each shipped space with the GPU count it is written for (the default: one node)."""

IGNORED: dict[str, tuple[Callable[[Layout], bool], str]] = {
    "recompute_method": (lambda s: s.recompute != Recompute.FULL,
                         "Megatron reads it only with full recompute"),
    "recompute_num_layers": (lambda s: s.recompute != Recompute.FULL,
                             "Megatron reads it only with full recompute"),
    "recompute_modules": (lambda s: s.recompute != Recompute.SELECTIVE,
                          "Megatron reads it only with selective recompute"),
    **{name: (lambda s: s.dp * s.cp == 1, "nothing to shard or overlap with one DP rank")
       for name in DATA_PARALLEL_OPTIONS},
    "embedding_loss_split": (lambda s: s.pp == 2 and s.vpp == 1,
                             "two ranks of (num_layers + 2) / 2 - 1 layers: the even split"),
}
"""When a dimension makes no difference to the run, written from Megatron's documentation
independently of autotune.megatron.identity: two layouts may share a key only by differing here."""


def _explained(a: Layout, b: Layout) -> bool:
    differ = [d for d in SEARCHED if getattr(a, d) != getattr(b, d)]
    return all(d in IGNORED and IGNORED[d][0](a) and IGNORED[d][0](b) for d in differ)


def _check_space(preset: str, gpus: int, space: SearchSpace) -> int:
    model = load_model(preset)
    cluster = ClusterSpec.make(gpus, gpu="h100-80gb", gpus_per_node=min(8, gpus))
    return _check_layouts(model, enumerate_space(space, model, cluster).valid)


def _check_layouts(model: ModelSpec, valid: Sequence[Layout]) -> int:
    reps = representatives(model, valid)
    groups: dict[Layout, list[Layout]] = {}
    for s in valid:
        groups.setdefault(reps[s], []).append(s)
    for rep, members in groups.items():
        assert rep in members or all(_explained(rep, s) for s in members)
        for a, b in itertools.combinations(members, 2):
            # Same key: the layouts differ only where Megatron ignores the difference.
            assert _explained(a, b), f"{a.describe()} and {b.describe()} share a key"
    # Distinct keys: distinct configurations, and every explained pair shares a key.
    assert len({run_key(model, rep) for rep in groups}) == len(groups)
    by_rest: dict[tuple[Any, ...], list[Layout]] = {}
    for s in valid:
        rest = tuple(getattr(s, d) for d in SEARCHED if d not in IGNORED)
        by_rest.setdefault(rest, []).append(s)
    for members in by_rest.values():
        for a, b in itertools.combinations(members, 2):
            if _explained(a, b):
                assert reps[a] == reps[b], f"{a.describe()} and {b.describe()} run twice"
    return len(valid)


@pytest.mark.parametrize("space_file", sorted(GPUS_FOR_SPACE))
def test_every_shipped_space_and_preset(space_file: str) -> None:
    assert {p.name for p in SPACES.glob("*.yaml")} == set(GPUS_FOR_SPACE)
    space = load_space(str(SPACES / space_file))
    checked = sum(_check_space(preset, gpus, space)
                  for preset in list_presets() for gpus in GPUS_FOR_SPACE[space_file])
    assert checked > 0


@pytest.mark.parametrize("preset", ["gpt2", "mixtral-8x7b"])
def test_a_dimension_outside_the_key_must_be_explained(preset: str) -> None:
    """Every searched dimension varies here: one that neither the worker nor the exported
    command receives would put two different layouts under one key, and fail."""
    model, _, valid = all_dimensions_layouts(preset, 8)
    assert _check_layouts(model, valid) > 1000


def _configured_key(model: ModelSpec, s: Layout) -> Hashable:
    """The definition run_key is held to: what Megatron receives (the worker's core config and
    the exported Megatron-LM arguments), after the hand rules."""
    for rule in SAME_RUN_RULES:
        if rule.applies(s):
            s = rule.normalise(s)
    return configuration(model, s)


def _groups(layouts: Sequence[Layout],
            key: Callable[[Layout], Hashable]) -> set[frozenset[Layout]]:
    found: dict[Hashable, set[Layout]] = {}
    for s in layouts:
        found.setdefault(key(s), set()).add(s)
    return {frozenset(g) for g in found.values()}


def _assert_grouped_as_configured(model: ModelSpec, layouts: Sequence[Layout]) -> None:
    by_key = _groups(layouts, lambda s: run_key(model, s))
    by_configuration = _groups(layouts, lambda s: _configured_key(model, s))
    split = [g for g in by_configuration if g not in by_key]
    assert not split, f"{len(split)} runs keyed apart, e.g. {[s.describe() for s in split[0]]}"
    assert by_key == by_configuration


@pytest.mark.parametrize("preset", ["gpt2", "mixtral-8x7b"])
def test_the_run_key_groups_as_the_configuration_every_dimension(preset: str) -> None:
    """run_key is built from the fields (issue 24: planning speed); every layout where each
    searched dimension varies must group as Megatron's configuration groups it."""
    model, _, valid = all_dimensions_layouts(preset, 8)
    _assert_grouped_as_configured(model, valid)


def _structures_sample(layouts: Sequence[Layout], budget: int) -> list[Layout]:
    """Every layout of a deterministic sample of the sizes (tp, pp, cp, ep, vpp, mbs): the
    layouts that differ only in their levers, the ones a key could group wrong, stay together."""
    by_sizes: dict[tuple[int, ...], list[Layout]] = {}
    for s in layouts:
        by_sizes.setdefault((s.tp, s.pp, s.cp, s.ep, s.vpp, s.mbs), []).append(s)
    step = len(layouts) // budget + 1  # groups spread over the enumeration, about `budget`
    return [s for members in list(by_sizes.values())[::step] for s in members]


@pytest.mark.parametrize(("preset", "gpus"), [
    ("gpt2-xl", 8), ("llama3-8b", 16), ("llama3-8b", 64), ("mixtral-8x7b", 64),
    ("gpt-1t", 3072)])
def test_the_run_key_groups_as_the_configuration_default_space(preset: str, gpus: int) -> None:
    model = load_model(preset)
    cluster = ClusterSpec.make(gpus, gpu="h100-80gb", gpus_per_node=8)
    valid = enumerate_space(load_space(), model, cluster).valid
    sample = _structures_sample(valid, 6000)
    assert len(sample) > 1000
    _assert_grouped_as_configured(model, sample)


@pytest.mark.parametrize(("a", "b", "same"), [
    (dict(recompute="none", recompute_num_layers=2), dict(recompute="none",
                                                          recompute_num_layers=8), True),
    (dict(recompute="full", recompute_method="block", recompute_num_layers=2),
     dict(recompute="full", recompute_method="block", recompute_num_layers=8), False),
    (dict(recompute="selective", recompute_method="block"),
     dict(recompute="selective", recompute_method="uniform"), True),
    (dict(distributed_optimizer=True), dict(distributed_optimizer=False), True),
    (dict(dp=2, distributed_optimizer=True), dict(dp=2, distributed_optimizer=False), False),
    (dict(impl="sdpa"), dict(impl="te"), False),
    (dict(impl="local"), dict(impl="sdpa"), False),
])
def test_same_run(a: dict[str, Any], b: dict[str, Any], same: bool) -> None:
    model = load_model("gpt2-xl")
    sa, sb = Layout(gbs=64, **a), Layout(gbs=64, **b)
    assert (run_key(model, sa) == run_key(model, sb)) is same


def test_the_hand_rules_change_only_options_whose_configuration_differs() -> None:
    """A hand rule is for layouts Megatron configures differently but runs the same; one that
    normalises a layout to the same configuration is redundant."""
    model = load_model("gpt2-xl")
    s = Layout(gbs=64, distributed_optimizer=True, overlap_grad_reduce=True, impl=Impl.SDPA,
               pp=2, embedding_loss_split=True)
    for rule in SAME_RUN_RULES:
        assert rule.applies(s) and rule.reason
        assert configuration(model, rule.normalise(s)) != configuration(model, s)


_DP_OPTIONS = {"distributed_optimizer": True, "overlap_grad_reduce": True,
               "overlap_param_gather": True}


@pytest.mark.parametrize(("layout", "kept"), [
    ({"tp": 2, "pp": 2, "dp": 1}, False),  # one DP rank: nothing to reduce or shard
    ({"tp": 1, "pp": 1, "dp": 1}, False),
    ({"tp": 1, "pp": 2, "dp": 2}, True),
    ({"tp": 2, "pp": 1, "dp": 1, "cp": 2}, True),  # DDP and the optimizer span dp x cp
    ({"tp": 1, "pp": 1, "dp": 1, "ep": 1}, False),
])
def test_one_data_parallel_rank_drops_the_data_parallel_options(
        layout: dict[str, int], kept: bool) -> None:
    s = Layout(gbs=64, mbs=1, **layout, **_DP_OPTIONS)
    c = representatives(load_model("gpt2-xl"), [s])[s]
    assert (c == s) is kept
    assert (c.distributed_optimizer, c.overlap_grad_reduce, c.overlap_param_gather) == (
        (True, True, True) if kept else (False, False, False))
    assert representatives(load_model("gpt2-xl"), [c])[c] == c
