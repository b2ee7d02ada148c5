"""Model, DDP wrapper and optimizer of one trial, built with megatron-core from the TrialSpec.

What to build (every configuration value) comes from autotune.megatron.core_config.core_config;
this module turns it into megatron-core objects on the GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from autotune.megatron.core_config import core_config
from autotune.megatron.megatron_versions import config_kwargs, installed_version, running
from autotune.trials.protocol import te_available
from autotune.trials.trial import TrialSpec

__all__ = ["PATCHES", "build_model", "build_optimizer", "grad_clip_code", "transformer_config",
           "transformer_config_class", "transformer_config_kwargs"]

log = logging.getLogger(__name__)


_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
_ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu}


def _resolved(kwargs: dict[str, Any]) -> dict[str, Any]:
    """core_config's names of dtypes and activations as the torch objects they name."""
    out = dict(kwargs)
    for key, value in kwargs.items():
        # Every dtype by name: the core's params_dtype and pipeline_dtype, and a lever's
        # (autotune.levers.base.CoreConfigTerm), e.g. the precision-aware optimizer's moments.
        if key.endswith("_dtype") and isinstance(value, str):
            out[key] = _DTYPES[value]
    if out.get("activation_func") == "squared_relu":
        from megatron.core.activations import squared_relu  # Megatron-LM's --squared-relu

        out["activation_func"] = squared_relu
    elif "activation_func" in out:
        out["activation_func"] = _ACTIVATIONS[out["activation_func"]]
    if isinstance(out.get("moe_layer_freq"), tuple):  # TransformerConfig's is a list
        out["moe_layer_freq"] = list(out["moe_layer_freq"])
    if out.get("recompute_modules") is not None:
        # A tuple in core_config (hashable, for the run key); TransformerConfig's is a list.
        out["recompute_modules"] = list(out["recompute_modules"])
    return out


def transformer_config_kwargs(spec: TrialSpec) -> dict[str, Any]:
    """TransformerConfig keyword arguments for the trial (pure: no CUDA needed), from
    autotune.megatron.core_config, the one mapping of a layout to megatron-core's configuration, in
    the installed megatron-core's field names (autotune.megatron.megatron_versions)."""
    return config_kwargs("TransformerConfig",
                         _resolved(core_config(spec.model, spec.layout).transformer),
                         running())


def transformer_config_class(kwargs: dict[str, Any]) -> Any:
    """megatron-core's config class for these keyword arguments: MLATransformerConfig for
    Multi-Latent Attention (Megatron-LM's core_transformer_config_from_args picks it with
    --multi-latent-attention), else TransformerConfig."""
    from megatron.core.transformer.transformer_config import (
        MLATransformerConfig,
        TransformerConfig,
    )

    return MLATransformerConfig if kwargs.get("multi_latent_attention") else TransformerConfig


def transformer_config(spec: TrialSpec) -> Any:
    kwargs = transformer_config_kwargs(spec)
    return transformer_config_class(kwargs)(**kwargs)


class _TorchNorm:
    """torch LayerNorm / RMSNorm that, unlike megatron-core's WrappedTorchNorm, allows
    sequence parallelism: it tags its parameters `sequence_parallel` so finalize_model_grads
    all-reduces their partial gradients over the TP group (what apex's FusedLayerNorm does).
    A zero-centred gamma (layernorm_zero_centered_gamma, --apply-layernorm-1p) is a different
    storing of the same weights through the same kernel: this norm keeps the plain one, with
    the same parameters and cost (Transformer Engine's norms, impl te, apply it)."""

    def __new__(cls, config: Any, hidden_size: int, eps: float = 1e-5,  # type: ignore[misc]
                **_: Any) -> torch.nn.Module:
        norm_cls = torch.nn.RMSNorm if config.normalization == "RMSNorm" else torch.nn.LayerNorm
        norm = norm_cls(hidden_size, eps=eps, dtype=config.params_dtype)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]
        return norm


