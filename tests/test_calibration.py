"""Calibration: the optimizer and recovering known constants."""

from __future__ import annotations

import json

import pytest

from autotune.errors import ConfigError
from autotune.layouts.layout import Layout
from autotune.predict.calibration import (
    CV_LEFT_OUT,
    CrossValidation,
    fit_cost_params,
    fit_memory_params,
    load_trials,
)
from autotune.predict.cost import CostParams, estimate_cost
from autotune.predict.memory import GIB, MemoryParams, estimate_memory
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.presets import load_model
from tests.measured import DATA_PATH, sourced_trials

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
# efficiency). No family's held-out memory median is over its 5% now (llama-1b on H200's was
# 5.4% before the term below).
# The memory figures moved on 2026-11-27 when the query, key and value a RoPE layer keeps joined
# the activations (autotune.specs.activations.qkv_extra; results/benchmarks/2026-11-27-cpu-
# activation-slope.md; before -> after, median / worst): the RoPE families' allocated peaks moved
# toward the measured ones (llama3-8b's median 3.4% low -> 0.4%, llama2-13b's 1.2% -> +0.3%),
# and the overheads fitted to device memory moved with them (fragmentation
# 4.5% -> 3.6%, CUDA context 2.9 -> 3.1 GiB): better for llama-1b (H100 2.3/2.3 -> 2.2/2.2, H200
# 5.4/10.5 -> 4.3/8.0), gpt-3.6b (3.9/4.7 -> 3.4/4.1), llama-3b on H100's median (3.0 -> 2.7)
# and wide-8k on H200's worst (3.8 -> 2.8); worse where the overheads, no longer offset by
# missing activations, predict more than the allocator reserves (llama2-13b 1.7/3.9 -> 3.1/3.9,
# llama3-8b 1.0/1.9 -> 1.2/2.5, wide-8k on H100 1.2/2.4 -> 1.7/3.1) and for GPT families held
# out of a fit whose fragmentation fell (gpt2-large on H200 3.6/6.7 -> 3.1/9.0, gpt2-xl on H200
# 1.8/4.7 -> 2.5/5.2, gpt2-xl on H100 2.1/7.4 -> 2.2/7.5, gpt2-large on H100 0.9/3.6 ->
# 1.1/3.6). Step time did not move.
# Step time moved on 2026-11-28 when attention dropout got its own term and fused attention its
# no-dropout rate (transformer_impl.Constants: attention_dropout_ops_per_score 0 -> 11,
# flash_attention_efficiency 0.45 -> 0.727; results/benchmarks/2026-11-28-cpu-gemm-rates.md):
# every family's held-out median now under issue 28's 10% (llama-1b on H200 15.2% -> 3.2%,
# wide-8k 10.6% / 9.7% -> 7.4% / 6.3%, llama-3b on H100 6.4% -> 2.9%, llama2-13b 4.9% -> 2.5%);
# the GPT families' and llama3-8b's bounds loosened with it, median before -> after: gpt-3.6b
# 4.9% -> 8.3%, gpt2-large on H100 1.3% -> 4.3%, on H200 4.4% -> 5.9%, gpt2-xl on H100 2.2% ->
# 5.2%, on H200 5.6% -> 6.7%, llama3-8b 1.8% -> 3.0% (the shared GEMM efficiency refits from
# 0.733 to 0.665). Memory did not move.
# Then (same day) the element-wise traffic was counted per architecture feature
# (autotune.specs.elementwise) and the shipped defaults refitted to all trials
# (results/benchmarks/2026-11-28-cpu-constants-refit-s15.md): gpt2-xl on H100 5.2% -> 4.2%
# (tightened), llama-3b on H200 4.5% -> 4.8% (under its bound), the rest within 0.2 points.
HELD_OUT_BOUNDS: dict[str, tuple[float, float, float]] = {
    "gpt-3.6b/h100-80gb": (0.093, 0.044, 0.052),      # 8.3%, 3.4%, 4.2%
    "gpt2-large/h100-80gb": (0.053, 0.022, 0.047),    # 4.3%, 1.2%, 3.8%
    "gpt2-large/h200": (0.069, 0.043, 0.095),          # 5.9%, 3.3%, 8.5%
    "gpt2-xl/h100-80gb": (0.052, 0.032, 0.086),       # 4.2%, 2.2%, 7.4%
    # gpt2-xl/h200's step median 8.6% (6.6% before) since session 18's six trials on one H200
    # joined, out of sample: its host ran the host-bound FP8 layouts (mbs 8, mbs 16 delayed)
    # 12-28% faster than the FP8 host floors fitted to the other days
    # (results/benchmarks/2026-11-28-cpu-fp8-h200-misses-s18.md).
    "gpt2-xl/h200": (0.096, 0.032, 0.061),            # 8.6%, 1.8%, 4.8%
    # llama-1b/h100: 7.0% / 2.3% / 7.7% since session 13's attention-dropout pair joined
    # (s13-dropout/0, /1: one shape predicted 1.864 s both ways, measured 1.682 and 2.042 s; the
    # dropout run's device memory 3.9 GiB above the other's at the same allocated peak);
    # 4.3%, 2.3%, 2.3% over the three trials before (2026-11-28-cpu-attention-dropout.md).
    "llama-1b/h100-80gb": (0.066, 0.032, 0.087),       # 5.6%, 2.3%, 7.7%
    # llama-1b/h200: 4.5% held out (3.7% before) since session 25's two trials at seq 65536
    # joined (s25-xseg-l1b/N, block/4 and /6 under expandable segments: predicted 4.7% and 5.9%
    # slow by the shipped constants; 2026-11-29-cpu-measured-trials-s26.md).
    "llama-1b/h200": (0.055, 0.053, 0.091),           # 4.5%, 4.5%, 7.6%
    # llama-3b/h100's memory worst: 10.0% since the FP8 trials of 2026-11-25 joined the data (10.4%
    # since qkv_extra)
    # (s8-fp8-l3b/mbs2-pao-*: the allocator's reserve with the precision-aware optimizer, the
    # miss results/benchmarks/2026-11-25-h100-fp8.md reported); 3.6% before. Its step median
    # 7.0% since FP8's casts are priced by recipe (2026-11-27-cpu-fp8-cost.md; 6.7% before).
    "llama-3b/h100-80gb": (0.039, 0.037, 0.115),      # 2.9%, 2.7%, 10.4%
    # llama-3b/h200's step median 3.6% since FP8's sequence-parallel host term prices its two
    # tp 2 + sp tensorwise/blockwise trials (6.4% before; 4.5% without those trials); the bound
    # stays: that term is in sample in this fold, no other family having such a trial
    # (results/benchmarks/2026-11-28-cpu-fp8-sp-host.md).
    # Its memory worst 6.2% since session 16's one-GPU search joined (s16-l3b-fp8follow/31: fp8pg
    # with the distributed optimizer on one GPU, 6.8% under the device memory with the shipped
    # constants; 4.8% before).
    # Its step median 2.9% with the swept FP8 speed-up and the cp host sum (2.8% before them);
    # 3.9% since session 17's eight trials joined, the first measured with RoPE fused as
    # Megatron-LM runs it (s17-l3b-fused/N: the model, fitted to unfused trials, predicts them
    # 2.4% fast to 7.9% slow; 2026-11-28-h200-rope-fusion-gap-s17.md).
    # Its memory worst 10.7% once session 18's 17 trials joined (s18-l3b-grid-levers/1: do + pao
    # with FP8 delayed at mbs 2, 8 GiB of allocator reserve), 9.2% since FP8's kept attention
    # output is counted (2026-11-28-cpu-fp8-h200-misses-s18.md).
    # Its step median 5.3% once session 20's 22 trials joined (s20-l3b*, s20-cutgrid-llama: the
    # shipped constants predict them 1-20% slow, median 5%, as sessions 18-19 saw on these hosts;
    # a search's own refit predicted them -9..+2%; 2026-11-28-cpu-s20-trials.md).
    "llama-3b/h200": (0.058, 0.025, 0.102),           # 5.3%, 1.5%, 8.9%
    # llama2-13b, llama3-8b: 2.5% / 3.2% and 1.0% / 2.2% since an untied model's embedding
    # group holds no NCCL communicator (2026-11-28-cpu-planning-accuracy.md; 3.1% / 3.9% and
    # 1.2% / 2.5% before).
    # llama2-13b: 3.5% held out with sessions 25 and 26's trials in the other families' fit
    # (3.4% before; its own 13 trials unchanged).
    "llama2-13b/h200": (0.045, 0.035, 0.042),         # 3.5%, 3.2%, 3.9%
    # llama3-8b: 4.0% / 1.3% / 5.4% since session 16's 12 trials on 4 x H200 joined (TE, bf16 and
    # FP8, two with context parallelism; 2026-11-28-cpu-measured-s16-trials-s17.md): FP8 ran
    # 5-21% faster than the model's, cp 2 4-17% slower; memory worst s16-l8b4-search/9 (tp 2 + sp,
    # FP8 delayed with fp8pg: 6.1% under). 3.0% / 1.0% / 2.2% over the 8 sdpa trials on 2 x H200.
    # Its step median 3.2% (worst 16.2% -> 10.6%) since FP8's speed-up is the swept one on H100
    # and H200 and FP8's host floor adds to the cp ring's host time.
    "llama3-8b/h200": (0.042, 0.023, 0.064),          # 3.2%, 1.3%, 5.4%
    # qwen3-4b/h200: session 22's 14 trials, out of sample (kv_channels != hidden / heads, QK
    # norm under TE, bf16 and FP8 delayed; 2026-11-29-h200-qwen3-s22.md).
    "qwen3-4b/h200": (0.072, 0.024, 0.049),           # 6.2%, 1.3%, 3.9%
    "wide-8k/h100-80gb": (0.084, 0.027, 0.041),       # 7.4%, 1.7%, 3.1%
    # wide-8k/h200: 7.4% held out once session 18's trials moved the other families' fit (its
    # own trials did not change; 2026-11-28-cpu-fp8-h200-misses-s18.md).
    "wide-8k/h200": (0.084, 0.032, 0.039),            # 7.4%, 2.3%, 2.9%
}


