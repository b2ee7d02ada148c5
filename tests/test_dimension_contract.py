"""The dimension contract: every layout dimension reaches every consumer that must see it.

For every dimension of autotune.layouts.layout.DIMENSIONS that a space can search, two valid
layouts that differ in it alone and are not the same run (autotune.megatron.identity) must differ
in the Megatron-LM arguments that export writes, in the worker's megatron-core configuration, and
in the memory or the cost model's prediction. A dimension that one of them ignores fails here,
unless ALLOWED below says why that is right. Adding a dimension without teaching a consumer about
it therefore fails a test instead of silently measuring the wrong thing.
"""

from __future__ import annotations

import functools
import itertools
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from autotune.dimensions import Impl
from autotune.layouts.layout import DIMENSIONS, SEARCHED, Layout, check
from autotune.levers import LEVERS, cross_entropy, recompute
from autotune.levers.base import CONFIG_PARTS, CostState, Lever, contract_problems
from autotune.levers.flags import FlagRow, Given, RunOptions
from autotune.megatron.core_config import core_config
from autotune.megatron.environment import run_environment
from autotune.megatron.identity import run_key
from autotune.megatron.megatron_args import exported_layout, megatron_lm_args
from autotune.predict.cost import CostParams, estimate_cost
from autotune.predict.memory import estimate_memory
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from tests.conftest import all_dimensions_layouts

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
            "the nearest (autotune.report.scripts), and the worker keeps the two apart."),
    Allowed("nan_checks", "model", lambda a, b: True,
            "The checks cost the overlap of the host's work with the GPU's across each wait, "
            "measured 2.5-27% of a step on 2 x H200 and not proportional to the waits; the "
            "model has no bf16 host time to price it, and its constants were fitted mostly on "
            "checked trials (autotune.levers.nan_checks: no_cost; "
            "2026-11-29-h200x2-nan-checks-s27.md). A search measures both where a space "
            "lists them."),
)

NO_PAIRS: dict[str, str] = {
    "embedding_loss_split": "Both values are valid only where pp x vpp divides both num_layers "
                            "and num_layers + 2, so at pp 2 without vpp, where the two split the "
                            "layers alike and are one run (autotune.megatron.identity). Its "
                            "consumers are checked on layouts only it makes valid: "
                            "tests/test_published_recipes.py (the 405B at pp 8 vpp 8), "
                            "test_megatron_args and the megatron-core cross-check.",
}
"""Dimensions no two valid layouts differing in them alone can tell apart as runs, and why: for
them the test asserts that this is still so."""
NOT_SEARCHED = {"dp": "derived from the GPU count and tp x pp x cp",
                "gbs": "the model's global batch size, not a search dimension"}


def _exported_args(model: ModelSpec, s: Layout) -> list[str]:
    exported = s if s.impl != Impl.SDPA else replace(s, impl=Impl.TE)
    return megatron_lm_args(model, exported, mock_data=True)


def _differs(consumer: str, model: ModelSpec, cluster: ClusterSpec, a: Layout,
             b: Layout) -> bool:
    # The run's environment (the allocator's option) reaches both: the exported script exports
    # it, and the worker sets it for the trial (autotune.worker.run.configure_allocator).
    env = run_environment(a) != run_environment(b)
    if consumer == "megatron-lm":
        return _exported_args(model, a) != _exported_args(model, b) or env
    if consumer == "worker":
        return core_config(model, a).signature() != core_config(model, b).signature() or env
    memory = estimate_memory(model, a, cluster) != estimate_memory(model, b, cluster)
    cost = (estimate_cost(model, a, cluster).step_time_s
            != estimate_cost(model, b, cluster).step_time_s)
    return memory or cost


@functools.cache
def _layouts(preset: str, gpus: int) -> tuple[ModelSpec, ClusterSpec, tuple[Layout, ...]]:
    """The valid layouts of the all-dimensions space (shared with test_identity)."""
    return all_dimensions_layouts(preset, gpus)


@functools.cache
def _values(preset: str, gpus: int) -> list[tuple[Any, ...]]:
    """Each valid layout's searched values, in SEARCHED order (read once, sliced per test)."""
    return [tuple(getattr(s, d) for d in SEARCHED) for s in _layouts(preset, gpus)[2]]


@functools.cache
def _key(preset: str, gpus: int, s: Layout) -> tuple[Any, ...]:
    """`s`'s run key, computed when a pair needs it: the all-dimensions space holds 100,000s
    of layouts and a test looks at a few hundred pairs of them."""
    return run_key(_layouts(preset, gpus)[0], s)


