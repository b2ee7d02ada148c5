"""Multi-Token Prediction (ModelSpec.mtp_num_layers; Megatron --mtp-num-layers): the model's
rules, its FLOPs, memory and step time on the last pipeline stage, and the flags both ways.
Its parameters against megatron-core's own GPTModel: tests/test_param_counts_megatron.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune.errors import ConfigError
from autotune.layouts.layout import Layout
from autotune.megatron.core_config import core_config
from autotune.megatron.megatron_args import megatron_lm_args
from autotune.megatron.megatron_command import read_megatron_command
from autotune.predict.cost import estimate_cost
from autotune.predict.memory import DEFAULT_MEMORY_PARAMS, estimate_memory, stage_params
from autotune.specs.flops import model_flops_per_token
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.model import ModelSpec, padded_vocab_size
from autotune.specs.params import parameter_counts

DENSE = ModelSpec(name="dense", num_layers=8, hidden_size=1024, num_attention_heads=16,
                  num_query_groups=4, ffn_hidden_size=4096, vocab_size=32000, seq_length=2048,
                  global_batch_size=64, gated_linear_unit=True, activation="swiglu",
                  normalization="RMSNorm", add_bias_linear=False, tied_embeddings=False,
                  position_embedding="rope", hidden_dropout=0.0, attention_dropout=0.0)
MTP = dataclasses.replace(DENSE, name="mtp", mtp_num_layers=1)
MOE = dataclasses.replace(DENSE, name="moe", num_experts=8, moe_topk=2, moe_ffn_hidden_size=1024)
# DeepSeek-V3's pattern: dense first layers, an MoE last layer, so an MoE MTP layer.
FIRST_DENSE = dataclasses.replace(MOE, name="first-dense", moe_layer_freq=(0, 0) + (1,) * 6)
CLUSTER = ClusterSpec(num_gpus=8, gpus_per_node=8, gpu=gpu_spec("h100-80gb"))


@pytest.mark.parametrize(("change", "error"), [
    ({"mtp_num_layers": -1}, "mtp_num_layers must be an integer between 0 and 16"),
    ({"mtp_num_layers": 17}, "mtp_num_layers must be an integer between 0 and 16"),
    ({"mtp_num_layers": True}, "mtp_num_layers must be an integer"),
    ({"mtp_num_layers": 1.5}, "mtp_num_layers must be an integer"),
    ({"mtp_num_layers": 0, "mtp_loss_scaling_factor": 0.1}, "needs mtp_num_layers above 0"),
    ({"mtp_num_layers": 1, "mtp_loss_scaling_factor": -0.1}, "between 0 and 100"),
    ({"mtp_num_layers": 1, "mtp_loss_scaling_factor": "0.1"}, "between 0 and 100"),
    # Megatron-LM's validate_args: rope or none only.
    ({"mtp_num_layers": 1, "position_embedding": "learned_absolute"},
     "needs position_embedding rope or none"),
])
def test_bad_mtp_settings_are_one_line(change: dict[str, object], error: str) -> None:
    with pytest.raises(ConfigError, match=error) as caught:
        dataclasses.replace(DENSE, **change)
    assert "\n" not in str(caught.value)


def test_a_model_file_reads_the_fields(tmp_path: Path) -> None:
    from autotune.specs.model import model_from_mapping

    fields = {**dataclasses.asdict(MTP), "mtp_loss_scaling_factor": 0.3}
    assert model_from_mapping(fields, "m.yaml") == dataclasses.replace(
        MTP, mtp_loss_scaling_factor=0.3)
    with pytest.raises(ConfigError, match="mtp_num_layers"):
        model_from_mapping({**fields, "mtp_num_layers": "1"}, "m.yaml")


@pytest.mark.parametrize(("model", "moe"), [
    (MTP, False),
    (dataclasses.replace(MOE, mtp_num_layers=1), True),
    (dataclasses.replace(FIRST_DENSE, mtp_num_layers=1), True),
    # Megatron-LM gpt_builders.py: the MTP layer is the last layer's kind.
    (dataclasses.replace(MOE, moe_layer_freq=(1,) * 7 + (0,), mtp_num_layers=1), False),
])
def test_the_mtp_layer_is_the_last_layers_kind(model: ModelSpec, moe: bool) -> None:
    layer = model.mtp_layer_model
    assert model.mtp_layer_is_moe == moe == layer.is_moe
    assert layer.mtp_num_layers == 0 and not layer.has_dense_layers
    # The kinds a mixed model is priced from carry no MTP (autotune.predict.mtp_terms).
    assert model.dense_layer_model.mtp_num_layers == model.moe_layer_model.mtp_num_layers == 0


@pytest.mark.parametrize("base", [DENSE, MOE, FIRST_DENSE], ids=lambda m: m.name)
@pytest.mark.parametrize("n", [1, 2])
def test_flops_add_a_layer_eh_proj_and_logits_per_mtp_layer(base: ModelSpec, n: int) -> None:
    """Megatron-LM's num_floating_point_operations (training.py): the MTP layers counted
    among the layers of the last layer's kind, 2h x h for eh_proj and the logits once more per
    MTP layer (its 3h of norms aside), forward and backward (x 3)."""
    h, v = base.hidden_size, base.vocab_size
    layer = base.mtp_layer_model
    longer = dataclasses.replace(layer, num_layers=layer.num_layers + 1)
    one_layer = model_flops_per_token(longer) - model_flops_per_token(layer)
    added = model_flops_per_token(dataclasses.replace(base, mtp_num_layers=n)) \
        - model_flops_per_token(base)
    assert added == pytest.approx(n * (one_layer + 3 * (2 * 2 * h * h + 2 * h * v)))


LAYOUTS = [Layout(tp=2, dp=4, gbs=64), Layout(pp=2, dp=4, gbs=64),
           Layout(pp=4, tp=2, gbs=64, sequence_parallel=True), Layout(pp=2, vpp=2, dp=4, gbs=64)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda s: s.describe())
def test_mtp_weighs_on_the_last_stage_only(layout: Layout) -> None:
    """Every MTP parameter sits on the last stage (megatron-core mtp_on_this_rank), with a copy
    of the word embeddings where that is not the first stage; the other stages are as
    without MTP, but for the first stage's embedding group (its gradient all-reduced with the
    copy's: finalize_model_grads.py), whose NCCL buffers an untied model had not."""
    base, mtp = estimate_memory(DENSE, layout, CLUSTER), estimate_memory(MTP, layout, CLUSTER)
    for before, after in zip(base.stages[:-1], mtp.stages[:-1], strict=True):
        group = DEFAULT_MEMORY_PARAMS.nccl_bytes_per_group if layout.pp > 1 else 0
        assert after.overhead_bytes - before.overhead_bytes == pytest.approx(group)
        assert dataclasses.replace(after, overhead_bytes=before.overhead_bytes) == before
    last = layout.pp - 1
    own = parameter_counts(MTP).mtp_layer_params  # at tp 1
    h, t = MTP.hidden_size, layout.tp
    embedding = padded_vocab_size(MTP, t) * h / t if layout.pp > 1 else 0
    added = sum(stage_params(MTP, layout, last)) - sum(stage_params(DENSE, layout, last))
    # At tp > 1 the column- and row-parallel weights split, the norms do not.
    norms = 2 * h + 3 * h  # the layer's two norms, enorm, hnorm, final_layernorm
    assert added == pytest.approx((own - norms) / t + norms + embedding)
    b, a = base.stages[-1], mtp.stages[-1]
    assert a.logits_bytes == pytest.approx(2 * b.logits_bytes)  # one MTP layer's logits
    assert a.activations_bytes > b.activations_bytes and a.weights_bytes > b.weights_bytes
    assert a.largest_block_bytes == b.largest_block_bytes


