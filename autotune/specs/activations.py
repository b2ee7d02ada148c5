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
Megatron's fused softmax this reproduces the paper's equations exactly (tests check it). Beyond
the paper, what megatron-core 0.16.1 keeps of a RoPE model's query, key and value (`qkv_extra`:
the QKV GEMM's output behind the value's view, GQA's repeated key and value) and RoPE's cos and
sin tables (`rope_table_bytes`).
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
    "mla_fused_norm_bytes",
    "mla_latent_bytes",
    "qkv_extra",
    "rope_table_bytes",
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
    shared_split: float = 0.0
    """Split bytes per token of the shared expert's internals (fc1 output, fc2 input), among
    moe_split: what `shared_experts` recompute frees (moe_layer.py checkpoints the module)."""
    shared_replicated: float = 0.0
    """Replicated bytes per token the shared expert keeps beyond its input, among
    moe_replicated (its gate's factors; under FP8's delayed recipe its fc1's quantized input):
    freed by `shared_experts` recompute too."""
    mla_qkv: float = 0.0
    """Split bytes per token of Multi-Latent Attention's query, key and value (among `split`):
    the up projections' region's outputs, whose storage `mla_up_proj` recompute empties once
    core attention has saved them (multi_latent_attention.py, CheckpointWithoutOutput)."""
    mla_fused_norms: float = 0.0
    """Replicated bytes per token that Transformer Engine's fused latent norm and up projection
    keep beyond their input (the norm's fp32 statistics and output), among `replicated`: inside
    mla_up_proj's checkpoint with impl te only (gpt_layer_specs.py fuses q_layernorm and
    kv_layernorm into linear_q_up_proj and linear_kv_up_proj there)."""
    qkv_extra: float = 0.0
    """Split bytes per token kept of the query, key and value beyond Q, K and V once each
    (`qkv_extra`): memory, not traffic, so not among `split` (the cost model's element-wise
    bytes read it)."""
    per_position: float = 0.0
    """Bytes per position of the local sequence, whatever the micro-batch size: RoPE's cos and
    sin tables (`rope_table_bytes`)."""


def dropout_rate(model: ModelSpec, name: str) -> float:
    """The model's `hidden_dropout` or `attention_dropout` (megatron-core's 0.1 if unset)."""
    value = getattr(model, name, DEFAULT_DROPOUT)
    return float(value) if value is not None else DEFAULT_DROPOUT


