"""A ColumnParallelLinear whose bias is added inside the GEMM (impl "sdpa", QKV projection).

megatron-core's local linear (tensor_parallel/layers.py,
LinearWithGradAccumulationAndAsyncCommunication.forward) computes `matmul(x, w.t())` and then
`output + bias` as a separate broadcast kernel. In the local GPT spec only the QKV projection
pays it: the other three linears hand their bias to the bias-GELU and bias-dropout-add fusions.
On one H100 (gpt2-xl, mbs 16, results/benchmarks/2026-11-21-h100-gpt2-xl-bias.md) that add was
192 kernels and 40 ms of a 1.53 s step.

When the linear needs none of Megatron's own machinery (no sequence-parallel all-gather, no
async dgrad all-reduce, which means a TP group of one; no fused wgrad accumulation; no deferred
embedding wgrad), torch.nn.functional.linear computes the same product with the bias in the
GEMM (cuBLASLt's bias epilogue for a contiguous input) and autograd's usual backward: dgrad,
wgrad into param.grad and the bias grad as a sum, which Megatron's DDP hooks then add to
main_grad exactly as before. Anything else goes through megatron-core's function unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel.layers import ColumnParallelLinear

__all__ = ["BiasInGemmColumnParallelLinear", "bias_in_gemm"]


def bias_in_gemm(megatron_impl: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Wrap ColumnParallelLinear._forward_impl: F.linear where it is the same computation."""

    def forward_impl(**kwargs: Any) -> torch.Tensor:
        plain = (kwargs["bias"] is not None
                 and not kwargs.get("gradient_accumulation_fusion")
                 and not kwargs.get("allreduce_dgrad")
                 and not kwargs.get("sequence_parallel")
                 and kwargs.get("grad_output_buffer") is None)
        if not plain:
            return megatron_impl(**kwargs)
        return F.linear(kwargs["input"], kwargs["weight"], kwargs["bias"])

    return forward_impl


class BiasInGemmColumnParallelLinear(ColumnParallelLinear):  # type: ignore[misc]  # untyped
    """ColumnParallelLinear with `bias_in_gemm` around its matrix multiply."""

    _forward_impl: Callable[..., torch.Tensor]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._forward_impl = bias_in_gemm(self._forward_impl)
