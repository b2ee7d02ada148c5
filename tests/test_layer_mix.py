"""Dense layers among the MoE layers (ModelSpec.moe_layer_freq; Megatron --moe-layer-freq):
the model's rules, where each pipeline stage's layers fall (against megatron-core's own
offsets), and the stages priced from the two kinds of layer."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.errors import ConfigError
from autotune.layouts.layout import Layout
from autotune.levers.pipeline_split import stage_layer_kinds
from autotune.levers.recompute import acting_layout
from autotune.predict.cost import estimate_cost
from autotune.predict.memory import estimate_memory, stage_params
from autotune.predict.trust import outside_range
from autotune.specs.flops import model_flops_per_token
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.model import ModelSpec
from autotune.specs.params import count_parameters

MOE = ModelSpec(name="moe", num_layers=8, hidden_size=1024, num_attention_heads=16,
                num_query_groups=4, ffn_hidden_size=4096, vocab_size=32000, seq_length=2048,
                global_batch_size=64, num_experts=8, moe_topk=2, moe_ffn_hidden_size=1024,
                gated_linear_unit=True, activation="swiglu", normalization="RMSNorm",
                add_bias_linear=False, tied_embeddings=False, position_embedding="rope",
                hidden_dropout=0.0, attention_dropout=0.0)
FIRST_DENSE = dataclasses.replace(MOE, name="first-dense", moe_layer_freq=(0, 0) + (1,) * 6)
CLUSTER = ClusterSpec(num_gpus=8, gpus_per_node=8, gpu=gpu_spec("h100-80gb"))


@pytest.mark.parametrize(("freq", "error"), [
    (0, "between 1 and num_layers=8"),
    (9, "between 1 and num_layers=8"),
    ((0, 1), "for each of the 8 layers, got 2"),
    ((0, 2) + (1,) * 6, "0 \\(dense\\) or 1 \\(MoE\\)"),
    ((0,) * 8, "no MoE layer"),
    (True, "a positive integer or a list"),
    ("2", "a positive integer or a list"),
])
def test_bad_patterns_are_one_line(freq: object, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        dataclasses.replace(MOE, moe_layer_freq=freq)


def test_a_pattern_needs_experts() -> None:
    dense = dataclasses.replace(MOE, num_experts=None, moe_ffn_hidden_size=None)
    with pytest.raises(ConfigError, match="needs num_experts above 1"):
        dataclasses.replace(dense, moe_layer_freq=2)


@pytest.mark.parametrize(("freq", "mask"), [
    (1, (True,) * 8),
    (2, (True, False) * 4),               # megatron-core: MoE where i % N == 0
    ((0, 0) + (1,) * 6, (False, False) + (True,) * 6),
    ([1, 0] * 4, (True, False) * 4),      # a list from JSON
])
def test_the_mask(freq: object, mask: tuple[bool, ...]) -> None:
    model = dataclasses.replace(MOE, moe_layer_freq=freq)
    assert model.moe_layer_mask == mask
    assert model.has_dense_layers == (not all(mask))


LAYOUTS = [
    Layout(pp=2, gbs=64),
    Layout(pp=4, gbs=64),
    Layout(pp=2, vpp=2, gbs=64),
    Layout(pp=4, vpp=2, gbs=64),
    Layout(pp=2, first_stage_layers=2, gbs=64),
    Layout(pp=3, first_stage_layers=2, last_stage_layers=2, gbs=64),
    Layout(pp=2, embedding_loss_split=True, gbs=64),
]


@pytest.mark.megatron
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda s: s.describe())
def test_stage_layers_are_megatron_cores(layout: Layout) -> None:
    """Each rank's (dense, MoE) layers from the layers megatron-core's own offsets give each of
    its model chunks (transformer_layer.py get_transformer_layer_offset,
    transformer_block.py get_num_layers_to_build)."""
    core = pytest.importorskip("megatron.core.transformer.transformer_layer")
    block = pytest.importorskip("megatron.core.transformer.transformer_block")
    from megatron.core.transformer.transformer_config import TransformerConfig

    model = dataclasses.replace(FIRST_DENSE, moe_layer_freq=(0, 1, 0, 1, 1, 1, 0, 1))
    config = TransformerConfig(
        num_layers=model.num_layers, hidden_size=64, num_attention_heads=4,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp if layout.vpp > 1 else None,
        num_layers_in_first_pipeline_stage=layout.first_stage_layers or None,
        num_layers_in_last_pipeline_stage=layout.last_stage_layers or None,
        account_for_embedding_in_pipeline_split=layout.embedding_loss_split,
        account_for_loss_in_pipeline_split=layout.embedding_loss_split,
        pipeline_dtype=__import__("torch").bfloat16)
    mask = model.moe_layer_mask
    expected = []
    for rank in range(layout.pp):
        dense = moe = 0
        for v in range(layout.vpp):
            vp = v if layout.vpp > 1 else None
            offset = core.get_transformer_layer_offset(config, vp_stage=vp, pp_rank=rank)
            n = block.get_num_layers_to_build(config, vp_stage=vp, pp_rank=rank)
            moe += sum(mask[offset:offset + n])
            dense += n - sum(mask[offset:offset + n])
        expected.append((dense, moe))
    assert stage_layer_kinds(layout, model) == tuple(expected)


def test_totals_count_each_kind() -> None:
    dense, moe = FIRST_DENSE.dense_layer_model, FIRST_DENSE.moe_layer_model
    assert count_parameters(FIRST_DENSE) == pytest.approx(
        (2 * count_parameters(dense) + 6 * count_parameters(moe)) / 8)
    assert model_flops_per_token(FIRST_DENSE) == pytest.approx(
        (2 * model_flops_per_token(dense) + 6 * model_flops_per_token(moe)) / 8)
    assert count_parameters(dense) < count_parameters(FIRST_DENSE) < count_parameters(MOE)


@pytest.mark.parametrize("layout", [Layout(pp=2, dp=4, ep=4, gbs=64),
                                    Layout(pp=4, dp=2, ep=2, vpp=2, gbs=64)],
                         ids=lambda s: s.describe())
def test_a_stage_of_moe_layers_alone_is_the_moe_models(layout: Layout) -> None:
    """The dense layers sit on the first stage: the last stage is the all-MoE model's, and the
    first lies between the two kinds', by its layers."""
    mixed = estimate_memory(FIRST_DENSE, layout, CLUSTER)
    moe = estimate_memory(MOE, layout, CLUSTER)
    dense = estimate_memory(FIRST_DENSE.dense_layer_model, layout, CLUSTER)
    assert mixed.stages[-1] == moe.stages[-1]
    first = [st.total_bytes for st in (dense.stages[0], mixed.stages[0], moe.stages[0])]
    assert first[0] < first[1] < first[2]
    # The stage's parameters: its layers of each kind, exactly.
    d, e = stage_params(FIRST_DENSE, layout, 0)
    dd, de = stage_params(FIRST_DENSE.dense_layer_model, layout, 0)
    md, me = stage_params(MOE, layout, 0)
    kinds = stage_layer_kinds(layout, FIRST_DENSE)[0]
    n = sum(kinds)
    assert (d, e) == pytest.approx(((kinds[0] * dd + kinds[1] * md) / n,
                                    (kinds[0] * de + kinds[1] * me) / n))
    # Step time: the pipeline runs at its slowest stage's pace, here one of MoE layers alone
    # (this model's MoE layers are slower than its dense ones: their host terms), as in the
    # all-MoE model; the model's FLOPs per token are its own (a dense layer's MLP does more).
    mixed_c, moe_c, dense_c = (estimate_cost(m, layout, CLUSTER)
                               for m in (FIRST_DENSE, MOE, FIRST_DENSE.dense_layer_model))
    assert mixed_c.compute_s == pytest.approx(moe_c.compute_s) != dense_c.compute_s
    assert mixed_c.launch_s == pytest.approx(moe_c.launch_s)
    assert mixed_c.tflops_per_gpu > moe_c.tflops_per_gpu


