"""Model, DDP wrapper and optimizer of one trial, built with megatron-core from the TrialSpec.

The mapping follows Megatron-LM's megatron/training/arguments.py (`core_transformer_config_from_
args`) and training.py (`get_model`, `setup_model_and_optimizer`), with Megatron-LM's defaults
where the spec says nothing (bias-GELU and bias-dropout fusion on; grads accumulated and
reduced in fp32, as Megatron-LM does with --bf16).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import math
from typing import Any

import torch
import torch.nn.functional as F

from autotune.model import padded_vocab_size
from autotune.strategy import Strategy
from autotune.trial import TrialSpec

__all__ = ["build_model", "build_optimizer", "has_transformer_engine", "transformer_config",
           "transformer_config_kwargs"]

log = logging.getLogger(__name__)


def has_transformer_engine() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def _recompute(strategy: Strategy) -> dict[str, Any]:
    if strategy.recompute == "none":
        return {"recompute_granularity": None, "recompute_method": None,
                "recompute_num_layers": None}
    if strategy.recompute == "selective":
        return {"recompute_granularity": "selective", "recompute_method": None,
                "recompute_num_layers": None}
    return {"recompute_granularity": "full", "recompute_method": strategy.recompute_method,
            "recompute_num_layers": strategy.recompute_num_layers}


def transformer_config_kwargs(spec: TrialSpec) -> dict[str, Any]:
    """TransformerConfig keyword arguments for the trial (pure: no CUDA needed)."""
    m, s = spec.model, spec.strategy
    swiglu = m.gated_linear_unit or m.activation in ("swiglu", "silu")
    kwargs: dict[str, Any] = {
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "num_query_groups": m.query_groups,
        "ffn_hidden_size": m.ffn_size,
        "kv_channels": m.head_dim,
        "tensor_model_parallel_size": s.tp,
        "pipeline_model_parallel_size": s.pp,
        "virtual_pipeline_model_parallel_size": s.vpp if s.vpp > 1 else None,
        "context_parallel_size": s.cp,
        "expert_model_parallel_size": s.ep,
        "sequence_parallel": s.sequence_parallel,
        "bf16": True,
        "params_dtype": torch.bfloat16,
        "pipeline_dtype": torch.bfloat16,
        "variable_seq_lengths": False,
        "hidden_dropout": m.hidden_dropout,
        "attention_dropout": m.attention_dropout,
        "normalization": m.normalization,
        "add_bias_linear": m.add_bias_linear,
        "gated_linear_unit": swiglu,
        "activation_func": F.silu if swiglu else F.gelu,
        # Megatron-LM's defaults (--bias-gelu-fusion, --bias-dropout-fusion); megatron-core
        # compiles these element-wise kernels with torch.compile (megatron/core/jit.py).
        "bias_activation_fusion": swiglu or m.add_bias_linear,
        "bias_dropout_fusion": True,
        # Megatron-LM turns this on with apex's fused_weight_gradient_mlp_cuda, which the worker
        # does not assume. A torch stand-in (addmm_ into main_grad) was measured on an H100:
        # no gain at gpt2-xl mbs 16, 11% slower at mbs 8 (results/benchmarks/
        # 2026-11-21-h100-worker-dev.md), so grads accumulate with a separate add.
        "gradient_accumulation_fusion": False,
        "masked_softmax_fusion": False,
        "cross_entropy_loss_fusion": s.cross_entropy_fusion,
        "cross_entropy_fusion_impl": "native",
        # megatron-core's default, kept on purpose: the unfused attention of impl local saves
        # fp32 probabilities. Megatron-LM's --attention-softmax-in-fp32 defaults to off, so
        # autotune.megatron_args passes it for impl local (measured: 9.4 GiB at gpt2-xl mbs 4).
        "attention_softmax_in_fp32": True,
        "init_method_std": 0.02,
        # Megatron-LM frees pipeline outputs after sending them (--deallocate-pipeline-outputs
        # is on by default in arguments.py).
        "deallocate_pipeline_outputs": True,
        # Megatron-LM's interleaved schedule overlaps its p2p sends and receives with compute
        # (--overlap-p2p-communication is on by default; arguments.py sets batch_p2p_comm = not
        # overlap_p2p_comm and turns the overlap off without vpp). megatron-core's own defaults
        # (batched, no overlap) deadlocked gpt2-xl pp4 vpp2 with 4 micro-batches on 4 x H200
        # (results/benchmarks/2026-11-21-h200x4-gpt2-xl-grid.md).
        "overlap_p2p_comm": s.vpp > 1,
        "batch_p2p_comm": s.vpp == 1,
        **_recompute(s),
    }
    if m.normalization == "RMSNorm":
        kwargs["layernorm_epsilon"] = 1e-5
    if m.is_moe:
        kwargs.update({
            "num_moe_experts": m.num_experts,
            "moe_router_topk": m.moe_topk,
            "moe_ffn_hidden_size": m.expert_ffn_size,
            "moe_token_dispatcher_type": "alltoall",
            "moe_router_load_balancing_type": "aux_loss",
            "moe_aux_loss_coeff": 1e-2,
            "moe_grouped_gemm": s.impl == "te",
        })
    return kwargs


def transformer_config(spec: TrialSpec) -> Any:
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(**transformer_config_kwargs(spec))


class _TorchNorm:
    """torch LayerNorm / RMSNorm that, unlike megatron-core's WrappedTorchNorm, allows
    sequence parallelism: it tags its parameters `sequence_parallel` so finalize_model_grads
    all-reduces their partial gradients over the TP group (what apex's FusedLayerNorm does)."""

    def __new__(cls, config: Any, hidden_size: int, eps: float = 1e-5,  # type: ignore[misc]
                **_: Any) -> torch.nn.Module:
        norm_cls = torch.nn.RMSNorm if config.normalization == "RMSNorm" else torch.nn.LayerNorm
        norm = norm_cls(hidden_size, eps=eps, dtype=config.params_dtype)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]
        return norm


