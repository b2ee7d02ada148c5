"""The megatron-core configuration a trial builds, as plain values: no torch, no megatron-core.

`core_config` is what the worker hands megatron-core for a model and layout: the
TransformerConfig, DistributedDataParallelConfig and OptimizerConfig keyword arguments, the layer
spec and the batch schedule; each lever adds its own keys (autotune.levers, `Lever.core_config`:
recompute, the pipeline split, offloading, the implementation's layer spec, the optimizer, ...)
after the core's, in registry order.
autotune.worker.build turns it into megatron-core objects; the orchestrator reads it to know when
two layouts are the same run (autotune.megatron.identity) and to check that every layout dimension
reaches the worker (tests/test_dimension_contract.py). dtypes and the activation are named here
("bfloat16", "silu") and resolved to torch objects in build.

The mapping follows Megatron-LM's megatron/training/arguments.py (`core_transformer_config_from_
args`) and training.py (`get_model`, `setup_model_and_optimizer`), with Megatron-LM's defaults
where the layout says nothing (bias-GELU and bias-dropout fusion on; grads accumulated and reduced
in fp32, as Megatron-LM does with --bf16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.layouts.layout import Layout
from autotune.levers import LEVERS
from autotune.specs.model import ModelSpec, padded_vocab_size

__all__ = ["MOE_TOKEN_DISPATCHER", "CoreConfig", "core_config", "mla_config"]

MOE_TOKEN_DISPATCHER = "alltoall"
"""megatron-core's token dispatcher for every MoE layout, the worker's and the export's
(--moe-token-dispatcher-type), at every ep. Megatron-LM recommends alltoall with expert
parallelism (arguments.py); at ep 1 it was also the faster of the two on one H200 with TE 2.11,
by 1.3-10.6% on four layouts (64 experts at mbs 1 and 4, 8 experts, Qwen1.5-MoE's layer with its
shared expert: results/benchmarks/2026-11-29-h200-moe-dispatcher-s23.md). Until session 23 the
export wrote allgather at ep 1, a run slower than the one the worker had measured."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreConfig:
    """Everything a trial's worker configures megatron-core with, as JSON-able values."""

    transformer: dict[str, Any]
    """TransformerConfig keyword arguments; `params_dtype`, `pipeline_dtype` and
    `activation_func` by name."""
    ddp: dict[str, Any]
    """DistributedDataParallelConfig keyword arguments (the first model chunk's)."""
    optimizer: dict[str, Any]
    """OptimizerConfig keyword arguments (params_dtype by name)."""
    model: dict[str, Any]
    """GPTModel arguments that depend on the layout, and the layer spec built (`layer_spec`,
    the transformer implementation's)."""
    schedule: dict[str, Any]
    """What megatron-core's forward_backward_func gets per step."""

    def signature(self) -> tuple[Any, ...]:
        """The whole configuration as one hashable value: equal for two layouts exactly when
        the worker would configure megatron-core the same way."""
        # core_config inserts the keys in one order for a given model, so the items need no
        # sorting (this runs for every valid layout of a space: 22,671 for gpt-1t on 3072 GPUs).
        return tuple(tuple(part.items()) for part in (
            self.transformer, self.ddp, self.optimizer, self.model, self.schedule))