@pytest.mark.parametrize(("modules", "dense", "moe"), [
    ("core_attn+mlp", "core_attn+mlp", "core_attn"),
    ("layernorm+moe", "none", "layernorm+moe"),     # TE fuses a dense layer's norms
    ("core_attn+moe_act", "core_attn", "core_attn+moe_act"),
    ("mlp", "mlp", "none"),
])
def test_each_kind_recomputes_the_modules_that_act_on_it(modules: str, dense: str,
                                                         moe: str) -> None:
    layout = Layout(recompute="selective", recompute_modules=modules, impl="te", gbs=64)

    def acting(model: ModelSpec) -> str:
        s = acting_layout(model, layout)
        return "none" if s.recompute == "none" else str(s.recompute_modules)

    assert (acting(FIRST_DENSE.dense_layer_model), acting(FIRST_DENSE.moe_layer_model)) == (
        dense, moe)


def test_the_trust_line_says_so() -> None:
    note = ("dense layers among MoE layers measured on one model at pp 1 only (step time up "
            "to 34% slow there)")
    assert note in outside_range(FIRST_DENSE, CLUSTER)
    assert note not in outside_range(MOE, CLUSTER)


def test_fp8_checks_both_kinds_of_layer() -> None:
    """TE's FP8 dimension rule reads a dense layer's MLP too: a dense width TE cannot run in
    FP8 is refused on a mixed model, though every MoE layer's GEMMs could."""
    from autotune.levers.fp8 import LEVER

    odd = dataclasses.replace(FIRST_DENSE, ffn_hidden_size=4100)
    layout = Layout(fp8="hybrid", impl="te", gbs=64)
    rule = next(r for r in LEVER.rules if r.name == "fp8_dims")
    assert rule.check(layout, FIRST_DENSE, CLUSTER) is None
    assert "dense layers' fc2 GEMM's input features divisible by 16" in (
        rule.check(layout, odd, CLUSTER) or "")
