"""The optimizer CPU offload lever (autotune/levers/optimizer_offload.py)."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from autotune.errors import ConfigError
from autotune.layouts.layout import Layout, check
from autotune.megatron.core_config import core_config
from autotune.megatron.megatron_args import megatron_lm_args, read_fields
from autotune.predict.cost import CostParams, estimate_cost
from autotune.predict.memory import estimate_memory, stage_params
from autotune.search.heuristics import MEMORY_OPTIONS
from autotune.search.space import enumerate_space, load_space
from autotune.specs.hardware import ClusterSpec
from autotune.specs.presets import load_model
from tests.conftest import given_of

MODEL = load_model("gpt2-xl")
ONE = ClusterSpec.make(1, gpu="h100-80gb")
PAO = Layout(dp=1, gbs=8, impl="te", distributed_optimizer=True,
             precision_aware_optimizer=True)


def _with(percent: int) -> Layout:
    return replace(PAO, optimizer_offload_percent=percent)


@pytest.mark.parametrize("percent", [50, 100])
def test_state_moves_to_the_host(percent: int) -> None:
    params = sum(stage_params(MODEL, PAO, 0))
    peak = estimate_memory(MODEL, _with(percent), ONE).peak
    f = percent / 100
    assert peak.optimizer_bytes == pytest.approx(12 * (1 - f) * params)
    assert peak.host_bytes == pytest.approx(18 * f * params)
    assert estimate_memory(MODEL, PAO, ONE).peak.host_bytes == 0


def test_host_memory_is_checked() -> None:
    layout = _with(100)
    need = estimate_memory(MODEL, layout, ONE).host_bytes_per_node
    small = replace(ONE, host_memory_bytes=need / 2)
    estimate = estimate_memory(MODEL, layout, small)
    assert not estimate.fits
    assert "host memory" in (estimate.explain() or "")
    assert estimate_memory(MODEL, layout, replace(ONE, host_memory_bytes=need * 2)).fits


def test_the_cpu_step_and_copies_cost_time() -> None:
    prm = CostParams()
    params = sum(stage_params(MODEL, PAO, 0))
    base = estimate_cost(MODEL, PAO, ONE).optimizer_s
    half = estimate_cost(MODEL, _with(50), ONE).optimizer_s
    full = estimate_cost(MODEL, _with(100), ONE).optimizer_s
    host_s = params * (8 / (ONE.gpu.pcie_bytes_per_s * prm.pcie_efficiency)
                       + 28 / prm.cpu_optimizer_bytes_per_s)
    assert full == pytest.approx(host_s)
    assert base < half < full


def test_its_constant_is_calibrated_with_the_rest() -> None:
    assert "cpu_optimizer_bytes_per_s" in {f.name for f in fields(CostParams)}


@pytest.mark.parametrize(("layout", "rule"), [
    (replace(_with(50), precision_aware_optimizer=False), "offload_pao"),
    (_with(101), "offload_percent"),
])
def test_megatron_refuses(layout: Layout, rule: str) -> None:
    assert rule in {v.rule for v in check(layout, MODEL, ONE)}


@pytest.mark.parametrize("percent", [0, 25, 50, 100])
def test_flags_round_trip(percent: int) -> None:
    args = megatron_lm_args(MODEL, _with(percent))
    assert ("--optimizer-cpu-offload" in args) == (percent > 0)
    assert read_fields(given_of(args))["optimizer_offload_percent"] == percent


def test_megatron_lm_default_fraction_is_all() -> None:
    args = [*megatron_lm_args(MODEL, PAO), "--optimizer-cpu-offload"]
    assert read_fields(given_of(args))["optimizer_offload_percent"] == 100


def test_fraction_between_percents_is_refused() -> None:
    args = [*megatron_lm_args(MODEL, PAO), "--optimizer-cpu-offload",
            "--optimizer-offload-fraction", "0.333"]
    with pytest.raises(ConfigError, match="whole percentage"):
        read_fields(given_of(args))


def test_worker_keys() -> None:
    optimizer = core_config(MODEL, _with(50)).optimizer
    assert (optimizer["optimizer_cpu_offload"], optimizer["optimizer_offload_fraction"]) == \
        (True, 0.5)
    assert core_config(MODEL, PAO).optimizer["optimizer_cpu_offload"] is False


def test_a_saving_the_seeds_may_spend() -> None:
    assert "optimizer_offload_percent" in MEMORY_OPTIONS


def test_space_offers_it_on_one_gpu() -> None:
    space = load_space("tools/spaces/optimizer-levers-1gpu.yaml")
    valid = enumerate_space(space, load_model("llama3-8b"), ONE).valid
    offloaded = {s.optimizer_offload_percent for s in valid if s.optimizer_offload_percent}
    assert offloaded == {50, 100}
    assert all(s.precision_aware_optimizer for s in valid if s.optimizer_offload_percent)
