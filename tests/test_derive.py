"""Derived levers: the count a space marks `derive` resolved from the memory model, `divisors`
enumerated from the layout, and the search's ladder that moves a count by measured peaks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from doubles.fake_backend import GIB, FakeBackend, small_cluster, small_model

from autotune.errors import ConfigError
from autotune.layouts.layout import Layout, check, with_fields
from autotune.predict.memory import estimate_memory
from autotune.search import SearchConfig, run_search
from autotune.search.derive import (
    DERIVE,
    fewest_fitting,
    resolve,
    safe_limit_bytes,
    values_of,
)
from autotune.search.ladder import LADDER_MARGIN, Ladder
from autotune.search.layout_map import LayoutMap
from autotune.search.space import _enumerate, enumerate_space, load_space, space_from_mapping
from autotune.specs.hardware import ClusterSpec
from autotune.specs.presets import load_model
from autotune.trials.trial import TrialStatus

MODEL = small_model()  # gpt2-medium: 24 layers, gbs 64, seq 1024
ONE_GPU = small_cluster(num_gpus=1, memory_gib=12.0)


def block(n: int, mbs: int = 8, **fields: Any) -> Layout:
    return Layout(gbs=MODEL.global_batch_size, mbs=mbs, recompute="full",
                  recompute_method="block", recompute_num_layers=n, impl="sdpa", **fields)


def peak(s: Layout) -> float:
    return estimate_memory(MODEL, s, ONE_GPU).peak_bytes


# -- resolution -------------------------------------------------------------------------------


@pytest.mark.parametrize("limit_gib", [11.0, 12.0, 13.5, 15.0, 17.0, 30.0, 5.0])
def test_block_count_is_the_fewest_that_fits_under_the_limit(limit_gib: float) -> None:
    limit = limit_gib * GIB
    resolved = resolve(block(1), ("recompute_num_layers",), MODEL, ONE_GPU, limit_bytes=limit)
    fitting = [n for n in range(1, MODEL.num_layers + 1) if peak(block(n)) <= limit]
    # The brute-force answer; with nothing fitting, every layer (the gate then says why not).
    assert resolved.recompute_num_layers == (fitting[0] if fitting else MODEL.num_layers)


def test_uniform_group_is_the_divisor_of_least_memory() -> None:
    s = replace(block(1), recompute_method="uniform")
    resolved = resolve(s, ("recompute_num_layers",), MODEL, ONE_GPU, limit_bytes=12 * GIB)
    divisors = [d for d in range(1, MODEL.num_layers + 1) if MODEL.num_layers % d == 0]
    best = min(divisors, key=lambda d: (peak(replace(s, recompute_num_layers=d)), d))
    assert resolved.recompute_num_layers == best
    assert not check(resolved, MODEL, ONE_GPU)


@pytest.mark.parametrize(("fields", "expected"), [
    # The lever means nothing here: the count stays at its default, so that layouts Megatron
    # runs alike stay alike.
    ({"recompute": "none"}, 1),
    ({"recompute": "selective"}, 1),
])
def test_a_lever_that_does_not_apply_keeps_its_default(fields: dict[str, Any],
                                                       expected: int) -> None:
    s = replace(block(7), **fields)
    assert resolve(s, ("recompute_num_layers",), MODEL, ONE_GPU,
                   limit_bytes=12 * GIB).recompute_num_layers == expected


def test_offload_derives_zero_where_the_layout_fits_without_it() -> None:
    s = Layout(gbs=MODEL.global_batch_size, mbs=1, impl="te")
    assert values_of("offload_layers", s, MODEL)[0] == 0
    resolved = resolve(s, ("offload_layers",), MODEL, ONE_GPU, limit_bytes=12 * GIB)
    assert resolved.offload_layers == 0
    tight = resolve(replace(s, mbs=8), ("offload_layers",), MODEL, ONE_GPU,
                    limit_bytes=12 * GIB)
    assert tight.offload_layers > 0 and not check(tight, MODEL, ONE_GPU)


@pytest.mark.parametrize(("preset", "gpus"), [
    ("gpt2-xl", 1), ("gpt2-xl", 8), ("llama3-8b", 16), ("llama3-70b", 64), ("gpt-1t", 3072),
    ("mixtral-8x7b", 64)])
def test_uniform_groups_scan_stops_where_the_full_scan_would_pick(preset: str,
                                                                  gpus: int) -> None:
    # least_memory stops at the first rise of a convex peak: it must pick what pricing every
    # divisor picks, on every uniform layout the default space enumerates.
    from autotune.search.derive import least_memory, values_of
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.presets import load_model

    model, cluster = load_model(preset), ClusterSpec.make(gpus, gpu="h100-80gb")
    space = space_from_mapping({
        "tp": [1, 2, 8], "pp": [1, 2, 3, 4, 8, 16], "vpp": [1, 2, 4], "mbs": [1, 2, 8],
        "sequence_parallel": [False, True], "recompute": ["full"],
        "recompute_method": ["uniform"], "recompute_num_layers": "derive",
        "distributed_optimizer": [False, True], "impl": ["sdpa"]}, "uniform")
    uniform = enumerate_space(space, model, cluster).valid
    assert uniform
    for s in uniform[:: max(1, len(uniform) // 200)]:
        values = values_of("recompute_num_layers", s, model)
        assert list(values) == sorted(values)

        def peak(v: int, s: Layout = s) -> float:
            return estimate_memory(model, replace(s, recompute_num_layers=v),
                                   cluster).peak_bytes

        assert least_memory(values, peak) == min(values, key=lambda v: (peak(v), v))


@pytest.mark.parametrize(("peaks", "limit", "expected"), [
    ([9, 7, 5, 3], 6, 3), ([9, 7, 5, 3], 100, 1), ([9, 7, 5, 3], 1, 4), ([9, 7, 5, 3], 7, 2),
    ([5], 5, 1), ([5], 4, 1),
])
def test_fewest_fitting_bisects_a_falling_sequence(peaks: list[int], limit: int,
                                                   expected: int) -> None:
    values = list(range(1, len(peaks) + 1))
    calls: list[int] = []

    def peak_of(v: int) -> float:
        calls.append(v)
        return peaks[v - 1]

    assert fewest_fitting(values, peak_of, limit) == expected
    assert len(calls) <= 2 + len(values).bit_length()


# -- the space --------------------------------------------------------------------------------


@pytest.mark.parametrize(("mapping", "message"), [
    ({"tp": "derive"}, "tp cannot be `derive`"),
    ({"recompute": ["derive"]}, "recompute cannot be `derive`"),
    ({"recompute_num_layers": "divisors"}, "recompute_num_layers cannot be `divisors`"),
    ({"pp": "divisors"}, "pp cannot be `divisors`"),
])
def test_markers_only_where_a_lever_takes_them(mapping: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        space_from_mapping(mapping, "t")


def test_divisors_offers_every_micro_batch_that_divides_the_batch_per_rank() -> None:
    model = replace(MODEL, global_batch_size=24)
    cluster = small_cluster(num_gpus=2, memory_gib=80.0)
    space = space_from_mapping({"tp": [1, 2], "mbs": "divisors", "impl": ["sdpa"]}, "t")
    summary = enumerate_space(space, model, cluster)
    by_dp: dict[int, set[int]] = {}
    for s in summary.valid:
        by_dp.setdefault(s.dp, set()).add(s.mbs)
    assert by_dp == {2: {1, 2, 3, 4, 6, 12}, 1: {1, 2, 3, 4, 6, 8, 12, 24}}
    assert summary.total == len(summary.valid) + sum(g.count for g in summary.rejected.values())


@pytest.mark.parametrize(("experts", "gpus", "expected"), [
    (None, 8, {1}),                  # dense: no experts to split
    (8, 8, {1, 2, 4, 8}),
    (16, 32, {1, 2, 4, 8, 16}),      # past one node's 8 GPUs
    (12, 12, {1, 2, 3, 4, 6, 12}),   # not only powers of two
    (64, 16, {1, 2, 4, 8, 16}),      # the GPU count bounds it (rule ep_world)
])
def test_ep_divisors_split_the_experts(experts: int | None, gpus: int,
                                       expected: set[int]) -> None:
    model = replace(MODEL, num_experts=experts, moe_topk=2, global_batch_size=96)
    cluster = small_cluster(num_gpus=gpus, memory_gib=80.0)
    space = space_from_mapping({"ep": "divisors", "mbs": [1], "impl": ["sdpa"]}, "t")
    assert {s.ep for s in enumerate_space(space, model, cluster).valid} == expected


def test_vpp_divisors_follow_the_layers_of_a_stage() -> None:
    cluster = small_cluster(num_gpus=2, memory_gib=80.0)
    space = space_from_mapping({"pp": [2], "vpp": "divisors", "mbs": [1]}, "t")
    vpps = {s.vpp for s in enumerate_space(space, MODEL, cluster).valid}
    # 24 layers over 2 stages: 12 a stage; the interleaved schedule's micro-batch rule (64
    # micro-batches, a multiple of pp) keeps them all.
    assert vpps == {1, 2, 3, 4, 6, 12}


def test_derived_count_is_no_parameter_but_part_of_the_key() -> None:
    space = space_from_mapping({"mbs": [4, 8], "recompute": ["none", "full"],
                                "recompute_method": ["block"],
                                "recompute_num_layers": "derive", "impl": ["sdpa"]}, "t")
    summary = enumerate_space(space, MODEL, ONE_GPU)
    cfg_layouts = LayoutMap(summary.valid,
                            {"mbs": (4, 8), "recompute": ("none", "full"),
                             "recompute_num_layers": (DERIVE,)},
                            model=MODEL, via_derive=summary.via_derive)
    assert set(cfg_layouts.distributions) == {"mbs", "recompute"}
    full8 = cfg_layouts.layout({"mbs": 8, "recompute": "full"})
    assert full8 is not None
    limit = safe_limit_bytes(ONE_GPU)
    assert full8.recompute_num_layers == resolve(
        full8, ("recompute_num_layers",), MODEL, ONE_GPU,
        limit_bytes=limit).recompute_num_layers
    rung = replace(full8, recompute_num_layers=full8.recompute_num_layers - 2)
    assert cfg_layouts.params(rung) == cfg_layouts.params(full8)
    assert cfg_layouts.run_params(rung) != cfg_layouts.run_params(full8)
    assert cfg_layouts.layout({"mbs": 8, "recompute": "full"},
                              {"recompute_num_layers": rung.recompute_num_layers}) == rung


def test_a_listed_value_and_derive_are_both_parameters() -> None:
    space = space_from_mapping({"mbs": [8], "offload_layers": [0, "derive"],
                                "impl": ["te"]}, "t")
    summary = enumerate_space(space, MODEL, ONE_GPU)
    offloads = {s.offload_layers for s in summary.valid}
    assert 0 in offloads and len(offloads) == 2


@pytest.mark.parametrize("deeper", [
    {},  # the derived level is the last one the space uses
    {"fp8": ["off", "hybrid"]},  # a deeper level follows (FP8, level 6; offload is level 5)
    {"fp8": ["off"], "fp8_recipe": ["delayed"]},
])
def test_a_derived_value_stays_reachable_when_a_deeper_level_follows(
        deeper: dict[str, Any]) -> None:
    # The enumerator once recorded only the last level's derived dimensions: with FP8 in the
    # space, offload's `derive` vanished from the parameters and its layouts were unreachable.
    space = space_from_mapping({"mbs": [8], "offload_layers": [0, "derive"], "impl": ["te"],
                                **deeper}, "t")
    summary = enumerate_space(space, MODEL, ONE_GPU)
    offloaded = [s for s in summary.valid if s.offload_layers > 0]
    assert offloaded and all("offload_layers" in summary.via_derive[s] for s in offloaded)
    layouts = LayoutMap.of(SearchConfig(model=MODEL, cluster=ONE_GPU, space=space,
                                        backend=FakeBackend(ONE_GPU)))
    assert DERIVE in layouts.free["offload_layers"]
    reached = layouts.layout({**{d: v[0] for d, v in layouts.free.items()},
                              "offload_layers": DERIVE})
    assert reached is not None and reached.offload_layers == offloaded[0].offload_layers


# -- the ladder -------------------------------------------------------------------------------


def test_ladder_goes_down_along_the_measured_slope_and_up_after_an_oom() -> None:
    ladder = Ladder(MODEL, ONE_GPU, ("recompute_num_layers",))
    start = block(24)  # predicted 11.9 GiB of 12
    measured = peak(start) - 1.0 * GIB  # the model over-predicts this layout by 1 GiB
    ladder.learn(start, TrialStatus.OK, measured)
    rung = ladder.next_rung(start)
    assert rung is not None and rung.recompute_num_layers < 24
    limit = ONE_GPU.gpu.memory_bytes * (1 - LADDER_MARGIN)
    n = rung.recompute_num_layers
    assert measured + peak(rung) - peak(start) <= limit
    assert measured + peak(block(n - 1)) - peak(start) > limit or n == 1
    assert ladder.extrapolated(rung) == pytest.approx(measured + peak(rung) - peak(start))
    # It ran out of memory after all: the next rung lies between it and the fit.
    ladder.learn(rung, TrialStatus.OOM, None)
    between = ladder.next_rung(rung)
    if 24 - n > 1:
        assert between is not None and n < between.recompute_num_layers < 24
    # Once every count between is tried, nothing is left.
    for v in range(n + 1, 24):
        ladder.learn(block(v), TrialStatus.OOM, None)
    assert ladder.next_rung(start) is None


def test_ladder_climbs_from_an_oom_with_no_fit_known() -> None:
    ladder = Ladder(MODEL, ONE_GPU, ("recompute_num_layers",))
    failed = block(12)
    ladder.learn(failed, TrialStatus.OOM, None)
    rung = ladder.next_rung(failed, capacity_bytes=peak(failed))
    assert rung is not None and rung.recompute_num_layers > 12


# -- the search -------------------------------------------------------------------------------

DERIVED_SPACE = {"mbs": "divisors", "recompute": ["none", "full"], "recompute_method": ["block"],
                 "recompute_num_layers": "derive", "impl": ["sdpa"]}


def _tokens(s: Layout) -> float:
    """Larger micro-batches are faster; each recomputed layer costs a third of its forward."""
    share = s.recompute_num_layers / MODEL.num_layers if s.recompute == "full" else 0.0
    return 1000.0 * (1 + 0.1 * s.mbs) * (1 - 0.3 * share)


def _truth(backend: FakeBackend, space: dict[str, Any]) -> tuple[float, Layout]:
    """The best layout of the exhaustive grid over every count that really fits with the
    ladder's margin: what an expert with the same caution would find."""
    best: tuple[float, Layout] | None = None
    for s in enumerate_space(space_from_mapping({**space, "recompute_num_layers": list(
            range(1, MODEL.num_layers + 1))}, "grid"), MODEL, ONE_GPU).valid:
        true_peak = peak(s) * backend.underestimate
        if true_peak > ONE_GPU.gpu.memory_bytes * (1 - LADDER_MARGIN):
            continue
        if best is None or _tokens(s) > best[0]:
            best = (_tokens(s), s)
    assert best is not None
    return best


