"""Multi-Latent Attention (DeepSeek-V2/V3, megatron-core 0.16.1 multi_latent_attention.py) in
autotune's model: its rules, parameters per rank, FLOPs, fused-attention head dims and the
worker's configuration. Parameter counts against megatron-core itself:
tests/test_param_counts_megatron.py (the MLA rows)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from autotune.errors import ConfigError
from autotune.specs.model import ModelSpec

BASE: dict[str, Any] = dict(name="mla", num_layers=2, hidden_size=2048, num_attention_heads=16,
                            vocab_size=102400, seq_length=4096, global_batch_size=8,
                            normalization="RMSNorm", add_bias_linear=False,
                            gated_linear_unit=True, activation="swiglu",
                            position_embedding="rope", ffn_hidden_size=10944,
                            qk_layernorm=True, multi_latent_attention=True, kv_lora_rank=512,
                            qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128)
"""DeepSeek-V2-Lite's attention (config.json: no q_lora_rank), two dense layers."""

MLA = ModelSpec(**BASE)


@pytest.mark.parametrize(("change", "message"), [
    ({"num_query_groups": 4}, "no query groups .*num_query_groups=4 must be unset"),
    ({"kv_channels": 128}, "kv_channels must be unset"),
    ({"add_qkv_bias": True}, "no bias: add_qkv_bias must be false"),
    ({"position_embedding": "learned_absolute"}, "position_embedding must be rope"),
    ({"position_embedding": "none"}, "position_embedding must be rope"),
    ({"kv_lora_rank": None}, "multi_latent_attention needs kv_lora_rank"),
    ({"qk_head_dim": None, "v_head_dim": None},
     "multi_latent_attention needs qk_head_dim, v_head_dim"),
    ({"multi_latent_attention": False}, "kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, "
                                        "v_head_dim need multi_latent_attention true"),
    ({"q_lora_rank": 0}, "q_lora_rank must be a positive integer"),
    ({"qk_pos_emb_head_dim": -64}, "qk_pos_emb_head_dim must be a positive integer"),
    ({"hidden_size": 2050}, "divisible by num_attention_heads"),  # Megatron-LM's kv_channels
])
def test_mla_rules_are_one_line(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        ModelSpec(**{**BASE, **change})
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("change", [
    {},
    {"q_lora_rank": 1536},                               # V2/V3's compressed query
    {"qk_layernorm": False},                             # megatron-core builds it without norms
    {"num_query_groups": 16},                            # = heads: no GQA
    {"num_experts": 64, "moe_topk": 6, "moe_ffn_hidden_size": 1408,
     "moe_shared_expert_intermediate_size": 2816},
])
def test_mla_models_megatron_core_builds_are_accepted(change: dict[str, Any]) -> None:
    model = ModelSpec(**{**BASE, **change})
    assert model.qk_dim == 192 and model.v_dim == 128 and model.attention_width == 16 * 128


def test_without_mla_the_head_dims_are_head_dim() -> None:
    plain = ModelSpec(name="gqa", num_layers=2, hidden_size=2048, num_attention_heads=16,
                      num_query_groups=4, kv_channels=96, vocab_size=1000, seq_length=128,
                      global_batch_size=1)
    assert (plain.qk_dim, plain.v_dim, plain.attention_width) == (96, 96, 16 * 96)


@pytest.mark.parametrize("preset", ["llama3-8b", "gpt2-xl", "mixtral-8x7b"])
def test_models_without_mla_keep_their_study_names(preset: str) -> None:
    """An MLA model is a study of its own (the old names: test_hardening_inputs.py
    test_a_model_field_added_later_keeps_the_study_name, with the MLA fields)."""
    from autotune.search.space import load_space
    from autotune.search.storage import default_study_name
    from autotune.specs.hardware import ClusterSpec, gpu_spec
    from autotune.specs.presets import load_model

    model = load_model(preset)
    cluster = ClusterSpec(num_gpus=8, gpus_per_node=8, gpu=gpu_spec("h100-80gb"))
    space = load_space()
    name = default_study_name(model, cluster, space, "simulate")
    mla = dataclasses.replace(model, num_query_groups=None, kv_channels=None,
                              add_qkv_bias=False, position_embedding="rope",
                              multi_latent_attention=True, kv_lora_rank=64, qk_head_dim=32,
                              qk_pos_emb_head_dim=16, v_head_dim=32)
    assert default_study_name(mla, cluster, space, "simulate") != name
