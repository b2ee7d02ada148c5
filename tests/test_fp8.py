"""The FP8 lever (autotune/levers/fp8.py): rules, flags both ways, core-config keys, memory and
cost terms, and the warnings a user's command gets for FP8 flags autotune does not model."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path
from statistics import median
from typing import Any

import pytest

from autotune.dimensions import Impl, Recompute
from autotune.errors import ConfigError
from autotune.layouts.layout import Layout, check
from autotune.levers.fp8 import (
    CAST_BYTES_PER_ELEMENT,
    MEASURED_FIT,
    Constants,
    Fp8,
    Fp8Recipe,
    cast_elements,
    gemm_dims,
    gemm_speedup,
    recipes_on,
    sp_gathers,
)
from autotune.levers.transformer_impl import attention_bytes
from autotune.megatron.core_config import core_config
from autotune.megatron.identity import run_key
from autotune.megatron.megatron_args import flag_names, megatron_lm_args, read_fields
from autotune.megatron.megatron_command import read_megatron_command, unmodeled_warning
from autotune.predict.cost import CostParams, estimate_cost
from autotune.predict.memory import GIB, estimate_memory, stage_linear_params
from autotune.report.scripts import megatron_lm_script
from autotune.specs.activations import layer_activations
from autotune.specs.flops import gemm_size
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model
from tests.conftest import given_of
from tests.measured import sourced_trials

XL = load_model("gpt2-xl")
LLAMA = load_model("llama3-8b")
H100 = ClusterSpec.make(1, gpu="h100-80gb")
H100x8 = ClusterSpec.make(8, gpu="h100-80gb")
BF16 = Layout(mbs=16, gbs=64, impl="te")
FP8 = replace(BF16, fp8=Fp8.HYBRID)
DP8 = Layout(dp=8, mbs=4, gbs=64, impl="te", distributed_optimizer=True)
LLAMA_3B_4K = replace(load_model("tests/data/hf/llama-3.2-3b.json"), seq_length=4096)
PAO = dict(distributed_optimizer=True, precision_aware_optimizer=True)
XL8 = Layout(mbs=8, gbs=64, impl=Impl.TE)
"""Host-bound under FP8: measured GPU busy 35-41% (results/benchmarks/2026-11-25-h100-fp8.md)."""
L3B2 = Layout(mbs=2, gbs=8, impl=Impl.TE, distributed_optimizer=True,
              precision_aware_optimizer=True)
"""GPU-bound under FP8 (97% busy): FP8 12-21% faster, measured."""


def _cluster(gpu: str, gpus: int = 1) -> ClusterSpec:
    return ClusterSpec(num_gpus=gpus, gpus_per_node=gpus, gpu=gpu_spec(gpu))


# ---- rules ---------------------------------------------------------------------------------

TINY = ModelSpec(name="tiny", num_layers=4, hidden_size=200, num_attention_heads=4,
                 vocab_size=1000, seq_length=100, global_batch_size=8)
"""hidden 200 is no multiple of 16; 100 tokens per sequence no multiple of 8."""
TINY256 = replace(TINY, hidden_size=256, global_batch_size=32)
"""Every GEMM dimension a multiple of 16 at tp 1, 2 and 4."""
SEQ128 = replace(TINY256, seq_length=128, max_position_embeddings=128)


@pytest.mark.parametrize(("model", "gpu", "fields", "rule"), [
    (XL, "h100-80gb", dict(fp8="hybrid"), None),
    (XL, "h100-80gb", dict(fp8="e4m3", fp8_recipe="tensorwise"), None),
    (XL, "h100-80gb", dict(fp8="hybrid", fp8_recipe="blockwise"), None),
    (XL, "h200", dict(fp8="hybrid", fp8_recipe="tensorwise"), None),
    (XL, "b200", dict(fp8="hybrid", fp8_recipe="mxfp8"), None),
    (XL, "h100-80gb", dict(fp8="hybrid", fp8_recipe="mxfp8"), "fp8_gpu"),    # Blackwell only
    (XL, "a100-80gb", dict(fp8="hybrid"), "fp8_gpu"),                          # no FP8 cores
    (XL, "a100-40gb", dict(fp8="hybrid", fp8_recipe="tensorwise"), "fp8_gpu"),
    (XL, "h100-80gb", dict(fp8="hybrid", impl="sdpa"), "fp8_te"),
    (XL, "h100-80gb", dict(fp8="hybrid", impl="local"), "fp8_te"),
    (XL, "h100-80gb", dict(fp8_recipe="tensorwise"), "fp8_recipe_unused"),
    (XL, "h100-80gb", dict(fp8_param_gather=True, distributed_optimizer=True),
     "fp8_param_gather"),
    (XL, "h100-80gb", dict(fp8="hybrid", fp8_param_gather=True), "fp8_pg_do"),
    (XL, "h100-80gb", dict(fp8="hybrid", fp8_param_gather=True, distributed_optimizer=True),
     None),
    # hidden 200 with 25 heads: head dim 8, which fused attention runs (TINY's 50 is left to
    # impl local by the rule fused_head_dim, ahead of FP8's).
    (replace(TINY, num_attention_heads=25), "h100-80gb", dict(fp8="hybrid", mbs=2),
     "fp8_dims"),
    (TINY256, "h100-80gb", dict(fp8="hybrid", mbs=1), "fp8_dims"),            # 100 tokens
    (TINY256, "h100-80gb", dict(fp8="hybrid", mbs=2), None),                  # 200 tokens
    (TINY256, "h100-80gb", dict(fp8="hybrid", tp=2, dp=1, mbs=4), None),      # 128 per shard
    (replace(TINY256, ffn_hidden_size=1040), "h100-80gb", dict(fp8="hybrid", mbs=4), None),
    (replace(TINY256, ffn_hidden_size=1040), "h100-80gb", dict(fp8="hybrid", tp=2, dp=1,
                                                               mbs=4), "fp8_dims"),  # 520
    # Sequence parallelism all-gathers block-scaled inputs in whole 128-element blocks.
    (TINY256, "h100-80gb", dict(fp8="hybrid", tp=2, dp=1, mbs=4, sequence_parallel=True),
     None),
    (TINY256, "h100-80gb", dict(fp8="hybrid", fp8_recipe="blockwise", tp=2, dp=1, mbs=4,
                                sequence_parallel=True), "fp8_dims"),          # 200 tokens
    (SEQ128, "h100-80gb", dict(fp8="hybrid", fp8_recipe="blockwise", tp=2, dp=1, mbs=1,
                               sequence_parallel=True), "fp8_dims"),           # 64 tokens
    (SEQ128, "h100-80gb", dict(fp8="hybrid", fp8_recipe="blockwise", tp=2, dp=1, mbs=2,
                               sequence_parallel=True), None),                # 128 tokens
    (SEQ128, "b200", dict(fp8="hybrid", fp8_recipe="mxfp8", tp=2, dp=1, mbs=1,
                          sequence_parallel=True), None),                     # 64: 32-blocks
])
def test_rules(model: ModelSpec, gpu: str, fields: dict[str, Any], rule: str | None) -> None:
    s = replace(Layout(mbs=4, gbs=model.global_batch_size, impl="te"), **fields)
    broken = [v.rule for v in check(s, model, _cluster(gpu, s.world_size))]
    assert broken[:1] == ([rule] if rule else [])


@pytest.mark.parametrize(("fields", "rule"), [
    # TransformerConfig.__post_init__: delayed scaling cannot recompute layernorm or moe_act.
    (dict(recompute="selective", recompute_modules="layernorm"), "fp8_recompute"),
    (dict(recompute="selective", recompute_modules="moe_act"), "fp8_recompute"),
    (dict(recompute="selective", recompute_modules="moe_act", fp8_recipe="tensorwise"), None),
    (dict(recompute="full", recompute_num_layers=1), None),
    # arguments.py: FP8 parameters with the optimizer's CPU offload need delayed scaling.
    (dict(distributed_optimizer=True, precision_aware_optimizer=True, fp8_param_gather=True,
          optimizer_offload_percent=50, fp8_recipe="tensorwise"), "fp8_offload"),
    (dict(distributed_optimizer=True, precision_aware_optimizer=True, fp8_param_gather=True,
          optimizer_offload_percent=50), None),
])
def test_interactions(fields: dict[str, Any], rule: str | None) -> None:
    moe = load_model("mixtral-8x7b")
    s = Layout(dp=8, ep=8, mbs=1, gbs=moe.global_batch_size, impl="te", fp8=Fp8.HYBRID,
               **fields)
    broken = [v.rule for v in check(s, moe, H100x8)]
    assert (rule in broken) if rule else not [r for r in broken if r.startswith("fp8")]


@pytest.mark.parametrize(("gpu", "recipes"), [
    ("h100-80gb", ("delayed", "tensorwise", "blockwise")),
    ("h200", ("delayed", "tensorwise", "blockwise")),
    ("b200", ("delayed", "tensorwise", "blockwise", "mxfp8")),
    ("a100-80gb", ()),
])
def test_recipes_per_gpu_generation(gpu: str, recipes: tuple[str, ...]) -> None:
    assert recipes_on(gpu_spec(gpu)) == recipes


def test_an_unused_recipe_is_the_same_run() -> None:
    # Megatron reads the recipe only with fp8; neither the worker nor the export passes it.
    assert run_key(XL, replace(BF16, fp8_recipe=Fp8Recipe.TENSORWISE)) == run_key(XL, BF16)
    assert run_key(XL, replace(FP8, fp8_recipe=Fp8Recipe.TENSORWISE)) != run_key(XL, FP8)


# ---- flags both ways -----------------------------------------------------------------------


@pytest.mark.parametrize(("layout", "flags"), [
    (BF16, []),
    (FP8, ["--fp8-format", "hybrid", "--fp8-recipe", "delayed"]),
    (replace(FP8, fp8=Fp8.E4M3, fp8_recipe=Fp8Recipe.BLOCKWISE),
     ["--fp8-format", "e4m3", "--fp8-recipe", "blockwise"]),
    (replace(DP8, fp8=Fp8.HYBRID, fp8_recipe=Fp8Recipe.TENSORWISE, fp8_param_gather=True),
     ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-param-gather"]),
])
def test_flags_round_trip(layout: Layout, flags: list[str]) -> None:
    args = megatron_lm_args(XL, layout)
    written = [a for a in args if a.startswith("--fp8") or a in ("hybrid", "e4m3")
               or a in tuple(Fp8Recipe)]
    assert written == flags
    read = read_fields(given_of(args))
    assert {k: read[k] for k in ("fp8", "fp8_recipe", "fp8_param_gather")} == {
        "fp8": layout.fp8, "fp8_recipe": layout.fp8_recipe,
        "fp8_param_gather": layout.fp8_param_gather}


@pytest.mark.parametrize(("extra", "read"), [
    ([], ("off", "delayed", False)),
    (["--fp8-recipe", "tensorwise"], ("off", "delayed", False)),   # unused without fp8
    (["--fp8-format", "e4m3"], ("e4m3", "delayed", False)),         # Megatron-LM's default
    (["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8", "--fp8-param-gather"],
     ("hybrid", "mxfp8", True)),
])
def test_reading_a_users_flags(extra: list[str], read: tuple[str, str, bool]) -> None:
    fields = read_fields(given_of([*megatron_lm_args(XL, BF16), *extra]))
    assert (fields["fp8"], fields["fp8_recipe"], fields["fp8_param_gather"]) == read


@pytest.mark.parametrize(("extra", "message"), [
    (["--fp8-format", "hybrid", "--fp8-recipe", "custom"], "not one autotune models"),
    (["--fp8-format", "e5m2"], "not one autotune models"),
])
def test_unmodeled_values_are_refused(extra: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read_fields(given_of([*megatron_lm_args(XL, BF16), *extra]))


def test_the_flags_are_megatron_lms() -> None:
    """Every flag the row writes is one Megatron-LM core_v0.16.1 and 0.19 declare (their
    argparse, read by tools/megatron_names.py into tests/data/megatron_versions/)."""

    args = megatron_lm_args(XL, replace(DP8, fp8=Fp8.HYBRID, fp8_param_gather=True))
    for version in ("0.16.1", "0.19.2"):
        known = set(json.loads((Path(__file__).parent / "data" / "megatron_versions"
                                / f"{version}.json").read_text())["flags"])
        assert {f for f in flag_names(args) if "fp8" in f} <= known


# ---- worker --------------------------------------------------------------------------------


@pytest.mark.parametrize(("layout", "transformer", "ddp", "optimizer"), [
    (BF16, {"fp8": None, "fp8_recipe": "delayed", "fp8_param": False},
     {"fp8_param_gather": False}, {"fp8_recipe": None}),
    (replace(FP8, fp8_recipe=Fp8Recipe.TENSORWISE),
     {"fp8": "hybrid", "fp8_recipe": "tensorwise", "fp8_param": False},
     {"fp8_param_gather": False}, {"fp8_recipe": "tensorwise"}),
    (replace(DP8, fp8=Fp8.E4M3, fp8_param_gather=True),
     {"fp8": "e4m3", "fp8_recipe": "delayed", "fp8_param": True},
     {"fp8_param_gather": True}, {"fp8_recipe": "delayed"}),
])
def test_worker_keys(layout: Layout, transformer: dict[str, Any], ddp: dict[str, Any],
                     optimizer: dict[str, Any]) -> None:
    config = core_config(XL, layout)
    assert {k: config.transformer[k] for k in transformer} == transformer
    assert {k: config.ddp[k] for k in ddp} == ddp
    assert {k: config.optimizer[k] for k in optimizer} == optimizer
    assert config.model["layer_spec"] == "te"


# ---- memory --------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [XL, LLAMA, load_model("mixtral-8x7b")])
@pytest.mark.parametrize(("recipe", "per_element"), [
    ("delayed", 1.0), ("tensorwise", 1.0), ("blockwise", 1 + 4 / 128), ("mxfp8", 1 + 1 / 32)])
def test_gemm_inputs_are_saved_in_fp8(model: ModelSpec, recipe: str,
                                      per_element: float) -> None:
    """The four GEMM inputs of a layer (QKV, projection, fc1, fc2; the experts' with MoE) lose
    2 - per_element bytes per element; the fused attention's output, which the projection
    shared in bf16, stays at 2 B beside the projection's FP8 copy (AttentionBytes.
    saves_output); every other saved tensor keeps its bytes."""
    h, t = model.hidden_size, 2
    bf16 = layer_activations(model, t, attention_bytes(model, "te"))
    fp8 = layer_activations(model, t, attention_bytes(model, "te"), per_element)
    saved = 2 - per_element
    k = model.moe_topk if model.is_moe else 1
    f = model.expert_ffn_size if model.is_moe else model.ffn_size
    # Replicated: the QKV and fc1 inputs (and the experts' fc1 input, k of them per token).
    assert bf16.replicated - fp8.replicated == pytest.approx(saved * (2 * h + (k * h if
                                                                           model.is_moe else 0)))
    # Split: the projection input and the fc2 input(s).
    assert bf16.split - fp8.split == pytest.approx(saved * (h / t + k * f / t) - 2 * h / t)
    assert bf16.per_key == fp8.per_key and bf16.dropout_mask == fp8.dropout_mask
    # Selective recompute of core attention frees that bf16 output with the kernel's state.
    assert fp8.attn_recomputable - bf16.attn_recomputable == pytest.approx(2 * h / t)


@pytest.mark.parametrize(("impl", "per_element", "kept"), [
    ("te", 2.0, 0.0),     # bf16: the projection's saved input is the kernel's output
    ("te", 1.0, 2.0),     # FP8: TE's FusedAttnFunc keeps `out`, the projection its FP8 copy
    ("te", 1 + 4 / 128, 2.0),
    ("local", 1.0, 0.0),  # the unfused kernel saves its probabilities and V, not its output
])
def test_attention_output_kept_beside_a_quantized_projection_input(
        impl: str, per_element: float, kept: float) -> None:
    """Bytes per token of one layer beyond the GEMM inputs' own: the attention output a kernel
    that saves it (flash, cuDNN fused) keeps in bf16 when the projection saves a quantized
    copy (TE 2.11 backends.py FusedAttnFunc, module/linear.py saved_inputmat)."""
    h, t = LLAMA.hidden_size, 2
    bf16 = layer_activations(LLAMA, t, attention_bytes(LLAMA, impl))
    other = layer_activations(LLAMA, t, attention_bytes(LLAMA, impl), per_element)
    inputs = (2 - per_element) * (h / t + LLAMA.ffn_size / t)
    assert other.split - bf16.split == pytest.approx(kept * h / t - inputs)


@pytest.mark.parametrize(("layout", "weight_bytes"), [
    (BF16, 2.0),                                                     # bf16 parameter
    (FP8, 4.0),                                                      # + FP8 copy + transpose
    (replace(DP8, fp8=Fp8.HYBRID), 4.0),
    (replace(DP8, fp8=Fp8.HYBRID, fp8_param_gather=True), 2.0),      # FP8 parameter + transpose
])
def test_gemm_weights(layout: Layout, weight_bytes: float) -> None:
    cluster = H100 if layout.dp == 1 else H100x8
    linear = stage_linear_params(XL, layout, 0)
    base = estimate_memory(XL, replace(layout, fp8=Fp8.OFF, fp8_param_gather=False),
                           cluster).stages[0].weights_bytes
    weights = estimate_memory(XL, layout, cluster).stages[0].weights_bytes
    assert weights - base == pytest.approx((weight_bytes - 2) * linear)


def test_fp8_saves_activation_memory_at_a_large_micro_batch() -> None:
    bf16, fp8 = (estimate_memory(XL, s, H100).peak for s in (BF16, FP8))
    assert fp8.activations_bytes < bf16.activations_bytes
    # gpt2-xl, mbs 16: 3.1 GiB less allocated measured on one H200 (s18-xl-grid/4 and /5 of
    # tests/data/measured_trials.json), 3.1 predicted; 4.3 predicted before the attention
    # output kept beside the projection's FP8 copy was counted.
    assert fp8.total_bytes < bf16.total_bytes - 2.5 * GIB


@pytest.mark.parametrize(("recipe", "extra"), [("delayed", 0.0), ("tensorwise", 2.0),
                                               ("blockwise", 2.0)])
def test_precision_aware_optimizer_keeps_an_fp32_master_without_delayed(
        recipe: str, extra: float) -> None:
    """OptimizerConfig.use_precision_aware_optimizer_no_fp8_or_ds_fp8: a non-delayed recipe
    makes megatron-core keep fp32 master weights (4 B) instead of FusedAdam's remainders."""
    pao = replace(DP8, precision_aware_optimizer=True, fp8=Fp8.HYBRID)
    base = estimate_memory(XL, pao, H100x8).stages[0].optimizer_bytes
    other = estimate_memory(XL, replace(pao, fp8_recipe=Fp8Recipe(recipe)), H100x8)
    shard = sum(stage_params_for(XL, pao)) / 8
    assert other.stages[0].optimizer_bytes - base == pytest.approx(extra * shard)