# These tests follow the ladder: finalists' repeats (tests/test_finalists.py) would run a rung
# again, so they opt out.
@pytest.mark.parametrize("underestimate", [0.93, 0.97, 1.0, 1.03])
def test_search_finds_the_fewest_layers_that_really_fit(tmp_path: Path,
                                                        underestimate: float) -> None:
    backend = FakeBackend(ONE_GPU, true_capacity_bytes=ONE_GPU.gpu.memory_bytes,
                          underestimate=underestimate, tokens=_tokens)
    space = space_from_mapping(DERIVED_SPACE, "t")
    result = run_search(SearchConfig(model=MODEL, cluster=ONE_GPU, space=space,
                                     backend=backend, results_dir=tmp_path, study_name="d",
                                     sampler="tpe", n_trials=30, finalists=0))
    best = result.best(1)[0]
    truth, expert = _truth(backend, DERIVED_SPACE)
    assert best.tokens_per_s is not None
    # The expert's best, or a count next to it.
    assert best.tokens_per_s >= 0.98 * truth, (best.layout.describe(), expert.describe())
    # The first trial is not an OOM: the first count is resolved with the gate's band.
    assert result.records[0].status is TrialStatus.OK
    counts = [r.layout.recompute_num_layers for r in result.records
              if r.launched and r.layout.recompute == "full"]
    assert len(counts) == len({(r.layout.mbs, r.layout.recompute_num_layers)
                               for r in result.records if r.launched
                               and r.layout.recompute == "full"})  # no rung twice