def _transformer(m: ModelSpec, s: Layout) -> dict[str, Any]:
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
        "params_dtype": "bfloat16",
        "pipeline_dtype": "bfloat16",
        "variable_seq_lengths": False,
        "hidden_dropout": m.hidden_dropout,
        "attention_dropout": m.attention_dropout,
        "normalization": m.normalization,
        "add_bias_linear": m.add_bias_linear,
        "gated_linear_unit": swiglu,
        # Megatron-LM's --squared-relu: megatron.core.activations.squared_relu, compiled
        # (jit_fuser); ModelSpec refuses it with biases, so no bias fusion is asked of it.
        "activation_func": "silu" if swiglu else (
            "squared_relu" if m.activation == "squared_relu" else "gelu"),
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
        # megatron-core's default, kept on purpose: the unfused attention of impl local saves
        # fp32 probabilities. Megatron-LM's --attention-softmax-in-fp32 defaults to off, so
        # autotune.megatron.megatron_args passes it for impl local (measured: 9.4 GiB at gpt2-xl
        # mbs 4).
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
    }
    if m.normalization == "RMSNorm":
        kwargs["layernorm_epsilon"] = 1e-5
    # Only where set: megatron-core's defaults (False) stay out of the run key of every model
    # before them (autotune.megatron.identity).
    if m.add_qkv_bias:
        kwargs["add_qkv_bias"] = True
    if m.qk_layernorm:
        kwargs["qk_layernorm"] = True
    if m.multi_latent_attention:
        kwargs.update(mla_config(m))
    if m.apply_layernorm_1p:  # Megatron-LM's --apply-layernorm-1p sets this field
        kwargs["layernorm_zero_centered_gamma"] = True
    if m.is_moe:
        kwargs.update({
            "num_moe_experts": m.num_experts,
            "moe_router_topk": m.moe_topk,
            "moe_ffn_hidden_size": m.expert_ffn_size,
            "moe_token_dispatcher_type": MOE_TOKEN_DISPATCHER,
            "moe_router_load_balancing_type": "aux_loss",
            "moe_aux_loss_coeff": 1e-2,
        })
        # Only where set, as above: models without a shared expert keep their run keys.
        if m.moe_shared_expert_intermediate_size:
            kwargs["moe_shared_expert_intermediate_size"] = m.moe_shared_expert_intermediate_size
        if m.moe_shared_expert_gate:
            kwargs["moe_shared_expert_gate"] = True
        if m.moe_layer_freq != 1:  # a tuple here (run keys); the worker passes a list
            kwargs["moe_layer_freq"] = m.moe_layer_freq
    if m.mtp_num_layers:  # only where set, as above; the block spec: autotune.worker.build
        kwargs["mtp_num_layers"] = m.mtp_num_layers
        if m.mtp_loss_scaling_factor is not None:
            kwargs["mtp_loss_scaling_factor"] = m.mtp_loss_scaling_factor
    return kwargs


MLA_ROPE_TYPE = "yarn"
"""The RoPE of Multi-Latent Attention: MLATransformerConfig's default rope_type, which
Megatron-LM keeps unless --rope-type (arguments.py core_transformer_config_from_args pops it);
megatron-core fuses MLA's RoPE only with it (MLATransformerConfig.__post_init__)."""

MLA_ROTARY_SCALING_FACTOR = 1.0
"""Megatron-LM's --rotary-scaling-factor default (arguments.py _add_mla_args), which it hands
MLATransformerConfig (whose own default is 40): YaRN without scaling. The factor changes the
cos/sin tables' values only, never a shape or a kernel."""


def mla_config(m: ModelSpec) -> dict[str, Any]:
    """MLATransformerConfig's Multi-Latent Attention keys for `m` (autotune.worker.build builds
    MLATransformerConfig when `multi_latent_attention` is among the keys, as Megatron-LM's
    core_transformer_config_from_args does with --multi-latent-attention)."""
    return {"multi_latent_attention": True, "q_lora_rank": m.q_lora_rank,
            "kv_lora_rank": m.kv_lora_rank, "qk_head_dim": m.qk_head_dim,
            "qk_pos_emb_head_dim": m.qk_pos_emb_head_dim, "v_head_dim": m.v_head_dim,
            "rope_type": MLA_ROPE_TYPE, "rotary_scaling_factor": MLA_ROTARY_SCALING_FACTOR}


def core_config(model: ModelSpec, layout: Layout) -> CoreConfig:
    """The configuration autotune's worker builds for `layout` (pure)."""
    s = layout
    ddp = {
        # Megatron-LM forces fp32 gradient accumulation and reduction with --bf16
        # (arguments.py: accumulate_allreduce_grads_in_fp32) unless --grad-reduce-in-bf16
        # (autotune.levers.grad_reduce sets this key); trials must use the memory and speed of
        # the command that export prints.
        "grad_reduce_in_fp32": True,
    }
    optimizer = {"optimizer": "adam", "lr": 1e-4, "bf16": True, "params_dtype": "bfloat16",
                 "clip_grad": 1.0}
    transformer = _transformer(model, s)
    gpt: dict[str, Any] = {"vocab_size": padded_vocab_size(model, s.tp), "model_chunks": s.vpp}
    if model.rotary_percent != 1.0:  # a GPTModel argument; only where set (run keys)
        gpt["rotary_percent"] = model.rotary_percent
    parts = {"transformer": transformer, "ddp": ddp, "optimizer": optimizer, "model": gpt}
    for lever in LEVERS:  # each lever's keys (autotune.levers), in registry order
        for part, keys in lever.core_config(model, s).items():
            parts[part].update(keys)
    schedule = {"micro_batch_size": s.mbs, "num_microbatches": s.num_microbatches,
                "data_parallel_size": s.dp, "seq_length": model.seq_length}
    return CoreConfig(transformer=transformer, ddp=ddp, optimizer=optimizer,
                        model=gpt, schedule=schedule)