def stage_params_for(model: ModelSpec, s: Layout) -> tuple[float, float]:
    from autotune.predict.memory import stage_params

    return stage_params(model, s, 0)


# ---- cost ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("gpu", "x", "low", "high"), [
    ("h100-80gb", 64, 0.0, 1.0),        # small GEMMs: FP8 slower (tiles half full)
    ("h100-80gb", 427, 0.99, 1.01),     # the crossover
    ("h100-80gb", 1024, 1.24, 1.26),    # cuBLAS 12.9's "at least 1.25x for most other cases"
    ("h100-80gb", 1e6, 1.74, 1.76),     # cuBLAS 12.9's 1.75x for large GEMMs
    ("h200", 1024, 1.24, 1.26),         # the same peaks: the same crossover
    ("b200", 1e6, 1.74, 1.76),          # twice its bf16 peak too: the same constants
])
def test_gemm_speedup(gpu: str, x: float, low: float, high: float) -> None:
    assert low <= gemm_speedup(x, gpu_spec(gpu), CostParams()) <= high


def test_the_speedup_grows_with_the_gemm() -> None:
    p = CostParams()
    sizes = [16, 64, 256, 1024, 4096, 16384]
    gains = [gemm_speedup(x, gpu_spec("h100-80gb"), p) for x in sizes]
    assert gains == sorted(gains)


