"""Parameter counts of a ModelSpec, for listings and the memory model.

Counts follow megatron-core's GPTModel: QKV and projection (with biases when add_bias_linear;
the QKV's alone with add_qkv_bias), the query and key norms (qk_layernorm), or Multi-Latent
Attention's down and up projections and latent norms (`mla_attention_params`), the MLP (two or,
gated, three matrices), two norms per layer, the final norm, word embeddings padded as Megatron
pads them, learned position embeddings, an untied output layer, and Multi-Token Prediction
layers (`mtp_own_params` and one transformer layer each). Checked against the models
megatron-core builds (tests/test_param_counts_megatron.py) and against published checkpoints
to the parameter (tests/test_hf_config.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from autotune.errors import ConfigError
from autotune.inputs.bounds import PARAMETERS_MAX
from autotune.specs.model import ModelSpec, padded_vocab_size

__all__ = ["ParameterCounts", "check_size", "count_parameters", "mla_attention_params",
           "mtp_own_params", "parameter_counts"]


def mla_attention_params(model: ModelSpec, tp: int) -> tuple[float, float]:
    """(all parameters, GEMM weights) of one layer's Multi-Latent Attention on one of `tp`
    tensor-parallel ranks, as Transformer Engine's layer spec builds it (megatron-core 0.16.1
    multi_latent_attention.py MLASelfAttention.__init__, gpt_layer_specs.py).

    The down projections (linear_q_down_proj h x q_lora_rank, linear_kv_down_proj h x
    (kv_lora_rank + qk_pos_emb_head_dim)) are TELinear in 'duplicated' mode: whole on every
    rank (the local spec splits them column-wise: the same total at tp = 1). The up projections
    (linear_q_up_proj q_lora_rank x heads (qk_head_dim + qk_pos_emb_head_dim), or linear_q_proj
    from h without q_lora_rank; linear_kv_up_proj kv_lora_rank x heads (qk_head_dim +
    v_head_dim)) split their heads; linear_proj (heads v_head_dim x h) its rows, its bias (with
    add_bias_linear) whole. None of the others has a bias. With qk_layernorm, a norm over each
    latent (q_layernorm: q_lora_rank, kv_layernorm: kv_lora_rank), whole on every rank."""
    assert model.kv_lora_rank is not None and model.qk_head_dim is not None
    assert model.qk_pos_emb_head_dim is not None and model.v_head_dim is not None
    h, n, t = model.hidden_size, model.num_attention_heads, tp
    q_rank, kv_rank, pe = model.q_lora_rank, model.kv_lora_rank, model.qk_pos_emb_head_dim
    q_heads = n * model.qk_dim / t
    # linear_q_proj, or linear_q_down_proj and linear_q_up_proj.
    query = h * q_heads if q_rank is None else h * q_rank + q_rank * q_heads
    kv = h * (kv_rank + pe) + kv_rank * n * (model.qk_head_dim + model.v_head_dim) / t
    proj = n * model.v_head_dim / t * h
    linear = query + kv + proj
    per_unit = 2 if model.normalization == "LayerNorm" else 1  # LayerNorm has a bias
    norms = per_unit * ((q_rank or 0) + kv_rank) if model.qk_layernorm else 0
    return linear + norms + (h if model.add_bias_linear else 0), linear


@dataclass(frozen=True, slots=True, kw_only=True)
class ParameterCounts:
    """Parameters by where they live; `dense_per_layer` excludes the experts."""

    num_layers: int
    embedding: int
    """Word embeddings (padded vocabulary at tp=1) plus learned positions."""
    output: int
    """The output layer when untied, else 0."""
    dense_per_layer: int
    expert_per_layer: int
    """All experts of one layer (0 for dense models)."""
    final_norm: int
    dense_layers: int = 0
    """Dense layers among the MoE layers (ModelSpec.moe_layer_freq); the per-layer counts above
    are an MoE layer's."""
    dense_layer_params: int = 0
    """One such dense layer's parameters."""
    mtp_layers: int = 0
    """Multi-Token Prediction layers (ModelSpec.mtp_num_layers)."""
    mtp_layer_params: int = 0
    """One MTP layer's own parameters (`mtp_layer_params`); the embedding and the output layer
    it shares are counted once, above."""

    @property
    def total(self) -> int:
        per_layer = self.dense_per_layer + self.expert_per_layer
        return (self.embedding + self.output + self.final_norm
                + per_layer * (self.num_layers - self.dense_layers)
                + self.dense_layer_params * self.dense_layers
                + self.mtp_layer_params * self.mtp_layers)

    @property
    def without_mtp(self) -> int:
        """The main model's parameters: what DeepSeek-V3's published 671B counts."""
        return self.total - self.mtp_layer_params * self.mtp_layers


