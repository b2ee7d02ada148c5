"""HBM traffic of one transformer layer's element-wise kernels, counted from the model's features.

What megatron-core 0.16.1 runs between the GEMMs and core attention, as autotune's worker builds
the layer (autotune.megatron.core_config: bias-activation and bias-dropout-add fused and compiled,
the QKV bias in its GEMM, RoPE fused with TE and unfused otherwise, torch's fused LayerNorm /
RMSNorm kernels), counted kernel
by kernel: the bytes each reads and writes per element of the tensor it acts on, forward and
backward (bf16 activations, 2 bytes; a 1-byte dropout mask). The tensors are those of Korthikanti
et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"), Section 4.1, whose
table of stored activations names each kernel's inputs; what each kernel writes and its backward
reads follow from the op. Per element:

- a norm (LayerNorm or RMSNorm, one fused kernel each way; the same traffic): forward reads x and
  writes y (4 B); backward reads x and dy and writes dx (6 B), and the weight gradients' pass reads
  x and dy again (4 B): 14 B, on h elements, twice a layer;
- the residual branch after the attention projection and after fc2 (megatron-core's
  bias_dropout_add, twice a layer, on h): without dropout an add (6 B) and, backward, the
  residual's gradient sum (6 B): 12 B; with hidden dropout the forward writes the mask (+1 B) and
  the backward multiplies the gradient by it (reads dy and the mask, writes dx: +5 B): 18 B;
- the MLP activation, on f / t elements: GeLU (bias fused) reads its input and writes its output
  (4 B), backward reads input and dy, writes dx (6 B): 10 B, and so does squared ReLU (Megatron
  --squared-relu: megatron.core.activations.squared_relu, compiled by jit_fuser into one kernel
  each way, no bias); SwiGLU reads the gate and the up projection (4 B) and writes 2 B,
  backward reads both and dy, writes both gradients (10 B): 16 B;
- RoPE on the query and key, unfused (models/common/embeddings/rope_utils.py,
  _apply_rotary_pos_emb_bshd: t * cos + rotate_half(t) * sin, rotate_half a chunk, a negation
  and a cat, then a cat with the pass-through part): 2 + 4 + 4 + 4 + 6 + 4 = 24 B forward and as
  many backward, 48 B on each element of the rank's query and key (with partial RoPE,
  ModelSpec.rotary_percent, all but the last cat act on the rotated share only: counted at the
  whole head, an over-count of at most the unrotated share of 40 of the 48 B); fused
  (`rope_fused`: Transformer Engine's fused_apply_rotary_pos_emb, one kernel each way reading
  the tensor and writing the result, the frequencies cached), 4 B forward and 4 B backward;
- the query and key norms (ModelSpec.qk_layernorm: q_layernorm and k_layernorm, head_dim wide,
  before RoPE), a norm's 14 B on each element of the rank's query and key;
- Multi-Latent Attention (ModelSpec.multi_latent_attention, `_mla_bytes`): its latent norms
  and its query's, key's and value's assembly (RoPE on their qk_pos_emb_head_dim parts, the
  concatenations), instead of the two items above;
- grouped-query attention through SDPA (autotune.worker.attention.SdpaAttention repeats each key
  and value group for its heads, repeat_interleave): per repeated element written (2 B) its group
  read, and backward the sum back to the groups: 4 B on each of the rank's h / t key and value
  elements, plus 4 B per group element; Transformer Engine takes the groups as they are.

Core attention (its kernel, attention dropout's random numbers) is priced apart
(autotune.levers.transformer_impl), and so are the GEMMs. The cost model multiplies these bytes by
the implementation's fitted factor (Constants.elementwise_bytes_local / _te): the share of HBM
bandwidth these small kernels reach, and what the count leaves out. Pure arithmetic.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from autotune.specs.activations import dropout_rate
from autotune.specs.model import ModelSpec

__all__ = ["NORM_BYTES", "ElementwiseBytes", "layer_elementwise_bytes", "rope_fused"]

NORM_BYTES = 14.0
"""Bytes per element of a fused LayerNorm or RMSNorm, forward (4) and backward (6 + 4)."""
RESIDUAL_BYTES = 12.0
"""Bytes per element of the residual add, forward (6) and its gradient's sum backward (6)."""
DROPOUT_EXTRA_BYTES = 6.0
"""What hidden dropout adds to a residual branch: the mask written (1) and, backward, dy times the
mask (read 2 + 1, write 2)."""
GELU_BYTES = 10.0
"""Bytes per fc1-output element of the fused bias-GeLU, forward (4) and backward (6)."""
SWIGLU_BYTES = 16.0
"""Bytes per fc2-input element of SwiGLU: forward reads gate and up (4), writes 2; backward reads
both and dy (6), writes both gradients (4)."""
ROPE_BYTES = 48.0
"""Bytes per query or key element of the unfused RoPE, forward (24) and backward (24)."""
ROPE_FUSED_BYTES = 8.0
"""Bytes per query or key element of TE's fused RoPE: read and write, forward and backward."""
MLA_COPY_BYTES = 8.0
"""Bytes per element of Multi-Latent Attention's query, key and value as it assembles them
unfused: torch.cat of the parts (the value a .contiguous() copy) reads 2 and writes 2; backward,
the split's gradient concatenated back, as many."""
GQA_REPEAT_BYTES = 4.0
"""Bytes per repeated key or value element (write 2 forward, read 2 in the backward's sum)."""