@pytest.mark.parametrize(("model", "layout", "faster"), [
    # x = 1,600: 1.37x GEMMs, but ~9 ms of GPU work a layer at mbs 16 against TE's FP8 host
    # floor (fp8_layer_host_s; measured at mbs 8: FP8 33-37% slower, GPU busy 35-41%).
    (XL, BF16, False),
    (LLAMA, Layout(mbs=1, gbs=8, impl="te", recompute="full", recompute_num_layers=1), True),
    (TINY, Layout(mbs=8, gbs=8, impl="te"), False),           # x = 200 < 427: no gain
])
def test_fp8_pays_only_for_large_gemms_and_a_busy_gpu(model: ModelSpec, layout: Layout,
                                                      faster: bool) -> None:
    model = replace(model, hidden_size=256) if model is TINY else model
    bf16 = estimate_cost(model, layout, H100).step_time_s
    fp8 = estimate_cost(model, replace(layout, fp8=Fp8.HYBRID), H100).step_time_s
    assert (fp8 < bf16) == faster, (gemm_size(model, layout), bf16, fp8)


@pytest.mark.parametrize("model", [XL, LLAMA, load_model("mixtral-8x7b")])
@pytest.mark.parametrize("layout", [FP8, replace(FP8, tp=2, sequence_parallel=True)])
def test_every_gemm_input_and_output_gradient_is_cast_once(model: ModelSpec,
                                                           layout: Layout) -> None:
    """cast_elements splits the elements TE quantizes per token into those its norm kernel
    writes (the QKV input; a dense MLP's fc1 input) and the rest; together, each GEMM's input
    and output gradient once."""
    norm, plain = cast_elements(model, layout)
    sp = layout.tp if layout.sequence_parallel else 1
    k = model.moe_topk if model.is_moe else 1
    (_, h, qkv), (_, heads, _), (_, _, fc1), (_, f, _) = gemm_dims(model, layout)
    assert h == model.hidden_size
    assert norm == pytest.approx(h / sp * (1 if model.is_moe else 2))
    assert norm + plain == pytest.approx(h / sp + heads + k * (h / sp + f)
                                         + qkv + h / sp + k * (fc1 + h / sp))


TP2SP = Layout(tp=2, mbs=4, gbs=64, impl=Impl.TE, sequence_parallel=True)
H200 = ClusterSpec.make(1, gpu="h200")
H100x2 = ClusterSpec.make(2, gpu="h100-80gb")


def _with(layout: Layout, recipe: str) -> Layout:
    return replace(layout, fp8=Fp8.HYBRID, fp8_recipe=Fp8Recipe(recipe))


def _compute(layout: Layout, recipe: str, cluster: ClusterSpec = H100) -> float:
    """The step's GPU work (layers and logits): where the recipes' casts show."""
    return estimate_cost(XL, _with(layout, recipe), cluster).compute_s


