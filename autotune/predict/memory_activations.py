"""Activation memory of one transformer layer and the micro-batches a pipeline stage holds.

Source: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Section 4. Per layer and micro-batch, in bytes (bf16 activations, 1-byte dropout masks):
    no parallelism          s b h (34 + 5 a s / h)                       (eq. 1)
    tensor parallel t       s b h (10 + 24/t + 5 a s / (h t))            (eq. 2)
    TP + sequence parallel  s b h (34/t + 5 a s / (h t))                 (eq. 3)
    selective recompute     drops the 5 a s / h term                     (eq. 4)
      of other modules      megatron-core 0.16.1's recompute_modules: what each module's
                            checkpoint frees, counted from the same tensors (MODULE_SAVINGS)
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

from autotune.specs.model import ModelSpec

__all__ = [
    "DEFAULT_DROPOUT",
    "LOCAL_SOFTMAX_SAVED_BYTES",
    "LayerActivations",
    "full_recompute_chunk",
    "inflight_microbatches",
    "layer_activations",
    "layer_bytes",
    "module_savings",
    "offloaded_layers",
    "recomputed_share",
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


def _dropout(model: ModelSpec, name: str) -> float:
    value = getattr(model, name, DEFAULT_DROPOUT)
    return float(value) if value is not None else DEFAULT_DROPOUT


@functools.lru_cache(maxsize=4096)
def layer_activations(model: ModelSpec, tp: int, impl: str,
                      linear_input_bytes: float = 2.0) -> LayerActivations:
    """Per-token stored bytes of one layer (Korthikanti et al. 2022, Section 4.1, generalized).

    `linear_input_bytes`: bytes per element of the inputs the GEMMs save for backward (the QKV,
    projection, fc1 and fc2 inputs, the experts' too): bf16's 2, or Transformer Engine's FP8
    byte and scales (autotune.levers.fp8, TE 2.11 linear.py / layernorm_linear.py /
    grouped_linear.py save their quantized input). Every other tensor keeps its bytes."""
    h = model.hidden_size
    t = tp
    e = linear_input_bytes
    # KV heads replicate when tp > num_query_groups (TransformerConfig: groups divide or are a
    # multiple of tp), so a rank holds max(1, g/t) KV heads.
    kv_rank = model.head_dim * max(1, model.query_groups // t)
    a_rank = model.num_attention_heads / t
    hidden_mask = 1.0 if _dropout(model, "hidden_dropout") > 0 else 0.0
    attn_mask = 1.0 if _dropout(model, "attention_dropout") > 0 else 0.0
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

    if impl == "local":
        # Unfused core attention: softmax output (fp32 without the fused kernel), dropout mask
        # (1 B) and dropout output (2 B, input of scores x V) per score: a s^2 b (4 + 1 + 2).
        per_key = a_rank * (LOCAL_SOFTMAX_SAVED_BYTES + attn_mask + 2)
        # Forward workspace beyond what the layer stores: megatron-core's
        # fusions/fused_softmax.py forward_torch_softmax holds the bf16 scores (2, the caller's
        # `attention_scores`, alive until DotProductAttention.forward returns) and their fp32
        # copy (4) while softmax writes its fp32 output; that output is the tensor
        # SoftmaxBackward saves, already counted in per_key's LOCAL_SOFTMAX_SAVED_BYTES. Later
        # the copy is freed and the bf16 probs (2) live until dropout: max(2 + 4, 2 + 2) = 6.
        # (Counting the fp32 output here too put full recompute of the local spec ~3 GiB high
        # at gpt2-xl mbs 32, where one layer's s^2 terms dominate: s3-xl-search/2.)
        transient = a_rank * (2 + 4)
        recomputable = 0.0
    else:
        # Flash attention (SDPA flash backend, TE/cuDNN fused attention) keeps Q, K, V, the
        # output and the fp32 log-sum-exp per head; dropout is regenerated from the RNG state.
        per_key = 0.0
        transient = 0.0
        recomputable = 4 * a_rank
    return LayerActivations(replicated=replicated, split=split + recomputable, per_key=per_key,
                            transient_per_key=transient, attn_recomputable=recomputable,
                            dropout_mask=hidden_mask, norm_outputs=e * h + e * h,
                            mlp_internal=mlp_internal, moe_act_output=moe_act,
                            moe_replicated=moe_replicated, moe_split=moe_split)


def module_savings(acts: LayerActivations, modules: tuple[str, ...], *, seq: float, tp: int,
                   sequence_parallel: bool) -> float:
    """Bytes per token of one layer that selective recompute of `modules` does not store.

    core_attn: Korthikanti et al. 2022 eq. 4 (the 5 a s / h term; with flash attention only the
    log-sum-exp, which is why megatron-core warns that fused attention needs no core_attn
    recompute). The others free what their checkpoint's region saves beyond its input
    (LayerActivations fields). `moe` frees the experts' internals, moe_act's output among them.
    """
    sp = tp if sequence_parallel else 1
    saved = 0.0
    if "core_attn" in modules:
        saved += seq * acts.per_key + acts.attn_recomputable
    if "layernorm" in modules:
        saved += acts.norm_outputs / sp
    if "mlp" in modules:
        saved += acts.mlp_internal
    if "moe" in modules:
        saved += acts.moe_replicated / sp + acts.moe_split
    elif "moe_act" in modules:
        saved += acts.moe_act_output
    return saved


def module_workspace(acts: LayerActivations, modules: tuple[str, ...]) -> float:
    """Bytes per token rebuilt at once in backward: the largest recomputed region of one
    layer (checkpoints rerun one region, then free it)."""
    regions = [0.0]
    if "mlp" in modules:
        regions.append(acts.mlp_internal)
    if "moe" in modules:
        regions.append(acts.moe_replicated + acts.moe_split)
    return max(regions)


def layer_bytes(acts: LayerActivations, *, tokens: float, seq: float, tp: int,
                sequence_parallel: bool, modules: tuple[str, ...] = ()) -> float:
    """Stored bytes of one layer for `tokens` local tokens of local sequence length `seq`,
    with selective recompute of `modules` (none: every activation stored)."""
    replicated = acts.replicated / tp if sequence_parallel else acts.replicated
    stored = replicated + acts.split + seq * acts.per_key
    if modules:
        stored -= module_savings(acts, modules, seq=seq, tp=tp,
                                 sequence_parallel=sequence_parallel)
    return tokens * stored


def offloaded_layers(layers: int, offload_layers: int) -> tuple[int, int]:
    """(offloaded, kept on the GPU) layers of a chunk with TE's layer-level CPU offload.

    Transformer Engine's double-buffered offload (transformer_engine/pytorch/cpu_offload.py,
    AsyncDoubleBufferGroupOffloadHandler, which megatron-core's get_cpu_offload_context wraps)
    copies a layer's saved tensors to pinned host memory while the next layer runs and frees
    them once the copy is done, and in backward reloads a layer while the one after it runs:
    one offloaded layer's tensors are on the GPU at a time besides the layers it keeps.
    """
    offloaded = min(offload_layers, layers)
    return offloaded, layers - offloaded + (1 if offloaded else 0)


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
