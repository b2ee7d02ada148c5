"""Activation memory of one transformer layer and the micro-batches a pipeline stage holds.

Source: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Section 4. Per layer and micro-batch, in bytes (bf16 activations, 1-byte dropout masks):
    no parallelism          s b h (34 + 5 a s / h)                       (eq. 1)
    tensor parallel t       s b h (10 + 24/t + 5 a s / (h t))            (eq. 2)
    TP + sequence parallel  s b h (34/t + 5 a s / (h t))                 (eq. 3)
    selective recompute     drops the 5 a s / h term                     (eq. 4)
      of other modules      megatron-core 0.16.1's recompute_modules: what each module's
                            checkpoint frees, counted from the same tensors
    full recompute          keeps the layer input, 2 s b h (/t with SP)  (Section 4.3)
We count the same tensors one by one (Section 4.1) so that GQA, gated / non-4h MLPs, top-k MoE,
context parallelism and flash attention are covered; for an MHA GPT with a 4h GeLU MLP and
Megatron's fused softmax this reproduces the paper's equations exactly (tests check it).
What the levers change lives in their modules: the 5 a s^2 b attention term by implementation
(autotune.levers.transformer_impl), the bytes of saved GEMM inputs (autotune.levers.fp8),
selective and full recompute (eq. 4, Section 4.3: autotune.levers.recompute) and CPU offload
(autotune.levers.activation_offload). Pure arithmetic: no torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.specs.model import ModelSpec

if TYPE_CHECKING:
    from autotune.levers.base import AttentionBytes

__all__ = [
    "DEFAULT_DROPOUT",
    "LayerActivations",
    "dropout_rate",
    "inflight_microbatches",
    "layer_activations",
    "layer_bytes",
]

DEFAULT_DROPOUT = 0.1
"""megatron/core/transformer/transformer_config.py: hidden_dropout = attention_dropout = 0.1,
also ModelSpec's default; the Llama and Mixtral presets set 0 (no dropout masks kept)."""

@dataclass(frozen=True, slots=True)
class LayerActivations:
    """Bytes stored per token of one layer on one tensor-parallel rank, split by how they shard.

    `replicated` is divided by t only with sequence parallelism; `split` is already per rank;
    `per_key` multiplies the local sequence length (the s^2 attention term, per token);
    `transient_per_key` is the attention workspace alive while one layer runs (local spec).
    """

    replicated: float
    split: float
    per_key: float
    transient_per_key: float
    attn_recomputable: float
    """Bytes per token that selective recompute of core attention frees (besides per_key)."""
    dropout_mask: float
    """Bytes per hidden element of a hidden-dropout mask: 1, or 0 without dropout."""
    norm_outputs: float = 0.0
    """Replicated bytes per token of the two norms' outputs (the QKV and fc1 inputs, 2h each),
    which `layernorm` recompute discards (transformer_layer.py: CheckpointWithoutOutput keeps
    the norm's input, the residual, which is stored anyway)."""
    mlp_internal: float = 0.0
    """Split bytes per token inside a dense MLP (activation input and fc2 input), which `mlp`
    recompute frees: its checkpoint keeps only the MLP input (the fc1 input, counted above)."""
    moe_act_output: float = 0.0
    """Split bytes per token of the experts' activation output (the expert fc2 input), which
    `moe_act`'s output-discarding checkpoint frees (experts.py)."""
    moe_replicated: float = 0.0
    """Replicated bytes per token inside an MoE layer (permuted tokens, router state) that `moe`
    recompute frees along with the experts' internals (moe_layer.py checkpoints the layer)."""
    moe_split: float = 0.0
    """Split bytes per token of the experts' internals (fc1 output, activation output)."""


def dropout_rate(model: ModelSpec, name: str) -> float:
    """The model's `hidden_dropout` or `attention_dropout` (megatron-core's 0.1 if unset)."""
    value = getattr(model, name, DEFAULT_DROPOUT)
    return float(value) if value is not None else DEFAULT_DROPOUT