@pytest.mark.parametrize(("lesser", "greater"), [
    # FP8 gains less at small GEMMs, and nothing below x = 427 (H100 and H200: the same peaks).
    pytest.param(lambda: gemm_speedup(512, gpu_spec("h100-80gb"), CostParams()),
                 lambda: gemm_speedup(4096, gpu_spec("h100-80gb"), CostParams()),
                 id="gemm-gain-grows-with-the-gemm"),
    pytest.param(lambda: gemm_speedup(256, gpu_spec("h200"), CostParams()), lambda: 1.0,
                 id="small-gemm-slower-in-fp8"),
    # The casts by recipe at one shape (CAST_BYTES_PER_ELEMENT): delayed's norm kernel writes
    # FP8 itself; block scaling quantizes the norm's bf16 output in a kernel of its own (and
    # writes scales); current scaling reads every other tensor once more for its amax.
    pytest.param(lambda: CAST_BYTES_PER_ELEMENT[Fp8Recipe.DELAYED].norm,
                 lambda: CAST_BYTES_PER_ELEMENT[Fp8Recipe.DELAYED].plain,
                 id="delayed-normalized-input-cheaper-than-plain"),
    pytest.param(lambda: _compute(BF16, "delayed"), lambda: _compute(BF16, "blockwise"),
                 id="blockwise-casts-cost-more-than-delayed"),
    pytest.param(lambda: _compute(BF16, "blockwise"), lambda: _compute(BF16, "tensorwise"),
                 id="tensorwise-casts-cost-more-than-blockwise"),
    # H200's faster HBM (4.8 against 3.35 TB/s) makes the same extra casts cheaper.
    pytest.param(lambda: _compute(BF16, "tensorwise", H200) - _compute(BF16, "delayed", H200),
                 lambda: _compute(BF16, "tensorwise") - _compute(BF16, "delayed"),
                 id="casts-cheaper-on-h200"),
    # TE's host time: block scaling computes its scales from the tensor, like current scaling
    # (fp8_current_layer_host_s); at gpt2-xl mbs 8 the layers wait on the host.
    pytest.param(lambda: estimate_cost(XL, _with(XL8, "delayed"), H100).launch_s,
                 lambda: estimate_cost(XL, _with(XL8, "blockwise"), H100).launch_s,
                 id="blockwise-host-floor-above-delayed"),
    pytest.param(lambda: estimate_cost(XL, XL8, H100).step_time_s,
                 lambda: estimate_cost(XL, _with(XL8, "delayed"), H100).step_time_s,
                 id="fp8-loses-where-host-bound"),
    pytest.param(lambda: estimate_cost(LLAMA_3B_4K, _with(L3B2, "delayed"), H100).step_time_s,
                 lambda: estimate_cost(LLAMA_3B_4K, L3B2, H100).step_time_s,
                 id="fp8-wins-where-gpu-bound"),
    # Current scaling agrees on each sequence-parallel tensor's amax across the TP group.
    pytest.param(lambda: estimate_cost(XL, _with(TP2SP, "delayed"), H100x2).tp_comm_s,
                 lambda: estimate_cost(XL, _with(TP2SP, "tensorwise"), H100x2).tp_comm_s,
                 id="tensorwise-sp-amax-all-reduces"),
])
def test_fp8_cost_behaviour(lesser: Any, greater: Any) -> None:
    assert lesser() < greater()


@pytest.mark.parametrize(("a", "b"), [
    # The GEMM crossover is the peaks' ratio's, which H100 and H200 share.
    pytest.param(lambda: gemm_speedup(427, gpu_spec("h100-80gb"), CostParams()),
                 lambda: gemm_speedup(427, gpu_spec("h200"), CostParams()),
                 id="same-gemm-rate-on-h100-and-h200"),
    # Without sequence parallelism no amax is reduced across ranks (with_amax_reduction).
    pytest.param(lambda: estimate_cost(XL, _with(replace(TP2SP, sequence_parallel=False),
                                                 "tensorwise"), H100x2).tp_comm_s,
                 lambda: estimate_cost(XL, _with(replace(TP2SP, sequence_parallel=False),
                                                 "delayed"), H100x2).tp_comm_s,
                 id="no-amax-all-reduce-without-sp"),
    # bf16 reads none of FP8's constants.
    pytest.param(lambda: estimate_cost(XL, XL8, H100),
                 lambda: estimate_cost(XL, XL8, H100, replace(CostParams(), **{
                     f.name: 2 * getattr(CostParams(), f.name) for f in fields(Constants)})),
                 id="bf16-unchanged-by-fp8-constants"),
])
def test_fp8_cost_invariants(a: Any, b: Any) -> None:
    assert a() == b()


def test_tensorwise_amax_all_reduces_are_latency() -> None:
    """Two a pass (the column-parallel inputs forward, the row-parallel output gradients
    backward), each one collective's latency: forward, backward, and again in a recomputed
    forward."""
    p = CostParams()
    for recompute, passes in ((Recompute.NONE, 2), (Recompute.FULL, 3)):
        s = replace(TP2SP, recompute=recompute)
        extra = (estimate_cost(XL, _with(s, "tensorwise"), H100x2).tp_comm_s
                 - estimate_cost(XL, _with(s, "delayed"), H100x2).tp_comm_s)
        assert extra == pytest.approx(
            2 * passes * XL.num_layers * s.num_microbatches * p.collective_latency_s)


# ---- current and block scaling's host time under sequence parallelism ------------------------

L3B_TP2SP = Layout(tp=2, mbs=2, gbs=8, impl=Impl.TE, sequence_parallel=True)
"""The layout of s12-fp8-l3b2/8-11 (Llama-3.2-3B seq 4096 on 2 x H200): host-bound under FP8."""
H200x2 = ClusterSpec.make(2, gpu="h200")
NO_SP_TERM = replace(CostParams(), fp8_sp_gather_host_s=0.0)


@pytest.mark.parametrize(("model", "fields", "gathers"), [
    # Forward the QKV and fc1 inputs, backward the same two again (for the weight gradients)
    # and the proj and fc2 output gradients (TE 2.11 layernorm_linear.py, linear.py, base.py).
    (XL, dict(tp=2, sequence_parallel=True), 6),
    (LLAMA, dict(tp=8, sequence_parallel=True), 6),
    # An MoE layer's experts get their tokens from megatron-core's dispatcher: attention only.
    (load_model("mixtral-8x7b"), dict(tp=2, sequence_parallel=True), 3),
    # Nothing gathered without sequence parallelism.
    (XL, dict(tp=2), 0),
    (XL, dict(), 0),
])
def test_sp_gathers(model: ModelSpec, fields: dict[str, Any], gathers: int) -> None:
    assert sp_gathers(model, Layout(impl=Impl.TE, **fields)) == gathers


@pytest.mark.parametrize(("recipe", "fields", "pays"), [
    ("tensorwise", {}, True),
    ("blockwise", {}, True),
    # Delayed scaling's scale is known before the cast: its gathers ask nothing more.
    ("delayed", {}, False),
    ("tensorwise", dict(sequence_parallel=False), False),
    ("blockwise", dict(sequence_parallel=False), False),
    ("off", {}, False),
])
def test_the_sp_host_term_by_recipe(recipe: str, fields: dict[str, Any], pays: bool) -> None:
    """Where it applies and the layers wait on the host, the term raises the floor by
    sp_gathers x fp8_sp_gather_host_s per layer and micro-batch."""
    s = replace(L3B_TP2SP, **fields)
    s = s if recipe == "off" else _with(s, recipe)
    added = (estimate_cost(LLAMA_3B_4K, s, H200x2).launch_s
             - estimate_cost(LLAMA_3B_4K, s, H200x2, NO_SP_TERM).launch_s)
    expected = (LLAMA_3B_4K.num_layers * s.num_microbatches * 6
                * CostParams().fp8_sp_gather_host_s) if pays else 0.0
    assert added == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(("model", "layout"), [
    # GPU-bound: the layers' GPU work per micro-batch outlasts the host's, which hides it.
    pytest.param(LLAMA_3B_4K, replace(L3B_TP2SP, mbs=8, gbs=64), id="llama-3b-mbs8"),
    pytest.param(LLAMA, Layout(tp=2, mbs=2, gbs=16, impl=Impl.TE, sequence_parallel=True),
                 id="llama3-8b-mbs2"),
])
@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise"])
def test_the_sp_host_term_hides_behind_gpu_work(model: ModelSpec, layout: Layout,
                                                recipe: str) -> None:
    s = _with(layout, recipe)
    assert estimate_cost(model, s, H200x2).step_time_s == \
        estimate_cost(model, s, H200x2, NO_SP_TERM).step_time_s


