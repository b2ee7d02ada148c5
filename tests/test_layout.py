from __future__ import annotations

import dataclasses

import pytest

from autotune.errors import InvalidLayoutError
from autotune.layouts.layout import DIMENSIONS, RULES, Layout, check, validate, with_fields
from autotune.levers.base import CostState, MemoryState, evolve
from autotune.specs.presets import load_model
from tests.conftest import cluster

# model, gpus, layout fields, broken rule (None = valid), a fragment of the message
CASES = [
    ("gpt2-xl", 8, dict(dp=8, mbs=4, gbs=64), None, ""),
    ("gpt2-xl", 8, dict(tp=2, dp=4, gbs=64), "tp_heads",
     "tp=2 must divide num_attention_heads=25"),
    ("gpt2-xl", 8, dict(dp=4, gbs=64), "world", "= 4 must equal the 8 GPUs"),
    ("gpt2-xl", 6, dict(pp=4, dp=1, gbs=64), "world", "= 4 must divide the 6 GPUs"),
    ("gpt2-large", 16, dict(tp=4, dp=4, gbs=64), None, ""),
    ("gpt2-large", 16, dict(tp=16, dp=1, gbs=64), "tp_node",
     "tp=16 must not exceed gpus_per_node=8"),
    ("llama3-70b", 16, dict(tp=16, dp=1, gbs=64), "tp_node", "gpus_per_node=8"),
    ("llama3-8b", 8, dict(tp=8, dp=1, gbs=64), None, ""),
    ("gpt2-large", 8, dict(pp=8, dp=1, gbs=64), "pp_layers", "pp=8 must divide num_layers=36"),
    ("gpt2-large", 8, dict(pp=4, vpp=2, dp=2, mbs=1, gbs=64), "vpp_layers",
     "vpp=2 must divide the 9 layers per pipeline stage"),
    ("gpt2-large", 4, dict(vpp=2, dp=4, gbs=64), "vpp_pp", "vpp=2 needs pp >= 2"),
    ("gpt2-xl", 4, dict(pp=2, vpp=2, dp=2, mbs=16, gbs=64), None, ""),
    ("gpt2-xl", 4, dict(pp=4, vpp=2, dp=1, mbs=32, gbs=64), "vpp_microbatches",
     "num_microbatches=2 (gbs/(mbs*dp)) to be a multiple of pp=4"),
    ("gpt2-xl", 8, dict(dp=8, mbs=16, gbs=64), "gbs_batch",
     "mbs=16 x dp=8 = 128 must divide global_batch_size=64"),
    ("gpt2-large", 2, dict(dp=2, sequence_parallel=True, gbs=64), "sp_tp",
     "sequence_parallel needs tp >= 2"),
    ("gpt2-large", 2, dict(cp=2, dp=1, gbs=64, impl="local"), "cp_impl", "cp=2 needs impl=te"),
    ("gpt2-large", 2, dict(cp=2, dp=1, gbs=64, impl="te"), None, ""),
    ("gpt2-xl", 2, dict(dp=2, ep=2, gbs=64), "ep_dense", "gpt2-xl has no experts"),
    ("mixtral-8x7b", 8, dict(dp=8, ep=8, gbs=64), None, ""),
    ("mixtral-8x7b", 8, dict(dp=8, ep=16, gbs=64), "ep_experts", "ep=16 must divide"),
    ("mixtral-8x7b", 16, dict(tp=2, dp=8, ep=8, sequence_parallel=True, gbs=64), None, ""),
    ("mixtral-8x7b", 16, dict(tp=2, dp=8, ep=8, gbs=64), "moe_sp", "needs sequence_parallel"),
    ("mixtral-8x7b", 24, dict(tp=2, pp=2, dp=6, ep=4, sequence_parallel=True, gbs=48),
     "ep_world", "tp=2 x ep=4 x pp=2 = 16 must divide the 24 GPUs"),
    ("gpt2-xl", 8, dict(dp=8, gbs=64, overlap_param_gather=True, overlap_grad_reduce=True),
     "opg_do", "overlap_param_gather needs distributed_optimizer"),
    ("gpt2-xl", 8, dict(dp=8, gbs=64, recompute="full", recompute_num_layers=49),
     "recompute_layers", "recompute_num_layers=49 must be between 1 and the 48 layers"),
    ("gpt2-xl", 8, dict(dp=8, gbs=64, recompute="sometimes"), "recompute_kind", "recompute="),
    ("gpt2-xl", 8, dict(dp=8, gbs=64, impl="jax"), "impl_known", "impl='jax'"),
    ("gpt2-xl", 8, dict(dp=8, gbs=64, mbs=0), "positive", "every size must be >= 1"),
]


@pytest.mark.parametrize(("model", "gpus", "fields", "rule", "fragment"), CASES)
def test_rules(model: str, gpus: int, fields: dict[str, object], rule: str | None,
               fragment: str) -> None:
    violations = check(Layout(**fields), load_model(model), cluster(gpus))  # type: ignore[arg-type]
    if rule is None:
        assert violations == []
    else:
        assert violations, f"expected {rule}"
        assert violations[0].rule == rule
        assert fragment in violations[0].message