def _layer_spec(spec: TrialSpec, config: Any, vp_stage: int | None) -> Any:
    """The GPT layer spec for `layout.impl`, as a block spec for this pipeline chunk; with dense
    layers among the MoE layers (ModelSpec.moe_layer_freq), each layer's own (megatron-core's
    get_gpt_decoder_block_spec picks them the same way, by moe_layer_pattern)."""
    from megatron.core.transformer.transformer_block import (
        LayerNormImpl,
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    m, impl = spec.model, spec.layout.impl
    if spec.layout.fp8 != "off" and impl != "te":
        # The layers' fp8_autocast (megatron-core fp8_utils.get_fp8_context) reaches TE's
        # modules only: a local spec would train in bf16 and be measured as FP8.
        raise RuntimeError(f"fp8={spec.layout.fp8} needs impl=te (Transformer Engine's "
                           f"spec), got impl={impl}")
    if impl not in ("local", "sdpa", "te"):
        raise ValueError(f"unknown impl {impl!r}")
    if impl == "te" and not te_available():
        raise RuntimeError("impl=te needs transformer-engine (pip install "
                           "'autotune[te]', best inside an NGC PyTorch image)")
    moe_layer = _kind_layer_spec(spec, m.num_experts if m.is_moe else None)
    if impl == "te" and not m.has_dense_layers:
        return moe_layer
    n = get_num_layers_to_build(config, vp_stage=vp_stage)
    layers = [moe_layer] * n
    if m.has_dense_layers:
        dense_layer = _kind_layer_spec(spec, None)
        offset = get_transformer_layer_offset(config, vp_stage=vp_stage)
        mask = m.moe_layer_mask
        layers = [moe_layer if mask[offset + j] else dense_layer for j in range(n)]
    return TransformerBlockSubmodules(layer_specs=layers,
                                      layer_norm=LayerNormImpl if impl == "te" else _TorchNorm)


def _mtp_block_spec(spec: TrialSpec, config: Any, vp_stage: int | None) -> Any:
    """The Multi-Token Prediction block spec of this pipeline chunk (None without MTP, and on
    every chunk but the last stage's last: megatron-core 0.16.1 get_mtp_num_layers_to_build).
    Its transformer layer is the model's last layer's kind, as Megatron-LM's gpt_builders.py
    takes decoder_layer_specs[-1]; the norms are the layers' own (TE's, or the worker's torch
    norm: the local backend's would be apex's or megatron-core's WrappedTorchNorm)."""
    if not spec.model.mtp_num_layers:
        return None
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

    m = spec.model
    layer = _kind_layer_spec(spec, m.num_experts if m.mtp_layer_is_moe else None)
    block = get_gpt_mtp_block_spec(config, layer, use_transformer_engine=spec.layout.impl == "te",
                                   vp_stage=vp_stage)
    if block is not None and spec.layout.impl != "te":
        for mtp_layer in block.layer_specs:
            sub = mtp_layer.submodules
            sub.enorm = sub.hnorm = sub.layer_norm = _TorchNorm
    return block


def _kind_layer_spec(spec: TrialSpec, experts: int | None) -> Any:
    """The layer spec of `spec`'s implementation for a layer with `experts` experts (None: a
    dense MLP)."""
    from megatron.core.models.gpt import gpt_layer_specs

    m, impl = spec.model, spec.layout.impl
    if impl == "te":
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=experts, moe_grouped_gemm=bool(experts), qk_layernorm=m.qk_layernorm,
            multi_latent_attention=m.multi_latent_attention)
    # With MLA, megatron-core's MLASelfAttention: column-parallel down and up projections
    # (multi_latent_attention.py gathers the down projections' outputs), latent norms with
    # qk_layernorm.
    layer = gpt_layer_specs.get_gpt_layer_local_spec(
        num_experts=experts, normalization=m.normalization, qk_layernorm=m.qk_layernorm,
        multi_latent_attention=m.multi_latent_attention)
    layer.submodules.input_layernorm = _TorchNorm
    layer.submodules.pre_mlp_layernorm = _TorchNorm
    attention = layer.submodules.self_attention.submodules
    if m.qk_layernorm:
        # megatron-core's WrappedTorchNorm refuses sequence parallelism even here, where the
        # norms act on whole heads; finalize_model_grads sums their gradients over the TP group
        # by name (q_layernorm, k_layernorm) with qk_layernorm on, as TE's norms get. MLA's
        # latent norms (q_layernorm, kv_layernorm) act on whole latents, gathered on each rank.
        attention.q_layernorm = _TorchNorm
        if m.multi_latent_attention:
            attention.kv_layernorm = _TorchNorm
        else:
            attention.k_layernorm = _TorchNorm
    if impl == "sdpa":
        from autotune.worker.attention import SdpaAttention
        from autotune.worker.linear import BiasInGemmColumnParallelLinear

        attention.core_attention = SdpaAttention
        if not m.multi_latent_attention:  # MLA's projections have no bias to fold in
            attention.linear_qkv = BiasInGemmColumnParallelLinear
    return layer


