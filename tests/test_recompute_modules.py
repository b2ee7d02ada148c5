"""Selective recompute of mla_up_proj, shared_experts, and mlp with an MoE-layer module on a model
of dense and MoE layers (NVIDIA's DeepSeek-V3 recipe), as megatron-core 0.16.1 runs them
(multi_latent_attention.py, moe_layer.py, transformer_layer.py): the rules, each kind of layer's
acting modules, what each frees and reruns, the worker's configuration and the export and read
of the flags. What one layer keeps under them, counted with megatron-core on CPU:
tests/test_activation_slope.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from conftest import cluster
from doubles.requirements import require_torch_and_megatron_core

from autotune.dimensions import Recompute, RecomputeModules
from autotune.layouts.layout import Layout, check
from autotune.levers.base import StageState
from autotune.levers.recompute import (
    LEVER,
    acting_layout,
    checkpoint_calls,
    module_position_savings,
    module_savings,
)
from autotune.levers.transformer_impl import attention_bytes
from autotune.megatron.core_config import core_config
from autotune.megatron.megatron_args import megatron_lm_args
from autotune.megatron.megatron_command import read_megatron_command
from autotune.predict.cost import LayerTimes, estimate_cost
from autotune.predict.memory import estimate_memory
from autotune.specs.activations import layer_activations, rope_table_bytes
from autotune.specs.flops import mlp_forward_flops_per_token, shared_expert_flops_per_token
from autotune.specs.model import ModelSpec

DEEPSEEK = ModelSpec(name="deepseek-like", num_layers=8, hidden_size=1024,
                     num_attention_heads=16, ffn_hidden_size=4096, vocab_size=32000,
                     seq_length=2048, global_batch_size=64, normalization="RMSNorm",
                     add_bias_linear=False, gated_linear_unit=True, activation="swiglu",
                     position_embedding="rope", tied_embeddings=False, hidden_dropout=0.0,
                     attention_dropout=0.0, qk_layernorm=True, multi_latent_attention=True,
                     q_lora_rank=384, kv_lora_rank=128, qk_head_dim=64, qk_pos_emb_head_dim=32,
                     v_head_dim=64, num_experts=8, moe_topk=2, moe_ffn_hidden_size=512,
                     moe_shared_expert_intermediate_size=512,
                     moe_layer_freq=(0, 0) + (1,) * 6)
"""DeepSeek-V3's shape on a small scale: MLA with the query's latent and the latent norms, two
dense layers first, MoE layers with a shared expert."""
MLA_DENSE = DEEPSEEK.dense_layer_model
PLAIN_MOE = dataclasses.replace(DEEPSEEK, name="plain-moe", multi_latent_attention=False,
                                qk_layernorm=False, q_lora_rank=None, kv_lora_rank=None,
                                qk_head_dim=None, qk_pos_emb_head_dim=None, v_head_dim=None,
                                moe_shared_expert_intermediate_size=None, moe_layer_freq=1)
"""Every layer MoE, no shared expert, no MLA."""


def _layout(**fields: Any) -> Layout:
    fields.setdefault("gbs", 64)
    fields.setdefault("impl", "sdpa")
    return Layout(dp=8 // fields.get("tp", 1), **fields)  # 8 GPUs; ep within dp


def _selective(modules: str, **fields: Any) -> Layout:
    return _layout(recompute="selective", recompute_modules=modules, **fields)


# -- rules -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "modules", "impl", "refused"), [
    (DEEPSEEK, "mla_up_proj+mlp+moe", "sdpa", False),
    (DEEPSEEK, "core_attn+mla_up_proj+mlp+moe_act+shared_experts", "te", False),
    (DEEPSEEK, "mlp+shared_experts", "sdpa", False),
    (MLA_DENSE, "layernorm+mla_up_proj+mlp", "sdpa", False),
    # TransformerConfig.__post_init__: mla_up_proj only with multi_latent_attention.
    (PLAIN_MOE, "mla_up_proj", "sdpa", True),
    # No shared expert, no dense layer, no MoE layer: the module acts on nothing.
    (PLAIN_MOE, "shared_experts", "sdpa", True),
    (PLAIN_MOE, "mlp+moe", "sdpa", True),
    (MLA_DENSE, "mlp+moe", "sdpa", True),
    (MLA_DENSE, "shared_experts", "sdpa", True),
    # moe recomputes the layer shared_experts is part of: not a value.
    (DEEPSEEK, "moe+shared_experts", "sdpa", True),
])
def test_rules(model: ModelSpec, modules: str, impl: str, refused: bool) -> None:
    s = _selective(modules, impl=impl, ep=8 if model.is_moe else 1)
    broken = {v.rule for v in check(s, model, cluster(8, gpus_per_node=8))}
    assert broken == ({"recompute_modules"} if refused else set()), broken


# -- each kind of layer ----------------------------------------------------------------------


@pytest.mark.parametrize(("modules", "dense", "moe"), [
    ("mla_up_proj+mlp+moe", "mla_up_proj+mlp", "mla_up_proj+moe"),
    ("mlp+moe_act+shared_experts", "mlp", "moe_act+shared_experts"),
    ("core_attn+mlp", "core_attn+mlp", "core_attn"),
    ("mlp", "mlp", None),                      # nothing acts on the MoE layers: no recompute
    ("shared_experts", None, "shared_experts"),
])
def test_each_kind_of_layer_gets_its_acting_modules(modules: str, dense: str | None,
                                                     moe: str | None) -> None:
    s = _selective(modules, ep=8)
    for kind, expected in ((DEEPSEEK.dense_layer_model, dense), (DEEPSEEK.moe_layer_model, moe)):
        got = acting_layout(kind, s)
        if expected is None:
            assert got.recompute == Recompute.NONE
        else:
            assert (got.recompute, got.recompute_modules) == (Recompute.SELECTIVE,
                                                              RecomputeModules(expected))


# -- what each frees ---------------------------------------------------------------------------


@pytest.mark.parametrize(("modules", "tp", "fused", "per_token"), [
    # MLA's query, key and value, bf16, heads / t per rank: 2 x 8 x (96 + 96 + 64).
    ("mla_up_proj", 2, False, 2 * 8 * (96 + 96 + 64)),
    # TE fuses the latent norms into the up projections: their fp32 rstd and outputs go too.
    ("mla_up_proj", 2, True, 2 * 8 * (96 + 96 + 64) + (4 + 2 * 384) + (4 + 2 * 128)),
    # The shared expert's SwiGLU fc1 output (2 x 2 x 512 / t) and fc2 input (2 x 512 / t).
    ("shared_experts", 2, False, 2 * 2 * 512 / 2 + 2 * 512 / 2),
    ("mla_up_proj+shared_experts", 1, False, 2 * 16 * 256 + 2 * 2 * 512 + 2 * 512),
])
def test_module_savings(modules: str, tp: int, fused: bool, per_token: float) -> None:
    kind = DEEPSEEK.moe_layer_model
    acts = layer_activations(kind, tp, attention_bytes(kind, "sdpa"))
    freed = module_savings(acts, tuple(modules.split("+")), seq=2048, tp=tp,
                           sequence_parallel=False, fused_latent_norms=fused)
    assert freed == pytest.approx(per_token)


def test_shared_expert_gate_is_freed_with_it() -> None:
    # Its sigmoid gate keeps the MLP's output and the score (2h + 2), in the checkpoint too.
    gated = dataclasses.replace(DEEPSEEK.moe_layer_model, moe_shared_expert_gate=True)
    plain = DEEPSEEK.moe_layer_model
    freed = [module_savings(layer_activations(m, 1, attention_bytes(m, "sdpa")),
                            ("shared_experts",), seq=2048, tp=1, sequence_parallel=False)
             for m in (gated, plain)]
    assert freed[0] - freed[1] == 2 * 1024 + 2


def test_mla_up_proj_keeps_the_rope_frequencies_not_the_tables() -> None:
    acts = layer_activations(MLA_DENSE, 1, attention_bytes(MLA_DENSE, "sdpa"))
    # cos and sin in bf16 for the query and the key (4 x 2 x 32) become fp32 frequencies (4 x 32).
    assert module_position_savings(acts, ("mla_up_proj",)) == rope_table_bytes(MLA_DENSE) / 2
    assert module_position_savings(acts, ("core_attn", "mlp")) == 0.0


def test_memory_falls_by_what_mla_up_proj_frees() -> None:
    s = _layout()
    acts = layer_activations(MLA_DENSE, 1, attention_bytes(MLA_DENSE, "sdpa"))
    tokens, seq = 2048, 2048
    plain = estimate_memory(MLA_DENSE, s, cluster(8, gpus_per_node=8)).stages[0]
    up = estimate_memory(MLA_DENSE, _selective("mla_up_proj"),
                         cluster(8, gpus_per_node=8)).stages[0]
    freed = MLA_DENSE.num_layers * (tokens * acts.mla_qkv + seq * acts.per_position / 2)
    assert plain.activations_bytes - up.activations_bytes == pytest.approx(freed)


def test_mixed_model_recomputes_mlp_and_moe_together() -> None:
    # Dense layers recompute mlp, MoE layers moe: less memory than either alone.
    c = cluster(8, gpus_per_node=8)
    peak = {mods: estimate_memory(DEEPSEEK, _selective(mods, ep=8), c).stages[0]
            .activations_bytes for mods in ("mlp", "moe", "mlp+moe")}
    none = estimate_memory(DEEPSEEK, _layout(ep=8), c).stages[0].activations_bytes
    assert peak["mlp+moe"] < min(peak["mlp"], peak["moe"]) < max(peak["mlp"], peak["moe"]) < none
    # The savings add up: each kind of layer frees its own.
    assert none - peak["mlp+moe"] == pytest.approx((none - peak["mlp"]) + (none - peak["moe"]))


# -- what each reruns --------------------------------------------------------------------------


def _stage(model: ModelSpec) -> StageState:
    acts = layer_activations(model, 1, attention_bytes(model, "sdpa"))
    layer = LayerTimes(gemm=10.0, core=3.0, elem=1.0, tp=0.0, cp=0.0, ep=0.5)
    # No element-wise traffic: the reruns are the GEMMs' seconds alone.
    return StageState(layers=4, chunk=4, layer=layer, mlp_forward_s=2.0, mla_up_forward_s=0.25,
                      activations=acts, tokens=2048, layer_bytes=0.0, hbm_bytes_per_s=1e12,
                      elementwise_bytes=0.0)


@pytest.mark.parametrize(("modules", "rerun"), [
    ("mla_up_proj", 0.25),                  # the up projections' GEMMs
    ("shared_experts", 2.0 * shared_expert_flops_per_token(DEEPSEEK.moe_layer_model)
     / mlp_forward_flops_per_token(DEEPSEEK.moe_layer_model)),
    ("moe", 2.0 + 0.5 / 2),                 # the whole MoE layer, its dispatch again
    # The shared expert's share of the MoE layer's GEMMs: its SwiGLU MLP (3 GEMMs of h x 512)
    # beside two routed experts' and the router's h x 8.
    ("mla_up_proj+moe_act+shared_experts",
     0.25 + 2.0 * 6 * 1024 * 512 / (3 * 6 * 1024 * 512 + 2 * 1024 * 8)),
])
def test_reruns(modules: str, rerun: float) -> None:
    kind = DEEPSEEK.moe_layer_model
    assert LEVER.stage_cost is not None
    state = LEVER.stage_cost(kind, _selective(modules, ep=8), cluster(8, gpus_per_node=8),
                             None, _stage(kind))  # type: ignore[arg-type]
    assert state.rerun_s == pytest.approx(rerun)
    assert state.checkpoints == checkpoint_calls(_selective(modules), 4)


@pytest.mark.parametrize(("modules", "per_layer"), [
    ("mla_up_proj", 1), ("shared_experts", 1), ("layernorm+mla_up_proj+mlp+moe_act", 5),
    ("core_attn+mla_up_proj+mlp+moe_act+shared_experts", 5),
])
def test_checkpoint_calls(modules: str, per_layer: int) -> None:
    assert checkpoint_calls(_selective(modules), 4) == 4 * per_layer


def test_each_module_costs_time() -> None:
    c = cluster(8, gpus_per_node=8)
    step = {mods: estimate_cost(DEEPSEEK, _selective(mods, ep=8) if mods else _layout(ep=8),
                                c).step_time_s
            for mods in ("", "mla_up_proj", "shared_experts", "mla_up_proj+shared_experts",
                         "mlp+moe")}
    assert step[""] < step["mla_up_proj"] < step["mla_up_proj+shared_experts"]
    assert step[""] < step["shared_experts"] < step["mla_up_proj+shared_experts"]
    assert step["shared_experts"] < step["mlp+moe"]  # the whole MoE layer rerun


# -- worker, export, read ----------------------------------------------------------------------


@pytest.mark.parametrize("modules", ["mla_up_proj+mlp+moe", "core_attn+mla_up_proj+mlp+moe_act"
                                     "+shared_experts", "layernorm+mla_up_proj+shared_experts"])
def test_worker_config_reaches_megatron_core(modules: str) -> None:
    s = _selective(modules, ep=8, impl="te")
    assert core_config(DEEPSEEK, s).transformer["recompute_modules"] == tuple(modules.split("+"))
    require_torch_and_megatron_core()
    from autotune.trials.trial import TrialSpec
    from autotune.worker import build

    kwargs = build.transformer_config_kwargs(TrialSpec(model=DEEPSEEK, layout=s))
    kwargs.update(use_cpu_initialization=True)
    # TransformerConfig.__post_init__ accepts the set (it raises on mla_up_proj without MLA).
    config = build.transformer_config_class(kwargs)(**kwargs)
    assert config.recompute_granularity == "selective"
    assert config.recompute_modules == modules.split("+")


@pytest.mark.parametrize("modules", ["mla_up_proj", "mla_up_proj+mlp+moe",
                                     "core_attn+layernorm+mla_up_proj+mlp+moe_act+shared_experts",
                                     "mlp+shared_experts"])
def test_export_is_read_back(tmp_path: Path, modules: str) -> None:
    s = _selective(modules, ep=8, impl="te")
    args = megatron_lm_args(DEEPSEEK, s)
    at = args.index("--recompute-modules")
    assert args[at + 1:at + 1 + len(modules.split("+"))] == modules.split("+")
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py "
                      + " ".join(f"'{a}'" if "(" in a or "*" in a else a for a in args) + "\n")
    fields = read_megatron_command(str(script)).layout_fields
    assert (fields["recompute"], fields["recompute_modules"]) == ("selective", modules)