# The shipped defaults, uncalibrated (what simulate predicts with: it never refits), median
# step-time error per family over its trials, about one point above the figure of
# results/benchmarks/2026-11-28-cpu-constants-refit-s15.md (the "shipped" column). Before the
# refit the defaults were fits to the GPT trials alone: llama3-8b 5.2%, llama2-13b 11.3%, wide-8k
# 18.3% / 16.9% (with today's attention terms under them: up to 21.3%).
SHIPPED_STEP_BOUNDS: dict[str, float] = {
    "gpt-3.6b/h100-80gb": 0.093,    # 8.3%
    "gpt2-large/h100-80gb": 0.053,  # 4.3%
    "gpt2-large/h200": 0.07,        # 6.0%
    "gpt2-xl/h100-80gb": 0.048,     # 3.8%
    "gpt2-xl/h200": 0.086,          # 7.6% (5.5% before session 18's six out-of-sample trials)
    "llama-1b/h100-80gb": 0.064,    # 5.4%
    "llama-1b/h200": 0.049,         # 3.9% with session 25's two trials at seq 65536 (3.1% before)
    "llama-3b/h100-80gb": 0.034,    # 2.4%
    "llama-3b/h200": 0.048,         # 4.3% with session 20's 22 trials (3.1% before them)
    "llama2-13b/h200": 0.033,       # 2.3%
    "llama3-8b/h200": 0.035,        # 2.5% (3.9% with session 16's trials and the FP8 curve)
    "qwen3-4b/h200": 0.075,         # 6.5% (session 22, out of sample)
    "wide-8k/h100-80gb": 0.083,     # 7.3%
    "wide-8k/h200": 0.068,          # 5.8%
}