def build_model(spec: TrialSpec, config: Any) -> list[Any]:
    """One DDP-wrapped GPTModel chunk per virtual pipeline stage of this rank."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.module import Float16Module

    m, s = spec.model, spec.layout
    wanted = core_config(m, s)
    _patch_megatron_core()
    vpp = s.vpp if s.vpp > 1 else None
    chunks = []
    for i in range(s.vpp):
        vp_stage = i if vpp else None
        with init_grad_mode(spec):
            model = _gpt_model(GPTModel, spec, config, wanted.model["vocab_size"], vp_stage)
        if spec.layout.fp8_param_gather:
            lend_fp8_init_values(model)
        # Megatron-LM wraps bf16 models the same way (training.py, get_model): every parameter
        # in bf16, inputs cast on the first stage, the loss in fp32 on the last.
        chunks.append(Float16Module(config, model.cuda()))
    ddp_config = DistributedDataParallelConfig(
        **config_kwargs("DistributedDataParallelConfig", wanted.ddp, running()))
    # Only the first chunk gets buckets, as in Megatron-LM (later chunks' grads are ready last).
    return [DistributedDataParallel(config=config, ddp_config=dataclasses.replace(ddp_config),
                                    module=chunk, disable_bucketing=i > 0)
            for i, chunk in enumerate(chunks)]


def init_grad_mode(spec: TrialSpec) -> Any:
    """The grad mode a trial's model is built in: without autograd where its weights are FP8.

    megatron-core builds FP8 weights inside TE's fp8_model_init with
    preserve_high_precision_init_val=torch.is_grad_enabled() (fp8_utils.get_fp8_context, 0.16.1).
    With it, TE copies every weight's high-precision initial value to host memory
    (module/base.py, `param.detach().cpu()`, TE 2.11), for the distributed optimizer to seed its
    fp32 main weights from. On 4 x H200 every llama3-8b trial with FP8 param gather spent
    16-19 s in the build against 1.5 s in bf16 (results/benchmarks/2026-11-28-h200x4-issue30-
    s19.md); built without autograd, 0.34-0.58 s (2026-11-28-h200x4-issue30-s20.md).
    Megatron-LM pays the copy once per job, a search once per trial. The optimizer still needs
    an initial value per weight: lend_fp8_init_values gives it one, on the GPU."""
    return torch.no_grad() if spec.layout.fp8_param_gather else contextlib.nullcontext()


def lend_fp8_init_values(module: Any) -> int:
    """Give each FP8 weight of `module` the init-value accessors TE gives it when built with
    autograd (get_/clear_high_precision_init_val), reading the weight itself; the number given.

    Without them megatron-core's distributed optimizer seeds its fp32 main weight from
    `model_param.float().view(-1)[shard]` (distrib_optimizer.py, _build_model_and_main_param_
    groups, 0.16.1): a view that keeps the whole fp32 copy of the weight alive, not only this
    rank's shard, and that carries autograd history back to the weight. Measured on 4 x H200
    (session 20, llama3-8b dp 4 with FP8 param gather): peak allocated 19.5 GiB above the same
    layout built with autograd ((dp - 1) / dp of 4 bytes per FP8 weight), and every such trial
    left 86 GiB per rank behind in the warm pool: the history holds each weight's gradient
    accumulator, whose DDP hook holds DDP, and PyTorch's collector cannot see that cycle while
    anything but its Python wrapper owns the accumulator. With the accessors megatron-core
    takes its other branch, `.clone().float()` of the shard, as it does in Megatron-LM. The value
    is the FP8 weight dequantized, not the bf16 value before rounding (TE's host copy): time
    and memory are the layout's; the loss guard judges the first steps against the bf16 twin."""
    from megatron.core.fp8_utils import is_float8tensor

    lent = 0
    for param in module.parameters():
        if not is_float8tensor(param) or hasattr(param, "get_high_precision_init_val"):
            continue
        param.get_high_precision_init_val = types.MethodType(_fp8_init_value, param)
        param.clear_high_precision_init_val = types.MethodType(_forget_fp8_init_value, param)
        lent += 1
    return lent


def _fp8_init_value(param: Any) -> torch.Tensor:
    """The weight's value in its high precision, with no autograd history."""
    with torch.no_grad():
        value: torch.Tensor = param.dequantize().detach()
    return value


def _forget_fp8_init_value(param: Any) -> None:
    """Drop the accessors once the optimizer has seeded its main weight (megatron-core calls
    this right after reading the value, as TE's own accessors expect)."""
    for name in ("get_high_precision_init_val", "clear_high_precision_init_val"):
        vars(param).pop(name, None)


def _gpt_model(gpt_model: Any, spec: TrialSpec, config: Any, vocab_size: int,
               vp_stage: int | None) -> Any:
    """One GPTModel chunk of this rank (virtual stage `vp_stage`)."""
    from megatron.core import parallel_state

    m = spec.model
    return gpt_model(
            config=config,
            transformer_layer_spec=_layer_spec(spec, config, vp_stage),
            mtp_block_spec=_mtp_block_spec(spec, config, vp_stage),
            vocab_size=vocab_size,
            max_sequence_length=m.max_positions,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False,
                                                               vp_stage=vp_stage),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False,
                                                               vp_stage=vp_stage),
            share_embeddings_and_output_weights=m.tied_embeddings,
            position_embedding_type=m.position_embedding,
            rotary_base=m.rotary_base,
            rotary_percent=m.rotary_percent,
            vp_stage=vp_stage,
        )