def _pairs(preset: str, gpus: int, name: str) -> list[tuple[Layout, Layout]]:
    """Valid layouts that differ in `name` alone and are different runs, a seeded sample."""
    _, _, valid = _layouts(preset, gpus)
    at = list(SEARCHED).index(name)
    by_rest: dict[tuple[Any, ...], list[Layout]] = {}
    for s, values in zip(valid, _values(preset, gpus), strict=True):
        by_rest.setdefault(values[:at] + values[at + 1:], []).append(s)
    candidates = [pair for group in by_rest.values()
                  for pair in itertools.combinations(group, 2)]
    random.Random(name).shuffle(candidates)
    pairs = []
    for a, b in candidates:
        if _key(preset, gpus, a) != _key(preset, gpus, b):
            pairs.append((a, b))
            if len(pairs) == MAX_PAIRS:
                break
    return pairs


CASES = [("gpt2", 8), ("mixtral-8x7b", 8)]
"""A dense model and a mixture of experts (ep), on 8 GPUs of one node."""


def test_every_dimension_is_searched_or_explained() -> None:
    assert set(DIMENSIONS) == set(SEARCHED) | set(NOT_SEARCHED)


@pytest.mark.parametrize("name", list(SEARCHED))
def test_every_consumer_sees_the_dimension(name: str) -> None:
    if name in NO_PAIRS:
        assert not any(_pairs(preset, gpus, name) for preset, gpus in CASES), (
            f"{name} now has pairs that are different runs: check its consumers here and drop "
            "it from NO_PAIRS")
        return
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


# ---- the lever contract (autotune/levers/) ------------------------------------------------
# Every registered lever declares its fields, rules, flag rows (read back), core-config keys that
# megatron-core 0.16.1's configuration classes have, and memory and cost terms, a saving in
# memory never free in time; megatron-core accepts every layout its rules accept.
# `lever_problems` reports what a lever breaks; a deliberately broken lever shows the check
# fails.

CONFIG_CLASSES = {
    "transformer": ("megatron.core.transformer.transformer_config", "TransformerConfig"),
    "ddp": ("megatron.core.distributed.distributed_data_parallel_config",
            "DistributedDataParallelConfig"),
    "optimizer": ("megatron.core.optimizer.optimizer_config", "OptimizerConfig"),
    "model": ("megatron.core.models.gpt.gpt_model", "GPTModel"),
}
MODEL_PART_KEYS = frozenset({"layer_spec"})
"""The worker config's model part beside GPTModel's arguments: the layer spec by name
(autotune.worker.build._layer_spec builds GPTModel's transformer_layer_spec from it)."""


def _needs_megatron() -> None:
    if not os.environ.get("CI"):  # CI installs megatron-core: a skip there would hide a gap
        pytest.importorskip("megatron.core")


@functools.cache
def _config_fields() -> dict[str, frozenset[str]]:
    """The keyword arguments megatron-core's configuration classes (and GPTModel) take, by
    worker part."""
    import dataclasses
    import importlib
    import inspect

    _needs_megatron()
    known = {}
    for part, (module, name) in CONFIG_CLASSES.items():
        cls = getattr(importlib.import_module(module), name)
        known[part] = frozenset(f.name for f in dataclasses.fields(cls)) \
            if dataclasses.is_dataclass(cls) \
            else frozenset(inspect.signature(cls.__init__).parameters) | MODEL_PART_KEYS
    return known


def _megatron_verdict(model: ModelSpec, s: Layout, gpus: int) -> str | None:
    """megatron-core's judgement of `s` (tools/rules_crosscheck.py: its parallel state,
    TransformerConfig, layer split and batch calculator on a fake process group)."""
    _needs_megatron()
    pytest.importorskip("torch")
    from tools.rules_crosscheck import megatron_verdict

    return megatron_verdict(model, s, gpus)


def teardown_module() -> None:
    """Leave no fake process group behind for the next test file in this process."""
    import sys

    if "tools.rules_crosscheck" in sys.modules:
        import torch.distributed as dist
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()


def _given(args: list[str], row: FlagRow) -> Given:
    """The flag values of `args` as Megatron-LM's argparse reads them (the row says which take
    a value; a flag of many values takes every word up to the next flag, joined by spaces)."""
    flags = {flag.name: flag for flag in row.flags}
    values: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        flag = flags.get(args[i])
        if flag is not None and not flag.takes_value:
            values[args[i]], i = None, i + 1
            continue
        end = i + 2
        if flag is not None and flag.many:
            while end < len(args) and not args[end].startswith("--"):
                end += 1
        values[args[i]], i = " ".join(args[i + 1:end]), end
    return Given(values, "round trip")


def _lever_layouts(lever: Lever) -> list[tuple[ModelSpec, ClusterSpec, Layout]]:
    """Valid layouts of the all-dimensions space with the lever's fields set and not, from a
    dense model and a mixture of experts on 8 GPUs and one GPU."""
    chosen = []
    for preset, gpus in [*CASES, ("gpt2", 1)]:
        model, cluster, valid = _layouts(preset, gpus)
        def lever_on(s: Layout) -> bool:
            return any(getattr(s, n) != DIMENSIONS[n].default for n in lever.field_names)
        on = [s for s in valid if lever_on(s)]
        off = [s for s in valid if not lever_on(s)]
        rng = random.Random(lever.name)
        for group in (on, off):
            chosen += [(model, cluster, s) for s in rng.sample(group, min(20, len(group)))]
    return chosen