@pytest.fixture(scope="module")
def cross_validation() -> CrossValidation:
    """Without the trials a fit leaves out (CV_LEFT_OUT, which says why), as
    tools/fit_constants.py fits."""
    from autotune.predict.calibration import cross_validate

    return cross_validate(load_trials(DATA_PATH, leave_out=CV_LEFT_OUT))


def test_left_out_trials_are_still_missed() -> None:
    import statistics

    trials = sourced_trials()
    for prefix, why in CV_LEFT_OUT.items():
        errors = [abs(estimate_cost(m, s, c).step_time_s / step - 1)
                  for src, (_, m, s, c, step, _) in trials if src.startswith(prefix)]
        assert errors, prefix
        assert statistics.median(errors) > 0.10, (prefix, why)


def test_shipped_defaults_per_family_do_not_regress(cross_validation: CrossValidation) -> None:
    assert {f.family for f in cross_validation.families} == set(SHIPPED_STEP_BOUNDS)
    for family in cross_validation.families:
        assert family.step_shipped <= min(0.10, SHIPPED_STEP_BOUNDS[family.family]), family


def test_held_out_error_per_family_does_not_regress(cross_validation: CrossValidation) -> None:
    cv = cross_validation
    assert {f.family for f in cv.families} == set(HELD_OUT_BOUNDS)
    for family in cv.families:
        # issue 28's target for every family: held-out step time <= 10%, memory <= 5% (medians)
        assert family.step_median <= 0.10 and family.memory_median <= 0.05, family
        step, memory, memory_worst = HELD_OUT_BOUNDS[family.family]
        assert family.step_median <= step, family
        assert family.memory_median <= memory, family
        assert family.memory_worst <= memory_worst, family


@pytest.mark.parametrize("with_left_out", [False, True])
def test_fit_constants_leaves_out_what_the_cross_validation_does(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        with_left_out: bool) -> None:
    """tools/fit_constants.py fits the trials the tests' cross-validation fits: CV_LEFT_OUT's
    out unless --with-left-out (the fit itself patched: its trials are what is asserted)."""
    from tools import fit_constants

    fitted: list[object] = []

    def cross_validate(trials: list[object], **_: object) -> CrossValidation:
        fitted.extend(trials)
        return CrossValidation(families=(), cost=CostParams(), memory=MemoryParams())

    monkeypatch.setattr(fit_constants, "cross_validate", cross_validate)
    assert fit_constants.main(["--json", *(["--with-left-out"] if with_left_out else [])]) == 0
    every = sourced_trials()
    missed = [t for src, t in every if src.startswith(tuple(CV_LEFT_OUT))]
    assert len(missed) >= len(CV_LEFT_OUT)
    assert fitted == [t for src, t in every
                      if with_left_out or not src.startswith(tuple(CV_LEFT_OUT))]
    assert json.loads(capsys.readouterr().out)["left_out"] == ({} if with_left_out
                                                                else CV_LEFT_OUT)