@functools.lru_cache(maxsize=4096)
def layer_activations(model: ModelSpec, tp: int, attention: AttentionBytes,
                      linear_input_bytes: float = 2.0) -> LayerActivations:
    """Per-token stored bytes of one layer (Korthikanti et al. 2022, Section 4.1, generalized).

    `attention`: what core attention keeps per score and head, by implementation
    (autotune.levers.transformer_impl.attention_bytes). `linear_input_bytes`: bytes per element
    of the inputs the GEMMs save for backward (the QKV, projection, fc1 and fc2 inputs, the
    experts' too): bf16's 2, or Transformer Engine's FP8 byte and scales (autotune.levers.fp8,
    TE 2.11 linear.py / layernorm_linear.py / grouped_linear.py save their quantized input).
    Every other tensor keeps its bytes."""
    h = model.hidden_size
    t = tp
    e = linear_input_bytes
    # KV heads replicate when tp > num_query_groups (TransformerConfig: groups divide or are a
    # multiple of tp), so a rank holds max(1, g/t) KV heads.
    kv_rank = model.head_dim * max(1, model.query_groups // t)
    a_rank = model.num_attention_heads / t
    hidden_mask = 1.0 if dropout_rate(model, "hidden_dropout") > 0 else 0.0
    gates = 2 if model.gated_linear_unit else 1

    # Section 4.1, attention block: LayerNorm input 2h, shared QKV input 2h, dropout mask h after
    # the output projection (all replicated over TP without SP: the "10" of eq. 2 with the MLP's).
    replicated = 2 * h + e * h + hidden_mask * h
    # Q (2h) and K (2h for MHA, 2 kv for GQA) for QK^T, V for scores x V, output-projection input.
    split = 2 * h / t + 2 * kv_rank + 2 * kv_rank + e * h / t
    # MLP block: LayerNorm input 2h, fc1 input 2h, dropout mask h (replicated)...
    replicated += 2 * h + e * h + hidden_mask * h
    mlp_internal = moe_act = moe_replicated = moe_split = 0.0
    if model.is_moe:
        assert model.num_experts is not None
        k, fe = model.moe_topk, model.expert_ffn_size
        # Each token is permuted to k experts: the expert fc1 input (k x 2h) and the expert output
        # kept for the probability-weighted unpermute (k x 2h); router logits and probs in fp32.
        moe_replicated = k * (e + 2) * h + 2 * 4 * model.num_experts
        moe_split = k * (2 * gates * fe / t + e * fe / t)
        moe_act = k * e * fe / t
        replicated += moe_replicated
        split += moe_split
    else:
        # ...activation input (fc1 output, 2f, or 2 x 2f gated for SwiGLU) and fc2 input (2f):
        # 8h + 8h = the paper's 16h of the GeLU for f = 4h.
        f = model.ffn_size
        mlp_internal = 2 * gates * f / t + e * f / t
        split += mlp_internal

    # Core attention's a s^2 b term (per key of the local sequence), its workspace while the
    # layer runs, and what a fused kernel saves instead: the implementation's.
    per_key = a_rank * attention.saved_per_score
    transient = a_rank * attention.workspace_per_score
    recomputable = attention.saved_per_head * a_rank
    return LayerActivations(replicated=replicated, split=split + recomputable, per_key=per_key,
                            transient_per_key=transient, attn_recomputable=recomputable,
                            dropout_mask=hidden_mask, norm_outputs=e * h + e * h,
                            mlp_internal=mlp_internal, moe_act_output=moe_act,
                            moe_replicated=moe_replicated, moe_split=moe_split)


def layer_bytes(acts: LayerActivations, *, tokens: float, seq: float, tp: int,
                sequence_parallel: bool, freed: float = 0.0) -> float:
    """Stored bytes of one layer for `tokens` local tokens of local sequence length `seq`,
    less `freed` bytes per token that a selective recompute does not store
    (autotune.levers.recompute.module_savings; 0: every activation stored)."""
    replicated = acts.replicated / tp if sequence_parallel else acts.replicated
    stored = replicated + acts.split + seq * acts.per_key
    stored -= freed
    return tokens * stored


def inflight_microbatches(*, pp: int, vpp: int, stage: int, num_microbatches: int) -> float:
    """Micro-batches of one whole stage (all its chunks) whose activations a stage holds.

    1F1B (Narayanan et al. 2021, Section 2.2.1): stage i runs pp - i - 1 warm-up forwards
    before its first backward, so it holds min(pp - i, m) micro-batches. Interleaved 1F1B
    (megatron/core/pipeline_parallel/schedules.py, get_pp_rank_microbatches): 2 (pp - i - 1) +
    (vpp - 1) pp warm-up chunk forwards, + 1 in flight, capped at m vpp chunks; a chunk holds
    1/vpp of the stage's layers. For stage 0 that is pp + (pp - 1)/vpp stage-micro-batches, i.e.
    Korthikanti et al. 2022 Section 4.2.3's factor (1 + (p - 1)/(p v)) on p micro-batches.
    Without pipelining each micro-batch runs forward then backward: 1.
    """
    if pp == 1:
        return 1.0
    if vpp == 1:
        return float(min(pp - stage, num_microbatches))
    chunks = min(2 * (pp - stage - 1) + (vpp - 1) * pp + 1, num_microbatches * vpp)
    return chunks / vpp
