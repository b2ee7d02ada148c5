"""FLOPs per token of a training step: one formula shared by the cost model and the worker's MFU.

Source: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", Section 5.1 / Appendix, eq. (3): with full recompute an iteration costs
96 B s l h^2 (1 + s/(6h) + V/(16 l h)) FLOPs; without recompute the factor is 72 and V/(12 l h)
(forward + backward = 3 forward passes). We count each matrix multiply explicitly so that GQA,
SwiGLU, a non-4h FFN, top-k MoE routing and Multi-Latent Attention are covered; for a GPT with
ffn = 4h, MHA, dense MLP this reduces exactly to the paper's expression (tests check it).
Attention scores are counted in full (s^2, no causal halving), as the paper and Megatron's
`num_floating_point_operations` do.
"""

from __future__ import annotations

from typing import Protocol

from autotune.specs.model import ModelSpec

__all__ = ["GemmFit", "GemmSplit", "eh_proj_forward_flops_per_token", "forward_flops_per_token",
           "gemm_efficiency", "gemm_size", "hardware_flops_per_token",
           "logits_forward_flops_per_token", "mla_down_flops_per_token", "mla_up_flops_per_token",
           "mlp_forward_flops_per_token", "model_flops_per_token", "mtp_forward_flops_per_token",
           "shared_expert_flops_per_token"]


def mlp_forward_flops_per_token(model: ModelSpec) -> float:
    """The MLP's (or the MoE layer's: top-k experts, the router and a shared expert) share of
    one layer's forward matrix-multiply FLOPs, per token: what `mlp` or `moe` recompute runs
    again."""
    h = model.hidden_size
    mlp_mats = 3 if model.gated_linear_unit else 2
    if model.is_moe:
        assert model.num_experts is not None
        return float(model.moe_topk * 2 * mlp_mats * h * model.expert_ffn_size
                     + 2 * h * model.num_experts  # router
                     + shared_expert_flops_per_token(model))
    return float(2 * mlp_mats * h * model.ffn_size)


def shared_expert_flops_per_token(model: ModelSpec) -> float:
    """An MoE layer's shared expert's forward FLOPs per token (moe/shared_experts.py): every
    token through one more MLP, and its gate's h x 1 GEMM; what `shared_experts` recompute runs
    again. 0 without a shared expert."""
    h = model.hidden_size
    mlp_mats = 3 if model.gated_linear_unit else 2
    return float(2 * mlp_mats * h * model.shared_expert_ffn_size
                 + (2 * h if model.moe_shared_expert_gate else 0))


def mla_down_flops_per_token(model: ModelSpec) -> float:
    """Multi-Latent Attention's down projections' forward FLOPs per token (linear_q_down_proj,
    h x q_lora_rank; linear_kv_down_proj, h x (kv_lora_rank + qk_pos_emb_head_dim)): the GEMMs
    Transformer Engine's spec runs whole on every tensor-parallel rank (TELinear 'duplicated',
    megatron-core 0.16.1 multi_latent_attention.py); 0 without MLA."""
    if not model.multi_latent_attention:
        return 0.0
    assert model.kv_lora_rank is not None and model.qk_pos_emb_head_dim is not None
    latent = (model.q_lora_rank or 0) + model.kv_lora_rank + model.qk_pos_emb_head_dim
    return float(2 * model.hidden_size * latent)


def mla_up_flops_per_token(model: ModelSpec) -> float:
    """Multi-Latent Attention's up projections' forward FLOPs per token
    (multi_latent_attention.py qkv_up_proj_and_rope_apply): the query from its latent
    (q_lora_rank; from h through linear_q_proj without one), heads of qk_dim; the keys' and
    values' from kv_lora_rank, heads of qk_head_dim + v_head_dim (the key's RoPE part comes out
    of the down projection, shared by heads). What `mla_up_proj` recompute runs again; 0
    without MLA."""
    if not model.multi_latent_attention:
        return 0.0
    assert model.kv_lora_rank is not None and model.qk_head_dim is not None
    n = model.num_attention_heads
    query = 2 * (model.q_lora_rank or model.hidden_size) * n * model.qk_dim
    return float(query + 2 * model.kv_lora_rank * n * (model.qk_head_dim + model.v_dim))


def _attention_forward_flops_per_token(model: ModelSpec) -> float:
    """The attention block's projections' forward FLOPs per token (core attention apart)."""
    h = model.hidden_size
    q = model.attention_width  # h unless the head dimension is the model's own (kv_channels)
    proj = 2 * q * h
    if model.multi_latent_attention:
        # multi_latent_attention.py: the down projections, then the up projections.
        return mla_down_flops_per_token(model) + mla_up_flops_per_token(model) + proj
    kv = model.query_groups * model.head_dim
    return float(2 * h * (q + 2 * kv) + proj)


def _layer_forward_flops_per_token(model: ModelSpec) -> tuple[float, float]:
    """(matrix-multiply FLOPs, core-attention FLOPs) of one layer's forward pass, per token."""
    mlp = mlp_forward_flops_per_token(model)
    # QK^T and scores x V: 2 * s * h each per token (Narayanan et al. 2021, 4 B s^2 h per layer),
    # h being the heads' total width there: the query/key heads' (qk_dim) for QK^T, the value
    # heads' (v_dim) for scores x V; the two differ with Multi-Latent Attention only.
    n = model.num_attention_heads
    core = 2 * model.seq_length * n * (model.qk_dim + model.v_dim)
    return float(_attention_forward_flops_per_token(model) + mlp), float(core)


