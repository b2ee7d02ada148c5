"""autotune.specs.params against megatron-core: the same shapes built as the worker builds them
(tests/doubles/megatron_params.py, CPU) count the same parameters, feature by feature, and
train a step."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from doubles.requirements import require_torch_and_megatron_core

from autotune.specs.model import ModelSpec
from autotune.specs.params import count_parameters

ROOT = Path(__file__).resolve().parents[1]

GPT = ModelSpec(name="gpt", num_layers=2, hidden_size=96, num_attention_heads=4,
                vocab_size=1000, seq_length=64, global_batch_size=1)
LLAMA = dataclasses.replace(GPT, name="llama", num_query_groups=2, ffn_hidden_size=160,
                            gated_linear_unit=True, activation="swiglu", normalization="RMSNorm",
                            add_bias_linear=False, tied_embeddings=False,
                            position_embedding="rope", hidden_dropout=0.0,
                            attention_dropout=0.0)
MLA = dataclasses.replace(LLAMA, name="mla", num_query_groups=None, multi_latent_attention=True,
                          q_lora_rank=48, kv_lora_rank=32, qk_head_dim=24,
                          qk_pos_emb_head_dim=8, v_head_dim=16, qk_layernorm=True)
# One tiny model per feature of a parameter count; each differs from GPT or LLAMA in it alone.
MODELS = [
    GPT,                                                                # biases, learned positions
    dataclasses.replace(GPT, name="gpt-untied", tied_embeddings=False),
    dataclasses.replace(GPT, name="gpt-qk-norm", qk_layernorm=True),    # LayerNorm: weight + bias
    dataclasses.replace(GPT, name="gpt-qkv-bias", add_qkv_bias=True),   # already biased: nothing
    LLAMA,                                                              # GQA, SwiGLU, RMSNorm
    dataclasses.replace(LLAMA, name="llama-mha", num_query_groups=None),
    dataclasses.replace(LLAMA, name="head-dim", kv_channels=40),        # 4 x 40 != 96
    dataclasses.replace(LLAMA, name="qwen2", add_qkv_bias=True),
    dataclasses.replace(LLAMA, name="qwen3", qk_layernorm=True, kv_channels=40),
    dataclasses.replace(LLAMA, name="odd-vocab", vocab_size=1001),      # padded to 1024
    # Nemotron: squared ReLU (two matrices), LayerNorm 1p (weight + bias, stored as w - 1),
    # half the head rotated (no parameter), its own head dimension, no biases.
    dataclasses.replace(LLAMA, name="nemotron", gated_linear_unit=False,
                        activation="squared_relu", normalization="LayerNorm",
                        apply_layernorm_1p=True, rotary_percent=0.5, kv_channels=40),
    # StarCoder2: GELU with biases on every linear layer, LayerNorm, GQA, RoPE, tied.
    dataclasses.replace(GPT, name="starcoder2", num_query_groups=2, position_embedding="rope",
                        hidden_dropout=0.0),
    dataclasses.replace(LLAMA, name="moe", num_experts=4, moe_topk=2, moe_ffn_hidden_size=64),
    dataclasses.replace(LLAMA, name="moe-shared", num_experts=4, moe_topk=2,  # Qwen2-MoE's
                        moe_ffn_hidden_size=64, moe_shared_expert_intermediate_size=80),
    dataclasses.replace(LLAMA, name="moe-shared-gate", num_experts=4, moe_topk=2,
                        moe_ffn_hidden_size=64, moe_shared_expert_intermediate_size=80,
                        moe_shared_expert_gate=True),
    # Multi-Latent Attention (DeepSeek-V2/V3): with and without the query's latent, with and
    # without the latent norms (qk_layernorm), dense and MoE, and LayerNorm's biased norms.
    MLA,
    dataclasses.replace(MLA, name="mla-no-q-lora", q_lora_rank=None),   # V2-Lite's query
    dataclasses.replace(MLA, name="mla-no-norms", qk_layernorm=False),
    dataclasses.replace(MLA, name="mla-moe", num_experts=4, moe_topk=2, moe_ffn_hidden_size=64,
                        moe_shared_expert_intermediate_size=80),
    dataclasses.replace(MLA, name="mla-moe-no-q-lora", q_lora_rank=None, num_experts=4,
                        moe_topk=2, moe_ffn_hidden_size=64),
    dataclasses.replace(MLA, name="mla-layernorm-bias", normalization="LayerNorm",
                        add_bias_linear=True),
    # Dense layers among the MoE layers (--moe-layer-freq): DeepSeek's dense first layer, and
    # every other layer MoE.
    dataclasses.replace(LLAMA, name="moe-dense-first", num_experts=4, moe_topk=2,
                        moe_ffn_hidden_size=64, moe_layer_freq=(0, 1)),
    dataclasses.replace(MLA, name="mla-moe-dense-first", num_experts=4, moe_topk=2,
                        moe_ffn_hidden_size=64, moe_shared_expert_intermediate_size=80,
                        moe_layer_freq=(0, 1)),
    dataclasses.replace(LLAMA, name="moe-freq-2", num_experts=4, moe_topk=2,
                        moe_ffn_hidden_size=64, moe_layer_freq=2),
    # Multi-Token Prediction (--mtp-num-layers): a dense one, two on a tied model, DeepSeek-V3's
    # shape (its MTP layer an MoE layer, as its last layer is), and a dense MTP layer where the
    # last layer of an MoE model is dense.
    dataclasses.replace(LLAMA, name="mtp", mtp_num_layers=1),
    dataclasses.replace(LLAMA, name="mtp-2", mtp_num_layers=2, mtp_loss_scaling_factor=0.3),
    # Tied: the same embedding, no second copy (pp = 1). Its dropout leaves the step out: with
    # the inputs as labels a tied model's loss starts well below ln(vocabulary).
    dataclasses.replace(LLAMA, name="mtp-tied", mtp_num_layers=1, tied_embeddings=True,
                        hidden_dropout=0.1),
    dataclasses.replace(MLA, name="mla-moe-dense-first-mtp", num_experts=4, moe_topk=2,
                        moe_ffn_hidden_size=64, moe_shared_expert_intermediate_size=80,
                        moe_layer_freq=(0, 1), mtp_num_layers=1),
    dataclasses.replace(LLAMA, name="moe-dense-last-mtp", num_experts=4, moe_topk=2,
                        moe_ffn_hidden_size=64, moe_layer_freq=(1, 0), mtp_num_layers=1),
]


@pytest.mark.slow
@pytest.mark.megatron
def test_parameter_counts_are_megatron_cores(tmp_path: Path) -> None:
    require_torch_and_megatron_core()
    models = tmp_path / "models.json"
    models.write_text(json.dumps([dataclasses.asdict(m) for m in MODELS]))
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "doubles" / "megatron_params.py"),
                          str(models)], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    built = {r["name"]: r["parameters"] for r in rows}
    assert built == {m.name: count_parameters(m) for m in MODELS}
    # The models without dropout also ran one forward and backward pass on CPU through the
    # worker's layer spec (sdpa: SdpaAttention with MLA's unequal head dims too): a loss near
    # ln(vocabulary) at random init, and a finite gradient for every parameter.
    stepped = {r["name"]: r for r in rows if r["loss"] is not None}
    assert {m.name for m in MODELS if m.multi_latent_attention} <= set(stepped)
    for name, row in stepped.items():
        assert row["loss"] == pytest.approx(math.log(1024), abs=0.2), name
        assert row["no_grad"] == [], name
    # The features counted at all: each moves the count.
    assert built["qwen3"] > built["head-dim"] and built["qwen2"] > built["llama"]
    assert built["gpt-qk-norm"] > built["gpt"] and built["gpt-qkv-bias"] == built["gpt"]
    assert built["moe-shared-gate"] > built["moe-shared"] > built["moe"]
    assert built["mla"] > built["mla-no-norms"] and built["mla"] != built["mla-no-q-lora"]
    assert built["starcoder2"] < built["gpt"]  # fewer key/value heads, no learned positions
    assert built["llama"] < built["moe-dense-first"] < built["moe"]
    assert built["moe-freq-2"] == built["moe-dense-first"]  # one MoE and one dense layer each
    # An MTP layer: one more layer of the last layer's kind, eh_proj (2h x h) and three norms.
    h = LLAMA.hidden_size
    one_layer = count_parameters(dataclasses.replace(LLAMA, num_layers=3)) \
        - count_parameters(LLAMA)
    assert built["mtp"] - built["llama"] == one_layer + 2 * h * h + 3 * h  # RMSNorm: weights
    assert built["mla-moe-dense-first-mtp"] - built["mla-moe-dense-first"] \
        > built["mtp"] - built["llama"]  # an MoE layer's experts