@pytest.mark.parametrize("layout", [Layout(pp=2, dp=4, ep=4, gbs=64),
                                    Layout(pp=4, dp=2, ep=2, vpp=2, gbs=64),
                                    Layout(dp=8, ep=8, gbs=64)],
                         ids=lambda s: s.describe())
def test_a_mixed_models_mtp_layer_is_one_kind(layout: Layout) -> None:
    """DeepSeek-V3's shape: what MTP adds to the last stage of the mixed model is what it adds
    to the all-MoE model's, whatever share of dense layers that stage has (at pp 1 a quarter);
    the first stage is untouched where it is not the last."""
    mixed = dataclasses.replace(FIRST_DENSE, mtp_num_layers=1)
    moe_mtp = dataclasses.replace(MOE, mtp_num_layers=1)
    plus, minus = estimate_memory(mixed, layout, CLUSTER), estimate_memory(FIRST_DENSE, layout,
                                                                           CLUSTER)
    kind_plus, kind_minus = (estimate_memory(m, layout, CLUSTER) for m in (moe_mtp, MOE))
    for name in ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
                 "logits_bytes"):
        assert getattr(plus.stages[-1], name) - getattr(minus.stages[-1], name) == \
            pytest.approx(getattr(kind_plus.stages[-1], name)
                          - getattr(kind_minus.stages[-1], name)), name
    if layout.pp > 1:
        assert plus.stages[0] == minus.stages[0]
    assert sum(stage_params(mixed, layout, layout.pp - 1)) \
        - sum(stage_params(FIRST_DENSE, layout, layout.pp - 1)) == pytest.approx(
            sum(stage_params(moe_mtp, layout, layout.pp - 1))
            - sum(stage_params(MOE, layout, layout.pp - 1)))
    # Step time: the last stage's time grows by the all-MoE model's MTP share.
    assert estimate_cost(mixed, layout, CLUSTER).step_time_s \
        > estimate_cost(FIRST_DENSE, layout, CLUSTER).step_time_s


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda s: s.describe())
def test_mtp_slows_the_step_through_the_last_stage(layout: Layout) -> None:
    """The MTP layer is one more layer on the last stage, plus eh_proj and another logits
    pass: the step slows by at least a layer's share of the last stage's work, and the MFU's
    numerator counts the MTP FLOPs."""
    base, mtp = estimate_cost(DENSE, layout, CLUSTER), estimate_cost(MTP, layout, CLUSTER)
    assert mtp.step_time_s > base.step_time_s
    assert mtp.compute_s > base.compute_s
    # The pipeline runs at the last stage's pace: one of stage_layers + 1 layers more.
    layers = DENSE.num_layers // layout.pp
    assert mtp.compute_s / base.compute_s > 1 + 0.5 / (layers + 1)
    ratio = model_flops_per_token(MTP) / model_flops_per_token(DENSE)
    assert mtp.tflops_per_gpu * mtp.step_time_s == pytest.approx(
        ratio * base.tflops_per_gpu * base.step_time_s)


