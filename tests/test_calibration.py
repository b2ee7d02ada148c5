"""Calibration: the optimizer and recovering known constants."""

from __future__ import annotations

import pytest

from autotune.errors import ConfigError
from autotune.layouts.layout import Layout
from autotune.predict.calibration import fit_cost_params, fit_memory_params
from autotune.predict.cost import CostParams, estimate_cost
from autotune.predict.memory import GIB, MemoryParams, estimate_memory
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.presets import load_model

C1 = ClusterSpec(num_gpus=1, gpus_per_node=1, gpu=gpu_spec("h100-80gb"))
C2 = ClusterSpec(num_gpus=2, gpus_per_node=2, gpu=gpu_spec("h100-80gb"))


def test_fit_cost_params_recovers_constants() -> None:
    truth = CostParams(gemm_efficiency_max=0.6, elementwise_bytes_local=20.0)
    model = load_model("gpt2-xl")
    samples = []
    for mbs in (1, 2, 4):
        for impl in ("local", "sdpa"):
            s = Layout(mbs=mbs, gbs=64, impl=impl)
            samples.append((model, s, C1, estimate_cost(model, s, C1, truth).step_time_s))
    fitted = fit_cost_params(samples, names=("gemm_efficiency_max", "elementwise_bytes_local"))
    assert fitted.gemm_efficiency_max == pytest.approx(0.6, rel=0.02)
    assert fitted.elementwise_bytes_local == pytest.approx(20.0, rel=0.03)
    assert fitted.flash_attention_efficiency == CostParams().flash_attention_efficiency


def test_fit_memory_params_recovers_overheads() -> None:
    truth = MemoryParams(cuda_context_bytes=0.8 * GIB, nccl_bytes_per_group=0.4 * GIB,
                         fragmentation=0.1)
    samples = []
    for model_name in ("gpt2", "gpt2-medium", "gpt2-large"):
        model = load_model(model_name)
        for s, c in ((Layout(mbs=2, gbs=8), C1), (Layout(dp=2, mbs=4, gbs=8), C2)):
            samples.append((model, s, c, estimate_memory(model, s, c, truth).peak_bytes))
    fitted = fit_memory_params(samples)
    for name in ("cuda_context_bytes", "nccl_bytes_per_group", "fragmentation"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.05), name


def test_fit_rejects_bad_samples() -> None:
    model = load_model("gpt2")
    with pytest.raises(ConfigError):
        fit_cost_params([])
    with pytest.raises(ConfigError, match="positive"):
        fit_cost_params([(model, Layout(mbs=1, gbs=8), C1, 0.0)])
    with pytest.raises(ConfigError, match="unknown"):
        fit_cost_params([(model, Layout(mbs=1, gbs=8), C1, 1.0)], names=("nope",))


# Leave-one-family-out over tests/data/measured_trials.json (tools/fit_constants.py;
# results/benchmarks/2026-11-27-cpu-constants-cv.md), measured 2026-11-27 with the 151 OK
# trials: (held-out step-time median, memory median, memory worst) per family, each bound about
# one point above today's figure. wide-8k (hidden 8192) is the model's known miss: 16.3%, over
# the 10% target (20.1% before llama3-8b's trials joined the data); llama-3b 6.4% and
# llama-1b 5.7% are over 5%.
HELD_OUT_BOUNDS: dict[str, tuple[float, float, float]] = {
    "gpt-3.6b/h100-80gb": (0.04, 0.045, 0.05),        # 3.2%, 3.5%, 4.3%
    "gpt2-large/h100-80gb": (0.02, 0.025, 0.055),     # 0.8%, 1.7%, 4.8%
    "gpt2-large/h200": (0.05, 0.04, 0.058),           # 3.9%, 2.8%, 4.8%
    "gpt2-xl/h100-80gb": (0.035, 0.025, 0.07),        # 2.3%, 1.5%, 6.4%
    "gpt2-xl/h200": (0.06, 0.03, 0.059),              # 5.1%, 1.9%, 4.9%
    "llama-1b/h100-80gb": (0.067, 0.04, 0.04),        # 5.7%, 3.2%, 3.2%
    "llama-3b/h100-80gb": (0.074, 0.03, 0.05),        # 6.4%, 2.1%, 4.0%
    "llama3-8b/h200": (0.028, 0.02, 0.029),           # 1.8%, 1.1%, 1.9%
    "wide-8k/h100-80gb": (0.173, 0.02, 0.025),        # 16.3%, 1.2%, 1.6%
}


def test_held_out_error_per_family_does_not_regress() -> None:
    from pathlib import Path

    from autotune.predict.calibration import cross_validate, load_trials

    data = Path(__file__).parent / "data" / "measured_trials.json"
    cv = cross_validate(load_trials(data))
    assert {f.family for f in cv.families} == set(HELD_OUT_BOUNDS)
    for family in cv.families:
        step, memory, memory_worst = HELD_OUT_BOUNDS[family.family]
        assert family.step_median <= step, family
        assert family.memory_median <= memory, family
        assert family.memory_worst <= memory_worst, family
