"""The pipeline split derived from the model (`first_stage_layers` / `last_stage_layers:
derive`): the choices megatron-core accepts, the one the models pick, a pp that does not divide
the layers reached by default, the export and its read-back."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune.layouts.layout import Layout, check, with_fields
from autotune.levers.pipeline_split import SHARE_SLACK, split_choices, stage_layers
from autotune.megatron.megatron_command import megatron_layout, read_megatron_command
from autotune.predict.cost import estimate_cost
from autotune.predict.memory import estimate_memory
from autotune.report.scripts import megatron_lm_script
from autotune.search.derive import PACE_TIE, resolve, safe_limit_bytes
from autotune.search.space import enumerate_space, space_from_mapping
from autotune.specs.hardware import ClusterSpec
from autotune.specs.hf_config import read_hf_config
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model

HF = Path(__file__).parent / "data" / "hf"
SPLIT = ("first_stage_layers", "last_stage_layers", "embedding_loss_split")
ALL_FREE = frozenset(SPLIT)


def _deepseek_v3() -> ModelSpec:
    # As session 23's plan: sequence 4096, batch 4096 (results/benchmarks/2026-11-29-cpu-
    # layer-mix-s23.md).
    spec = read_hf_config(str(HF / "deepseek-v3.json")).spec
    return dataclasses.replace(spec, seq_length=4096, global_batch_size=4096)


def _deepseek_v3_without_mtp() -> ModelSpec:
    # Session 23's model: its config.json's MTP layer was not read then.
    return dataclasses.replace(_deepseek_v3(), mtp_num_layers=0)


def _llama_405b() -> ModelSpec:
    return read_hf_config(str(HF / "llama-3.1-405b.json")).spec


def _tiny(layers: int) -> ModelSpec:
    return dataclasses.replace(load_model("llama3-8b"), num_layers=layers)


def _split(s: Layout) -> tuple[int, int, bool]:
    return (s.first_stage_layers, s.last_stage_layers, s.embedding_loss_split)


# -- the choices are megatron-core's ----------------------------------------------------------

# num_layers, pp, vpp: layer counts pp divides and does not, with and without interleaving.
GRID = [(61, 16, 1), (61, 8, 1), (61, 4, 1), (61, 2, 1), (61, 3, 1), (126, 16, 1), (126, 8, 1),
        (126, 8, 2), (126, 16, 2), (32, 3, 1), (32, 4, 1), (32, 4, 2), (32, 6, 2), (30, 8, 2),
        (48, 5, 1), (48, 7, 1), (22, 4, 1), (80, 3, 2)]


@pytest.mark.megatron
@pytest.mark.parametrize(("layers", "pp", "vpp"), GRID)
def test_every_choice_passes_megatron_core_and_builds_its_stage_layers(
        layers: int, pp: int, vpp: int) -> None:
    """Each choice passes TransformerConfig.__post_init__ (megatron-core 0.16.1), and each
    rank builds the layers autotune's stage_layers gives it (transformer_block.py
    get_num_layers_to_build over the rank's virtual stages); autotune's own rules agree."""
    pytest.importorskip("torch")
    block = pytest.importorskip("megatron.core.transformer.transformer_block")
    from megatron.core.transformer.transformer_config import TransformerConfig

    model = _tiny(layers)
    cluster = ClusterSpec.make(pp, gpu="h100-80gb")
    s = Layout(pp=pp, vpp=vpp, gbs=pp * 4)
    choices = split_choices(s, model, ALL_FREE)
    assert choices
    for choice in choices:
        layout = with_fields(s, **choice)
        config = TransformerConfig(
            num_layers=layers, hidden_size=64, num_attention_heads=4,
            pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
            num_layers_in_first_pipeline_stage=layout.first_stage_layers or None,
            num_layers_in_last_pipeline_stage=layout.last_stage_layers or None,
            account_for_embedding_in_pipeline_split=layout.embedding_loss_split,
            account_for_loss_in_pipeline_split=layout.embedding_loss_split,
            pipeline_dtype=__import__("torch").bfloat16)
        built = tuple(sum(block.get_num_layers_to_build(
            config, vp_stage=v if vpp > 1 else None, pp_rank=rank) for v in range(vpp))
            for rank in range(pp))
        assert built == stage_layers(layout, model), layout.describe()
        assert sum(built) == layers
        assert not [p for p in check(layout, model, cluster)
                    if p.rule in ("pp_layers", "vpp_layers")], layout.describe()


@pytest.mark.parametrize(("layers", "pp", "vpp"), GRID)
def test_the_choices_keep_the_end_stages_within_the_share(layers: int, pp: int,
                                                          vpp: int) -> None:
    """No end stage holds more than a middle one (what it adds, the embedding or the output
    layer and the loss, only makes it heavier), and no middle stage more than SHARE_SLACK
    layers above the least share; the even split is among them where it exists."""
    model = _tiny(layers)
    s = Layout(pp=pp, vpp=vpp, gbs=pp * 4)
    choices = [with_fields(s, **c) for c in split_choices(s, model, ALL_FREE)]
    least = -(-layers // pp)
    for layout in choices:
        counts = stage_layers(layout, model)
        if pp > 2:
            assert max(counts[0], counts[-1]) <= counts[1] <= least + SHARE_SLACK
        else:
            assert max(counts) <= least + SHARE_SLACK
    assert ((0, 0, False) in map(_split, choices)) == (layers % (pp * vpp) == 0)
    assert len(set(map(_split, choices))) == len(choices)


@pytest.mark.parametrize(("layers", "pp", "vpp"), [(61, 32, 1), (61, 16, 2), (22, 4, 4),
                                                   (7, 8, 1)])
def test_no_choice_leaves_the_rule_to_say_why(layers: int, pp: int, vpp: int) -> None:
    # 61 at pp 32: ends of 1 layer between them; at vpp 2 no even share; 8 stages of 7 layers.
    model = _tiny(layers)
    cluster = ClusterSpec.make(pp, gpu="h100-80gb")
    s = Layout(pp=pp, vpp=vpp, gbs=pp * 4)
    assert split_choices(s, model, ALL_FREE) == ()
    resolved = resolve(s, SPLIT, model, cluster, limit_bytes=safe_limit_bytes(cluster))
    assert _split(resolved) == (0, 0, False)
    assert check(resolved, model, cluster)


def test_a_field_not_derived_is_kept() -> None:
    model = _tiny(61)
    s = Layout(pp=16, gbs=64, last_stage_layers=3)
    assert {c["last_stage_layers"] for c in split_choices(s, model, frozenset(SPLIT[:1]))} \
        == {3}
    assert not any(c["embedding_loss_split"]
                   for c in split_choices(s, model, frozenset(SPLIT[:2])))


# -- the choice the models make -----------------------------------------------------------------

# model, layout fields, the stage layers resolved (first to last).
RESOLVED = [
    # 61 layers (3 dense + 58 MoE) at pp 16: 2 and 3 on the end stages, the least peak of the
    # four splits that keep the pace of 4 MoE layers (session 23 found it by hand).
    (_deepseek_v3_without_mtp, {"pp": 16, "ep": 8}, (2, *(4,) * 14, 3)),
    (_deepseek_v3_without_mtp, {"pp": 8, "ep": 8}, (6, *(8,) * 6, 7)),
    # With the MTP layer its config.json trains (num_nextn_predict_layers 1), which megatron-
    # core builds on the last stage: a layer moves off that stage.
    (_deepseek_v3, {"pp": 16, "ep": 8}, (3, *(4,) * 14, 2)),
    (_deepseek_v3, {"pp": 8, "ep": 8}, (7, *(8,) * 6, 6)),
    # 126 layers at pp 16: the embedding/loss split NVIDIA runs (7 + 14 x 8 + 7), listed before
    # the same counts by --decoder-first/last-pipeline-num-layers.
    (_llama_405b, {"pp": 16, "tp": 8}, (7, *(8,) * 14, 7)),
    (_llama_405b, {"pp": 8, "tp": 8}, (15, *(16,) * 6, 15)),
]


@pytest.mark.parametrize(("make", "fields", "stages"), RESOLVED,
                         ids=["dsv3-no-mtp-pp16", "dsv3-no-mtp-pp8", "dsv3-pp16", "dsv3-pp8",
                              "405b-pp16", "405b-pp8"])
def test_the_resolved_split(make: type[ModelSpec], fields: dict[str, int],
                            stages: tuple[int, ...]) -> None:
    model = make()
    cluster = ClusterSpec.make(1024, gpu="h100-80gb")
    s = Layout(gbs=model.global_batch_size, dp=1024 // fields["pp"] // fields.get("tp", 1),
               **fields)
    resolved = resolve(s, SPLIT, model, cluster, limit_bytes=safe_limit_bytes(cluster))
    assert stage_layers(resolved, model) == stages
    assert not check(resolved, model, cluster)
    # None of the other choices is faster; an equally fast one holds more memory.
    pace = estimate_cost(model, resolved, cluster).pace_s
    peak = estimate_memory(model, resolved, cluster).peak_bytes
    for choice in split_choices(s, model, ALL_FREE):
        other = with_fields(s, **choice)
        other_pace = estimate_cost(model, other, cluster).pace_s
        assert other_pace >= pace * (1 - PACE_TIE)
        if other_pace <= pace * (1 + PACE_TIE):
            assert estimate_memory(model, other, cluster).peak_bytes >= peak


# A model pp divides: the even split unless another is predicted faster. llama3-8b's output
# layer costs its last stage about half a layer in the cost model (the launches of a layer
# outweigh it), so every pp keeps the even split; a vocabulary of 2M (2 h V: 17 GFLOP a token)
# makes the last stage the slowest by several layers, and a split with fewer layers there is
# predicted faster.
EVEN = [("llama3-8b-pp2", 2, 1, None, True), ("llama3-8b-pp4", 4, 1, None, True),
        ("llama3-8b-pp4-vpp2", 4, 2, None, True), ("llama3-8b-pp8", 8, 1, None, True),
        ("small-vocab-pp4", 4, 1, 1024, True), ("2m-vocab-pp4", 4, 1, 2 ** 21, False),
        ("2m-vocab-pp2", 2, 1, 2 ** 21, False)]


@pytest.mark.parametrize(("name", "pp", "vpp", "vocab", "even"), EVEN,
                         ids=[case[0] for case in EVEN])
def test_a_divisible_model_keeps_the_even_split_unless_another_is_faster(
        name: str, pp: int, vpp: int, vocab: int | None, even: bool) -> None:
    model = load_model("llama3-8b")
    if vocab is not None:
        model = dataclasses.replace(model, vocab_size=vocab)
    cluster = ClusterSpec.make(8, gpu="h100-80gb")
    s = Layout(pp=pp, vpp=vpp, dp=8 // pp, gbs=model.global_batch_size)
    resolved = resolve(s, SPLIT, model, cluster, limit_bytes=safe_limit_bytes(cluster))
    even_pace = estimate_cost(model, s, cluster).pace_s
    pace = estimate_cost(model, resolved, cluster).pace_s
    assert (_split(resolved) == (0, 0, False)) == even
    if even:
        assert all(estimate_cost(model, with_fields(s, **c), cluster).pace_s
                   >= even_pace * (1 - PACE_TIE) for c in split_choices(s, model, ALL_FREE))
    else:
        counts = stage_layers(resolved, model)
        assert pace < even_pace * (1 - PACE_TIE) and counts[-1] < max(counts)


# -- the default space ------------------------------------------------------------------------

@pytest.mark.parametrize(("make", "gpus", "pps", "ep"), [
    (_deepseek_v3, 1024, {16}, 8),   # 61 layers: only an uneven split reaches pp 16
    (_llama_405b, 1024, {8, 16}, 1),
], ids=["dsv3", "405b"])
def test_the_default_space_reaches_a_pp_that_does_not_divide_the_layers(
        make: type[ModelSpec], gpus: int, pps: set[int], ep: int) -> None:
    from autotune.search.space import load_space

    model = make()
    cluster = ClusterSpec.make(gpus, gpu="h100-80gb")
    space = load_space()
    narrow = {d: v for d, v in space.candidates.items()}
    # The pp, vpp and split levels of the default space, the deeper ones at one value each:
    # the split is resolved at its own level, whatever they hold.
    narrow.update(pp=tuple(sorted(pps)), tp=(8,), cp=(1,), ep=(ep,), mbs=(1,),
                  sequence_parallel=(True,), recompute=("full",), recompute_method=("block",),
                  distributed_optimizer=(True,), overlap_param_gather=(True,), impl=("te",),
                  fp8=("off",), fp8_recipe=("delayed",), fp8_param_gather=(False,))
    summary = enumerate_space(space_from_mapping(
        {d: list(v) for d, v in narrow.items()}, "narrow"), model, cluster)
    reached = {s.pp for s in summary.valid}
    assert pps <= reached
    for s in summary.valid:
        assert model.num_layers % s.pp == 0 or s.uneven
        assert not check(s, model, cluster)


# -- the export and its read-back -------------------------------------------------------------

@pytest.mark.parametrize(("make", "fields"), [
    (_deepseek_v3, {"pp": 16, "ep": 8}), (lambda: load_model("llama3-8b"), {"pp": 3}),
    (_llama_405b, {"pp": 16, "tp": 8}),
], ids=["dsv3-pp16", "llama3-8b-pp3", "405b-pp16"])
def test_the_export_writes_the_split_and_from_megatron_reads_it_back(
        tmp_path: Path, make: type[ModelSpec], fields: dict[str, int]) -> None:
    model = make()
    gpus = fields["pp"] * fields.get("tp", 1) * 8
    cluster = ClusterSpec.make(gpus, gpu="h100-80gb")
    s = Layout(gbs=model.global_batch_size, dp=8, **fields)
    resolved = resolve(s, SPLIT, model, cluster, limit_bytes=safe_limit_bytes(cluster))
    assert resolved.uneven and not check(resolved, model, cluster)
    script = tmp_path / "run.sh"
    script.write_text(megatron_lm_script(model, resolved, title=["derived split"],
                                         nodes=gpus // 8))
    text = script.read_text()
    if resolved.embedding_loss_split:
        assert "--account-for-embedding-in-pipeline-split" in text
        assert "--account-for-loss-in-pipeline-split" in text
    for flag, value in (("--decoder-first-pipeline-num-layers", resolved.first_stage_layers),
                        ("--decoder-last-pipeline-num-layers", resolved.last_stage_layers)):
        assert (f"{flag} {value}" in text) == bool(value)
    back = megatron_layout(read_megatron_command(str(script)), gpus)
    assert _split(back) == _split(resolved)
    assert stage_layers(back, model) == stage_layers(resolved, model)


# -- the plan ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_deepseek_v3_on_1024_h100_plans_by_default(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Session 23's plan, refused by the default space before ("no layout is predicted to
    fit": no pp the space offers divides 61 layers but 1), plans pp 16 with 4 and 1 layers on
    the end stages: the MTP layer and its logits share the last stage with one MoE layer.
    Two simulated trials: the enumeration of the whole default space is most of the time
    (about 30 s on 2 cores)."""
    from autotune.cli import main

    monkeypatch.setenv("COLUMNS", "240")
    dgx = Path(__file__).parent.parent / "search_spaces" / "clusters" / "dgx-h100.yaml"
    code = main([str(HF / "deepseek-v3.json"), "--gpus", "1024", "--gpu", str(dgx),
                 "--backend", "simulate", "--seq-len", "4096",
                 "--gbs", "4096", "--trials", "2", "--results-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    best = next(line for line in out.splitlines() if line.startswith("│ 0 "))
    # The splits that tie at pp's level (3 + 2 and 4 + 1 on the end stages) judged at the
    # complete layout: 4 (the middle stages' share, not named) and 1.
    assert "pp16" in best and "last1" in best and "first" not in best, best