def test_the_sp_host_term_meets_its_trials() -> None:
    """The two trials it is fitted to (tp 2 + sp, tensorwise and blockwise, 2 x H200): 37-38%
    optimistic without it; within 2% with it; fitted to one recipe's trial, the other's within
    3% (results/benchmarks/2026-11-28-cpu-fp8-sp-host.md: -2.3%, +2.4%)."""
    from autotune.predict.calibration import fit_cost_params, load_trials

    # Its trials are the 2 x H200 pair; session 16's two llama3-8b tp 2 + sp tensorwise trials
    # on 4 x H200 are GPU-bound (the floor it raises hides behind their GPU work), so they do
    # not test it.
    trials = [t for t in load_trials(Path(__file__).parent / "data" / "measured_trials.json")
              if t[2].fp8 != Fp8.OFF and t[2].sequence_parallel and t[3].num_gpus == 2
              and t[2].fp8_recipe in (Fp8Recipe.TENSORWISE, Fp8Recipe.BLOCKWISE)]
    assert sorted(t[2].fp8_recipe for t in trials) == ["blockwise", "tensorwise"]
    for _, m, s, c, step, _ in trials:
        assert estimate_cost(m, s, c, NO_SP_TERM).step_time_s / step - 1 < -0.3
        assert abs(estimate_cost(m, s, c).step_time_s / step - 1) <= 0.02
        other = [(m2, s2, c2, t2) for _, m2, s2, c2, t2, _ in trials
                 if s2.fp8_recipe != s.fp8_recipe]
        fitted = fit_cost_params(other, names=("fp8_sp_gather_host_s",))
        assert abs(estimate_cost(m, s, c, fitted).step_time_s / step - 1) <= 0.03


def test_the_cast_constant_is_priced() -> None:
    p = CostParams()
    cheap = estimate_cost(XL, FP8, H100, replace(p, fp8_cast_scale=p.fp8_cast_scale / 2))
    dear = estimate_cost(XL, FP8, H100, replace(p, fp8_cast_scale=p.fp8_cast_scale * 2))
    assert cheap.step_time_s < estimate_cost(XL, FP8, H100, p).step_time_s < dear.step_time_s


def test_fp8_parameters_gather_in_one_byte() -> None:
    """The distributed optimizer all-gathers the GEMM weights in FP8 (1 B): less exposed time
    for the same layout with --fp8-param-gather."""
    s = replace(DP8, fp8=Fp8.HYBRID, overlap_param_gather=False)
    plain = estimate_cost(XL, s, H100x8).dp_comm_s
    gathered = estimate_cost(XL, replace(s, fp8_param_gather=True), H100x8).dp_comm_s
    assert gathered < plain


def test_bf16_predictions_do_not_move() -> None:
    """The lever off changes nothing: CostState and MemoryState start where they stood."""
    for s in (BF16, DP8, replace(DP8, tp=2, dp=4, sequence_parallel=True)):
        model = LLAMA
        a, b = estimate_cost(model, s, H100x8), estimate_cost(
            model, replace(s, fp8_recipe=Fp8Recipe.TENSORWISE), H100x8)
        assert a == b


# ---- delayed scaling's host time under full recompute (TE's checkpoint) -----------------------

L3B1 = Layout(mbs=1, gbs=8, impl=Impl.TE, recompute=Recompute.FULL, **PAO)
"""s26-rch-l3b/4's layout (Llama-3.2-3B seq 4096 on one H200, every layer recomputed): host-bound
under FP8 (GPU busy 35%, measured)."""
H200 = _cluster("h200")
NO_RC_TERM = replace(CostParams(), fp8_delayed_recompute_host_s=0.0)
_BENCH = Path(__file__).parent.parent / "results" / "benchmarks"


@pytest.mark.parametrize(("recipe", "fields", "recomputed"), [
    ("delayed", {}, 28),  # every layer, uniform
    ("delayed", dict(recompute_method="block", recompute_num_layers=7), 7),
    # Current and block scaling keep no amax history to stash and restore (TE 2.11: each of
    # quantization.py's recompute helpers returns at once unless the recipe is delayed).
    ("tensorwise", {}, 0),
    ("blockwise", {}, 0),
    ("delayed", dict(recompute=Recompute.NONE), 0),
    # Core attention's checkpoint: not priced (its FP8 trials are GPU-bound).
    ("delayed", dict(recompute=Recompute.SELECTIVE), 0),
    ("off", {}, 0),
])
def test_the_delayed_recompute_host_term(recipe: str, fields: dict[str, Any],
                                         recomputed: int) -> None:
    """Where the layers wait on the host it raises the floor by fp8_delayed_recompute_host_s per
    recomputed layer and micro-batch."""
    s = replace(L3B1, **fields)
    s = s if recipe == "off" else _with(s, recipe)
    added = (estimate_cost(LLAMA_3B_4K, s, H200).launch_s
             - estimate_cost(LLAMA_3B_4K, s, H200, NO_RC_TERM).launch_s)
    expected = recomputed * s.num_microbatches * CostParams().fp8_delayed_recompute_host_s
    assert added == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_the_delayed_recompute_host_term_hides_behind_gpu_work() -> None:
    """Llama-3.2-3B at mbs 8 with every layer recomputed (s17-l3b-fused/11, s18-l3b-search/11,
    s20-l3b/11: 2.44-2.51 s measured) is GPU-bound: unchanged."""
    s = _with(replace(L3B1, mbs=8, gbs=16, distributed_optimizer=False,
                      precision_aware_optimizer=False), "delayed")
    assert estimate_cost(LLAMA_3B_4K, s, H200).step_time_s == \
        estimate_cost(LLAMA_3B_4K, s, H200, NO_RC_TERM).step_time_s


def _delayed_full_trials() -> dict[str, tuple[ModelSpec, Layout, ClusterSpec, float]]:
    """The host-bound FP8 delayed trials with every layer recomputed, by source: sessions 25
    and 26 on one H200 each (their trial files, until they join tests/data/measured_trials.json;
    every older FP8 trial with recompute is GPU-bound)."""

    from tests.measured import trial_inputs

    rows: list[dict[str, Any]] = []
    for name in ("2026-11-29-h200-s25-trials.json", "2026-11-29-h200-s26-grid-trials.json"):
        data = json.loads((_BENCH / name).read_text())
        rows += data["trials"] if isinstance(data, dict) else data
    return {t["source"]: (*trial_inputs(t), t["step_time_s"]) for t in rows
            if t["status"] == "OK" and t["strategy"]["fp8"] != "off"
            and t["strategy"]["fp8_recipe"] == "delayed" and t["strategy"]["recompute"] == "full"}


# The two misses, with the term: gpt2-xl mbs 8 ran 2.4 ms per layer and micro-batch faster than
# mbs 4 on the same machine (its threads' CPU time says the same, not explained); the 8B with FP8
# parameters and 1% of the optimizer offloaded, on session 25's host, still 15% fast
# (results/benchmarks/2026-11-29-cpu-fp8-recompute-host-s26.md).
_MISSES = {"s26-rch-xl/10": 0.169, "s25-l8b-offload/2": -0.150}