def mtp_own_params(model: ModelSpec, tp: int = 1) -> float:
    """One MTP layer's parameters besides its transformer layer, on one of `tp` ranks:
    megatron-core 0.16.1 MultiTokenPredictionLayer's enorm, hnorm and final_layernorm (the
    model's norm, whole on every rank) and eh_proj, a column-parallel 2h x h linear without
    bias (multi_token_prediction.py __init__)."""
    h = model.hidden_size
    norm = (2 if model.normalization == "LayerNorm" else 1) * h  # LayerNorm has a bias
    return 3 * norm + 2 * h * h / tp


@lru_cache(maxsize=256)
def parameter_counts(model: ModelSpec) -> ParameterCounts:
    """Parameter counts of `model` at tp = 1."""
    if model.mtp_num_layers:
        # The main model's counts, and each MTP layer's: its transformer layer (a layer of the
        # kind of the model's last layer, ModelSpec.mtp_layer_model) and its own modules.
        layer = parameter_counts(model.mtp_layer_model)
        return replace(parameter_counts(model.without_mtp), mtp_layers=model.mtp_num_layers,
                       mtp_layer_params=layer.dense_per_layer + layer.expert_per_layer
                       + int(mtp_own_params(model)))
    if model.has_dense_layers:
        # Each kind of layer counted as a model of that kind alone counts it.
        one = parameter_counts(model.dense_layer_model)
        return replace(parameter_counts(model.moe_layer_model),
                       dense_layers=model.layer_kinds(0, model.num_layers)[0],
                       dense_layer_params=one.dense_per_layer + one.expert_per_layer)
    h = model.hidden_size
    bias = model.add_bias_linear
    kv = model.query_groups * model.head_dim
    q = model.attention_width  # h unless the head dimension is the model's own (kv_channels)
    per_unit = 2 if model.normalization == "LayerNorm" else 1  # LayerNorm has a bias
    norm = per_unit * h
    attention = h * (q + 2 * kv) + q * h + ((q + 2 * kv) + h if bias else 0)
    if model.add_qkv_bias and not bias:
        attention += q + 2 * kv
    if model.qk_layernorm:  # one norm of width head_dim for all queries, one for all keys
        attention += 2 * per_unit * model.head_dim
    if model.multi_latent_attention:
        attention = int(mla_attention_params(model, 1)[0])
    up_width = 2 if model.gated_linear_unit else 1  # gated: gate and up projections fused

    def mlp(ffn: int) -> int:
        biases = ffn * up_width + h if bias else 0
        return h * ffn * up_width + ffn * h + biases

    if model.is_moe:
        assert model.num_experts is not None
        dense = attention + 2 * norm + h * model.num_experts  # router
        if model.shared_expert_ffn_size:  # moe/shared_experts.py: an MLP, and a 1 x h gate
            dense += mlp(model.shared_expert_ffn_size) + (h if model.moe_shared_expert_gate
                                                         else 0)
        experts = model.num_experts * mlp(model.expert_ffn_size)
    else:
        dense = attention + 2 * norm + mlp(model.ffn_size)
        experts = 0
    vocab = padded_vocab_size(model)
    positions = model.max_positions * h if model.position_embedding == "learned_absolute" else 0
    return ParameterCounts(num_layers=model.num_layers, embedding=vocab * h + positions,
                           output=0 if model.tied_embeddings else vocab * h,
                           dense_per_layer=dense, expert_per_layer=experts, final_norm=norm)


def count_parameters(model: ModelSpec) -> int:
    """All parameters of the model (tp = 1, padded vocabulary)."""
    return parameter_counts(model).total


def check_size(model: ModelSpec) -> ModelSpec:
    """`model` as read from a file (a preset, a model YAML file, a config.json), or ConfigError
    in one line where its counts, each within its bound, make more than PARAMETERS_MAX
    parameters (10**12 layers: a plan of 1e18 GiB per GPU and 0 tokens/s)."""
    total = count_parameters(model)
    if total > PARAMETERS_MAX:
        raise ConfigError(f"model {model.name}: {total:.3g} parameters, over the "
                          f"{PARAMETERS_MAX / 1e12:.0f}T autotune plans for (100 times gpt-1t, "
                          "the largest preset): check its layers and widths")
    return model
