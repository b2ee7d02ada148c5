"""The dimension contract: every layout dimension reaches every consumer that must see it.

For every dimension of autotune.layout.DIMENSIONS that a space can search, two valid layouts
that differ in it alone and are not the same run (autotune.identity) must differ in the
Megatron-LM arguments that export writes, in the worker's megatron-core configuration, and in the
memory or the cost model's prediction. A dimension that one of them ignores fails here, unless
ALLOWED below says why that is right. Adding a dimension without teaching a consumer about it
therefore fails a test instead of silently measuring the wrong thing.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from autotune.cost import estimate_cost
from autotune.dimensions import Impl
from autotune.hardware import ClusterSpec
from autotune.identity import run_key
from autotune.layout import DIMENSIONS, SEARCHED, Layout
from autotune.megatron_args import megatron_lm_args
from autotune.memory import estimate_memory
from autotune.model import ModelSpec, load_model
from autotune.space import enumerate_space
from autotune.worker.config import worker_config
from tests.conftest import all_dimensions_space

CONSUMERS = ("megatron-lm", "worker", "model")
MAX_PAIRS = 60
"""Pairs checked per dimension and model (spread over the valid layouts): enough to meet every
combination of the other dimensions that matters, in a few seconds."""


@dataclass(frozen=True, slots=True)
class Allowed:
    """A consumer that may ignore a dimension for the pairs `when` accepts, and why."""

    dimension: str
    consumer: str
    when: Callable[[Layout, Layout], bool]
    reason: str


ALLOWED: tuple[Allowed, ...] = (
    Allowed("impl", "megatron-lm", lambda a, b: {a.impl, b.impl} == {Impl.SDPA, Impl.TE},
            "Megatron-LM has no sdpa implementation; export writes Transformer Engine's spec, "
            "the nearest (autotune.scripts), and the worker keeps the two apart."),
)
NOT_SEARCHED = {"dp": "derived from the GPU count and tp x pp x cp",
                "gbs": "the model's global batch size, not a search dimension"}


def _exported_args(model: ModelSpec, s: Layout) -> list[str]:
    exported = s if s.impl != Impl.SDPA else replace(s, impl=Impl.TE)
    return megatron_lm_args(model, exported, mock_data=True)


def _differs(consumer: str, model: ModelSpec, cluster: ClusterSpec, a: Layout,
             b: Layout) -> bool:
    if consumer == "megatron-lm":
        return _exported_args(model, a) != _exported_args(model, b)
    if consumer == "worker":
        return worker_config(model, a).signature() != worker_config(model, b).signature()
    memory = estimate_memory(model, a, cluster) != estimate_memory(model, b, cluster)
    cost = (estimate_cost(model, a, cluster).step_time_s
            != estimate_cost(model, b, cluster).step_time_s)
    return memory or cost


@functools.cache
def _layouts(preset: str, gpus: int) -> tuple[ModelSpec, ClusterSpec, dict[Layout, str]]:
    """The valid layouts of the all-dimensions space, each with its run key."""
    model = load_model(preset)
    cluster = ClusterSpec.make(gpus, gpu="h100-80gb")
    valid = enumerate_space(all_dimensions_space(), model, cluster).valid
    return model, cluster, {s: run_key(model, s) for s in valid}


def _pairs(preset: str, gpus: int, name: str) -> list[tuple[Layout, Layout]]:
    """Valid layouts that differ in `name` alone and are different runs, a seeded sample."""
    _, _, keys = _layouts(preset, gpus)
    others = [d for d in SEARCHED if d != name]
    by_rest: dict[tuple[Any, ...], list[Layout]] = {}
    for s in keys:
        by_rest.setdefault(tuple(getattr(s, d) for d in others), []).append(s)
    pairs = [(a, b) for group in by_rest.values() for a, b in itertools.combinations(group, 2)
             if keys[a] != keys[b]]
    return random.Random(name).sample(pairs, min(MAX_PAIRS, len(pairs)))


CASES = [("gpt2", 8), ("mixtral-8x7b", 8)]
"""A dense model and a mixture of experts (ep), on 8 GPUs of one node."""


def test_every_dimension_is_searched_or_explained() -> None:
    assert set(DIMENSIONS) == set(SEARCHED) | set(NOT_SEARCHED)


@pytest.mark.parametrize("name", list(SEARCHED))
def test_every_consumer_sees_the_dimension(name: str) -> None:
    checked = 0
    for preset, gpus in CASES:
        model, cluster, _ = _layouts(preset, gpus)
        for a, b in _pairs(preset, gpus, name):
            checked += 1
            for consumer in CONSUMERS:
                if _differs(consumer, model, cluster, a, b):
                    continue
                if any(rule.dimension == name and rule.consumer == consumer and rule.when(a, b)
                       for rule in ALLOWED):
                    continue
                pytest.fail(f"{name}: {consumer} does not see the difference between "
                            f"{a.describe()} and {b.describe()} ({preset} on {gpus} GPUs)")
    assert checked > 0, f"no valid pair of layouts differs in {name} alone"


@pytest.mark.parametrize("rule", ALLOWED, ids=lambda r: f"{r.dimension}-{r.consumer}")
def test_every_allowance_is_needed(rule: Allowed) -> None:
    """An allowance that no pair uses is stale: the consumer has learnt the dimension."""
    used = False
    for preset, gpus in CASES:
        model, cluster, _ = _layouts(preset, gpus)
        used = used or any(rule.when(a, b) and not _differs(rule.consumer, model, cluster, a, b)
                           for a, b in _pairs(preset, gpus, rule.dimension))
    assert used