def test_the_delayed_recompute_host_term_meets_its_trials() -> None:
    """Without it every one is predicted 11-34% fast; with it four within 1.2%, the two misses
    at their listed errors."""
    trials = _delayed_full_trials()
    assert len(trials) == 6
    for source, (m, s, c, step) in trials.items():
        assert estimate_cost(m, s, c, NO_RC_TERM).step_time_s / step - 1 < -0.11, source
        err = estimate_cost(m, s, c).step_time_s / step - 1
        assert err == pytest.approx(_MISSES.get(source, 0.0), abs=0.015), source


def test_the_delayed_recompute_host_term_across_machines() -> None:
    """Fitted to one session's trials it predicts the other machine's better than the plain 1.5x
    relaunch, in the median (s26 -> s25: 10.6% against 25.7%; s25 -> s26: 11.6% against 22.5%,
    though its worst, gpt2-xl mbs 8, goes from -11.5% to +30.5%)."""
    from autotune.predict.calibration import fit_cost_params

    trials = _delayed_full_trials()
    for fit_on in ("s25", "s26"):
        fit = [v for k, v in trials.items() if k.startswith(fit_on)]
        held = [v for k, v in trials.items() if not k.startswith(fit_on)]
        p = fit_cost_params(fit, names=("fp8_delayed_recompute_host_s",))
        with_term = median(abs(estimate_cost(m, s, c, p).step_time_s / t - 1)
                           for m, s, c, t in held)
        without = median(abs(estimate_cost(m, s, c, NO_RC_TERM).step_time_s / t - 1)
                         for m, s, c, t in held)
        assert with_term < 0.12 < 0.2 < without


# ---- a user's command ----------------------------------------------------------------------


@pytest.mark.parametrize(("extra", "named"), [
    ([], []),
    (["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"], []),
    (["--fp8-format", "hybrid", "--fp8-margin", "1", "--fp8-amax-history-len", "1024"],
     ["--fp8-margin", "--fp8-amax-history-len"]),
    (["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16",
      "--num-layers-at-start-in-bf16", "2"],
     ["--first-last-layers-bf16", "--num-layers-at-start-in-bf16"]),
    (["--tp-comm-overlap", "--te-rng-tracker"], ["--tp-comm-overlap", "--te-rng-tracker"]),
    (["--attention-backend", "auto"], []),              # Megatron-LM's default
    (["--attention-backend", "flash"], ["--attention-backend"]),
])
def test_unmodeled_flags_are_named_in_one_line(tmp_path: Path, extra: list[str],
                                               named: list[str]) -> None:
    script = tmp_path / "run.sh"
    text = megatron_lm_script(XL, replace(BF16, impl="te"), title=["fp8"], nodes=1)
    script.write_text(text.replace("--bf16", " ".join(["--bf16", *extra]), 1))
    command = read_megatron_command(str(script))
    assert list(command.unmodeled) == named
    warning = unmodeled_warning(command)
    if not named:
        assert warning is None
        return
    assert warning is not None and "\n" not in warning
    assert all(flag in warning for flag in named)


