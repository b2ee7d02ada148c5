"""Multi-Latent Attention (DeepSeek-V2/V3, megatron-core 0.16.1 multi_latent_attention.py) in
autotune's model: its rules, parameters per rank, FLOPs, fused-attention head dims and the
worker's configuration. Parameter counts against megatron-core itself:
tests/test_param_counts_megatron.py (the MLA rows)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from autotune.errors import ConfigError
from autotune.specs.model import ModelSpec

BASE: dict[str, Any] = dict(name="mla", num_layers=2, hidden_size=2048, num_attention_heads=16,
                            vocab_size=102400, seq_length=4096, global_batch_size=8,
                            normalization="RMSNorm", add_bias_linear=False,
                            gated_linear_unit=True, activation="swiglu",
                            position_embedding="rope", ffn_hidden_size=10944,
                            qk_layernorm=True, multi_latent_attention=True, kv_lora_rank=512,
                            qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128,
                            hidden_dropout=0.0, attention_dropout=0.0)
"""DeepSeek-V2-Lite's attention (config.json: no q_lora_rank), two dense layers."""

MLA = ModelSpec(**BASE)


@pytest.mark.parametrize(("change", "message"), [
    ({"num_query_groups": 4}, "no query groups .*num_query_groups=4 must be unset"),
    ({"kv_channels": 128}, "kv_channels must be unset"),
    ({"add_qkv_bias": True}, "no bias: add_qkv_bias must be false"),
    ({"position_embedding": "learned_absolute"}, "position_embedding must be rope"),
    ({"position_embedding": "none"}, "position_embedding must be rope"),
    ({"kv_lora_rank": None}, "multi_latent_attention needs kv_lora_rank"),
    ({"qk_head_dim": None, "v_head_dim": None},
     "multi_latent_attention needs qk_head_dim, v_head_dim"),
    ({"multi_latent_attention": False}, "kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, "
                                        "v_head_dim need multi_latent_attention true"),
    ({"q_lora_rank": 0}, "q_lora_rank must be a positive integer"),
    ({"qk_pos_emb_head_dim": -64}, "qk_pos_emb_head_dim must be a positive integer"),
    ({"hidden_size": 2050}, "divisible by num_attention_heads"),  # Megatron-LM's kv_channels
])
def test_mla_rules_are_one_line(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        ModelSpec(**{**BASE, **change})
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("change", [
    {},
    {"q_lora_rank": 1536},                               # V2/V3's compressed query
    {"qk_layernorm": False},                             # megatron-core builds it without norms
    {"num_query_groups": 16},                            # = heads: no GQA
    {"num_experts": 64, "moe_topk": 6, "moe_ffn_hidden_size": 1408,
     "moe_shared_expert_intermediate_size": 2816},
])
def test_mla_models_megatron_core_builds_are_accepted(change: dict[str, Any]) -> None:
    model = ModelSpec(**{**BASE, **change})
    assert model.qk_dim == 192 and model.v_dim == 128 and model.attention_width == 16 * 128


def test_without_mla_the_head_dims_are_head_dim() -> None:
    plain = ModelSpec(name="gqa", num_layers=2, hidden_size=2048, num_attention_heads=16,
                      num_query_groups=4, kv_channels=96, vocab_size=1000, seq_length=128,
                      global_batch_size=1)
    assert (plain.qk_dim, plain.v_dim, plain.attention_width) == (96, 96, 16 * 96)


@pytest.mark.parametrize("preset", ["llama3-8b", "gpt2-xl", "mixtral-8x7b"])
def test_models_without_mla_keep_their_study_names(preset: str) -> None:
    """An MLA model is a study of its own (the old names: test_hardening_inputs.py
    test_a_model_field_added_later_keeps_the_study_name, with the MLA fields)."""
    from autotune.search.space import load_space
    from autotune.search.storage import default_study_name
    from autotune.specs.hardware import ClusterSpec, gpu_spec
    from autotune.specs.presets import load_model

    model = load_model(preset)
    cluster = ClusterSpec(num_gpus=8, gpus_per_node=8, gpu=gpu_spec("h100-80gb"))
    space = load_space()
    name = default_study_name(model, cluster, space, "simulate")
    mla = dataclasses.replace(model, num_query_groups=None, kv_channels=None,
                              add_qkv_bias=False, position_embedding="rope",
                              multi_latent_attention=True, kv_lora_rank=64, qk_head_dim=32,
                              qk_pos_emb_head_dim=16, v_head_dim=32)
    assert default_study_name(mla, cluster, space, "simulate") != name


V2 = dataclasses.replace(MLA, name="v2", q_lora_rank=1536)
"""DeepSeek-V2's attention (q_lora_rank 1536) on V2-Lite's widths."""


@pytest.mark.parametrize("model", [MLA, V2, dataclasses.replace(MLA, qk_layernorm=False),
                                   dataclasses.replace(V2, add_bias_linear=True)],
                         ids=["v2-lite", "v2", "no-norms", "proj-bias"])
def test_mla_flops_are_two_per_gemm_weight(model: ModelSpec) -> None:
    """Each GEMM weight is one multiply-add per token (mla_attention_params counts them apart),
    and core attention's QK^T and scores x V are qk_dim and v_dim wide per head."""
    from autotune.specs.flops import _layer_forward_flops_per_token, mlp_forward_flops_per_token
    from autotune.specs.params import mla_attention_params

    mats, core = _layer_forward_flops_per_token(model)
    weights = mla_attention_params(model, 1)[1]
    assert mats - mlp_forward_flops_per_token(model) == 2 * weights
    assert core == 2 * model.seq_length * 16 * (192 + 128)


@pytest.mark.parametrize(("model", "tp", "total", "linear"), [
    # V2-Lite: q_proj 2048 x 16*192 split; kv_down 2048 x 576 whole; kv_up 512 x 16*256 split;
    # proj 16*128 x 2048 split; kv_layernorm 512 (RMSNorm) whole.
    (MLA, 1, 2048 * 3072 + 2048 * 576 + 512 * 4096 + 2048 * 2048 + 512,
     2048 * 3072 + 2048 * 576 + 512 * 4096 + 2048 * 2048),
    (MLA, 4, 2048 * 768 + 2048 * 576 + 512 * 1024 + 512 * 2048 + 512,
     2048 * 768 + 2048 * 576 + 512 * 1024 + 512 * 2048),
    # V2's query latent: q_down 2048 x 1536 whole, q_up 1536 x 16*192 split, q_layernorm 1536.
    (V2, 2, 2048 * 1536 + 1536 * 1536 + 2048 * 576 + 512 * 2048 + 1024 * 2048 + 2048,
     2048 * 1536 + 1536 * 1536 + 2048 * 576 + 512 * 2048 + 1024 * 2048),
])
def test_mla_parameters_per_rank(model: ModelSpec, tp: int, total: int, linear: int) -> None:
    from autotune.predict.memory import _param_counts
    from autotune.specs.params import mla_attention_params

    assert mla_attention_params(model, tp) == (total, linear)
    counts = _param_counts(model, tp, 1, 1)
    mlp = 2048 * 2 * 10944 // tp + 10944 // tp * 2048
    assert counts.layer_dense == 2 * 2048 + total + mlp  # two RMSNorms of h
    assert counts.layer_linear == linear + mlp


@pytest.mark.parametrize(("model", "e", "latents"), [
    # kv_combined 2 x (512 + 64), its norm's rstd 4, the up projection's input 2 x 512.
    (MLA, 2.0, 1152 + 4 + 1024),
    (V2, 2.0, 2 * 1536 + 4 + 2 * 1536 + 1152 + 4 + 1024),
    (V2, 1.0, 2 * 1536 + 4 + 1536 + 1152 + 4 + 512),             # FP8 GEMM inputs
    (dataclasses.replace(MLA, qk_layernorm=False), 2.0, 1152),   # the view keeps kv_combined
    (dataclasses.replace(V2, qk_layernorm=False), 1.0, 1536 + 512),
    (dataclasses.replace(V2, normalization="LayerNorm"), 2.0,    # mean and rstd
     2 * 1536 + 8 + 2 * 1536 + 1152 + 8 + 1024),
])
def test_mla_latent_bytes(model: ModelSpec, e: float, latents: float) -> None:
    from autotune.specs.activations import mla_latent_bytes

    assert mla_latent_bytes(model, e) == latents


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_mla_activations_split_by_heads_and_keep_latents_whole(tp: int) -> None:
    from autotune.levers.transformer_impl import attention_bytes
    from autotune.specs.activations import layer_activations, mla_latent_bytes, rope_table_bytes

    acts = layer_activations(V2, tp, attention_bytes(V2, "te"))
    heads = 16 / tp
    # Q and K 192 wide per head, V and the projection's input 128, TE's log-sum-exp per head.
    attention = 2 * heads * 192 * 2 + 2 * heads * 128 + 2 * heads * 128
    mlp = 2 * 2 * 10944 / tp + 2 * 10944 / tp
    lse = acts.split - attention - mlp
    assert 0 <= lse <= 8 * heads
    assert acts.replicated == 2 * 2048 + 2 * 2048 + mla_latent_bytes(V2) + 2 * 2048 + 2 * 2048
    assert acts.qkv_extra == 0.0
    assert rope_table_bytes(V2) == 4 * 2 * 64  # cos and sin of the RoPE part only


@pytest.mark.parametrize(("impl", "split"), [
    # Unfused: RoPE (48 B) on 16 x 64 query and 64 key elements; the query, key and value
    # assembled (8 B on 16 x (192 + 192 + 128)).
    ("sdpa", 48 * (16 * 64 + 64) + 8 * 16 * 512),
    # Fused (TE's MLA RoPE kernels): 8 B on each query, key and value element.
    ("te", 8 * 16 * 512),
])
def test_mla_elementwise_bytes(impl: str, split: float) -> None:
    from autotune.specs.elementwise import NORM_BYTES, SWIGLU_BYTES, layer_elementwise_bytes

    got = layer_elementwise_bytes(V2, 1, impl)
    assert got.split - SWIGLU_BYTES * 10944 == split
    assert got.replicated - 2 * NORM_BYTES * 2048 - 2 * 12 * 2048 == NORM_BYTES * (1536 + 512)


@pytest.mark.parametrize(("model", "tp", "dims"), [
    (MLA, 2, [("q_proj", 2048, 1536), ("kv_down_proj", 2048, 576), ("kv_up_proj", 512, 2048),
              ("proj", 1024, 2048), ("fc1", 2048, 10944), ("fc2", 5472, 2048)]),
    (V2, 4, [("q_down_proj", 2048, 1536), ("q_up_proj", 1536, 768),
             ("kv_down_proj", 2048, 576), ("kv_up_proj", 512, 1024), ("proj", 512, 2048),
             ("fc1", 2048, 5472), ("fc2", 2736, 2048)]),
])
def test_mla_fp8_gemm_dims(model: ModelSpec, tp: int, dims: list[tuple[str, int, int]]) -> None:
    from types import SimpleNamespace

    from autotune.levers.fp8 import gemm_dims

    assert gemm_dims(model, SimpleNamespace(tp=tp)) == dims  # type: ignore[arg-type]


@pytest.mark.parametrize(("sp", "norm", "casts"), [
    # No SP: q_down and kv_down quantize h each; q_up and kv_up their norms' outputs (1536 +
    # 512, normalized); proj 1024, fc1 from TE's norm (h, normalized), fc2 5472. Backward:
    # the down projections' 1536 + 576, the up projections' 1536 + 2048, proj's h, fc1's
    # 2 x 5472, fc2's h.
    (False, 2048 + 2048, 2 * 2048 + 1024 + 5472 + 1536 + 576 + 1536 + 2048 + 2048 + 10944
     + 2048),
    (True, (2048 + 2048) / 2, 2 * 1024 + 1024 + 5472 + (1536 + 576) / 2 + 1536 + 2048 + 1024
     + 10944 + 1024),
])
def test_mla_fp8_casts(sp: bool, norm: float, casts: float) -> None:
    from autotune.layouts.layout import Layout
    from autotune.levers.fp8 import cast_elements, sp_gathers

    s = Layout(mbs=1, gbs=8, tp=2, sequence_parallel=sp)
    assert cast_elements(V2, s) == (norm, casts)
    assert sp_gathers(V2, s) == (2 * 3 + 2 if sp else 0)  # q_up, kv_up, fc1; proj, fc2


@pytest.mark.parametrize(("qk", "v", "cc", "why"), [
    (192, 128, (9, 0), None),                  # DeepSeek's dims: cuDNN on Hopper
    (192, 128, (10, 0), None),                 # and on Blackwell (cuDNN 9.11)
    (192, 128, (8, 0), "trains up to 128"),    # A100: flash-attn 2 takes equal dims only
    (96, 64, (8, 0), None),                    # both up to 128: anywhere
    (160, 64, (9, 0), None),                   # Hopper up to 256
    (256, 128, (9, 0), "excludes both from 128"),
    (320, 128, (9, 0), "up to 256 on Hopper"),
    (100, 64, (9, 0), "multiples of 8"),
])
def test_mla_fused_attention_head_dims(qk: int, v: int, cc: tuple[int, int],
                                       why: str | None) -> None:
    from autotune.levers.transformer_impl import fused_attention_unavailable

    model = ModelSpec(**{**BASE, "qk_head_dim": qk - 32, "qk_pos_emb_head_dim": 32,
                         "v_head_dim": v})
    got = fused_attention_unavailable(model, cc)
    assert got is None if why is None else why in got


def test_the_fused_head_dim_rule_reads_the_gpu() -> None:
    from autotune.layouts.layout import Layout
    from autotune.levers.transformer_impl import _fused_head_dim
    from autotune.specs.hardware import ClusterSpec, gpu_spec

    s = Layout(mbs=1, gbs=8, impl="te")  # type: ignore[arg-type]
    assert _fused_head_dim(s, MLA, ClusterSpec(num_gpus=8, gpus_per_node=8,
                                               gpu=gpu_spec("h100-80gb"))) is None
    refused = _fused_head_dim(s, MLA, ClusterSpec(num_gpus=8, gpus_per_node=8,
                                                  gpu=gpu_spec("a100-80gb")))
    assert refused is not None and refused.startswith("impl=te: query/key head dim 192")


@pytest.mark.parametrize(("model", "sp", "width"), [
    (dataclasses.replace(MLA, multi_latent_attention=False, qk_head_dim=None,
                         qk_pos_emb_head_dim=None, v_head_dim=None, kv_lora_rank=None),
     True, 2048),                                     # one QKV GEMM: h
    (MLA, False, (2048 + 2048 + 512) / 2),            # linear_q_proj's h, kv_up's 512
    (MLA, True, (2048 + 2048 + 512 + 64) / 2),        # and the key's RoPE part gathered
    (V2, True, (2048 + 1536 + 512 + 64) / 2),
])
def test_mla_tensor_parallel_width(model: ModelSpec, sp: bool, width: float) -> None:
    from autotune.predict.cost import _attention_tp_width

    assert _attention_tp_width(model, sp) == width


def test_mla_core_config_keys_are_mla_transformer_configs() -> None:
    from autotune.layouts.layout import Layout
    from autotune.megatron.core_config import core_config

    keys = core_config(V2, Layout(mbs=1, gbs=8)).transformer
    assert {k: keys[k] for k in ("multi_latent_attention", "q_lora_rank", "kv_lora_rank",
                                  "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
                                  "rope_type", "rotary_scaling_factor")} == {
        "multi_latent_attention": True, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128, "rope_type": "yarn",
        "rotary_scaling_factor": 1.0}
    plain = dataclasses.replace(MLA, multi_latent_attention=False, qk_head_dim=None,
                                qk_pos_emb_head_dim=None, v_head_dim=None, kv_lora_rank=None)
    assert "multi_latent_attention" not in core_config(plain, Layout(mbs=1, gbs=8)).transformer


def test_an_mla_model_is_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory and time come out for an MLA MoE model on 8 GPUs; TE's duplicated down
    projections cost each rank their whole GEMMs only at tp > 1 without sequence parallelism."""
    import autotune.predict.cost as cost
    from autotune.layouts.layout import Layout
    from autotune.predict.memory import estimate_memory
    from autotune.specs.hardware import ClusterSpec, gpu_spec

    moe = dataclasses.replace(V2, num_experts=8, moe_topk=2, moe_ffn_hidden_size=1408,
                              moe_shared_expert_intermediate_size=2816, num_layers=4)
    cluster = ClusterSpec(num_gpus=8, gpus_per_node=8, gpu=gpu_spec("h100-80gb"))
    layouts = {(impl, tp, sp): Layout(mbs=1, gbs=8, tp=tp, ep=8 // tp, impl=impl,  # type: ignore[arg-type]
                                      sequence_parallel=sp)
               for impl in ("te", "sdpa") for tp, sp in ((1, False), (2, False), (2, True))}
    for s in layouts.values():
        assert estimate_memory(moe, s, cluster).peak_bytes > 0
    times = {k: cost.estimate_cost(moe, s, cluster).step_time_s for k, s in layouts.items()}
    monkeypatch.setattr(cost, "mla_down_flops_per_token", lambda m: 0.0)
    without = {k: cost.estimate_cost(moe, s, cluster).step_time_s for k, s in layouts.items()}
    assert {k for k in times if times[k] != without[k]} == {("te", 2, False)}
    assert times["te", 2, False] > without["te", 2, False]


def test_an_mla_prediction_says_how_little_was_measured() -> None:
    from autotune.predict.trust import outside_range
    from autotune.specs.hardware import ClusterSpec, gpu_spec

    cluster = ClusterSpec(num_gpus=1, gpus_per_node=1, gpu=gpu_spec("h200"))
    assert outside_range(MLA, cluster) == [
        "Multi-Latent Attention measured on one model's layers only (step time within 11% "
        "there, 34% with MoE)"]
    plain = dataclasses.replace(MLA, multi_latent_attention=False, qk_head_dim=None,
                                qk_pos_emb_head_dim=None, v_head_dim=None, kv_lora_rank=None)
    assert outside_range(plain, cluster) == []


@pytest.mark.parametrize(("gpu", "kept"), [("h100-80gb", ("local", "sdpa", "te")),
                                            ("b200", ("local", "sdpa", "te")),
                                            ("a100-80gb", ("local",))])
def test_the_search_leaves_unfused_mla_impls_out_on_the_gpu(gpu: str,
                                                            kept: tuple[str, ...]) -> None:
    """The search tells the user once, with the reason of the GPU it plans for."""
    from autotune.dimensions import Impl
    from autotune.search.impls import rankable_impls
    from autotune.specs.hardware import gpu_spec

    choice = rankable_impls((Impl.LOCAL, Impl.SDPA, Impl.TE), "simulate", te_installed=False,
                            asked=True, model=MLA,
                            compute_capability=gpu_spec(gpu).compute_capability)
    assert tuple(str(i) for i in choice.kept) == kept
    note = choice.note()
    assert (note is not None and "query/key head dim 192" in note) == (len(kept) == 1)