def test_resume_continues_the_ladder_without_repeating_a_rung(tmp_path: Path) -> None:
    space = space_from_mapping(DERIVED_SPACE, "t")
    backend = FakeBackend(ONE_GPU, true_capacity_bytes=ONE_GPU.gpu.memory_bytes,
                          underestimate=0.93, tokens=_tokens)
    cfg = SearchConfig(model=MODEL, cluster=ONE_GPU, space=space, backend=backend,
                       results_dir=tmp_path, study_name="r", sampler="tpe", n_trials=2,
                       finalists=0)
    first = run_search(cfg)
    assert [r.source for r in first.records[:2]] == ["alpa", "derived"]
    again = FakeBackend(ONE_GPU, true_capacity_bytes=ONE_GPU.gpu.memory_bytes,
                        underestimate=0.93, tokens=_tokens)
    resumed = run_search(replace(cfg, backend=again, resume=True, n_trials=30))
    ran_before = {(r.layout.mbs, r.layout.recompute_num_layers, r.layout.recompute)
                  for r in first.records if r.launched}
    ran_after = {(s.mbs, s.recompute_num_layers, s.recompute) for s in again.calls}
    assert not ran_before & ran_after
    stored = {r.number: r.layout for r in resumed.records}
    # The records read back carry the counts the trials ran with.
    for r in first.records:
        assert stored[r.number] == r.layout