def test_the_worker_config_and_the_export_say_it() -> None:
    model = dataclasses.replace(MTP, mtp_num_layers=2, mtp_loss_scaling_factor=0.3)
    kwargs = core_config(model, Layout(gbs=64)).transformer
    assert kwargs["mtp_num_layers"] == 2 and kwargs["mtp_loss_scaling_factor"] == 0.3
    assert "mtp_num_layers" not in core_config(DENSE, Layout(gbs=64)).transformer
    args = megatron_lm_args(model, Layout(gbs=64))
    assert args[args.index("--mtp-num-layers") + 1] == "2"
    assert args[args.index("--mtp-loss-scaling-factor") + 1] == "0.3"
    # megatron-core's default factor is left to it; no MTP, no flag.
    assert "--mtp-loss-scaling-factor" not in megatron_lm_args(MTP, Layout(gbs=64))
    assert "--mtp-num-layers" not in megatron_lm_args(DENSE, Layout(gbs=64))


COMMAND = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 24 --hidden-size 2048 "
           "--num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 "
           "--position-embedding-type rope --micro-batch-size 1 --global-batch-size 64 --bf16 "
           "--tokenizer-type NullTokenizer --vocab-size 32000")


@pytest.mark.parametrize(("extra", "layers", "factor"), [
    ("", 0, None),
    (" --mtp-num-layers 1", 1, None),
    (" --mtp-num-layers 1 --mtp-loss-scaling-factor 0.3", 1, 0.3),
    (" --mtp-num-layers 3 --mtp-loss-scaling-factor 1", 3, 1.0),
    (" --mtp-num-layers 0 --mtp-loss-scaling-factor 0.3", 0, None),  # nothing to scale
])
def test_mtp_flags_both_ways(tmp_path: Path, extra: str, layers: int,
                             factor: float | None) -> None:
    """--from-megatron reads the MTP layers and their loss weight, the export writes them
    back, and the exported script reads back the same model."""
    from autotune.report.scripts import megatron_lm_script

    script = tmp_path / "train.sh"
    script.write_text(COMMAND + extra + "\n")
    model = read_megatron_command(str(script)).model
    assert (model.mtp_num_layers, model.mtp_loss_scaling_factor) == (layers, factor)
    exported = tmp_path / "exported.sh"
    exported.write_text(megatron_lm_script(model, Layout(gbs=64), title=["round trip"]))
    again = read_megatron_command(str(exported)).model
    assert (again.mtp_num_layers, again.mtp_loss_scaling_factor) == (layers, factor)


@pytest.mark.parametrize(("layout", "refused"), [
    (Layout(pp=2, dp=4, gbs=64, recompute="full", recompute_method="uniform",
            recompute_num_layers=2), "megatron-core checkpoints them with 1 only"),
    (Layout(pp=2, dp=4, gbs=64, recompute="full", recompute_method="uniform",
            recompute_num_layers=1), None),
    (Layout(pp=2, dp=4, gbs=64, recompute="full", recompute_method="block",
            recompute_num_layers=2), None),
])
def test_uniform_recompute_of_mtp_takes_one_layer(layout: Layout, refused: str | None) -> None:
    """multi_token_prediction.py asserts recompute_num_layers 1 under uniform full recompute;
    the model without MTP takes the others."""
    from autotune.layouts.layout import check

    assert check(layout, DENSE, CLUSTER) == []
    messages = [v.message for v in check(layout, MTP, CLUSTER)]
    assert messages == ([] if refused is None else [messages[0]])
    assert refused is None or refused in messages[0]


def test_the_trust_line_says_mtp_never_ran_on_a_gpu() -> None:
    from autotune.predict.trust import outside_range

    assert "Multi-Token Prediction measured on one dense model at pp 1 only" in outside_range(
        MTP, CLUSTER)
    assert not any("Multi-Token" in note for note in outside_range(DENSE, CLUSTER))
