"""Issue 16's memory options: selective recompute's modules, uneven pipeline splits and CPU
offloading, through the rules, the worker's configuration, the memory and cost models, the gate's
error band and Alpa's seeds."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from typing import Any

import pytest
from conftest import cluster

from autotune.dimensions import RECOMPUTE_MODULES, RecomputeModules
from autotune.layouts.layout import Layout, check, stage_layers
from autotune.levers.activation_offload import offloaded_layers
from autotune.levers.recompute import checkpoint_calls, module_savings
from autotune.levers.transformer_impl import attention_bytes
from autotune.megatron.core_config import core_config
from autotune.predict.cost import estimate_cost
from autotune.predict.gate import DEFAULT_ERROR_BAND, MEMORY_ERROR_BAND, MemoryGate
from autotune.predict.memory import estimate_memory
from autotune.search.heuristics import alpa_seeds, predicted_speed
from autotune.search.space import enumerate_space, space_from_mapping
from autotune.specs.activations import layer_activations
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model
from tests.measured import DATA_PATH, trial_inputs

GPT36 = load_model("gpt-3.6b")  # 30 layers
XL = load_model("gpt2-xl")  # 48 layers
MIXTRAL = load_model("mixtral-8x7b")
LLAMA13 = load_model("llama2-13b")


def _layout(gpus: int = 1, **fields: Any) -> Layout:
    inner = fields.get("tp", 1) * fields.get("pp", 1) * fields.get("cp", 1)
    fields.setdefault("gbs", 64)
    return Layout(dp=max(1, gpus // inner), **fields)


def _broken(model: ModelSpec, s: Layout, gpus: int) -> set[str]:
    return {v.rule for v in check(s, model, cluster(gpus, gpus_per_node=8))}


# -- rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "gpus", "fields", "rule"), [
    (GPT36, 2, {"pp": 2, "first_stage_layers": 14}, None),                       # 14 + 16
    (GPT36, 2, {"pp": 2, "last_stage_layers": 13}, None),                        # 17 + 13
    (GPT36, 2, {"pp": 2, "first_stage_layers": 14, "last_stage_layers": 14}, "pp_layers"),
    (GPT36, 4, {"pp": 4}, "pp_layers"),                                           # 30 / 4
    (GPT36, 4, {"pp": 4, "first_stage_layers": 6, "last_stage_layers": 6}, None),  # 6 9 9 6
    (GPT36, 4, {"pp": 4, "first_stage_layers": 7}, "pp_layers"),                  # 23 over 3
    (GPT36, 1, {"first_stage_layers": 10}, "pp_layers"),                         # needs pp >= 2
    (XL, 4, {"pp": 4, "vpp": 2, "first_stage_layers": 10, "last_stage_layers": 10}, None),
    (XL, 4, {"pp": 4, "vpp": 2, "first_stage_layers": 9, "last_stage_layers": 13},
     "vpp_layers"),
    (XL, 1, {"recompute": "full", "recompute_num_layers": 5}, "recompute_groups"),  # 48 % 5
    (XL, 1, {"recompute": "full", "recompute_method": "block", "recompute_num_layers": 5}, None),
    (XL, 1, {"recompute": "selective", "recompute_modules": "layernorm+mlp"}, None),
    (XL, 1, {"recompute": "selective", "recompute_modules": "moe"}, "recompute_modules"),
    (XL, 1, {"recompute": "selective", "recompute_modules": "layernorm", "impl": "te"},
     "recompute_modules"),  # TE fuses the norms into the linear layers
    (MIXTRAL, 8, {"ep": 8, "recompute": "selective", "recompute_modules": "mlp"},
     "recompute_modules"),
    (MIXTRAL, 8, {"ep": 8, "recompute": "selective", "recompute_modules": "moe_act"},
     "recompute_modules"),  # needs moe_grouped_gemm: impl te
    (MIXTRAL, 8, {"ep": 8, "recompute": "selective", "recompute_modules": "moe_act",
                  "impl": "te"}, None),
    (XL, 1, {"offload_layers": 8, "impl": "te"}, None),
    (XL, 1, {"offload_layers": 8, "impl": "sdpa"}, "offload"),     # TE's offload only
    (XL, 2, {"pp": 2, "offload_layers": 8, "impl": "te"}, "offload"),
    (XL, 1, {"offload_layers": 8, "impl": "te", "recompute": "full"}, "offload"),
    (XL, 1, {"offload_layers": 48, "impl": "te"}, "offload"),      # < num_layers
])
def test_rules(model: ModelSpec, gpus: int, fields: dict[str, Any], rule: str | None) -> None:
    broken = _broken(model, _layout(gpus, **fields), gpus)
    assert broken == ({rule} if rule else set()), broken


@pytest.mark.parametrize(("pp", "first", "last", "expected"), [
    (1, 0, 0, (30,)), (2, 0, 0, (15, 15)), (2, 14, 0, (14, 16)), (2, 0, 12, (18, 12)),
    (2, 13, 17, (13, 17)), (3, 8, 0, (8, 11, 11)), (4, 6, 6, (6, 9, 9, 6)),
])
def test_stage_layers(pp: int, first: int, last: int, expected: tuple[int, ...]) -> None:
    s = _layout(pp, pp=pp, first_stage_layers=first, last_stage_layers=last)
    assert stage_layers(s, GPT36) == expected and sum(expected) == GPT36.num_layers


def test_module_sets_are_ordered_and_complete() -> None:
    # Any subset of the attention side, with mlp or not, with one MoE-layer choice or none:
    # `moe` recomputes the layer moe_act and shared_experts are part of.
    attention = ("core_attn", "layernorm", "mla_up_proj")
    moe_side = ((), ("moe_act",), ("moe",), ("shared_experts",), ("moe_act", "shared_experts"))
    expected = {"+".join(a + m + e) for n in range(4) for a in itertools.combinations(attention, n)
                for m in ((), ("mlp",)) for e in moe_side} - {""}
    assert {value.value for value in RecomputeModules} == expected
    for value in RecomputeModules:
        modules = value.modules
        assert list(modules) == sorted(modules, key=RECOMPUTE_MODULES.index)
    # The spellings studies stored before mla_up_proj and shared_experts: unchanged.
    assert [v.value for v in RecomputeModules][:15] == [
        "core_attn", "core_attn+mlp", "core_attn+moe_act", "core_attn+moe", "layernorm",
        "layernorm+mlp", "layernorm+moe_act", "layernorm+moe", "core_attn+layernorm",
        "core_attn+layernorm+mlp", "core_attn+layernorm+moe_act", "core_attn+layernorm+moe",
        "mlp", "moe_act", "moe"]


# -- the worker's configuration --------------------------------------------------------------


@pytest.mark.parametrize(("fields", "expected"), [
    ({"recompute": "selective", "recompute_modules": "core_attn+layernorm+mlp"},
     {"recompute_granularity": "selective", "recompute_modules": ("core_attn", "layernorm",
                                                                  "mlp")}),
    ({"recompute": "full"}, {"recompute_modules": None, "recompute_method": "uniform"}),
    ({"pp": 2, "first_stage_layers": 14},
     {"num_layers_in_first_pipeline_stage": 14, "num_layers_in_last_pipeline_stage": None}),
    ({"pp": 2}, {"num_layers_in_first_pipeline_stage": None}),
    ({"impl": "te", "offload_layers": 4}, {"cpu_offloading": True,
                                           "cpu_offloading_num_layers": 4}),
    ({}, {"cpu_offloading": False, "recompute_modules": None}),
])
def test_worker_config(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    s = _layout(fields.get("pp", 1), **fields)
    transformer = core_config(GPT36, s).transformer
    assert {k: transformer[k] for k in expected} == expected


# -- memory -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "impl", "modules", "per_token"), [
    # Korthikanti et al. 2022 Table 2 tensors, per token and layer, bytes (t = 1, no SP):
    (XL, "local", ("layernorm",), 4 * 1600),              # the two norms' outputs, 2h each
    (XL, "local", ("mlp",), 2 * 6400 + 2 * 6400),          # GeLU input and fc2 input: 16h
    (XL, "sdpa", ("core_attn",), 4 * 25),                  # flash: the fp32 log-sum-exp only
    (XL, "local", ("core_attn",), 1024 * 25 * (4 + 1 + 2)),  # softmax, mask, dropout: a s
    (MIXTRAL, "te", ("moe_act",), 2 * 2 * 14336),          # k x the experts' fc2 input
])
def test_module_savings(model: ModelSpec, impl: str, modules: tuple[str, ...],
                        per_token: float) -> None:
    acts = layer_activations(model, 1, attention_bytes(model, impl))
    saved = module_savings(acts, modules, seq=model.seq_length, tp=1, sequence_parallel=False)
    assert saved == pytest.approx(per_token)


def test_modules_save_in_order_of_what_they_hold() -> None:
    def peak(modules: str) -> float:
        s = _layout(recompute="selective", recompute_modules=modules, impl="sdpa", mbs=4)
        return estimate_memory(GPT36, s, cluster(1)).peak_bytes
    none = estimate_memory(GPT36, _layout(impl="sdpa", mbs=4), cluster(1)).peak_bytes
    assert none > peak("core_attn") > peak("layernorm") > peak("mlp") > peak("layernorm+mlp")


@pytest.mark.parametrize(("layers", "offload", "expected"), [
    (48, 0, (0, 48)), (48, 8, (8, 41)), (48, 47, (47, 2)), (4, 8, (4, 1)),
])
def test_offloaded_layers(layers: int, offload: int, expected: tuple[int, int]) -> None:
    assert offloaded_layers(layers, offload) == expected


def test_offload_saves_memory_and_reports_it() -> None:
    base = estimate_memory(XL, _layout(impl="te", mbs=8), cluster(1))
    off = estimate_memory(XL, _layout(impl="te", mbs=8, offload_layers=16), cluster(1))
    per_layer = (base.peak.activations_bytes - off.peak.activations_bytes) / 15
    assert off.peak_bytes < base.peak_bytes and per_layer > 0
    assert off.peak.saved_bytes == pytest.approx(15 * per_layer)
    assert base.peak.saved_bytes == 0


def test_uneven_split_moves_memory_off_the_first_stage() -> None:
    c = cluster(2, gpu="h200")
    even = estimate_memory(LLAMA13, _layout(2, pp=2, gbs=32, impl="sdpa"), c)
    uneven = estimate_memory(LLAMA13, _layout(2, pp=2, gbs=32, impl="sdpa",
                                              first_stage_layers=19), c)
    assert uneven.stages[0].total_bytes < even.stages[0].total_bytes
    assert uneven.stages[1].total_bytes > even.stages[1].total_bytes
    assert uneven.peak_bytes < even.peak_bytes  # the first stage holds two micro-batches


# -- cost ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "calls"), [
    ({"recompute": "full"}, 30), ({"recompute": "full", "recompute_num_layers": 5}, 6),
    ({"recompute": "full", "recompute_method": "block", "recompute_num_layers": 4}, 4),
    ({"recompute": "selective"}, 30),
    ({"recompute": "selective", "recompute_modules": "core_attn+layernorm+mlp"}, 120),
    ({}, 0),
])
def test_checkpoint_calls(fields: dict[str, Any], calls: int) -> None:
    assert checkpoint_calls(_layout(**fields), 30) == calls


def test_selective_modules_cost_what_they_rerun() -> None:
    def step(**fields: Any) -> float:
        s = _layout(impl="sdpa", mbs=2, gbs=16, **fields)
        return estimate_cost(GPT36, s, cluster(1)).step_time_s
    none = step()
    layernorm = step(recompute="selective", recompute_modules="layernorm")
    mlp = step(recompute="selective", recompute_modules="mlp")
    full = step(recompute="full")
    # The norms rerun only element-wise kernels; the MLP reruns 2/3 of the GEMMs of a GPT
    # layer with a 4h MLP; full recompute all of them.
    assert none < layernorm < mlp < full
    assert (layernorm - none) / none < 0.02


def test_offload_exposes_what_the_host_link_cannot_hide() -> None:
    c = cluster(1)
    small = estimate_cost(XL, _layout(impl="te", mbs=8, offload_layers=16), c)
    assert small.offload_s > 0  # h 1600: a layer's bytes outlast its compute on PCIe
    none = estimate_cost(XL, _layout(impl="te", mbs=8), c)
    assert none.offload_s == 0
    assert small.step_time_s == pytest.approx(none.step_time_s + small.offload_s, rel=1e-6)


def test_an_uneven_split_paces_the_pipeline_by_its_slowest_stage() -> None:
    c = cluster(2, gpu="h200")
    s = _layout(2, pp=2, gbs=32, impl="sdpa", mbs=1, recompute="full")
    even = estimate_cost(LLAMA13, s, c).step_time_s
    fewer_last = estimate_cost(LLAMA13, _layout(2, pp=2, gbs=32, impl="sdpa", mbs=1,
                                                recompute="full", last_stage_layers=19),
                               c).step_time_s
    more_last = estimate_cost(LLAMA13, _layout(2, pp=2, gbs=32, impl="sdpa", mbs=1,
                                               recompute="full", first_stage_layers=18),
                              c).step_time_s
    # The stage with the most work sets the pace: 20 layers + the logits (a 32k vocabulary,
    # less than a layer) even, 21 layers on the first stage, 22 + the logits on the last.
    assert even < fewer_last < more_last


# -- the gate's error band ---------------------------------------------------------------------


def _measured_band() -> dict[str, float]:
    worst: dict[str, float] = {}
    for t in json.loads(DATA_PATH.read_text())["trials"]:
        if t["status"] != "OK" or not t.get("device_used_bytes"):
            continue
        model, s, c = trial_inputs(t)
        if s.expandable_segments:  # their band is gate.EXPANDABLE_ERROR_BAND (test_allocator)
            continue
        under = 1 - estimate_memory(model, s, c).peak_bytes / t["device_used_bytes"]
        worst[t["gpu"]] = max(worst.get(t["gpu"], 0.0), under)
    return worst


def test_error_band_is_the_measured_worst_under_prediction() -> None:
    measured = _measured_band()
    assert set(measured) == set(MEMORY_ERROR_BAND)
    for gpu, band in MEMORY_ERROR_BAND.items():
        assert band == pytest.approx(measured[gpu], abs=0.002)
    assert max(MEMORY_ERROR_BAND.values()) == DEFAULT_ERROR_BAND


@pytest.mark.parametrize(("into_band", "risky"), [(-0.05, False), (-0.01, False), (0.01, True),
                                                  (0.03, True)])
def test_a_prediction_inside_the_band_is_a_risk(into_band: float, risky: bool) -> None:
    s = _layout(impl="sdpa", mbs=2, gbs=16)
    c = cluster(1)
    peak = estimate_memory(GPT36, s, c).peak_bytes
    # A GPU whose capacity puts gpt-3.6b mbs 2 `into_band` past the edge of h100's band.
    share = 1 - MEMORY_ERROR_BAND["h100-80gb"] + into_band
    scaled = ClusterSpec(num_gpus=1, gpus_per_node=1,
                         gpu=replace(c.gpu, memory_bytes=int(peak / share)))
    decision = MemoryGate(GPT36, scaled).decide(s)
    assert decision.launch and decision.risky == risky
    assert "error band" in decision.reason and ("risk" in decision.reason) == risky


def test_measured_peaks_widen_the_band() -> None:
    gate = MemoryGate(GPT36, cluster(1))
    s = _layout(impl="sdpa", mbs=2, gbs=16)
    gate.record_peak(100.0, 99.0)
    assert gate.error_band(s) == MEMORY_ERROR_BAND["h100-80gb"]
    over = MEMORY_ERROR_BAND["h100-80gb"] + 0.03  # a miss wider than the measured band
    gate.record_peak(100.0, 100.0 * (1 + over))
    assert gate.error_band(s) == pytest.approx(over)


# -- Alpa's seeds carried through memory ----------------------------------------------------------


def test_the_seeds_spend_a_memory_saving_where_it_buys_a_faster_layout() -> None:
    c = cluster(2, gpu="h200")
    model = LLAMA13
    space = space_from_mapping({"tp": [1, 2], "pp": [1, 2], "mbs": [1, 2],
                                "first_stage_layers": [0, 19], "impl": ["sdpa"],
                                "recompute": ["none", "selective", "full"],
                                "recompute_method": ["block"], "recompute_num_layers": [4],
                                "recompute_modules": ["layernorm+mlp"],
                                "distributed_optimizer": [False, True]}, "test")
    valid = enumerate_space(space, model, c).valid
    gate = MemoryGate(model, c)
    fits = lambda s: gate.decide(s).launch  # noqa: E731
    plain = alpa_seeds(valid, fits, "sdpa")
    carried = alpa_seeds(valid, fits, "sdpa", speed=predicted_speed(model, c),
                         risky=lambda s: gate.decide(s).risky)
    assert carried and all(fits(s) for s in carried)
    speed = predicted_speed(model, c)
    safe = [s for s in carried if not gate.decide(s).risky]
    # Per (tp, pp, dp) group the safe seed is the fastest layout predicted to fit with a
    # margin, a memory saving or not: at least as fast as Alpa's plain seed when that is safe.
    by_group = {(s.tp, s.pp, s.dp): s for s in plain if not gate.decide(s).risky}
    for s in safe:
        if (s.tp, s.pp, s.dp) in by_group:
            assert speed(s) >= speed(by_group[(s.tp, s.pp, s.dp)])
    # Risky seeds never come before safe ones, and a safe one exists here.
    flags = [gate.decide(s).risky for s in carried]
    assert flags == sorted(flags) and not flags[0]


def test_the_max_dp_group_gets_a_seed_made_to_fit() -> None:
    # gpt-3.6b on 8 H100s at gbs 64: dp 8 with mbs 8 needs a saving; the seed makes it fit.
    c = cluster(8)
    model = GPT36.with_overrides(global_batch_size=64)
    space = space_from_mapping({"tp": [1, 2], "pp": [1, 2], "mbs": [1, 2, 4, 8],
                                "impl": ["sdpa"], "recompute": ["none", "selective", "full"],
                                "recompute_modules": ["layernorm+mlp"],
                                "distributed_optimizer": [True]}, "test")
    valid = enumerate_space(space, model, c).valid
    gate = MemoryGate(model, c)
    seeds = alpa_seeds(valid, lambda s: gate.decide(s).launch, "sdpa",
                       speed=predicted_speed(model, c))
    assert seeds[0].dp == 8 and gate.decide(seeds[0]).launch