def _all_layers_forward(model: ModelSpec) -> tuple[float, float]:
    """(matrix-multiply, core-attention) forward FLOPs per token of all the layers: with dense
    layers among the MoE layers (ModelSpec.moe_layer_freq), each kind's times its count."""
    if not model.has_dense_layers:
        mats, core = _layer_forward_flops_per_token(model)
        return model.num_layers * mats, model.num_layers * core
    dense, moe = model.layer_kinds(0, model.num_layers)
    dense_mats, dense_core = _layer_forward_flops_per_token(model.dense_layer_model)
    moe_mats, moe_core = _layer_forward_flops_per_token(model.moe_layer_model)
    return dense * dense_mats + moe * moe_mats, dense * dense_core + moe * moe_core


def logits_forward_flops_per_token(model: ModelSpec) -> float:
    """The output layer's forward FLOPs per token (2 h V), once per prediction depth: the
    main model's and each MTP layer's (megatron-core 0.16.1 gpt_model.py _postprocess runs
    output_layer on each MTP layer's hidden states)."""
    return float(2 * model.hidden_size * model.vocab_size * (1 + model.mtp_num_layers))


def mtp_forward_flops_per_token(model: ModelSpec) -> tuple[float, float]:
    """(matrix-multiply, core-attention) forward FLOPs per token of the Multi-Token Prediction
    layers, their output GEMMs apart (logits_forward_flops_per_token): each one transformer
    layer of the last layer's kind (ModelSpec.mtp_layer_model) and eh_proj, 2h x h
    (multi_token_prediction.py); Megatron-LM's num_floating_point_operations counts the same
    (training.py: the MTP layers among the layers of the last layer's kind, "MTP eh proj"
    2 h^2, and the logits x (mtp_num_layers + 1)). 0 without MTP."""
    n = model.mtp_num_layers
    if not n:
        return 0.0, 0.0
    mats, core = _layer_forward_flops_per_token(model.mtp_layer_model)
    return n * mats + eh_proj_forward_flops_per_token(model), n * core


def eh_proj_forward_flops_per_token(model: ModelSpec) -> float:
    """The MTP layers' eh_proj GEMMs' forward FLOPs per token: 2h x h each
    (multi_token_prediction.py MultiTokenPredictionLayer.eh_proj); 0 without MTP."""
    return float(model.mtp_num_layers * 2 * (2 * model.hidden_size) * model.hidden_size)


def forward_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token: all layers, the MTP layers and the output logits (2 h V per
    prediction depth)."""
    mats, core = _all_layers_forward(model)
    mtp_mats, mtp_core = mtp_forward_flops_per_token(model)
    return mats + core + mtp_mats + mtp_core + logits_forward_flops_per_token(model)


def model_flops_per_token(model: ModelSpec) -> float:
    """Training FLOPs per token without recompute (forward + backward = 3 forwards).

    This is the numerator of MFU (PaLM, Chowdhery et al. 2022, Appendix B): recomputation is
    work the hardware does, not work the model needs.
    """
    return 3 * forward_flops_per_token(model)


def hardware_flops_per_token(model: ModelSpec, recompute: str = "none") -> float:
    """FLOPs the GPUs execute per token, recomputation included.

    Full recompute repeats every layer's forward (eq. 3's 96 instead of 72); selective
    recompute repeats only core attention (Korthikanti et al. 2022, Section 5). The decoder's
    layers only: an MTP layer's recompute (multi_token_prediction.py _checkpointed_forward:
    with the uniform method, none with block) is not counted.
    """
    mats, core = _all_layers_forward(model)
    extra = 0.0
    if recompute == "full":
        extra = mats + core
    elif recompute == "selective":
        extra = core
    return model_flops_per_token(model) + extra


# ---- how fast a GEMM runs -----------------------------------------------------------------------
# The cost model's time for the layers' matrix multiplies and the fp8 lever's speed-up over bf16
# both read these; they sit here, below the levers and the models, so that neither imports the
# other for them.


class GemmSplit(Protocol):
    """What gemm_size reads of a layout (autotune.layouts.layout.Layout)."""

    @property
    def mbs(self) -> int: ...
    @property
    def tp(self) -> int: ...
    @property
    def cp(self) -> int: ...


class GemmFit(Protocol):
    """The saturating fit's constants (autotune.predict.cost.CostParams)."""

    @property
    def gemm_efficiency_max(self) -> float: ...
    @property
    def gemm_half_size(self) -> float: ...


def gemm_size(model: ModelSpec, layout: GemmSplit) -> float:
    """The x of gemm_efficiency for the layers' GEMMs: the smaller of the local tokens of a
    micro-batch (mbs * seq / cp) and the hidden size per tensor-parallel rank."""
    return min(layout.mbs * (model.seq_length / layout.cp), model.hidden_size / layout.tp)


GEMM_EFFICIENCY_MAX = 0.6657
"""Fraction of the dense bf16 peak that large GEMMs reach in training, as priced: the default of
CostParams.gemm_efficiency_max, fitted with the element-wise factors and step_overhead_s to all
of tests/data/measured_trials.json (results/benchmarks/2026-11-28-cpu-constants-refit-s15.md).
FP8's first-principles efficiency is a multiple of it (autotune.levers.fp8.Constants)."""


def gemm_efficiency(x: float, params: GemmFit) -> float:
    """Saturating fit eff_max * x / (x + x_half) (empirical, see CostParams.gemm_half_size)."""
    return params.gemm_efficiency_max * x / (x + params.gemm_half_size)
