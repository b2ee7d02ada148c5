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
# results/benchmarks/2026-11-27-cpu-constants-cv-s10.md), measured 2026-11-27 with the 212 OK
# trials (187 before session 12's llama2-13b and 2-GPU FP8 trials, 164 before the FP8 trials of
# 2026-11-25 and 2026-11-27): (held-out step-time median, memory median, memory worst) per
# family, each bound about one point above today's figure. Over the 10% target: llama-1b
# on H200 (15.1%, the
# attention term at seq 16384-32768) and wide-8k on H100 (hidden 8192: 10.7%; 11.8% before
# session 12's trials, 13.9% on H200, now 9.5%: the 13B model's GEMMs pin the shared GEMM
# efficiency); llama-1b on H200's memory (5.4% median, 10.5% worst, seq 16384) is over its 5%.
HELD_OUT_BOUNDS: dict[str, tuple[float, float, float]] = {
    "gpt-3.6b/h100-80gb": (0.054, 0.051, 0.059),      # 4.4%, 4.1%, 4.9%
    "gpt2-large/h100-80gb": (0.021, 0.022, 0.053),    # 1.1%, 0.9%, 3.9%
    "gpt2-large/h200": (0.06, 0.046, 0.077),          # 5.0%, 3.6%, 6.7%
    "gpt2-xl/h100-80gb": (0.036, 0.03, 0.083),        # 2.6%, 2.0%, 7.3%
    "gpt2-xl/h200": (0.072, 0.028, 0.057),            # 6.2%, 1.8%, 4.7%
    "llama-1b/h100-80gb": (0.062, 0.038, 0.038),      # 4.7%, 2.4%, 2.4%
    "llama-1b/h200": (0.164, 0.067, 0.117),           # 15.1%, 5.4%, 10.5%
    # llama-3b/h100's memory worst: 10.0% since the FP8 trials of 2026-11-25 joined the data
    # (s8-fp8-l3b/mbs2-pao-*: the allocator's reserve with the precision-aware optimizer, the
    # miss results/benchmarks/2026-11-25-h100-fp8.md reported); 3.6% before. Its step median
    # 7.0% since FP8's casts are priced by recipe (2026-11-27-cpu-fp8-cost.md; 6.7% before).
    "llama-3b/h100-80gb": (0.088, 0.042, 0.112),      # 7.8%, 3.0%, 10.2%
    "llama-3b/h200": (0.074, 0.027, 0.059),           # 6.4%, 1.7%, 4.9%
    "llama2-13b/h200": (0.062, 0.027, 0.049),         # 5.2%, 1.7%, 3.9%
    "llama3-8b/h200": (0.031, 0.02, 0.03),            # 2.1%, 1.0%, 2.0%
    "wide-8k/h100-80gb": (0.117, 0.022, 0.034),       # 10.7%, 1.2%, 2.4%
    "wide-8k/h200": (0.107, 0.024, 0.05),             # 9.5%, 1.4%, 3.8%
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