@functools.lru_cache(maxsize=4096)
def layer_activations(model: ModelSpec, tp: int, attention: AttentionBytes,
                      linear_input_bytes: float = 2.0, *,
                      proj_saves_original: bool = False) -> LayerActivations:
    """Per-token stored bytes of one layer (Korthikanti et al. 2022, Section 4.1, generalized).

    `attention`: what core attention keeps per score and head, by implementation
    (autotune.levers.transformer_impl.attention_bytes). `linear_input_bytes`: bytes per element
    of the inputs the GEMMs save for backward (the QKV, projection, fc1 and fc2 inputs, the
    experts' too): bf16's 2, or Transformer Engine's FP8 byte and scales (autotune.levers.fp8,
    TE 2.11 linear.py / layernorm_linear.py / grouped_linear.py save their quantized input).
    Every other tensor keeps its bytes. `proj_saves_original`: the attention output projection
    saves its bf16 input instead (TE's save_original_input, which megatron-core sets for FP8
    recipes other than delayed: autotune.levers.fp8)."""
    h = model.hidden_size
    t = tp
    e = linear_input_bytes
    # KV heads replicate when tp > num_query_groups (TransformerConfig: groups divide or are a
    # multiple of tp), so a rank holds max(1, g/t) KV heads.
    groups_rank = max(1, model.query_groups // t)
    q = model.attention_width  # the query's and attention output's width (h but for kv_channels)
    a_rank = model.num_attention_heads / t
    # Q's and K's heads are qk_dim wide, V's v_dim: head_dim both but with Multi-Latent
    # Attention (whose keys and values are per head: groups_rank = a_rank there).
    q_in = a_rank * model.qk_dim
    k_in, v_in = groups_rank * model.qk_dim, groups_rank * model.v_dim
    hidden_mask = 1.0 if dropout_rate(model, "hidden_dropout") > 0 else 0.0
    gates = 2 if model.gated_linear_unit else 1

    # Section 4.1, attention block: LayerNorm input 2h, shared QKV input 2h, dropout mask h after
    # the output projection (all replicated over TP without SP: the "10" of eq. 2 with the MLP's).
    replicated = 2 * h + e * h + hidden_mask * h + mla_latent_bytes(model, e)
    # Q (2h) and K (2h for MHA, 2 kv for GQA) for QK^T, V for scores x V, output-projection input
    # (bf16, 2 h/t, where the projection saves its original input).
    split = 2 * q_in + 2 * k_in + 2 * v_in + (2 if proj_saves_original else e) * q / t
    # A kernel that saves its output (flash, cuDNN fused) shares it with the projection in
    # bf16; a projection that quantizes its input (FP8) saves its own copy and the kernel's
    # bf16 output stays too (out_copy): TE 2.11 backends.py FusedAttnFunc.forward saves
    # (q, k, v, out) when the attention itself is not FP8 (megatron-core's default
    # fp8_dot_product_attention=False), and module/linear.py saves the quantized `inputmat`,
    # not `inp`. Freed with the kernel's other saved tensors by core_attn recompute. Not where
    # the projection saves its original input (megatron-core 0.16.1 attention.py,
    # set_save_original_input(self.linear_proj) for FP8 recipes other than delayed): that is
    # the kernel's output itself, one tensor, and the projection keeps it through a core_attn
    # checkpoint too (measured: s16-l8b4-search/14 and /67, tensorwise with core_attn
    # recompute, were 1.1 and 0.6 GiB under without it).
    out_copy = 2 * q / t if attention.saves_output and e != 2.0 and not proj_saves_original \
        else 0.0
    split += out_copy
    # MLP block: LayerNorm input 2h, fc1 input 2h, dropout mask h (replicated)...
    replicated += 2 * h + e * h + hidden_mask * h
    mlp_internal = moe_act = moe_replicated = moe_split = shared_split = shared_replicated = 0.0
    if model.is_moe:
        assert model.num_experts is not None
        k, fe = model.moe_topk, model.expert_ffn_size
        # Each token is permuted to k experts: the expert fc1 input (k x 2h) and the expert output
        # kept for the probability-weighted unpermute (k x 2h); router logits and probs in fp32.
        moe_replicated = k * (e + 2) * h + 2 * 4 * model.num_experts
        moe_split = k * (2 * gates * fe / t + e * fe / t)
        moe_act = k * e * fe / t
        # A shared expert (moe/shared_experts.py) is a dense MLP on the same norm output the
        # router reads (kept above): its fc1 output and fc2 input, as the dense MLP's below;
        # its gate multiplies the MLP's output by sigmoid(x . w), keeping both factors (2h + 2).
        # In the MoE layer, so `moe` recompute frees it; `moe_act` is the routed experts' only.
        # Under FP8 its fc1 keeps a quantized copy of that input too, but for the recipes that
        # make it save the original (shared_experts.py: set_save_original_input where the
        # recipe is not delayed, the projection's condition above).
        fs = model.shared_expert_ffn_size
        shared_split = 2 * gates * fs / t + e * fs / t
        if fs and e != 2 and not proj_saves_original:
            shared_replicated += e * h
        if model.moe_shared_expert_gate:
            shared_replicated += 2 * h + 2
        moe_split += shared_split
        moe_replicated += shared_replicated
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
    lse = attention.saved_per_head * a_rank
    # What the layer keeps of Q, K and V beyond the count above, and what a checkpointed core
    # attention (selective recompute of core_attn) keeps instead: what that recompute frees.
    extra = qkv_extra(model, t, attention)
    recomputable = lse + out_copy + extra - qkv_extra(model, t, attention, checkpointed=True)
    return LayerActivations(replicated=replicated, split=split + lse, per_key=per_key,
                            transient_per_key=transient, attn_recomputable=recomputable,
                            dropout_mask=hidden_mask, norm_outputs=e * h + e * h,
                            mlp_internal=mlp_internal, moe_act_output=moe_act,
                            moe_replicated=moe_replicated, moe_split=moe_split,
                            shared_split=shared_split, shared_replicated=shared_replicated,
                            mla_qkv=(2 * q_in + 2 * k_in + 2 * v_in
                                     if model.multi_latent_attention else 0.0),
                            mla_fused_norms=mla_fused_norm_bytes(model, e),
                            qkv_extra=extra, per_position=rope_table_bytes(model))


def mla_latent_bytes(model: ModelSpec, linear_input_bytes: float = 2.0) -> float:
    """Bytes per token that Multi-Latent Attention keeps of its latents (whole on every
    tensor-parallel rank: divided by t with sequence parallelism only); 0 without MLA.

    megatron-core 0.16.1 multi_latent_attention.py get_query_key_value_tensors: the query's
    down projection writes q_compressed [s, b, q_lora_rank] (gathered whole on each rank), the
    key and value's writes kv_combined [s, b, kv_lora_rank + qk_pos_emb_head_dim], split by
    views into kv_compressed and the key's RoPE part. With qk_layernorm each latent goes
    through its norm, which saves its input and fp32 statistics per token (RMSNorm's rstd,
    LayerNorm's mean and rstd), and the up projection saves the norm's output (FP8: its
    quantized copy, `linear_input_bytes`). kv_compressed is a view: the norm (or the up
    projection without norms) keeps all of kv_combined. RoPE keeps only its cos and sin
    (`rope_table_bytes`); the up projections' outputs are split into views and concatenated
    into new query, key and value tensors, which are core attention's (counted there), so
    those outputs are freed. Counted on CPU against one megatron-core layer (sdpa):
    tools/saved_tensors.py --mla, results/benchmarks/2026-11-29-cpu-mla-s23.md."""
    if not model.multi_latent_attention:
        return 0.0
    assert model.kv_lora_rank is not None and model.qk_pos_emb_head_dim is not None
    e = linear_input_bytes
    stats = 4.0 if model.normalization == "RMSNorm" else 8.0
    q_rank, kv_rank = model.q_lora_rank, model.kv_lora_rank
    combined = 2.0 * (kv_rank + model.qk_pos_emb_head_dim)
    if model.qk_layernorm:
        query = 2 * q_rank + stats + e * q_rank if q_rank else 0.0
        return query + combined + stats + e * kv_rank
    query = e * q_rank if q_rank else 0.0
    # The up projection saves kv_compressed itself, the view, in bf16; FP8 a quantized copy.
    return query + (combined if e == 2.0 else e * kv_rank)


def mla_fused_norm_bytes(model: ModelSpec, linear_input_bytes: float = 2.0) -> float:
    """Bytes per token of mla_latent_bytes that the latent norms add beyond their inputs (fp32
    statistics, the up projections' saved input): what a checkpoint of the up projections frees
    where Transformer Engine fuses each norm into its up projection (TELayerNormColumnParallel-
    Linear keeps its input, the statistics and the norm's output; the checkpoint keeps the
    input alone). 0 without MLA or without qk_layernorm."""
    if not model.multi_latent_attention or not model.qk_layernorm:
        return 0.0
    assert model.kv_lora_rank is not None
    stats = 4.0 if model.normalization == "RMSNorm" else 8.0
    e = linear_input_bytes
    query = stats + e * model.q_lora_rank if model.q_lora_rank else 0.0
    return query + stats + e * model.kv_lora_rank


def qkv_extra(model: ModelSpec, tp: int, attention: AttentionBytes, *,
              checkpointed: bool = False) -> float:
    """Bytes per token that one rank keeps of a layer's query, key and value for backward beyond
    Q, K and V once each (Section 4.1's 2h, 2 kv and 2 kv per token; kv = head_dim x the rank's
    key/value groups).

    megatron-core 0.16.1 (attention.py, get_query_key_value_tensors) computes all three with one
    GEMM and splits its output [s, b, (h + 2 kv)/t] into views (torch.split; the query's reshape
    to heads copies it with GQA). RoPE replaces the query and the key by new tensors
    (models/common/embeddings/rope_utils.py, _apply_rotary_pos_emb_bshd ends in torch.cat;
    TE's fused kernel, run with impl te, writes new tensors too), the value stays a view, and a
    saved view keeps the whole GEMM output alive. So a kernel that keeps its inputs as given
    (`AttentionBytes.qkv_as_given`: local, sdpa) keeps, for an MHA RoPE model, RoPE's query and
    key and the GEMM output: 2h + 2 kv more than counted (Llama 2 13B: 4h); with GQA the key
    and value repeated for every head (dot_product_attention.py, SdpaAttention:
    repeat_interleave; 2h each, the GEMM output freed): 4h - 4 kv more. Transformer Engine
    keeps Q, K and V once (its own layout or a copy into one: get_qkv_layout). A checkpointed
    core attention (`checkpointed`: tensor_parallel.checkpoint saves its inputs) keeps RoPE's
    query and key and the value's view, whatever the implementation. Without RoPE a GPT's
    query, key and value are views of the GEMM output, which is what Section 4.1 counts.

    Counted: tools/saved_tensors.py adds up what one megatron-core layer saves on CPU (the
    worker's sdpa spec); the model is within 0.1% of it with this term, 13-15% short without.
    Measured (tests/data/measured_trials.json, the block-recompute series of sdpa Llama models;
    results/benchmarks/2026-11-27-cpu-activation-slope.md): the peak allocated per layer not
    recomputed was 14% over the model without this term for llama2-13b (MHA) and 10-11% over
    for llama3-8b and Llama-3.2-3B (GQA); with it and the RoPE tables each is within 0.5%.
    """
    if model.multi_latent_attention:
        # MLA's query, key and value are new contiguous tensors (torch.cat, .contiguous():
        # multi_latent_attention.py qkv_up_proj_and_rope_apply), one key and value per head:
        # any kernel, or a checkpoint, keeps them as they are, once each (mla_latent_bytes).
        return 0.0
    d = model.head_dim
    heads, groups = model.num_attention_heads / tp, max(1, model.query_groups // tp)
    q = 2 * heads * d  # bf16 query, or a key or value repeated per head
    kv = 2.0 * groups * d
    output: float
    if model.query_groups < tp:
        # Each rank gathers the whole GEMM output and slices its groups out of it (attention.py,
        # all_gather_last_dim_from_tensor_parallel_region): the views hold all of it.
        output = 2 * (model.num_attention_heads + 2 * model.query_groups) * d
    else:
        output = q + 2 * kv
    rope = model.position_embedding == "rope"
    # RoPE and the query and key norms each make new tensors of the query and the key.
    new_key = rope or model.qk_layernorm
    new_query = new_key or model.query_groups != model.num_attention_heads
    if attention.qkv_as_given and not checkpointed and heads > groups:
        # GQA: a new query (the reshape), the key and value repeated per head; no view is kept.
        kept = 3 * q
        output_kept = False
    elif attention.qkv_as_given or checkpointed:
        # The query and key as RoPE (or the reshape) left them, and the value's view.
        kept = (q if new_query else 0.0) + (kv if new_key else 0.0) + output
        output_kept = True
    else:
        kept = q + 2 * kv
        output_kept = False
    if model.qk_layernorm:
        kept += _qk_norm_inputs(model, tp, attention, output=output, output_kept=output_kept)
    return kept - (q + 2 * kv)


def _qk_norm_inputs(model: ModelSpec, tp: int, attention: AttentionBytes, *, output: float,
                    output_kept: bool) -> float:
    """Bytes per token that the query and key norms (ModelSpec.qk_layernorm) keep beyond the
    rest of qkv_extra's count: each saves its input and an fp32 rstd per head (torch 2.11's
    CUDA `_fused_rms_norm` and layer_norm; TE 2.11 ops/basic/rmsnorm.py and layernorm.py), and
    applies before RoPE and core attention, so a core_attn checkpoint keeps them too.

    Their inputs come out of get_query_key_value_tensors (megatron-core 0.16.1 attention.py): the
    key a view of the QKV GEMM's output, the query a view of it too unless its reshape to heads
    copies it (several query heads per group and several groups on the rank). Torch's norms
    (local, sdpa) save the view, which keeps the whole GEMM output alive; Transformer Engine's
    copy their input contiguous first (`input_.contiguous()`), so the query and key are kept
    once each. Counted on CPU (tools/saved_tensors.py, sdpa) within 0.1%: results/benchmarks/
    2026-11-29-cpu-qwen-attention-s21.md."""
    d = model.head_dim
    heads, groups = model.num_attention_heads / tp, max(1, model.query_groups // tp)
    # fp32 per head and token: RMSNorm's rstd; LayerNorm's mean and rstd.
    rstd = (4.0 if model.normalization == "RMSNorm" else 8.0) * (heads + groups)
    if not attention.qkv_as_given:
        return 2 * heads * d + 2 * groups * d + rstd
    query_copied = groups > 1 and heads > groups
    return (0.0 if output_kept else output) + (2 * heads * d if query_copied else 0.0) + rstd


ROPE_TABLE_BYTES = 2
"""bf16: _apply_rotary_pos_emb_bshd casts cos and sin to the query's dtype."""


def rope_table_bytes(model: ModelSpec) -> float:
    """Bytes per position of the local sequence that a RoPE layer keeps whatever the micro-batch
    size: cos and sin of the positions ([s, 1, 1, head_dim], rope_utils.py,
    _apply_rotary_pos_emb_bshd), made once for the query and once for the key, each saved by
    the product it enters (`t * cos_`, `_rotate_half(t) * sin_`). 4 x 2 x 128 = 1 KiB per
    position at head_dim 128: a twentieth of what llama2-13b keeps per token beyond the paper's
    count at mbs 1 (`qkv_extra`), and measured with it (results/benchmarks/2026-11-27-cpu-
    activation-slope.md)."""
    if model.position_embedding != "rope":
        return 0.0
    # Multi-Latent Attention rotates the qk_pos_emb_head_dim part only.
    rotated = model.qk_pos_emb_head_dim if model.multi_latent_attention else model.head_dim
    assert rotated is not None
    return 4 * ROPE_TABLE_BYTES * rotated


def layer_bytes(acts: LayerActivations, *, tokens: float, seq: float, tp: int,
                sequence_parallel: bool, freed: float = 0.0,
                freed_per_position: float = 0.0) -> float:
    """Stored bytes of one layer for `tokens` local tokens of local sequence length `seq`,
    less `freed` bytes per token and `freed_per_position` bytes per position that a selective
    recompute does not store (autotune.levers.recompute.module_savings,
    module_position_savings; 0: every activation stored)."""
    replicated = acts.replicated / tp if sequence_parallel else acts.replicated
    stored = replicated + acts.split + acts.qkv_extra + seq * acts.per_key
    stored -= freed
    return tokens * stored + seq * (acts.per_position - freed_per_position)


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
