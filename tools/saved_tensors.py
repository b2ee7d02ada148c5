"""What one megatron-core transformer layer keeps for backward, counted, against the memory model.

    PYTHONPATH=. python tools/saved_tensors.py [--model NAME] [--heads-divisor K] [--seq S]
        [--mbs B] [--impl sdpa] [--qk-layernorm] [--mla | --moe] [--recompute-modules a+b]
        [--json]

Builds one layer as autotune's worker does (autotune.worker.build: the layout's layer spec,
megatron-core 0.16.1's TransformerConfig from autotune.megatron.core_config) on CPU torch, runs
its forward under torch.autograd.graph.saved_tensors_hooks and adds up the storages of every
tensor saved for backward, parameters left out: a saved view counts its whole storage, which is
what it keeps alive. The model is the preset with its heads, query groups, hidden and FFN sizes
divided by K (head_dim, the GQA ratio and the FFN ratio kept), dropout off (CPU dropout saves a
bf16 mask where CUDA's native_dropout saves a 1-byte one; the paper's masks are not in
question here). It prints the bytes per token beside autotune.specs.activations.layer_bytes.

What CPU does not run as CUDA does is replaced by what the CUDA kernel saves:
- RMSNorm: torch's CPU rms_norm is a composite that saves fp32 copies; on CUDA, torch 2.11
  dispatches to `_fused_rms_norm`, whose backward node (FusedRmsNormBackward0,
  torch/csrc/autograd/generated/Functions.h) saves the input, the weight and the fp32 rstd.
- SDPA: CPU's flash kernel saves query, key, value, output and log-sum-exp, as CUDA's flash
  kernel does.
Local core attention (its global memory buffer) and Transformer Engine need CUDA: sdpa only.
--mla counts Multi-Latent Attention layers instead (`MLA_MODELS`: DeepSeek-V2-Lite's attention
with 2 of its 16 heads, with and without the query's latent and the latent norms); MLA builds
its own rotary embedding, whose frequency buffers ask for the current CUDA device: the CPU here.
--moe counts MoE layers with a shared expert (`moe_models`) through megatron-core's allgather
token dispatcher: the alltoall one, which the worker runs, makes CUDA streams when it is built.
The dispatchers save different tensors, so the MoE layer's total is not the model's (which is
alltoall's); what a recompute frees is compared between two counts (tests/test_activation_slope).
--recompute-modules counts the layer under selective recompute of those modules (autotune's
spelling, `core_attn+mla_up_proj`), against the model less levers.recompute.module_savings; the
storages are read after the forward, as an output-discarding checkpoint (mla_up_proj,
tensor_parallel.CheckpointWithoutOutput) empties its outputs' storages once core attention has
saved them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["Count", "count_layer", "scaled_model"]

# torch.compile (megatron-core's jit_fuser) adds minutes on CPU and changes nothing saved: the
# fused functions are autograd.Functions that save their inputs explicitly.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")


@dataclass(frozen=True, slots=True)
class Count:
    """Bytes one layer keeps for backward for one micro-batch, counted and modelled."""

    model: str
    seq: int
    mbs: int
    counted: float
    modelled: float

    @property
    def per_token(self) -> tuple[float, float]:
        tokens = self.seq * self.mbs
        return self.counted / tokens, self.modelled / tokens


def scaled_model(name: str, divisor: int) -> Any:
    """The preset with heads, query groups, hidden and FFN sizes divided by `divisor`; no
    dropout."""
    from autotune.specs.presets import load_model

    m = load_model(name)
    if m.num_attention_heads % divisor or m.query_groups % divisor:
        raise SystemExit(f"--heads-divisor {divisor} must divide {m.name}'s "
                         f"{m.num_attention_heads} heads and {m.query_groups} query groups")
    return replace(m, name=f"{m.name}/{divisor}", hidden_size=m.hidden_size // divisor,
                   num_attention_heads=m.num_attention_heads // divisor,
                   num_query_groups=m.query_groups // divisor,
                   ffn_hidden_size=m.ffn_size // divisor, hidden_dropout=0.0,
                   attention_dropout=0.0)


def mla_models() -> list[Any]:
    """DeepSeek-V2-Lite's attention (config.json: kv_lora_rank 512, qk_nope_head_dim 128,
    qk_rope_head_dim 64, v_head_dim 128, no q_lora_rank) on 2 heads of hidden 256, SwiGLU
    MLP of 1368 (its 10944 / 8), no dropout; with V2's query latent (1536) and without the
    latent norms."""
    from autotune.specs.model import ModelSpec

    lite = ModelSpec(name="v2-lite-attention/8", num_layers=1, hidden_size=256,
                     num_attention_heads=2, ffn_hidden_size=1368, vocab_size=1024,
                     seq_length=256, global_batch_size=1, normalization="RMSNorm",
                     add_bias_linear=False, gated_linear_unit=True, activation="swiglu",
                     position_embedding="rope", hidden_dropout=0.0, attention_dropout=0.0,
                     tied_embeddings=False, qk_layernorm=True, multi_latent_attention=True,
                     kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128)
    return [lite, replace(lite, name="v2-attention/8", q_lora_rank=1536),
            replace(lite, name="v2-lite-attention/8 no norms", qk_layernorm=False),
            replace(lite, name="v2-attention/8 no norms", q_lora_rank=1536,
                    qk_layernorm=False)]


def moe_models() -> list[Any]:
    """A small MoE layer (hidden 256, 2 heads, 4 experts of 128, top-2, SwiGLU) with a shared
    expert of 384, without and with its sigmoid gate (Qwen2-MoE's shared_expert_gate)."""
    from autotune.specs.model import ModelSpec

    moe = ModelSpec(name="moe-shared/cpu", num_layers=1, hidden_size=256,
                    num_attention_heads=2, ffn_hidden_size=512, vocab_size=1024,
                    seq_length=256, global_batch_size=1, normalization="RMSNorm",
                    add_bias_linear=False, gated_linear_unit=True, activation="swiglu",
                    position_embedding="rope", hidden_dropout=0.0, attention_dropout=0.0,
                    tied_embeddings=False, num_experts=4, moe_topk=2, moe_ffn_hidden_size=128,
                    moe_shared_expert_intermediate_size=384)
    return [moe, replace(moe, name="moe-shared-gate/cpu", moe_shared_expert_gate=True)]


def _world() -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:  # a free one: two counts may run side by side
            import socket

            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
        dist.init_process_group("gloo", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    import torch

    from autotune.worker import build

    build._patch_megatron_core()  # the installed release's holes, as the worker fills them
    if not torch.cuda.is_available():  # MLA's rotary buffers (the module docstring)
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
        # A checkpoint stores the CUDA generator's state to draw the same numbers again
        # (tensor_parallel/random.py, _get_all_rng_states): the CPU generator's here.
        from megatron.core.tensor_parallel import random as rng

        rng._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()


def _cuda_rms_norm() -> Any:
    """torch.nn.RMSNorm saving what CUDA's fused kernel saves (input, weight, fp32 rstd)."""
    import torch

    class FusedRmsNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor,
                    eps: float) -> torch.Tensor:
            rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
            ctx.save_for_backward(x, weight, rstd)
            return (x.float() * rstd).type_as(x) * weight

        @staticmethod
        def backward(ctx: Any, *grads: torch.Tensor) -> Any:
            raise NotImplementedError("forward only: it counts what backward would keep")

    class Norm(torch.nn.RMSNorm):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = FusedRmsNorm.apply(  # type: ignore[no-untyped-call]
                x, self.weight, self.eps or 1e-5)
            return out

    return Norm


def _cuda_sdpa() -> Any:
    """scaled_dot_product_attention saving what CUDA's fused kernels save (query, key, value,
    output, fp32 log-sum-exp per head and query). CPU's flash kernel wants one head dim for
    query, key and value; MLA's differ (qk_head_dim + qk_pos_emb_head_dim against v_head_dim)
    and CPU falls back to the math path, which saves fp32 scores. On a GPU PyTorch's
    memory-efficient and cuDNN kernels take them, saving what flash does."""
    import torch
    import torch.nn.functional as F

    math_sdpa = F.scaled_dot_product_attention

    class FusedSdpa(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    scale: float | None) -> torch.Tensor:
            with torch.no_grad():
                out = math_sdpa(q, k, v, is_causal=True, scale=scale)
            b, n, s, _ = out.shape
            # The fused kernels write [b, s, n, d] and return it as [b, n, s, d].
            out = out.transpose(1, 2).contiguous().transpose(1, 2)
            lse = torch.empty(b, n, s, dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx: Any, *grads: torch.Tensor) -> Any:
            raise NotImplementedError("forward only: it counts what backward would keep")

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
             is_causal: bool = True, scale: float | None = None) -> torch.Tensor:
        out: torch.Tensor = FusedSdpa.apply(q, k, v, scale)  # type: ignore[no-untyped-call]
        return out

    return sdpa