def _layer_spec(spec: TrialSpec, config: Any, vp_stage: int | None) -> Any:
    """The GPT layer spec for `strategy.impl`, as a block spec for this pipeline chunk."""
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    m, impl = spec.model, spec.strategy.impl
    experts = m.num_experts if m.is_moe else None
    if impl == "te":
        if not has_transformer_engine():
            raise RuntimeError("impl=te needs transformer-engine (pip install "
                               "'autotune[te]', best inside an NGC PyTorch image)")
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=experts, moe_grouped_gemm=bool(experts))
    if impl not in ("local", "sdpa"):
        raise ValueError(f"unknown impl {impl!r}")
    layer = gpt_layer_specs.get_gpt_layer_local_spec(num_experts=experts,
                                                     normalization=m.normalization)
    layer.submodules.input_layernorm = _TorchNorm
    layer.submodules.pre_mlp_layernorm = _TorchNorm
    if impl == "sdpa":
        from autotune.worker.attention import SdpaAttention
        from autotune.worker.linear import BiasInGemmColumnParallelLinear

        layer.submodules.self_attention.submodules.core_attention = SdpaAttention
        layer.submodules.self_attention.submodules.linear_qkv = BiasInGemmColumnParallelLinear
    n = get_num_layers_to_build(config, vp_stage=vp_stage)
    return TransformerBlockSubmodules(layer_specs=[layer] * n, layer_norm=_TorchNorm)


def build_model(spec: TrialSpec, config: Any) -> list[Any]:
    """One DDP-wrapped GPTModel chunk per virtual pipeline stage of this rank."""
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.module import Float16Module

    m, s = spec.model, spec.strategy
    _patch_megatron_core()
    vpp = s.vpp if s.vpp > 1 else None
    chunks = []
    for i in range(s.vpp):
        vp_stage = i if vpp else None
        model = GPTModel(
            config=config,
            transformer_layer_spec=_layer_spec(spec, config, vp_stage),
            vocab_size=padded_vocab_size(m, s.tp),
            max_sequence_length=m.max_positions,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False,
                                                               vp_stage=vp_stage),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False,
                                                               vp_stage=vp_stage),
            share_embeddings_and_output_weights=m.tied_embeddings,
            position_embedding_type=m.position_embedding,
            rotary_base=m.rotary_base,
            vp_stage=vp_stage,
        )
        # Megatron-LM wraps bf16 models the same way (training.py, get_model): every parameter
        # in bf16, inputs cast on the first stage, the loss in fp32 on the last.
        chunks.append(Float16Module(config, model.cuda()))
    ddp_config = DistributedDataParallelConfig(
        # Megatron-LM forces fp32 gradient accumulation and reduction with --bf16
        # (arguments.py: accumulate_allreduce_grads_in_fp32); trials must use the memory and
        # speed of the command that export prints, and the memory model assumes 4-byte grads.
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=s.overlap_grad_reduce,
        overlap_param_gather=s.overlap_param_gather,
        align_param_gather=s.overlap_param_gather and s.vpp > 1,
        use_distributed_optimizer=s.distributed_optimizer,
    )
    # Only the first chunk gets buckets, as in Megatron-LM (later chunks' grads are ready last).
    return [DistributedDataParallel(config=config, ddp_config=dataclasses.replace(ddp_config),
                                    module=chunk, disable_bucketing=i > 0)
            for i, chunk in enumerate(chunks)]


