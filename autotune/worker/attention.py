"""Core attention through torch.nn.functional.scaled_dot_product_attention (impl "sdpa").

It replaces megatron-core's local DotProductAttention (megatron/core/transformer/
dot_product_attention.py), which materializes the [b, heads, s, s] scores, with PyTorch's fused
kernels (flash, cuDNN, memory-efficient). Same constructor keywords and forward signature, same
layouts: query [sq, b, heads/tp, head_dim], key/value [sk, b, groups/tp, head_dim], output
[sq, b, heads/tp * head_dim] (with Multi-Latent Attention the value's and output's head_dim is
v_head_dim, the query's and key's qk_head_dim + qk_pos_emb_head_dim).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig

from autotune.trials.protocol import SDPA_BACKEND_ENV

__all__ = ["SdpaAttention", "configure_sdpa_backends"]


def configure_sdpa_backends(choice: str | None = None) -> str:
    """Allow only fused SDPA kernels; `choice` (or $AUTOTUNE_SDPA_BACKEND) picks one of them.

    The math fallback is switched off: it is the O(s^2)-memory path impl "local" already
    measures, and silently landing on it would make an sdpa trial lie about its memory.
    """
    choice = (choice or os.environ.get(SDPA_BACKEND_ENV) or "auto").lower()
    allowed = {"auto": ("flash", "cudnn", "efficient"), "flash": ("flash",),
               "cudnn": ("cudnn",), "efficient": ("efficient",)}
    if choice not in allowed:
        raise ValueError(f"{SDPA_BACKEND_ENV}={choice!r} must be one of {', '.join(allowed)}")
    on = allowed[choice]
    torch.backends.cuda.enable_flash_sdp("flash" in on)
    torch.backends.cuda.enable_cudnn_sdp("cudnn" in on)
    torch.backends.cuda.enable_mem_efficient_sdp("efficient" in on)
    torch.backends.cuda.enable_math_sdp(False)
    return choice


class SdpaAttention(MegatronModule):  # type: ignore[misc]  # megatron-core is untyped
    """Causal self-attention core on PyTorch's fused SDPA kernels."""

    def __init__(self, config: TransformerConfig, layer_number: int,
                 attn_mask_type: AttnMaskType, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 k_channels: int | None = None, v_channels: int | None = None,
                 cp_comm_type: str | None = None, pg_collection: Any = None) -> None:
        # k_channels and v_channels: Multi-Latent Attention's query/key and value head widths
        # (multi_latent_attention.py passes them); SDPA reads them off the tensors.
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("impl=sdpa does not implement context parallelism (cp > 1 needs "
                             "impl=te)")
        if attn_mask_type != AttnMaskType.causal:
            raise ValueError(f"impl=sdpa supports causal attention only, got {attn_mask_type}")
        self.dropout_p = (config.attention_dropout if attention_dropout is None
                          else attention_dropout)
        # None lets SDPA use 1/sqrt(head_dim), as DotProductAttention does by default.
        self.softmax_scale = softmax_scale
        self.sequence_parallel = config.sequence_parallel

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: Any = None,
                attention_bias: Any = None, packed_seq_params: Any = None) -> torch.Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("impl=sdpa supports neither packed sequences nor attention bias")
        sq, b, heads, _ = query.shape
        groups = key.shape[2]
        if heads != groups:
            # GQA: repeat each key/value group for its heads. The flash kernel takes no
            # enable_gqa, and the copy is small next to the activations of the MLP.
            key = key.repeat_interleave(heads // groups, dim=2)
            value = value.repeat_interleave(heads // groups, dim=2)
        # [s, b, n, d] -> [b, n, s, d] as strided views; the fused kernels need only the last
        # dimension contiguous, so no copy is made here.
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        dropout_p = self.dropout_p if self.training else 0.0
        if dropout_p > 0.0 and not self.sequence_parallel:
            # Heads are split over TP ranks: each rank drops with its own model-parallel RNG
            # stream, as DotProductAttention does.
            with tensor_parallel.get_cuda_rng_tracker().fork():
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p,
                                                     is_causal=True, scale=self.softmax_scale)
        else:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True,
                                                 scale=self.softmax_scale)
        # [b, n, s, d_v] -> [s, b, n * d_v]; d_v is the value's width (MLA's v_head_dim).
        return out.permute(2, 0, 1, 3).reshape(sq, b, heads * value.shape[-1])