def test_a_rung_runs_even_when_the_model_has_nothing_left_to_try(tmp_path: Path) -> None:
    # One structure in the space: once its first count ran, the model's stop rule knows no
    # untried layout, yet the rung the measurement asked for still runs (seen on an H100:
    # gpt2-xl at seq 32768 stopped after block/31 with block/28 queued).
    space = space_from_mapping({"mbs": [8], "recompute": ["full"], "recompute_method": ["block"],
                                "recompute_num_layers": "derive", "impl": ["sdpa"]}, "t")
    backend = FakeBackend(ONE_GPU, true_capacity_bytes=ONE_GPU.gpu.memory_bytes,
                          underestimate=0.93, tokens=_tokens)
    result = run_search(SearchConfig(model=MODEL, cluster=ONE_GPU, space=space,
                                     backend=backend, results_dir=tmp_path, study_name="one",
                                     finalists=0))
    sources = [r.source for r in result.records if r.launched]
    assert sources[0] == "alpa" and "derived" in sources
    counts = [s.recompute_num_layers for s in backend.calls]
    assert counts == sorted(counts, reverse=True) and len(set(counts)) == len(counts)


# -- the enumeration's lazy resolution --------------------------------------------------------

_MOE_SPACE = {
    "tp": [1, 2, 8], "pp": [1, 2, 4], "cp": [1, 2], "ep": [1, 8],
    "sequence_parallel": [False, True], "mbs": [1, 2], "recompute": ["none", "selective", "full"],
    "recompute_method": ["uniform", "block"], "recompute_num_layers": "derive",
    "distributed_optimizer": [False, True], "overlap_grad_reduce": [False, True],
    "overlap_param_gather": [False, True], "impl": ["local", "sdpa", "te"],
    "fp8": ["off", "hybrid"]}