def test_the_search_warns_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.cli import main

    script = tmp_path / "run.sh"
    text = megatron_lm_script(XL, FP8, title=["fp8"], nodes=1)
    script.write_text(text.replace("--bf16", "--bf16 --fp8-margin 0 --first-last-layers-bf16",
                                   1))
    assert main(["--from-megatron", str(script), "--backend", "simulate", "--results-dir",
                 str(tmp_path / "r"), "--trials", "2", "--gpu", "h100-80gb"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "does not model" in line]
    assert len(lines) == 1 and "--fp8-margin" in lines[0] and "--first-last-layers-bf16" in \
        lines[0]
    assert "fp8=hybrid" in err  # the user's FP8 layout is read, not dropped


# ---- the search space, --precision bf16, the report, calibration ---------------------------


def test_the_default_space_offers_fp8_on_hopper_only(capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.cli import main

    for gpu, offered in (("h100-80gb", "hybrid, off"), ("a100-80gb", "off")):
        assert main(["gpt2-xl", "--gpus", "1", "--gpu", gpu, "--dry-run"]) == 0
        out = capsys.readouterr().out
        line = next(x for x in out.splitlines() if x.strip().startswith("fp8 "))
        assert line.split(None, 1)[1].strip() == offered, (gpu, line)


@pytest.mark.parametrize(("args", "code", "said", "offered"), [
    (["--precision", "bf16"], 0, "default.yaml + fp8=off", "off"),
    (["--precision", "fp8"], 2, "give bf16 or any", None),
    (["--precision", "any"], 0, "default.yaml", "hybrid, off"),  # the space decides
    (["--precision", "bf16", "--fix", "fp8=hybrid"], 2, "cannot go with a pin of fp8", None),
])
def test_precision_bf16(capsys: pytest.CaptureFixture[str], args: list[str], code: int,
                        said: str, offered: str | None) -> None:
    from autotune.cli import main

    assert main(["gpt2-xl", "--gpus", "1", "--gpu", "h100-80gb", "--dry-run", *args]) == code
    captured = capsys.readouterr()
    assert said in captured.out + captured.err
    if code == 0:
        line = next(x for x in captured.out.splitlines() if x.strip().startswith("fp8 "))
        assert line.split(None, 1)[1].strip() == offered


def test_precision_bf16_refuses_a_users_fp8_command(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.cli import main

    script = tmp_path / "run.sh"
    script.write_text(megatron_lm_script(XL, FP8, title=["fp8"], nodes=1))
    assert main(["--from-megatron", str(script), "--backend", "simulate", "--gpu", "h100-80gb",
                 "--precision", "bf16", "--dry-run"]) == 2
    assert "trains in FP8" in capsys.readouterr().err


@pytest.mark.parametrize(("te", "kept"), [(True, ("off", "hybrid")), (False, ("off",))])
def test_without_transformer_engine_fp8_is_left_out(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str],
                                                    te: bool, kept: tuple[str, ...]) -> None:
    from autotune.commands import search
    from autotune.search.space import load_space

    monkeypatch.setattr(search, "te_available", lambda: te)
    space = search._runnable_precision(load_space(None), "worker")
    assert space.candidates["fp8"] == kept
    assert ("fp8 hybrid left out" in capsys.readouterr().err) is not te
    # Planning needs no Transformer Engine: the space stays as written.
    assert search._runnable_precision(load_space(None), "simulate").candidates["fp8"] == (
        "off", "hybrid")


def test_yaml_reads_a_bare_off_as_the_choice() -> None:
    from autotune.search.space import space_from_mapping

    # PyYAML (YAML 1.1) reads `fp8: [off, hybrid]` as [False, "hybrid"].
    space = space_from_mapping({"fp8": [False, "hybrid"]}, "test.yaml")
    assert space.candidates["fp8"] == (Fp8.OFF, Fp8.HYBRID)


def test_the_report_shows_mfu_against_both_peaks() -> None:
    from autotune.report.load import _fp8_mfu
    from autotune.report.markdown import FP8_MFU, TOP_COLUMNS, with_fp8_mfu

    rows: list[dict[str, Any]] = [{"fp8": Fp8.OFF, "tflops_per_gpu": 450.0, "mfu": 0.455},
                                  {"fp8": Fp8.HYBRID, "tflops_per_gpu": 600.0, "mfu": 0.607}]
    assert with_fp8_mfu(TOP_COLUMNS, rows) == list(TOP_COLUMNS)
    _fp8_mfu(rows, gpu_spec("h100-80gb"))
    assert "mfu_fp8" not in rows[0] and rows[1]["mfu_fp8"] == pytest.approx(600 / 1979)
    columns = with_fp8_mfu(TOP_COLUMNS, rows)
    at = [c.key for c in columns].index("mfu")
    assert columns[at + 1] == FP8_MFU  # beside MFU, which stays against the bf16 peak
    _fp8_mfu(rows[:1], gpu_spec("a100-80gb"))  # no FP8 peak: nothing to show


def test_measured_fp8_trials_fit_the_fp8_constants() -> None:
    from autotune.predict.calibration import fit_cost_params, lever_fit_fields

    assert lever_fit_fields([BF16]) == ()
    # llama3-8b at seq 8192 is GPU-bound: its FP8 step times see the GEMM efficiency.
    truth = replace(CostParams(), fp8_gemm_efficiency_max=0.6)
    layouts = [replace(BF16, mbs=mbs, gbs=16, fp8=fp8) for mbs in (1, 2, 4) for fp8 in
               (Fp8.OFF, Fp8.HYBRID)]
    names = lever_fit_fields(layouts)
    assert {"fp8_gemm_efficiency_max", "fp8_gemm_half_size", "fp8_cast_scale",
            "fp8_layer_host_s", "fp8_current_layer_host_s"} <= set(names)
    samples = [(LLAMA, s, H100, estimate_cost(LLAMA, s, H100, truth).step_time_s)
               for s in layouts]
    fitted = fit_cost_params(samples, names=("fp8_gemm_efficiency_max",))
    assert fitted.fp8_gemm_efficiency_max == pytest.approx(0.6, rel=0.05)
    # gpt2-xl at mbs 8 sits on TE's host floor: its FP8 step times fit the host constant.
    truth = replace(CostParams(), fp8_layer_host_s=0.012)
    layouts = [replace(BF16, mbs=mbs, fp8=Fp8.HYBRID) for mbs in (2, 4, 8)]
    samples = [(XL, s, H100, estimate_cost(XL, s, H100, truth).step_time_s) for s in layouts]
    fitted = fit_cost_params(samples, names=("fp8_layer_host_s",))
    assert fitted.fp8_layer_host_s == pytest.approx(0.012, rel=0.05)




@pytest.mark.parametrize(("model", "fields", "measured"), [
    # results/benchmarks/2026-11-25-h100-fp8.md (one H100, TE 2.11): tokens/s measured. The
    # host-bound FP8 trials were predicted 15-108% optimistic before the host floor.
    (XL, dict(mbs=8, gbs=64), {"off": 26731, "delayed": 18004, "tensorwise": 16904,
                               "blockwise": 17034}),
    (LLAMA_3B_4K, dict(mbs=1, gbs=8), {"off": 19380, "delayed": 18427, "tensorwise": 14831,
                                       "blockwise": 15813}),
    (LLAMA_3B_4K, dict(mbs=2, gbs=8, **PAO), {"off": 20491, "delayed": 24743,
                                              "tensorwise": 23037}),
])
def test_measured_fp8_trials_rank_against_bf16_as_measured(model: ModelSpec,
                                                           fields: dict[str, Any],
                                                           measured: dict[str, float]) -> None:
    base = Layout(impl="te", **fields)
    predicted = {}
    for recipe in measured:
        s = base if recipe == "off" else replace(base, fp8=Fp8.HYBRID, fp8_recipe=recipe)
        predicted[recipe] = estimate_cost(model, s, H100).tokens_per_s
    for recipe, tokens in measured.items():
        if recipe != "off":  # bf16's gpt2-xl trial was noisy (CV 0.14): its order only
            assert predicted[recipe] == pytest.approx(tokens, rel=0.16), recipe
        # FP8 wins where it won, and loses where it lost.
        assert (predicted[recipe] > predicted["off"]) == (tokens > measured["off"]), recipe


# Every FP8 trial of tests/data/measured_trials.json (26: gpt2-xl mbs 8/16 and Llama-3.2-3B mbs
# 1/2 on one H100, 2026-11-25 and -27; Llama-3.2-3B mbs 2 at dp 2, tp 2 and tp 2 + sp on two
# H200, 2026-11-27; TE 2.11), by tools/fp8_errors.py (results/benchmarks/2026-11-28-cpu-fp8-sp-
# host.md): the shipped constants' step-time error (median, worst), and held out: the host
# floors (MEASURED_FIT) fitted to the other families' FP8 trials, everything else as shipped.
# Each bound about one point above today's figure (6.0%, 14.3%; 6.6%, 20.8%; over 24 trials
# before the sequence-parallel host term, its two trials held apart as a known miss 37-38%
# optimistic: 7.0%, 14.3%; 7.4%, 20.8%). The two tp 2 + sp tensorwise/blockwise trials' held-out
# figures here are in sample for fp8_sp_gather_host_s (no other family has such a trial):
# test_the_sp_host_term_meets_its_trials holds it out by recipe instead. Over the issue's
# 10%: the same layout measured on two days is up to 23% apart (gpt2-xl mbs 8 blockwise), so no
# model comes within 10.4% of both runs.
# Since the shared constants were refitted to all trials and the casts and host floors with them
# (results/benchmarks/2026-11-28-cpu-constants-refit-s15.md): 5.3%, 16.9%; held out 5.5%, 22.0%.
# The medians fell (6.0 -> 5.3, 6.6 -> 5.5), the worst rose (14.3 -> 16.9, 20.8 -> 22.0: the
# host-bound Llama-3.2-3B mbs 1 delayed trial, predicted +16.9%), and the bounds with them.
# Session 16's 15 FP8 trials (llama3-8b on 4 x H200, Llama-3.2-3B on one H200, GPU-bound: the
# model 5-21% slow on all but the cp 2 trial) raised them to 7.9%, 20.8%; held out 8.7%, 22.0%
# (2026-11-28-cpu-measured-s16-trials-s17.md). With the layers' FP8 speed-up the swept ratio
# on H100 and H200 and FP8's host floor added to the cp ring's host time (same report): 4.3%,
# 19.6%; held out 4.2%, 22.0%. The worst shipped is now s12-fp8-l3b2/3 (-19.6%, -12.3% before):
# the 2 x H200 lane that ran beside another lane, 18-26% slower per sequence than session 16's same
# shape alone on one H200.
# Session 18's 18 FP8 trials on one H200 (out of sample, constants unchanged): 4.7%, 30.2%; held
# out 4.5%, 23.8%. The worst are host-bound, s18-l3b-grid-base/1 (+30.2%) and s18-xl-grid/1
# (+27.5%): that machine's host ran the same layouts' bf16 twins too 20-28% faster per layer
# than the H100 hosts of sessions 8 and 11, and the host floors fitted to its trials alone are
# 6.4 / 7.4 ms against 8.0-9.7 on every other day (results/benchmarks/2026-11-28-cpu-fp8-h200-
# misses-s18.md): a property of the host that `autotune calibrate` refits, not of FP8. The
# worst bounds are today's figures and a point; the medians stand.
# Sessions 25 and 26's 21 FP8 trials (one and four H200) leave both figures where they were
# (medians 4.5% -> 4.3%, 4.4% -> 4.3%) but for the four below, listed apart with their shipped
# error instead of the bounds widened around them; held in, the worst would be 36.4% shipped
# and 38.5% held out (the held-out floors pulled by them: s18-l3b-grid-base/1 34.7%).
FP8_STEP_ERROR = (0.053, 0.312)
FP8_STEP_ERROR_HELD_OUT = (0.052, 0.248)

# FP8 trials the model predicts too fast for a reason outside FP8's terms, each with the shipped
# step-time error (predicted over measured, minus one) and the cause; a fix moves the error off
# its figure and fails test_fp8_step_time_known_misses until the trial leaves this table.
KNOWN_FP8_STEP_MISSES: dict[str, tuple[float, str]] = {
    # Llama-3.1-8B on one H200, mbs 1, full recompute of every layer, 1% of the optimizer on
    # the CPU, FP8 delayed with fp8pg: host-bound. Delayed scaling's host time per recomputed
    # layer (fp8.Constants.fp8_delayed_recompute_host_s, 4.12 ms fitted over six trials of two
    # machines) took it from -34.1% to -15.0%; this one needs about 6 ms (its profile: 19 ms of
    # host per layer and micro-batch, results/benchmarks/2026-11-29-h200-fp8-offload-profile-
    # s25.md). Its 10%-offloaded twin (/1) is now within 0.2%.
    "s25-l8b-offload/2": (-0.150, "delayed scaling's recompute host time, this host's slower"),
    # gpt2-xl on 4 x H200 at gbs 64 (session 26's default search): every trial of that search
    # is predicted too fast, bf16 too (-12% to -46%), so the cause is not FP8's; not understood
    # yet (results/benchmarks/2026-11-29-cpu-measured-trials-s26.md).
    "s26-xl4-search/8": (-0.364, "gpt2-xl on 4 GPUs, every layout predicted fast"),
    "s26-xl4-search/24": (-0.337, "gpt2-xl on 4 GPUs, every layout predicted fast"),
}


def _fp8_trials() -> list[tuple[str, Any]]:
    """(source, load_trials sample) of every OK FP8 trial of measured_trials.json."""
    return [(src, t) for src, t in sourced_trials() if t[2].fp8 != Fp8.OFF]


def test_fp8_step_time_known_misses() -> None:
    found = {src: estimate_cost(m, s, c).step_time_s / step - 1
             for src, (_, m, s, c, step, _) in _fp8_trials() if src in KNOWN_FP8_STEP_MISSES}
    assert set(found) == set(KNOWN_FP8_STEP_MISSES)
    for src, (error, why) in KNOWN_FP8_STEP_MISSES.items():
        assert found[src] == pytest.approx(error, abs=0.005), (src, why)


def test_fp8_step_time_error_does_not_regress() -> None:
    from autotune.predict.calibration import held_out_step_errors

    trials = [t for src, t in _fp8_trials() if src not in KNOWN_FP8_STEP_MISSES]
    assert len(trials) >= 26 and len({t[0] for t in trials}) >= 3
    shipped = [abs(estimate_cost(m, s, c).step_time_s / step - 1)
               for _, m, s, c, step, _ in trials]
    held = [abs(e) for e in held_out_step_errors(trials, MEASURED_FIT)]
    assert median(shipped) <= FP8_STEP_ERROR[0], shipped
    assert max(shipped) <= FP8_STEP_ERROR[1], shipped
    assert median(held) <= FP8_STEP_ERROR_HELD_OUT[0], held
    assert max(held) <= FP8_STEP_ERROR_HELD_OUT[1], held



# ---- FP8's host floor against the machine's bf16 host time (issue 26) ----------------------
#
# The floor stays an absolute time of its own (Constants.fp8_layer_host_s), not a multiple of
# the bf16 TE layer's host time (CostParams.layer_launch_s + te_layer_launch_s) that a search's
# refit learns from a machine's bf16 trials: refitted so, per machine, that host time is
# 1.2-4.1 ms and the FP8 floors fitted to the same machine's FP8 trials are 2.0-7.9 times it
# (shipped 4.25), so a floor following it would have predicted session 18's H200 within 10.5%
# (30.0% now) but sessions 8 and 11's H100 FP8 trials 39% and 108% slow in the median and
# session 12's 26% fast (results/benchmarks/2026-11-28-cpu-fp8-host-floor-s19.md).

@pytest.mark.parametrize("gpu", ["h100-80gb", "h200"])
@pytest.mark.parametrize(("field", "value"), [
    ("layer_launch_s", 0.0008),       # half the shipped 1.62 ms: a fast host
    ("layer_launch_s", 0.0025),       # a slow one (session 11's refit: 3.7 ms with the GEMMs)
    ("te_layer_launch_s", 0.0),
    ("te_layer_launch_s", 0.0008),
])
@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_the_host_floor_does_not_follow_the_bf16_host_time(gpu: str, field: str, value: float,
                                                           recipe: str) -> None:
    """gpt2-xl mbs 8 (host-bound under FP8): the bf16 step moves with the host time per layer
    the refit learns; the FP8 step, on TE's FP8 floor, does not."""
    cluster, moved = _cluster(gpu), replace(CostParams(), **{field: value})
    fp8 = replace(XL8, fp8=Fp8.HYBRID, fp8_recipe=Fp8Recipe(recipe))
    assert estimate_cost(XL, XL8, cluster, moved).step_time_s != pytest.approx(
        estimate_cost(XL, XL8, cluster).step_time_s, rel=0.01)
    assert estimate_cost(XL, fp8, cluster, moved).step_time_s == pytest.approx(
        estimate_cost(XL, fp8, cluster).step_time_s, rel=1e-9)


# A search's refit (autotune.search.refit.refit_cost_params: REFIT_FIELDS through fit_fields)
# to one machine's bf16 trials, that machine's FP8 trials then predicted: the shipped
# constants' |error| worst and the refitted ones' (results/benchmarks/2026-11-28-cpu-fp8-host-
# floor-s19/host_floor.py, section 2), each bound today's figure and a point. Session 18's
# host-bound trials stay the worst (+30%): its host ran 20-28% faster than the floors' hosts.
REFIT_FP8_WORST = {
    "s8/h100-80gbx1": (0.179, 0.172),
    "s11/h100-80gbx1": (0.146, 0.133),
    "s12/h200x2": (0.206, 0.173),
    "s16/h200x1": (0.053, 0.065),
    "s16/h200x4": (0.070, 0.098),
    "s17/h200x1": (0.089, 0.066),
    "s18/h200x1": (0.312, 0.310),
}


@pytest.fixture(scope="module")
def by_machine() -> dict[str, list[tuple[Any, ...]]]:
    """The OK trials of tests/data/measured_trials.json by machine: session, GPU kind and
    count (the sessions before session 2 named none: left out)."""
    import re

    from autotune.predict.calibration import load_trials

    path = Path(__file__).parent / "data" / "measured_trials.json"
    raw = [t for t in json.loads(path.read_text())["trials"] if t["status"] == "OK"]
    groups: dict[str, list[tuple[Any, ...]]] = {}
    for r, (_, m, s, c, step, _) in zip(raw, load_trials(path), strict=True):
        session = re.match(r"(s\d+)-", r["source"])
        if session:
            machine = f"{session.group(1)}/{r['gpu']}x{r['gpus']}"
            groups.setdefault(machine, []).append((m, s, c, step))
    return groups


@pytest.mark.parametrize("machine", sorted(REFIT_FP8_WORST))
def test_a_refit_to_bf16_trials_keeps_the_fp8_predictions(
        by_machine: dict[str, list[tuple[Any, ...]]], machine: str) -> None:
    from autotune.predict.calibration import fit_cost_params, fit_fields
    from autotune.search.refit import REFIT_FIELDS

    bf16 = [t for t in by_machine[machine] if t[1].fp8 == Fp8.OFF]
    fp8 = [t for t in by_machine[machine] if t[1].fp8 != Fp8.OFF]
    assert bf16 and fp8
    start = CostParams()
    refit = fit_cost_params(bf16, names=fit_fields(REFIT_FIELDS, start, [t[1] for t in bf16]),
                            start=start)
    # Only the bf16 constants move: no FP8 trial was measured.
    assert all(getattr(refit, n) == getattr(start, n) for n in MEASURED_FIT)
    shipped, refitted = REFIT_FP8_WORST[machine]
    for params, bound in ((start, shipped), (refit, refitted)):
        worst = max(abs(estimate_cost(m, s, c, params).step_time_s / step - 1)
                    for m, s, c, step in fp8)
        assert worst <= bound, (machine, params is refit, worst)