@pytest.mark.parametrize(("groups", "tp", "broken"), [
    (8, 8, False), (8, 4, False), (8, 2, False), (4, 4, False),
    # megatron-core TransformerConfig.__post_init__ raises ValueError: "num_query_groups (4)
    # must be a multiple of tensor_model_parallel_size (8)" (Qwen2.5-3B: 2 groups, tp 4 or 8).
    (4, 8, True), (2, 4, True), (2, 8, True), (1, 2, True),
])
def test_query_groups_are_a_multiple_of_tp(groups: int, tp: int, broken: bool) -> None:
    model = dataclasses.replace(load_model("llama3-8b"), num_query_groups=groups)
    violations = check(Layout(tp=tp, dp=8 // tp, gbs=64), model, cluster(8))
    assert [v.rule for v in violations] == (["tp_groups"] if broken else [])
    if broken:
        assert (f"num_query_groups={groups} must be a multiple of tp={tp}"
                in violations[0].message)


def test_validate_raises_with_the_numbers() -> None:
    with pytest.raises(InvalidLayoutError, match="tp=2 must divide num_attention_heads=25"):
        validate(Layout(tp=2, dp=4, gbs=64), load_model("gpt2-xl"), cluster(8))


@pytest.mark.parametrize(("fields", "expected"), [
    (dict(dp=4, mbs=2, gbs=64), 8),
    (dict(dp=1, mbs=1, gbs=64), 64),
    (dict(dp=8, mbs=8, gbs=64), 1),
])
def test_num_microbatches(fields: dict[str, int], expected: int) -> None:
    assert Layout(**fields).num_microbatches == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(("fields", "label"), [
    (dict(tp=2, pp=2, dp=2, vpp=2, mbs=4, gbs=64, sequence_parallel=True,
          recompute="selective", distributed_optimizer=True, impl="sdpa"),
     "tp2 pp2 dp2 vpp2 mbs4 sp rc=selective do sdpa"),
    (dict(dp=8, mbs=2, gbs=64, recompute="full", distributed_optimizer=True,
          overlap_grad_reduce=True, overlap_param_gather=True),
     "tp1 pp1 dp8 mbs2 rc=full do ogr opg local"),
    (dict(pp=2, dp=4, mbs=2, gbs=64, recompute="full", recompute_method="block",
          recompute_num_layers=3), "tp1 pp2 dp4 mbs2 rc=full(block/3) local"),
    (dict(cp=2, ep=2, dp=4, gbs=64, impl="te"), "tp1 pp1 dp4 cp2 ep2 mbs1 te"),
])
def test_describe_names_every_non_default(fields: dict[str, object], label: str) -> None:
    assert Layout(**fields).describe() == label  # type: ignore[arg-type]


def test_field_order_is_the_labels_and_the_studies() -> None:
    """A Layout's fields keep their order whether a field is the core's or a lever's: labels
    (describe) and a study's parameters follow it, so the pipeline split stays between vpp and
    mbs and the implementation last of Megatron's fields, with the run's environment (the
    allocator's, added after every earlier field) after it (autotune.layouts.layout.Layout's
    bases)."""
    names = list(DIMENSIONS)
    assert names[:12] == ["tp", "pp", "dp", "cp", "ep", "vpp", "first_stage_layers",
                          "last_stage_layers", "embedding_loss_split", "mbs", "gbs",
                          "sequence_parallel"]
    assert names[12:17] == ["recompute", "recompute_method", "recompute_num_layers",
                            "recompute_modules", "offload_layers"]
    assert names[-2:] == ["impl", "expandable_segments"]


def test_levers_rules_run_first_within_a_level() -> None:
    """pp_layers (the pipeline split's) decides the stage counts vpp_layers reads."""
    names = [rule.name for rule in RULES]
    assert names.index("pp_layers") < names.index("vpp_pp") < names.index("vpp_layers")
    assert [rule.level for rule in RULES] == sorted(rule.level for rule in RULES)


# -- the copies the enumeration and the models make a million times: dataclasses.replace's ----

@pytest.mark.parametrize("changes", [
    {"mbs": 4},
    {"tp": 2, "sequence_parallel": True, "recompute": "full", "impl": "te"},  # plain strings
    {"fp8": "hybrid", "fp8_recipe": "tensorwise", "recompute_num_layers": 3},
    {"mbs": 1},  # no change: the layout itself
])
def test_with_fields_is_replace(changes: dict[str, object]) -> None:
    base = Layout(tp=1, pp=2, dp=4, mbs=1, gbs=512)
    copy = with_fields(base, **changes)
    assert copy == dataclasses.replace(base, **changes)  # type: ignore[arg-type]
    assert hash(copy) == hash(dataclasses.replace(base, **changes))  # type: ignore[arg-type]
    for name in changes:  # enum members, as Layout() makes them
        assert type(getattr(copy, name)) is DIMENSIONS[name].kind
    # Every enum field, changed or copied (with_fields coerces only what it changes).
    for name, dim in DIMENSIONS.items():
        assert dim.choices is None or type(getattr(copy, name)) is dim.kind, name
    assert base == Layout(tp=1, pp=2, dp=4, mbs=1, gbs=512)  # the original is untouched


@pytest.mark.parametrize("state", [
    MemoryState(optimizer_bytes_per_param=12.0),
    CostState(optimizer_bytes_per_param=12.0),
], ids=lambda s: type(s).__name__)
def test_evolve_is_replace(state: object) -> None:
    first = dataclasses.fields(state)[0].name  # type: ignore[arg-type]
    copy = evolve(state, **{first: 99.0})  # type: ignore[type-var]
    assert copy == dataclasses.replace(state, **{first: 99.0})  # type: ignore[type-var]
    assert copy is not state and getattr(state, first) != 99.0


@pytest.mark.parametrize("copy", [lambda: with_fields(Layout(), warp=1),
                                  lambda: evolve(MemoryState(optimizer_bytes_per_param=1.0),
                                                 warp=1)],
                         ids=["with_fields", "evolve"])
def test_an_unknown_field_is_refused(copy: object) -> None:
    with pytest.raises(TypeError, match="no field warp"):
        copy()  # type: ignore[operator]