def _fill_te_general_gemm() -> None:
    """megatron-core 0.16.1 without Transformer Engine: RouterGatingLinearFunction tests
    `te_general_gemm is not None`, but moe_utils binds the name only when TE imports, so every
    MoE forward raises NameError (0.19 binds it to None)."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _mla_without_te() -> None:
    """megatron-core 0.16.1 without Transformer Engine: multi_latent_attention.py sets HAVE_TE
    when megatron.core.extensions.transformer_engine imports, which it does without TE (its TE
    classes then stand-ins, not types), so every MLASelfAttention raises TypeError in
    `isinstance(self.linear_proj, TELinear)` (0.19 tests TE itself). TE's absent: say so."""
    from megatron.core.transformer import multi_latent_attention

    if not te_available():
        multi_latent_attention.HAVE_TE = False


PATCHES: dict[str, Callable[[], None]] = {"moe_te_general_gemm_unbound": _fill_te_general_gemm,
                                          "mla_have_te_without_te": _mla_without_te}
"""The holes autotune fills, by the names autotune.megatron.megatron_versions gives the releases
that have them (MegatronVersion.worker_patches)."""


def _patch_megatron_core() -> None:
    """Fill the holes the installed megatron-core release has (its version table row)."""
    row = running()
    log.info("megatron-core %s (version table row %s), patches: %s",
             installed_version(), row.version, ", ".join(sorted(row.worker_patches)) or "none")
    for name in sorted(row.worker_patches):
        PATCHES[name]()


def build_optimizer(spec: TrialSpec, model: list[Any]) -> Any:
    """Megatron's mixed-precision Adam over the chunks, on a fused kernel where possible."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    config = OptimizerConfig(**config_kwargs(
        "OptimizerConfig", _resolved(core_config(spec.model, spec.layout).optimizer),
        running()))
    optimizer = get_megatron_optimizer(config, model, use_gloo_process_groups=False)
    fused = _use_fused_torch_adam(optimizer)
    _use_foreach_multi_tensor_ops()
    log.info("optimizer %s, fused torch AdamW groups: %d, grad clipping: %s",
             type(optimizer).__name__, fused, grad_clip_code())
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


def grad_clip_code() -> str:
    """Which kernels megatron-core's gradient clipping runs (its norm's): "te" or "apex" (what
    clip_grads imported), "foreach" (autotune's stand-ins for its Python fallback, taken when
    neither imports: without TE and apex, or with a TE that lacks a name the release imports, as
    0.19.2 with TE 2.11; autotune.megatron.megatron_versions, TeGap) or "local" (that fallback).
    """
    from megatron.core import utils as mcore_utils
    from megatron.core.optimizer import clip_grads

    impl = clip_grads.l2_norm_impl
    if impl is _foreach_l2_norm:
        return "foreach"
    if impl is mcore_utils.local_multi_tensor_l2_norm:
        return "local"
    module = str(getattr(impl, "__module__", "") or "")
    if module.startswith("transformer_engine"):
        return "te"
    if module.startswith(("amp_C", "apex")):
        return "apex"
    return f"{module}.{getattr(impl, '__qualname__', type(impl).__name__)}"


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
