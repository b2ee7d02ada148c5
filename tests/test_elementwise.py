"""The element-wise kernels' traffic per architecture feature (autotune.specs.elementwise)."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.specs.elementwise import (
    DROPOUT_EXTRA_BYTES,
    GELU_BYTES,
    GQA_REPEAT_BYTES,
    NORM_BYTES,
    RESIDUAL_BYTES,
    ROPE_BYTES,
    ROPE_FUSED_BYTES,
    SWIGLU_BYTES,
    layer_elementwise_bytes,
)
from autotune.specs.presets import load_model


def test_a_gpt_layer_is_norms_residuals_with_dropout_and_gelu() -> None:
    m = load_model("gpt2-xl")  # LayerNorm, hidden dropout 0.1, 4h GeLU MLP, learned positions
    h = m.hidden_size
    ew = layer_elementwise_bytes(m, 1, "sdpa")
    assert ew.replicated == 2 * NORM_BYTES * h + 2 * (RESIDUAL_BYTES + DROPOUT_EXTRA_BYTES) * h
    assert ew.split == ew.mlp == GELU_BYTES * 4 * h
    assert ew.per_token(1, False) == pytest.approx(104 * h)


def test_a_llama_layer_adds_swiglu_rope_and_the_gqa_repeat() -> None:
    m = load_model("llama3-8b")  # RMSNorm, no dropout, SwiGLU, RoPE, 8 KV groups of 32 heads
    h, d = m.hidden_size, m.head_dim
    kv = m.query_groups * d
    ew = layer_elementwise_bytes(m, 1, "sdpa")
    assert ew.replicated == 2 * NORM_BYTES * h + 2 * RESIDUAL_BYTES * h
    assert ew.mlp == SWIGLU_BYTES * m.ffn_size
    assert ew.split == pytest.approx(ew.mlp + ROPE_BYTES * (h + kv)
                                     + 2 * GQA_REPEAT_BYTES * (h + kv))
    # Transformer Engine takes the groups as they are: no repeat; and RoPE runs as its fused
    # kernel (Megatron-LM's default), or unfused with --no-rope-fusion.
    te = layer_elementwise_bytes(m, 1, "te")
    assert te.split == pytest.approx(ew.mlp + ROPE_FUSED_BYTES * (h + kv))
    unfused = layer_elementwise_bytes(dataclasses.replace(m, rope_fusion=False), 1, "te")
    assert unfused.split == pytest.approx(ew.mlp + ROPE_BYTES * (h + kv))


def test_each_feature_moves_only_its_own_term() -> None:
    gpt = load_model("gpt2-xl")
    base = layer_elementwise_bytes(gpt, 1, "sdpa")
    no_dropout = layer_elementwise_bytes(dataclasses.replace(gpt, hidden_dropout=0.0), 1, "sdpa")
    assert base.replicated - no_dropout.replicated == 2 * DROPOUT_EXTRA_BYTES * gpt.hidden_size
    swiglu = layer_elementwise_bytes(dataclasses.replace(gpt, gated_linear_unit=True), 1, "sdpa")
    assert swiglu.mlp / base.mlp == SWIGLU_BYTES / GELU_BYTES
    rms = layer_elementwise_bytes(dataclasses.replace(gpt, normalization="RMSNorm"), 1, "sdpa")
    assert rms == base  # one fused kernel each way, the same bytes


def test_tensor_and_sequence_parallel_split_what_they_shard() -> None:
    m = load_model("llama3-8b")
    one, two = layer_elementwise_bytes(m, 1, "te"), layer_elementwise_bytes(m, 2, "te")
    assert two.replicated == one.replicated
    assert two.split == pytest.approx(one.split / 2)
    assert two.per_token(2, True) == pytest.approx(one.per_token(1, False) / 2)
    assert two.per_token(2, False) > two.per_token(2, True)


@pytest.mark.parametrize(("impl", "tp"), [("sdpa", 1), ("te", 1), ("te", 4)])
def test_query_and_key_norms_add_a_norm_on_the_ranks_query_and_key(impl: str, tp: int) -> None:
    m = load_model("llama3-8b")
    d = m.head_dim
    query, key = m.num_attention_heads // tp * d, max(1, m.query_groups // tp) * d
    base = layer_elementwise_bytes(m, tp, impl)
    normed = layer_elementwise_bytes(dataclasses.replace(m, qk_layernorm=True), tp, impl)
    assert normed.replicated == base.replicated and normed.mlp == base.mlp
    assert normed.split - base.split == pytest.approx(NORM_BYTES * (query + key))