@dataclass(frozen=True, slots=True)
class ElementwiseBytes:
    """HBM bytes per token of one layer's element-wise kernels, forward and backward."""

    replicated: float
    """On the hidden-size tensors (norms, residual branches): divided by t only with sequence
    parallelism."""
    split: float
    """Already per tensor-parallel rank (the MLP activation, RoPE, GQA's repeat)."""
    mlp: float
    """The MLP activation's part of `split` (what `mlp` selective recompute runs again)."""

    def per_token(self, tp: int, sequence_parallel: bool) -> float:
        """Bytes per local token on one rank."""
        return self.replicated / (tp if sequence_parallel else 1) + self.split


def rope_fused(model: ModelSpec, impl: str) -> bool:
    """Whether a RoPE layer runs Transformer Engine's fused kernel. Megatron-LM turns
    apply_rope_fusion on by default (arguments.py, --no-rope-fusion) and megatron-core then calls
    TE's fused_apply_rotary_pos_emb (rope_utils.py, apply_rotary_pos_emb). autotune's worker
    does so where TE builds the layer (impl te); the local spec and sdpa run the unfused torch
    version, and the export says --no-rope-fusion for them, so that the command runs what was
    measured (and starts where TE is not installed: megatron-core asserts the fused kernel)."""
    return model.position_embedding == "rope" and model.rope_fusion and impl == "te"


def _mla_bytes(model: ModelSpec, tp: int, impl: str) -> tuple[float, float]:
    """(replicated, split) bytes per token of Multi-Latent Attention's element-wise kernels
    (megatron-core 0.16.1 multi_latent_attention.py get_query_key_value_tensors): the latent
    norms (qk_layernorm, on q_lora_rank and kv_lora_rank, whole on each rank); unfused, RoPE
    on the query's qk_pos_emb_head_dim part per head and the key's once, then the query and
    key concatenated from their parts and the value made contiguous (MLA_COPY_BYTES); fused
    (`rope_fused`: fused_apply_mla_rope_for_q / _for_kv, one kernel each way writing the
    query, key and value), ROPE_FUSED_BYTES on each of their elements."""
    assert model.kv_lora_rank is not None and model.qk_pos_emb_head_dim is not None
    latent = NORM_BYTES * ((model.q_lora_rank or 0) + model.kv_lora_rank) \
        if model.qk_layernorm else 0.0
    heads = model.num_attention_heads / tp
    qkv = heads * (2 * model.qk_dim + model.v_dim)
    if rope_fused(model, impl):
        return latent, ROPE_FUSED_BYTES * qkv
    pe = model.qk_pos_emb_head_dim
    return latent, ROPE_BYTES * (heads * pe + pe) + MLA_COPY_BYTES * qkv


@functools.lru_cache(maxsize=1024)
def layer_elementwise_bytes(model: ModelSpec, tp: int, impl: str) -> ElementwiseBytes:
    """One layer's element-wise traffic per token on one of `tp` ranks with implementation
    `impl` (the module docstring's counts, from the model's features)."""
    h = model.hidden_size
    dropout = dropout_rate(model, "hidden_dropout") > 0
    residual = RESIDUAL_BYTES + (DROPOUT_EXTRA_BYTES if dropout else 0.0)
    replicated = 2 * NORM_BYTES * h + 2 * residual * h
    if model.is_moe:
        assert model.num_experts is not None
        # The shared expert's activation runs on every token beside the routed experts'.
        f = model.moe_topk * model.expert_ffn_size + model.shared_expert_ffn_size
    else:
        f = model.ffn_size
    mlp = (SWIGLU_BYTES if model.gated_linear_unit else GELU_BYTES) * f / tp
    split = mlp
    if model.multi_latent_attention:
        latent, split_mla = _mla_bytes(model, tp, impl)
        return ElementwiseBytes(replicated=replicated + latent, split=split + split_mla, mlp=mlp)
    d = model.head_dim
    heads, kv = model.num_attention_heads / tp * d, max(1, model.query_groups // tp) * d
    if model.position_embedding == "rope":
        split += (ROPE_FUSED_BYTES if rope_fused(model, impl) else ROPE_BYTES) * (heads + kv)
    if model.qk_layernorm:
        split += NORM_BYTES * (heads + kv)
    if impl != "te" and model.query_groups != model.num_attention_heads:
        split += 2 * GQA_REPEAT_BYTES * (heads + kv)
    return ElementwiseBytes(replicated=replicated, split=split, mlp=mlp)