def _lazy_cases() -> list[tuple[str, int, Any]]:
    from autotune.search.space import load_space
    from autotune.specs.presets import search_spaces_dir
    single = search_spaces_dir().joinpath("single-gpu.yaml").read_text()
    from autotune.inputs.documents import parse_yaml
    return [("gpt2-xl", 8, load_space()),
            ("gpt2-xl", 1, space_from_mapping(parse_yaml(single, "single"), "single")),
            ("llama3-8b", 1, space_from_mapping(parse_yaml(single, "single"), "single")),
            ("mixtral-8x7b", 64, space_from_mapping(_MOE_SPACE, "moe"))]


@pytest.mark.parametrize("case", range(4))
def test_lazy_resolution_enumerates_what_resolving_every_combination_does(
        case: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # The enumeration resolves a derived count only for a layout that the rules reading no
    # count pass, and once for choices that differ only in memory-blind fields: the valid
    # layouts, their counts, the rejections (rule, count, examples, order) stay those of
    # resolving every combination first, with fewer resolutions.
    from autotune.search import space as space_module
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.presets import load_model

    preset, gpus, space = _lazy_cases()[case]
    model, cluster = load_model(preset), ClusterSpec.make(gpus, gpu="h100-80gb")
    resolved = {True: 0, False: 0}
    lazy = True

    def counting(*args: Any, **kwargs: Any) -> Layout:
        resolved[lazy] += 1
        return resolve(*args, **kwargs)

    monkeypatch.setattr(space_module, "resolve", counting)
    summaries = {}
    for lazy in (False, True):
        summaries[lazy] = space_module._enumerate(space, model, cluster, lazy=lazy)
    eager, lazily = summaries[False], summaries[True]
    assert lazily.valid == eager.valid and lazily.valid
    assert [(s.recompute_num_layers, s.offload_layers) for s in lazily.valid] == \
        [(s.recompute_num_layers, s.offload_layers) for s in eager.valid]
    assert lazily.via_derive == eager.via_derive and lazily.total == eager.total
    assert [(k, g.count, g.examples) for k, g in lazily.rejected.items()] == \
        [(k, g.count, g.examples) for k, g in eager.rejected.items()]
    assert 0 < resolved[True] < resolved[False]


def _rule_probes() -> list[tuple[Any, Layout]]:
    # Layouts that break and pass each rule of level 5 and 6 (no enumeration: broken ones too).
    import itertools

    from autotune.specs.presets import load_model
    probes = []
    for preset in ("gpt2-xl", "mixtral-8x7b"):
        model = load_model(preset)
        for tp, pp, cp, rc, method, impl, do, opg, fp8 in itertools.product(
                (1, 2), (1, 2, 4), (1, 2), ("none", "selective", "full"), ("uniform", "block"),
                ("local", "te"), (False, True), (False, True), ("off", "hybrid")):
            fields: dict[str, Any] = {
                "tp": tp, "pp": pp, "cp": cp, "recompute": rc, "recompute_method": method,
                "impl": impl, "distributed_optimizer": do, "overlap_grad_reduce": True,
                "overlap_param_gather": opg, "fp8": fp8, "sequence_parallel": tp > 1,
                "recompute_modules": "core_attn+layernorm"}
            probes.append((model, Layout(gbs=model.global_batch_size, **fields)))
    return probes


def test_a_rule_not_named_by_a_derivable_answers_alike_for_every_count() -> None:
    # Derivable.rules names every rule that reads the count: any other gives one answer
    # whatever the count, so the enumeration may check it before the count is resolved.
    from autotune.layouts.layout import RULES
    from autotune.search.derive import DERIVABLE
    from autotune.specs.hardware import ClusterSpec

    cluster = ClusterSpec.make(64, gpu="h100-80gb")
    for model, s in _rule_probes():
        for dim, lever in DERIVABLE.items():
            # Counts below, inside and above every range a lever offers.
            n = model.num_layers
            variants = [with_fields(s, **{dim: c}) for c in (0, 1, 2, 3, n // 2, n - 1, n, n + 1)]
            for rule in RULES:
                # A rule of level k reads only fields of levels <= k; the counts are level 5.
                if rule.name in lever.rules or rule.level < 5:
                    continue
                answers = {rule.check(v, model, cluster) for v in variants}
                assert len(answers) == 1, (dim, rule.name, s.describe())


def test_every_count_the_resolver_may_give_passes_the_rules_that_read_it() -> None:
    from autotune.layouts.layout import RULES
    from autotune.search.derive import DERIVABLE
    from autotune.specs.hardware import ClusterSpec

    cluster = ClusterSpec.make(64, gpu="h100-80gb")
    named = {r.name: r for r in RULES}
    assert all(name in named for lever in DERIVABLE.values() for name in lever.rules)
    checked = 0
    for model, s in _rule_probes():
        for dim, lever in DERIVABLE.items():
            if dim == "offload_layers":
                s = with_fields(s, recompute="none")
            for n in values_of(dim, s, model):
                checked += 1
                for name in lever.rules:
                    assert named[name].check(with_fields(s, **{dim: n}), model, cluster) is None
    assert checked


def test_memory_blind_fields_change_no_estimate_and_no_resolved_count() -> None:
    from autotune.search.derive import DERIVABLE, MEMORY_BLIND
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.presets import load_model

    assert {"overlap_grad_reduce", "overlap_param_gather", "nan_checks"} == MEMORY_BLIND
    model, cluster = load_model("mixtral-8x7b"), ClusterSpec.make(64, gpu="h100-80gb")
    layouts = enumerate_space(space_from_mapping(_MOE_SPACE, "moe"), model, cluster).valid
    limit = safe_limit_bytes(cluster)
    for s in layouts[:: max(1, len(layouts) // 150)]:
        for field in MEMORY_BLIND:
            other = with_fields(s, **{field: not getattr(s, field)})
            assert estimate_memory(model, other, cluster) == estimate_memory(model, s, cluster)
            for dim, lever in DERIVABLE.items():
                assert values_of(dim, other, model) == values_of(dim, s, model)
                assert lever.monotone(other) == lever.monotone(s)
                assert resolve(other, (dim,), model, cluster, limit_bytes=limit) == \
                    with_fields(resolve(s, (dim,), model, cluster, limit_bytes=limit),
                                **{field: getattr(other, field)})


# -- the pipeline split -----------------------------------------------------------------------

# num_layers, pp, vpp, the embedding_loss_split values `derive` leaves among the valid layouts
# (empty: no split lets pp divide the layers). The split only where the even one cannot be:
# Llama 3.1 405B's 126 layers at pp 8 (128 slots), never a repeat of an even split's run.
SPLITS = [
    (22, 4, 1, {True}),     # 22 % 4, 24 % 4 == 0
    (22, 8, 1, {True}),
    (25, 3, 1, {True}),     # 27 % 3 == 0: not only powers of two
    (22, 2, 1, {False}),    # both split evenly: the even split (the same run at pp 2)
    (24, 4, 1, {False}),
    (24, 5, 1, set()),      # neither 24 nor 26 divisible by 5
    (30, 8, 2, {True}),     # 32 slots: 4 a rank, 2 a virtual stage
    (30, 8, 4, {True}),
    (22, 4, 4, set()),      # 6 slots a rank: vpp 4 does not divide them
]


@pytest.mark.parametrize(("layers", "pp", "vpp", "splits"), SPLITS)
def test_the_embedding_loss_split_is_derived_where_only_it_divides_the_layers(
        layers: int, pp: int, vpp: int, splits: set[bool]) -> None:
    model = replace(MODEL, num_layers=layers)
    cluster = small_cluster(num_gpus=pp, memory_gib=80.0)
    space = space_from_mapping({"pp": [pp], "vpp": [vpp], "mbs": [1], "impl": ["te"],
                                "embedding_loss_split": "derive"}, "t")
    summary = enumerate_space(space, model, cluster)
    assert {s.embedding_loss_split for s in summary.valid} == splits
    for s in summary.valid:
        assert not check(s, model, cluster)
    # The lazy enumeration agrees with resolving every combination first.
    eager = _enumerate(space, model, cluster, lazy=False)
    assert set(eager.valid) == set(summary.valid)


@pytest.mark.parametrize(("model_ref", "seq", "gbs", "gpu"), [
    ("tests/data/hf/llama-3.2-3b.json", 8192, 4, "h100-80gb"),  # bf16 12 layers, FP8 18
    ("gpt2-xl", 32768, 1, "h100-80gb"),
    ("tests/data/hf/qwen3-4b.json", 4096, 16, "h200"),
])
def test_a_count_derived_for_bf16_is_raised_where_fp8_needs_more(
        model_ref: str, seq: int, gbs: int, gpu: str) -> None:
    """A count is resolved at its level with FP8 (a deeper level) off; an FP8 layout that needs
    more memory gets the fewest count that fits it, so that the space holds an FP8 layout
    predicted to fit wherever one exists."""
    from autotune.search.loss_guard import arithmetic, twin

    model = load_model(model_ref).with_overrides(seq_length=seq, global_batch_size=gbs)
    cluster = ClusterSpec.make(1, gpu=gpu)
    summary = enumerate_space(load_space(None), model, cluster)
    limit = {on: safe_limit_bytes(cluster, expandable=on) for on in (False, True)}
    bf16 = {arithmetic(s): s for s in summary.valid
            if s.fp8 == "off" and s.recompute_method == "block" and s.recompute == "full"}
    raised = 0
    for s in summary.valid:
        if s.fp8 == "off" or s.recompute != "full" or s.recompute_method != "block":
            continue
        base = bf16.get(arithmetic(twin(s)))
        if base is None:
            continue
        assert s.recompute_num_layers >= base.recompute_num_layers
        if s.recompute_num_layers > base.recompute_num_layers:
            raised += 1
            fewer = with_fields(s, recompute_num_layers=s.recompute_num_layers - 1)
            # The fewest that fits; all of the chunk's layers where none does.
            fits = estimate_memory(model, s, cluster).peak_bytes <= limit[s.expandable_segments]
            assert fits or s.recompute_num_layers == values_of("recompute_num_layers", s,
                                                               model)[-1]
            assert estimate_memory(model, fewer, cluster).peak_bytes > \
                limit[s.expandable_segments]
    if model_ref.endswith("llama-3.2-3b.json"):
        assert raised