def count_layer(model: Any, *, impl: str = "sdpa", seq: int = 256, mbs: int = 1,
                modules: str | None = None) -> Count:
    """Build one layer of `model` as the worker does and count what its forward saves, under
    selective recompute of `modules` (`a+b`) where given."""
    import torch
    from megatron.core.transformer.spec_utils import build_module

    from autotune.dimensions import Impl, Recompute, RecomputeModules
    from autotune.layouts.layout import Layout
    from autotune.levers.recompute import module_position_savings, module_savings
    from autotune.levers.transformer_impl import attention_bytes
    from autotune.specs.activations import layer_activations, layer_bytes
    from autotune.trials.trial import TrialSpec
    from autotune.worker import build

    _world()
    m = model.with_overrides(seq_length=seq)
    layout = Layout(mbs=mbs, gbs=mbs, impl=Impl(impl))
    if modules:
        layout = replace(layout, recompute=Recompute.SELECTIVE,
                         recompute_modules=RecomputeModules(modules))
    spec = TrialSpec(model=m, layout=layout)
    kwargs = build.transformer_config_kwargs(spec)
    kwargs.update(num_layers=1, use_cpu_initialization=True)
    if m.is_moe:  # the alltoall dispatcher makes CUDA streams (the module docstring)
        kwargs.update(moe_token_dispatcher_type="allgather")
    config = build.transformer_config_class(kwargs)(**kwargs)
    rms_norm = torch.nn.RMSNorm
    torch.nn.RMSNorm = _cuda_rms_norm()  # type: ignore[misc]
    try:
        layer_spec = build._layer_spec(spec, config, None).layer_specs[0]
        layer = build_module(layer_spec, config=config, layer_number=1).to(torch.bfloat16)
    finally:
        torch.nn.RMSNorm = rms_norm  # type: ignore[misc]
    rope = None
    if m.position_embedding == "rope" and not m.multi_latent_attention:
        # megatron-core's RotaryEmbedding output [s, 1, 1, head_dim] (fp32), built here because
        # its forward moves inv_freq to the current CUDA device.
        inv = 1.0 / (m.rotary_base ** (torch.arange(0, m.head_dim, 2).float() / m.head_dim))
        freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
        rope = torch.cat((freqs, freqs), dim=-1)[:, None, None, :]
    x = torch.randn(seq, mbs, m.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    storages: dict[int, Any] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage  # its size read after the forward
        return t

    from autotune.worker import attention as sdpa_attention

    fused = sdpa_attention.F.scaled_dot_product_attention
    if m.qk_dim != m.v_dim:  # _cuda_sdpa: CPU's flash kernel takes one head dim
        sdpa_attention.F.scaled_dot_product_attention = _cuda_sdpa()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            layer(x, attention_mask=None, rotary_pos_emb=rope)
    finally:
        sdpa_attention.F.scaled_dot_product_attention = fused
    acts = layer_activations(m, 1, attention_bytes(m, impl))
    chosen = layout.recompute_modules.modules if modules else ()
    modelled = layer_bytes(acts, tokens=seq * mbs, seq=seq, tp=1, sequence_parallel=False,
                           freed=module_savings(acts, chosen, seq=seq, tp=1,
                                                sequence_parallel=False),
                           freed_per_position=module_position_savings(acts, chosen))
    counted = float(sum(storage.nbytes() for storage in storages.values()))
    return Count(model=m.name, seq=seq, mbs=mbs, counted=counted, modelled=modelled)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="preset (repeatable); default: "
                        "llama2-13b/8, llama3-8b/8, gpt2-xl/5")
    parser.add_argument("--heads-divisor", type=int, action="append")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--mbs", type=int, action="append")
    parser.add_argument("--impl", default="sdpa", choices=("sdpa",))
    parser.add_argument("--qk-layernorm", action="store_true",
                        help="the models with their query and key norms on (Qwen3's)")
    parser.add_argument("--mla", action="store_true",
                        help="Multi-Latent Attention layers (mla_models) instead")
    parser.add_argument("--moe", action="store_true",
                        help="MoE layers with a shared expert (moe_models) instead")
    parser.add_argument("--recompute-modules", help="selective recompute of these modules "
                        "(`core_attn+mla_up_proj`)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    names = args.model or ["llama2-13b", "llama3-8b", "gpt2-xl"]
    divisors = args.heads_divisor or ([8, 8, 5] if not args.model else [1] * len(names))
    if len(divisors) != len(names):
        parser.error("give one --heads-divisor per --model")
    warnings.filterwarnings("ignore")
    models = [scaled_model(n, k) for n, k in zip(names, divisors, strict=True)]
    if args.qk_layernorm:
        models = [replace(m, qk_layernorm=True) for m in models]
    if args.mla:
        models = mla_models()
    if args.moe:
        models = moe_models()
    rows = [count_layer(m, impl=args.impl, seq=args.seq, mbs=b, modules=args.recompute_modules)
            for m in models for b in (args.mbs or [1, 2])]
    if args.json:
        print(json.dumps([{"model": r.model, "seq": r.seq, "mbs": r.mbs, "counted": r.counted,
                           "modelled": r.modelled} for r in rows]))
        return 0
    print("| model | seq | mbs | counted B/token | modelled B/token | modelled / counted |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        counted, modelled = r.per_token
        print(f"| {r.model} | {r.seq} | {r.mbs} | {counted:.0f} | {modelled:.0f} | "
              f"{modelled / counted:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