def lever_problems(lever: Lever) -> list[str]:
    """What `lever` breaks of the contract, as sentences."""
    problems = contract_problems(lever)
    known = _config_fields()
    layouts = _lever_layouts(lever)
    if not any(getattr(s, n) != DIMENSIONS[n].default
               for _, _, s in layouts for n in lever.field_names):
        problems.append(f"lever {lever.name}: no valid layout of the all-dimensions space "
                        "turns it")
    read_back: set[str] = set()
    for model, cluster, s in layouts:
        for part, keys in lever.core_config(model, s).items():
            if part not in known:
                problems.append(f"lever {lever.name}: core_config part {part} is none of "
                                f"{', '.join(CONFIG_PARTS)}")
                continue
            for key in sorted(set(keys) - known[part]):
                problems.append(f"lever {lever.name}: core_config key {key} is no field of "
                                f"megatron-core's {CONFIG_CLASSES[part][1]}")
        # What Megatron-LM runs reads back: impl sdpa is exported as te (exported_layout).
        exported = exported_layout(s)
        read: dict[str, Any] = {}
        for row in lever.flag_rows:
            if row.read is not None:
                read.update(row.read(_given(row.emit(model, exported, RunOptions()), row)))
        for name in lever.field_names:
            if name in read and read[name] != getattr(exported, name):
                problems.append(f"lever {lever.name}: {name}={getattr(exported, name)} reads "
                                f"back as {read[name]}")
        read_back |= set(read)
        # megatron-core accepts what the rules accept (tests/test_megatron_crosscheck.py holds
        # the converse on random layouts).
        verdict = _megatron_verdict(model, s, cluster.num_gpus)
        if verdict is not None:
            problems.append(f"lever {lever.name}: megatron-core rejects {s.describe()}, which "
                            f"the rules accept: {verdict}")
        # A lever the memory model prices must cost time too (or say why not): the layout
        # with the lever's fields at their defaults, where Megatron accepts it.
        off = replace(s, **{n: DIMENSIONS[n].default for n in lever.field_names})
        if off == s or check(off, model, cluster) or lever.no_cost:
            continue
        if estimate_memory(model, s, cluster) == estimate_memory(model, off, cluster):
            continue
        # The step's terms must see it (its stage may not set the pace: the fused cross
        # entropy on a last stage lighter than the first changes no step time; nor does
        # recomputing attention on a stage that waits on the context-parallel ring's host).
        start = CostState(optimizer_bytes_per_param=CostParams().optimizer_bytes_per_param)
        terms = [lever.cost(model, layout, cluster, CostParams(), start)
                 for layout in (s, off)] if lever.cost is not None else [start, start]
        if terms[0] == terms[1] and (estimate_cost(model, s, cluster)
                                     == estimate_cost(model, off, cluster)):
            problems.append(f"lever {lever.name}: {s.describe()} changes memory but not time")
    for row in lever.flag_rows:
        for name in sorted(set(row.reads) - read_back):
            problems.append(f"lever {lever.name}: flag row {row.name} never reads back {name}")
    return sorted(set(problems))


@pytest.mark.parametrize("lever", LEVERS, ids=lambda lever: lever.name)
def test_every_lever_keeps_the_contract(lever: Lever) -> None:
    assert lever_problems(lever) == []


def _noop_cost(m: ModelSpec, s: Layout, c: ClusterSpec, p: Any, state: CostState) -> CostState:
    return state


@pytest.mark.parametrize(("change", "reported"), [
    ({"memory": None}, "no memory term"),
    ({"cost": None}, "no cost term"),
    ({"cost": _noop_cost}, "changes memory but not time"),
    ({"flag_rows": ()}, "no Megatron-LM flag row"),
    ({"core_config": lambda m, s: {"transformer": {"cross_entropy_fused_typo": True}}},
     "core_config key cross_entropy_fused_typo is no field"),
])
def test_a_broken_lever_is_reported(change: dict[str, Any], reported: str) -> None:
    broken = replace(cross_entropy.LEVER, **change)
    assert any(reported in problem for problem in lever_problems(broken)), \
        lever_problems(broken)


def test_a_saving_without_its_stage_cost_is_reported() -> None:
    """Recompute prices its time per stage (autotune.levers.base.StageState): without that
    term its saving would be free."""
    broken = replace(recompute.LEVER, stage_cost=None)
    assert any("changes memory but not time" in p for p in contract_problems(broken))


def test_a_flag_row_that_does_not_read_back_is_reported() -> None:
    row = replace(cross_entropy.LEVER.flag_rows[0],
                  read=lambda g: {"cross_entropy_fusion": False})
    broken = replace(cross_entropy.LEVER, flag_rows=(row,))
    assert any("reads back as False" in p for p in lever_problems(broken))
