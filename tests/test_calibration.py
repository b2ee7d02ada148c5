"""Calibration: the optimizer and recovering known constants."""

from __future__ import annotations

import pytest

from autotune.calibration import fit_cost_params, fit_memory_params, nelder_mead
from autotune.cost import CostParams, estimate_cost
from autotune.errors import ConfigError
from autotune.hardware import ClusterSpec, gpu_spec
from autotune.layout import Layout
from autotune.memory import GIB, MemoryParams, estimate_memory
from autotune.model import load_model

C1 = ClusterSpec(num_gpus=1, gpus_per_node=1, gpu=gpu_spec("h100-80gb"))
C2 = ClusterSpec(num_gpus=2, gpus_per_node=2, gpu=gpu_spec("h100-80gb"))


def test_nelder_mead_rosenbrock() -> None:
    def rosen(x: list[float]) -> float:
        return (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2

    x = nelder_mead(rosen, [-1.2, 1.0], step=0.5, max_iter=5000)
    assert x == pytest.approx([1.0, 1.0], abs=1e-3)
    assert nelder_mead(rosen, [-1.2, 1.0], step=0.5) == x  # deterministic


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
