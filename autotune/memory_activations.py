"""Activation memory of one transformer layer and the micro-batches a pipeline stage holds.

Source: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Section 4. Per layer and micro-batch, in bytes (bf16 activations, 1-byte dropout masks):
    no parallelism          s b h (34 + 5 a s / h)                       (eq. 1)
    tensor parallel t       s b h (10 + 24/t + 5 a s / (h t))            (eq. 2)
    TP + sequence parallel  s b h (34/t + 5 a s / (h t))                 (eq. 3)
    selective recompute     drops the 5 a s / h term                     (eq. 4)
    full recompute          keeps the layer input, 2 s b h (/t with SP)  (Section 4.3)
We count the same tensors one by one (Section 4.1) so that GQA, gated / non-4h MLPs, top-k MoE,
context parallelism and flash attention are covered; for an MHA GPT with a 4h GeLU MLP and
Megatron's fused softmax this reproduces the paper's equations exactly (tests check it).
Pure arithmetic: no torch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from autotune.model import ModelSpec

__all__ = [
    "DEFAULT_DROPOUT",
    "LOCAL_SOFTMAX_SAVED_BYTES",
    "LayerActivations",
    "full_recompute_chunk",
    "inflight_microbatches",
    "layer_activations",
    "layer_bytes",
]

DEFAULT_DROPOUT = 0.1
"""megatron/core/transformer/transformer_config.py: hidden_dropout = attention_dropout = 0.1,
also ModelSpec's default; the Llama and Mixtral presets set 0 (no dropout masks kept)."""

LOCAL_SOFTMAX_SAVED_BYTES = 4
"""Bytes per attention score that the local spec's softmax saves for backward.
megatron-core's FusedScaleMaskSoftmax uses the fused kernel only when masked_softmax_fusion is set
(default False, transformer_config.py) and the apex/TE kernel is installed; otherwise
`forward_torch_softmax` upcasts to fp32 (attention_softmax_in_fp32=True) and torch's softmax saves
its fp32 output. The paper's 5 a s^2 b assumes the fused kernel (2 bytes): 2 + 1 mask + 2."""


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


def _dropout(model: ModelSpec, name: str) -> float:
    value = getattr(model, name, DEFAULT_DROPOUT)
    return float(value) if value is not None else DEFAULT_DROPOUT


@functools.lru_cache(maxsize=4096)
def layer_activations(model: ModelSpec, tp: int, impl: str) -> LayerActivations:
    """Per-token stored bytes of one layer (Korthikanti et al. 2022, Section 4.1, generalized)."""
    h = model.hidden_size
    t = tp
    # KV heads replicate when tp > num_query_groups (TransformerConfig: groups divide or are a
    # multiple of tp), so a rank holds max(1, g/t) KV heads.
    kv_rank = model.head_dim * max(1, model.query_groups // t)
    a_rank = model.num_attention_heads / t
    hidden_mask = 1.0 if _dropout(model, "hidden_dropout") > 0 else 0.0
    attn_mask = 1.0 if _dropout(model, "attention_dropout") > 0 else 0.0
    gates = 2 if model.gated_linear_unit else 1

    # Section 4.1, attention block: LayerNorm input 2h, shared QKV input 2h, dropout mask h after
    # the output projection (all replicated over TP without SP: the "10" of eq. 2 with the MLP's).
    replicated = 2 * h + 2 * h + hidden_mask * h
    # Q (2h) and K (2h for MHA, 2 kv for GQA) for QK^T, V for scores x V, output-projection input.
    split = 2 * h / t + 2 * kv_rank + 2 * kv_rank + 2 * h / t
    # MLP block: LayerNorm input 2h, fc1 input 2h, dropout mask h (replicated)...
    replicated += 2 * h + 2 * h + hidden_mask * h
    if model.is_moe:
        assert model.num_experts is not None
        k, fe = model.moe_topk, model.expert_ffn_size
        # Each token is permuted to k experts: the expert fc1 input (k x 2h) and the expert output
        # kept for the probability-weighted unpermute (k x 2h); router logits and probs in fp32.
        replicated += k * 4 * h + 2 * 4 * model.num_experts
        split += k * (2 * gates * fe / t + 2 * fe / t)
    else:
        # ...activation input (fc1 output, 2f, or 2 x 2f gated for SwiGLU) and fc2 input (2f):
        # 8h + 8h = the paper's 16h of the GeLU for f = 4h.
        f = model.ffn_size
        split += 2 * gates * f / t + 2 * f / t

    if impl == "local":
        # Unfused core attention: softmax output (fp32 without the fused kernel), dropout mask
        # (1 B) and dropout output (2 B, input of scores x V) per score: a s^2 b (4 + 1 + 2).
        per_key = a_rank * (LOCAL_SOFTMAX_SAVED_BYTES + attn_mask + 2)
        # Forward workspace: bf16 scores (2) + fp32 copy (4) + fp32 softmax output (4) alive
        # together in DotProductAttention.forward / forward_torch_softmax.
        transient = a_rank * (2 + 4 + 4)
        recomputable = 0.0
    else:
        # Flash attention (SDPA flash backend, TE/cuDNN fused attention) keeps Q, K, V, the
        # output and the fp32 log-sum-exp per head; dropout is regenerated from the RNG state.
        per_key = 0.0
        transient = 0.0
        recomputable = 4 * a_rank
    return LayerActivations(replicated=replicated, split=split + recomputable, per_key=per_key,
                            transient_per_key=transient, attn_recomputable=recomputable,
                            dropout_mask=hidden_mask)


def layer_bytes(acts: LayerActivations, *, tokens: float, seq: float, tp: int,
                sequence_parallel: bool, selective: bool) -> float:
    """Stored bytes of one layer for `tokens` local tokens of local sequence length `seq`."""
    replicated = acts.replicated / tp if sequence_parallel else acts.replicated
    if selective:
        # Korthikanti et al. 2022 eq. 4: selective recompute drops the core-attention term.
        return tokens * (replicated + acts.split - acts.attn_recomputable)
    return tokens * (replicated + acts.split + seq * acts.per_key)


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


def recomputed_share(layers: int, *, method: str, num_layers: int) -> float:
    """The share of a chunk's `layers` layers whose forward full recompute runs again.

    megatron/core/transformer/transformer_block.py, _checkpointed_forward: `uniform` checkpoints
    groups of num_layers layers, so every layer is recomputed; `block` checkpoints the first
    num_layers layers of the chunk and runs the rest normally.
    """
    n = max(1, min(num_layers, layers))
    return n / layers if method == "block" else 1.0


def full_recompute_chunk(layers: int, *, method: str, num_layers: int, full: float,
                         layer_input: float) -> tuple[float, float]:
    """(stored, recompute workspace) bytes of one chunk of `layers` layers, one micro-batch.

    megatron/core/transformer/transformer_block.py, _checkpointed_forward: `uniform` checkpoints
    groups of num_layers layers and keeps each group's input; `block` checkpoints the first
    num_layers layers one by one and stores the rest in full. During backward one checkpointed
    unit's activations are rebuilt (the workspace).
    """
    n = max(1, min(num_layers, layers))
    if method == "block":
        return n * layer_input + (layers - n) * full, full
    return math.ceil(layers / n) * layer_input, n * full