def _patch_megatron_core() -> None:
    """Fill a hole megatron-core 0.16.1 leaves when Transformer Engine is not installed."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        # RouterGatingLinearFunction tests `te_general_gemm is not None`, but the name is only
        # bound when TE imports: without TE every MoE forward raises NameError.
        moe_utils.te_general_gemm = None


def build_optimizer(spec: TrialSpec, model: list[Any]) -> Any:
    """Megatron's mixed-precision Adam over the chunks, on a fused kernel where possible."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    config = OptimizerConfig(optimizer="adam", lr=1e-4, bf16=True, params_dtype=torch.bfloat16,
                             use_distributed_optimizer=spec.strategy.distributed_optimizer,
                             clip_grad=1.0)
    optimizer = get_megatron_optimizer(config, model, use_gloo_process_groups=False)
    fused = _use_fused_torch_adam(optimizer)
    _use_foreach_multi_tensor_ops()
    log.info("optimizer %s, fused torch AdamW groups: %d", type(optimizer).__name__, fused)
    return optimizer


def _inner_optimizers(optimizer: Any) -> list[Any]:
    chained = getattr(optimizer, "chained_optimizers", None)
    parts = chained if chained is not None else [optimizer]
    return [getattr(p, "optimizer", None) for p in parts]


def _use_fused_torch_adam(optimizer: Any) -> int:
    """Switch torch.optim.AdamW (megatron-core's fallback without TE or apex) to fused=True.

    megatron/core/optimizer/__init__.py builds `torch.optim.AdamW(params, lr, ...)` with no
    `fused` flag, so PyTorch picks the foreach path. The fused CUDA kernel is faster; AdamW
    reads the flag per step from its param groups, and its state is created on the first step,
    so setting it before any step is enough. Returns the number of groups switched.
    """
    switched = 0
    for inner in _inner_optimizers(optimizer):
        if not isinstance(inner, torch.optim.AdamW | torch.optim.Adam):
            continue
        params = [p for g in inner.param_groups for p in g["params"]]
        if not params or not all(p.is_cuda and p.is_floating_point() for p in params):
            continue
        for group in inner.param_groups:
            group["fused"] = True
            group["foreach"] = False
            switched += 1
        inner._step_supports_amp_scaling = True
    return switched


def _foreach_l2_norm(chunk_size: int, noop_flag: Any, tensor_lists: list[list[torch.Tensor]],
                     per_tensor: bool, *args: Any) -> tuple[torch.Tensor, None]:
    # megatron/core/utils.py's local_multi_tensor_l2_norm copies one scalar per parameter to the
    # host; one foreach kernel and one stack keep the gradient norm on the GPU.
    tensors = tensor_lists[0]
    if not tensors:
        return torch.zeros(1, dtype=torch.float, device="cuda"), None
    norms = torch._foreach_norm(tensors)
    return torch.linalg.vector_norm(torch.stack(norms).float()).reshape(1), None


def _foreach_scale(chunk_size: int, noop_flag: Any, tensor_lists: list[list[torch.Tensor]],
                   scale: float) -> None:
    # Replaces local_multi_tensor_scale's per-tensor Python loop (two kernels per parameter).
    src, dst = tensor_lists
    if not src:
        return
    if all(a is b for a, b in zip(src, dst, strict=True)):
        torch._foreach_mul_(dst, scale)
    elif scale == 1.0:
        torch._foreach_copy_(dst, src)
    else:
        torch._foreach_copy_(dst, torch._foreach_mul(src, scale))


def _use_foreach_multi_tensor_ops() -> None:
    """Replace megatron-core's pure-Python multi-tensor fallbacks (used without TE or apex)."""
    from megatron.core import utils as mcore_utils
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer import optimizer as mcore_optimizer

    if clip_grads.l2_norm_impl is mcore_utils.local_multi_tensor_l2_norm:
        clip_grads.l2_norm_impl = _foreach_l2_norm
    for module in (clip_grads, mcore_optimizer):
        if module.multi_tensor_scale_impl is mcore_utils.local_multi_tensor_scale:
            module.multi_tensor_scale_impl = _foreach_scale


def nccl_timeout_minutes(timeout_s: float) -> int:
    """initialize_model_parallel takes its sub-groups' timeout in whole minutes."""
    return max(1, math.ceil(timeout_s / 60))
