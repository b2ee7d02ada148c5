"""Megatron-LM's `--pipeline-model-parallel-layout`, read by `--from-megatron` (was: refused in
one line as "a pipeline layout of its own"): parsed as megatron-core parses it (checked against
its own parser), checked as it checks it, mapped to autotune's split where that split says it and
refused in one line naming the stage where it does not, and rewritten by the export for another
layout (read back by the same reader)."""

from __future__ import annotations

import dataclasses
import difflib
import random
from pathlib import Path
from typing import Any

import pytest

from autotune.cli import main
from autotune.errors import ConfigError
from autotune.layouts.layout import Layout, check, with_fields
from autotune.levers.pipeline_split import chunk_sizes, split_choices
from autotune.megatron.megatron_command import (
    layout_changes,
    megatron_layout,
    read_megatron_command,
)
from autotune.megatron.pipeline_layout import (
    expand,
    format_layout,
    read_layout,
    split_fields,
    string_split,
)
from autotune.megatron.script_patch import patch_script
from autotune.specs.hardware import ClusterSpec
from autotune.specs.hf_config import read_hf_config
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model

HF = Path(__file__).parent / "data" / "hf"
ALL_FREE = frozenset(("first_stage_layers", "last_stage_layers", "embedding_loss_split"))
EVEN = {"first_stage_layers": 0, "last_stage_layers": 0, "embedding_loss_split": False}


def _deepseek_v3() -> ModelSpec:
    return read_hf_config(str(HF / "deepseek-v3.json")).spec  # 61 layers, one MTP layer


def _kimi_k2() -> ModelSpec:
    # Kimi K2's 61 layers without MTP: DeepSeek-V3's shape is enough for the split.
    return dataclasses.replace(_deepseek_v3(), mtp_num_layers=0)


def _llama_405b() -> ModelSpec:
    return read_hf_config(str(HF / "llama-3.1-405b.json")).spec  # 126 layers


def _tiny(layers: int, mtp: int = 0) -> ModelSpec:
    return dataclasses.replace(load_model("llama3-8b"), num_layers=layers, mtp_num_layers=mtp)


def _read(model: ModelSpec, pp: int, text: str) -> dict[str, Any]:
    layout = read_layout(text, pp=pp, num_layers=model.num_layers,
                         mtp_num_layers=model.mtp_num_layers, source="train.sh")
    return split_fields(layout, model, "train.sh")


# -- what maps: NVIDIA's published layouts ----------------------------------------------------

MAPPED = [
    # (where it is published, model, pp, string, the Layout fields it reads as)
    # Megatron-Bridge recipes/deepseek/deepseek_v3.py set_deepseek_v3_pipeline_model_parallel_
    # layout, its lists written as strings: (16, 1), (8, 1), (4, 1).
    ("Bridge DeepSeek-V3 pp16", _deepseek_v3, 16, "Et*4|(t*4|)*14tmL",
     {**EVEN, "vpp": 1, "last_stage_layers": 1}),
    ("Bridge DeepSeek-V3 pp8", _deepseek_v3, 8, "Et*8|(t*8|)*6t*5mL",
     {**EVEN, "vpp": 1, "last_stage_layers": 5}),
    ("Bridge DeepSeek-V3 pp4", _deepseek_v3, 4, "Et*16|(t*16|)*2t*13mL",
     {**EVEN, "vpp": 1, "last_stage_layers": 13}),
    # Megatron-Bridge recipes/kimi _get_kimi_k2_pipeline_layout (16, 1): no MTP.
    ("Bridge Kimi K2 pp16", _kimi_k2, 16, "Et*4|(t*4|)*14tL",
     {**EVEN, "vpp": 1, "last_stage_layers": 1}),
    # Megatron-LM tests/functional_tests .../deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_
    # release/model_config.yaml: 14 layers, one MTP layer, pp 2.
    ("Megatron-LM DeepSeek-V3 proxy pp2", lambda: _tiny(14, mtp=1), 2, "Et*7|t*7mL",
     {**EVEN, "vpp": 1}),
    # NVIDIA's Llama 3.1 405B split (pp 8, vpp 8, the embedding and loss counted as layers),
    # said as a string: one embedding/loss slot each at the ends.
    ("Llama 3.1 405B pp8 vpp8, embedding and loss as layers", _llama_405b, 8,
     "Et|(tt|)*62tL", {**EVEN, "vpp": 8, "embedding_loss_split": True}),
    # One slot per virtual stage: the embedding and the loss each alone in one.
    ("Llama 3.1 405B pp16 vpp8, embedding and loss alone", _llama_405b, 16, "E|(t|)*126L",
     {**EVEN, "vpp": 8, "embedding_loss_split": True}),
    # The same at vpp 1 is the end stages' own counts (the same layers; chunk_sizes).
    ("Llama 3.1 405B pp8, embedding and loss as layers", _llama_405b, 8,
     "Et*15|(t*16|)*6t*15L", {**EVEN, "vpp": 1, "first_stage_layers": 15,
                              "last_stage_layers": 15}),
    ("commas are cosmetic", _deepseek_v3, 16, "E,t*4|(t*4|)*14,t,m,L",
     {**EVEN, "vpp": 1, "last_stage_layers": 1}),
    ("interleaved even split", lambda: _tiny(32), 4, "Et*4|(t*4|)*6t*4L", {**EVEN, "vpp": 2}),
    ("pp 2, the lighter end named", lambda: _tiny(31), 2, "Et*15|t*16L",
     {**EVEN, "vpp": 1, "first_stage_layers": 15}),
    ("pp 1", lambda: _tiny(32, mtp=2), 1, "Et*32m*2L", {**EVEN, "vpp": 1}),
]


@pytest.mark.parametrize(("name", "model", "pp", "text", "fields"), MAPPED,
                         ids=[m[0] for m in MAPPED])
def test_published_layouts_map_to_autotunes_split(name: str, model: Any, pp: int, text: str,
                                                  fields: dict[str, Any]) -> None:
    spec = model()
    assert _read(spec, pp, text) == fields
    # The split autotune's own rules accept, each chunk holding the string's layers.
    layout = Layout(pp=pp, dp=1, gbs=pp * 8, **fields)
    assert not [p for p in check(layout, spec, ClusterSpec.make(pp, gpu="h100-80gb"))
                if p.rule in ("pp_layers", "vpp_layers")], layout.describe()
    parsed = read_layout(text, pp=pp, num_layers=spec.num_layers,
                         mtp_num_layers=spec.mtp_num_layers, source="x")
    assert chunk_sizes(layout, spec) == parsed.decoder_chunks()


# -- what is refused, and why ------------------------------------------------------------------

REFUSED = [
    # (where from, model, pp, string, the line's reason)
    # Megatron-LM docs/user-guide/features/pipeline_parallel_layout.md (DeepSeek-V3, pp16 vpp2):
    # its MTP layer has a virtual stage of its own on rank 14.
    ("Megatron-LM docs DeepSeek-V3 pp16 vpp2", _deepseek_v3, 16, "Et*3|(tt|)*29,m|L",
     "the MTP layers on pipeline stage 14, virtual stage 1: autotune places the MTP layers on "
     "the last stage"),
    # Megatron-Bridge (8, 2): the (16, 1) list at vpp 2, so rank 7 holds 4 and 1 layers.
    ("Bridge DeepSeek-V3 pp8 vpp2", _deepseek_v3, 8, "Et*4|(t*4|)*14tmL",
     "pipeline stage 7 holds 4, 1 transformer layers in its 2 virtual stages"),
    ("Bridge Kimi K2 pp2 vpp8", _kimi_k2, 2, "Et*4|(t*4|)*14tL",
     "pipeline stage 1 holds 4, 4, 4, 4, 4, 4, 4, 1 transformer layers in its 8 virtual"),
    # Megatron-LM functional tests (gpt3_moe_..._pp2_ep4 and deepseekv3_proxy_flex_tp1pp4).
    ("Megatron-LM MoE pp2 vpp4", lambda: _tiny(15), 2, "Et*3|(tt|)*6L",
     "pipeline stage 0 holds 3, 2, 2, 2 transformer layers"),
    ("Megatron-LM DeepSeek-V3 proxy pp4 vpp2", lambda: _tiny(14, mtp=1), 4,
     "Et*2|(tt|)*5t|tmL", "pipeline stage 2 holds 2, 1 transformer layers"),
    ("the embedding on a stage of its own", lambda: _tiny(24), 4, "E|t*8|t*8|t*8L",
     "pipeline stage 0 holds no transformer layer"),
    ("uneven middle stages", lambda: _tiny(16), 4, "Et*4|t*5|t*3|t*4L",
     "pipeline stage 2 holds 3 transformer layers, stage 1 5"),
    ("the embedding off the first stage", lambda: _tiny(8), 3, "|Et*4|t*4L",
     "the embedding on pipeline stage 1: autotune places the embedding on the first stage"),
]


@pytest.mark.parametrize(("name", "model", "pp", "text", "why"), REFUSED,
                         ids=[r[0] for r in REFUSED])
def test_layouts_autotune_does_not_model_are_refused_naming_the_stage(
        name: str, model: Any, pp: int, text: str, why: str) -> None:
    with pytest.raises(ConfigError) as info:
        _read(model(), pp, text)
    line = str(info.value)
    assert why in line and "\n" not in line, line
    assert line.startswith(f"train.sh: --pipeline-model-parallel-layout {text!r}: ")
    assert line.endswith("autotune does not model this layout (its memory and step time "
                         "would be another's)")


MEGATRON_REFUSES = [
    # (string, pp, layers, MTP layers, the line's reason): megatron-core refuses each too.
    ("Et*4|t*4L", 4, 8, 0, "2 stages do not split over --pipeline-model-parallel-size 4"),
    ("t*4|Et*4L", 2, 8, 0, "the first layer must be the embedding E"),
    ("Et*4|t*4Lt", 2, 9, 0, "the last layer must be the loss L"),
    ("EEt*4|t*4L", 2, 8, 0, "the embedding E must be given once, not 2 times"),
    ("Et*4|t*4LL", 2, 8, 0, "the loss L must be given once"),
    ("Et*4|t*3L", 2, 8, 0, "7 transformer layers t, but --num-layers 8"),
    ("Et*4|t*4mL", 2, 8, 0, "1 MTP layers m, but --mtp-num-layers 0"),
    ("Et*4|t*4L", 2, 8, 1, "0 MTP layers m, but --mtp-num-layers 1"),
    ("Et*4m|t*4L", 2, 8, 1, "a transformer layer t after an MTP layer m"),
    ("Et*4|t*4m||L", 2, 8, 1, "MTP layers on pipeline stage 1: megatron-core keeps them in a "
     "rank's last virtual stage"),
    ("Et*8m|mL", 2, 8, 2, "the MTP layers split over several stages"),
    # The grammar: what megatron-core's symbols are not.
    ("Et*4|X|t*4L", 2, 8, 0, "expected E, t, m, L, '|' or '(' at character 6 ('X')"),
    ("Et 4|t*4L", 2, 8, 0, "expected E, t, m, L, '|' or '(' at character 3 (' ')"),
    ("Et*|t*4L", 2, 8, 0, "'*' at character 3 is not followed by a count"),
    ("E(t*4|t*4L", 2, 8, 0, "a '(' without its ')'"),
    ("Et*2*2|t*4L", 2, 8, 0, "a count after a count"),
    ("E((t|)*2)*2L", 2, 4, 0, "parentheses inside parentheses"),
    ("E(t*4|)t*4L", 2, 8, 0, "'(...)' without a count"),
    ("E(t|)*9999999L", 2, 8, 0, "a count too large for a layout"),
    ("E(t*99999|)*99999L", 2, 8, 0, "more layers than any model has"),
    ("E" + "t*99999" * 3 + "L", 2, 8, 0, "more layers than any model has"),
]


@pytest.mark.parametrize(("text", "pp", "layers", "mtp", "why"), MEGATRON_REFUSES,
                         ids=[r[0] for r in MEGATRON_REFUSES])
def test_layouts_megatron_refuses_are_refused_in_one_line(text: str, pp: int, layers: int,
                                                         mtp: int, why: str) -> None:
    with pytest.raises(ConfigError) as info:
        read_layout(text, pp=pp, num_layers=layers, mtp_num_layers=mtp, source="train.sh")
    line = str(info.value)
    assert line.startswith(f"train.sh: --pipeline-model-parallel-layout {text!r}: ")
    assert why in line and "\n" not in line, line


# -- the cross-check with megatron-core's own parser ---------------------------------------------


def _megatron_layout() -> Any:
    pytest.importorskip("torch")
    module = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
    return module.PipelineParallelLayerLayout


_SYMBOL = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}


def _megatron_stages(text: str) -> tuple[str, ...]:
    parsed = _megatron_layout().parse_str_to_list(text)
    return tuple("".join(_SYMBOL[t.name] for t in stage) for stage in parsed)


@pytest.mark.megatron
@pytest.mark.parametrize("text", sorted({m[3] for m in MAPPED} | {r[3] for r in REFUSED}
                                        | {r[0] for r in MEGATRON_REFUSES[:11]}))
def test_the_parser_reads_as_megatron_core(text: str) -> None:
    assert expand(text, "x") == _megatron_stages(text)


def _random_layout(rng: random.Random) -> str:
    """A string of the grammar: symbols with and without counts, groups of them."""
    def item() -> str:
        symbol = rng.choice("EtttmL||")
        return symbol + (f"*{rng.randint(0, 12)}" if rng.random() < 0.4 else "")

    out = []
    for _ in range(rng.randint(1, 6)):
        if rng.random() < 0.3:
            out.append("(" + "".join(item() for _ in range(rng.randint(1, 4)))
                       + f")*{rng.randint(0, 5)}")
        else:
            out.append(item())
        if rng.random() < 0.2:
            out.append(",")
    return "".join(out)


@pytest.mark.megatron
@pytest.mark.parametrize("seed", range(4))
def test_random_strings_of_the_grammar_read_as_megatron_core(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(500):
        text = _random_layout(rng)
        assert expand(text, "x") == _megatron_stages(text), text


QUIRKS = [
    # Outside the grammar, megatron-core's two regular-expression passes read these as no
    # one would write them (a count after a count: 2 + 3 layers, not 6; a nested group times
    # zero: nothing): autotune refuses them instead of reading either.
    ("(t)*2*3", ("tttt",)),
    ("((t)*0", ("",)),
]


@pytest.mark.megatron
@pytest.mark.parametrize(("text", "megatron_reads"), QUIRKS)
def test_megatron_cores_quirks_are_refused(text: str, megatron_reads: tuple[str, ...]) -> None:
    assert _megatron_stages(text) == megatron_reads
    with pytest.raises(ConfigError):
        expand(text, "x")


@pytest.mark.megatron
@pytest.mark.parametrize(("text", "pp", "layers", "mtp", "why"), MEGATRON_REFUSES[:11],
                         ids=[r[0] for r in MEGATRON_REFUSES[:11]])
def test_megatron_core_refuses_what_autotune_refuses_as_megatrons(
        text: str, pp: int, layers: int, mtp: int, why: str) -> None:
    cls = _megatron_layout()
    with pytest.raises(AssertionError):
        cls(text, pp).validate_layer_layout(num_layers=layers, mtp_num_layers=mtp or None)


# -- the string for a Layout, and back ----------------------------------------------------------

GRID = [(61, 16, 1, 1), (61, 8, 1, 1), (61, 4, 1, 0), (61, 2, 1, 1), (126, 8, 1, 0),
        (126, 8, 2, 0), (126, 16, 2, 0), (32, 4, 2, 1), (32, 6, 2, 0), (30, 8, 2, 0),
        (48, 5, 1, 2), (22, 4, 1, 0), (80, 3, 2, 1), (24, 1, 1, 1)]


def _splits(layers: int, pp: int, vpp: int, mtp: int) -> list[tuple[ModelSpec, Layout]]:
    model = _tiny(layers, mtp)
    s = Layout(pp=pp, vpp=vpp, gbs=pp * 4)
    choices = split_choices(s, model, ALL_FREE) if pp > 1 else ({},)
    return [(model, with_fields(s, **choice)) for choice in choices]


@pytest.mark.parametrize(("layers", "pp", "vpp", "mtp"), GRID)
def test_the_string_of_every_split_reads_back_as_that_split(layers: int, pp: int, vpp: int,
                                                            mtp: int) -> None:
    for model, s in _splits(layers, pp, vpp, mtp):
        text = format_layout(model, s)
        read = with_fields(s, **_read(model, pp, text))
        if s.embedding_loss_split and vpp == 1:
            # The same layers as the end stages' own counts, which the string cannot tell apart.
            assert chunk_sizes(read, model) == chunk_sizes(s, model), text
            assert read == string_split(model, s, "x")
        else:
            assert read == s, text


@pytest.mark.megatron
@pytest.mark.parametrize(("layers", "pp", "vpp", "mtp"), GRID)
def test_megatron_core_builds_the_strings_chunks(layers: int, pp: int, vpp: int,
                                                 mtp: int) -> None:
    """megatron-core's PipelineParallelLayerLayout accepts each string and puts in each model
    chunk the transformer layers autotune's chunk_sizes gives it, the embedding in the first
    and the MTP layers and the loss in the last."""
    cls = _megatron_layout()
    for model, s in _splits(layers, pp, vpp, mtp):
        text = format_layout(model, s)
        layout = cls(text, pp)
        assert layout.validate_layer_layout(num_layers=layers,
                                            mtp_num_layers=mtp or None) is False  # standalone
        counts = tuple(tuple(sum(t.name == "decoder" for t in layout.layout[r][v])
                             for v in range(vpp)) for r in range(pp))
        assert layout.virtual_pipeline_model_parallel_size == vpp
        assert counts == chunk_sizes(s, model), text
        assert layout.layout[0][0][0].name == "embedding"
        assert [t.name for t in layout.layout[-1][-1][-1 - mtp:]] == ["mtp"] * mtp + ["loss"]


# -- a user's script: read, and the export's round trip -----------------------------------------


def _script(layers: int, pp: int, text: str, extra: str = "", gpus: int = 8) -> str:
    return (f"torchrun --nproc-per-node {gpus} pretrain_gpt.py --num-layers {layers} "
            "--hidden-size 256 --num-attention-heads 8 --seq-length 512 "
            "--max-position-embeddings 512 --position-embedding-type rope "
            "--global-batch-size 64 --micro-batch-size 1 --tokenizer-type NullTokenizer "
            f"--vocab-size 1000 --pipeline-model-parallel-size {pp} \\\n"
            f"    --pipeline-model-parallel-layout \"{text}\"{extra}\n")


@pytest.mark.parametrize(("extra", "why"), [
    (" --num-virtual-stages-per-pipeline-rank 2",
     "--pipeline-model-parallel-layout with --num-virtual-stages-per-pipeline-rank: "
     "Megatron-LM refuses the two together"),
    (" --decoder-last-pipeline-num-layers 2",
     "--pipeline-model-parallel-layout with --decoder-last-pipeline-num-layers: Megatron-LM "
     "refuses the two together"),
    (" --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split",
     "--pipeline-model-parallel-layout with --account-for-embedding-in-pipeline-split"),
])
def test_the_flags_megatron_refuses_beside_the_string_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, why: str) -> None:
    script = tmp_path / "train.sh"
    script.write_text(_script(16, 4, "Et*4|(t*4|)*2t*4L", extra))
    code = main(["--from-megatron", str(script), "--backend", "simulate", "--results-dir",
                 str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and why in err, err


def test_a_script_with_a_layout_string_is_read_with_its_split(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(_script(14, 4, "Et*2|(t*4|)*2t*4mL", " --mtp-num-layers 1"))
    command = read_megatron_command(str(script))
    assert command.layout_string == "Et*2|(t*4|)*2t*4mL"
    layout = megatron_layout(command, 8)
    assert (layout.pp, layout.vpp, layout.first_stage_layers, layout.last_stage_layers) == \
        (4, 1, 2, 0)


def _diff(before: str, after: str) -> list[str]:
    return [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(),
                                                  lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


PATCHED = [
    # (name, layers, MTP, pp, string, GPUs, the new layout's fields, the string written)
    ("another pp and split", 14, 1, 2, "Et*7|t*7mL", 8,
     {"pp": 4, "dp": 2, "first_stage_layers": 2}, "Et*2|(t*4|)*2t*4mL"),
    ("interleaved, the embedding and loss as layers", 30, 0, 2, "Et*15|t*15L", 8,
     {"pp": 4, "dp": 2, "vpp": 2, "embedding_loss_split": True}, "Et*3|(t*4|)*6t*3L"),
    ("DeepSeek-V3's 61 layers, pp 16 to pp 8", 61, 1, 16, "Et*4|(t*4|)*14tmL", 16,
     {"pp": 8, "dp": 2, "last_stage_layers": 5}, "Et*8|(t*8|)*6t*5mL"),
    ("even, from the end stages' counts", 32, 0, 4, "Et*7|(t*8|)*2t*9L", 8,
     {"pp": 2, "dp": 4, "first_stage_layers": 0, "last_stage_layers": 0}, "Et*16|t*16L"),
]


@pytest.mark.parametrize(("name", "layers", "mtp", "pp", "text", "gpus", "new", "written"),
                         PATCHED, ids=[p[0] for p in PATCHED])
def test_the_export_rewrites_the_string_and_reads_back(
        tmp_path: Path, name: str, layers: int, mtp: int, pp: int, text: str, gpus: int,
        new: dict[str, Any], written: str) -> None:
    """The user keeps a layout string: the export writes the new layout's (and the new pp),
    never the split flags Megatron-LM refuses beside it, and the result reads back as the
    layout exported."""
    extra = f" --mtp-num-layers {mtp}" if mtp else ""
    script = tmp_path / "train.sh"
    before = _script(layers, pp, text, extra, gpus)
    script.write_text(before)
    command = read_megatron_command(str(script))
    old = megatron_layout(command, gpus)
    target = with_fields(old, **new)
    changes = layout_changes(command, old, target)
    patched = patch_script(command, target, changes)
    lines = _diff(before, patched)
    assert f"+    --pipeline-model-parallel-layout '{written}'" + extra in lines, lines
    for flag in ("--num-virtual-stages-per-pipeline-rank", "--decoder-first-pipeline-num-layers",
                 "--decoder-last-pipeline-num-layers", "--account-for-"):
        assert flag not in patched
    again = tmp_path / "tuned.sh"
    again.write_text(patched)
    back = megatron_layout(read_megatron_command(str(again)), gpus)
    assert back == string_split(command.model, target, "x")
    assert chunk_sizes(back, command.model) == chunk_sizes(target, command.model)


def test_the_same_split_keeps_the_users_string(tmp_path: Path) -> None:
    """A winner with the string's own split changes other flags only: the user's string, as
    they wrote it (commas and all), stays."""
    script = tmp_path / "train.sh"
    before = _script(16, 4, "E,t*4|(t*4|)*2,t*4L")
    script.write_text(before)
    command = read_megatron_command(str(script))
    old = megatron_layout(command, 8)
    target = with_fields(old, mbs=2)
    patched = patch_script(command, target, layout_changes(command, old, target))
    diff = _diff(before, patched)
    assert len(diff) == 2 and diff[1] == "+" + diff[0][1:].replace("--micro-batch-size 1",
                                                                   "--micro-batch-size 2")
    assert '--pipeline-model-parallel-layout "E,t*4|(t*4|)*2,t*4L"' in patched


def test_search_then_export_round_trip(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`--from-megatron` searches a script whose layout is a string; `export` writes the best
    layout into the user's file as a string, which reads back as the layout exported."""
    script = tmp_path / "train.sh"
    script.write_text(_script(14, 2, "Et*7|t*7mL", " --mtp-num-layers 1"))
    results = tmp_path / "r"
    assert main(["--from-megatron", str(script), "--backend", "simulate", "--results-dir",
                 str(results), "--study", "s"]) == 0
    tuned = tmp_path / "tuned.sh"
    capsys.readouterr()
    assert main(["export", "--from-megatron", str(script), "--study", "s", "--results-dir",
                 str(results), "-o", str(tuned)]) == 0
    text = tuned.read_text()
    command = read_megatron_command(str(tuned))
    assert command.layout_string is not None and command.layout_string in text
    layout = megatron_layout(command, 8)
    parsed = read_layout(command.layout_string, pp=layout.pp, num_layers=14, mtp_num_layers=1,
                         source="x")
    assert parsed.decoder_chunks() == chunk_sizes(layout, command.model)
    for flag in ("--num-virtual-stages-per-pipeline-rank", "--decoder-first-pipeline-num-layers",
                 "--decoder-last-pipeline-num-layers", "--account-for-"):
        assert flag not in text


DEEPSEEK = Path(__file__).parent / "data" / "megatron" / "deepseek-v3-layout.sh"
"""The model flags of Megatron-LM's examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh at pp 16
with Megatron-Bridge's DeepSeek-V3 layout string for pp 16."""


def test_nvidias_deepseek_v3_layout_reads_and_exports_the_derived_split(tmp_path: Path) -> None:
    """DeepSeek-V3 (MLA, 256 experts, dense first layers, one MTP layer) with the string
    Megatron-Bridge writes for pp 16 reads as pp 16 with one layer on the last stage; the
    split autotune derives for it (3 and 2 on the end stages) is exported as a string."""
    command = read_megatron_command(str(DEEPSEEK))
    assert command.model.mtp_num_layers == 1 and command.model.num_layers == 61
    old = megatron_layout(command, 1024)
    assert (old.pp, old.vpp, old.first_stage_layers, old.last_stage_layers) == (16, 1, 0, 1)
    target = with_fields(old, first_stage_layers=3, last_stage_layers=2)
    text = DEEPSEEK.read_text()
    patched = patch_script(command, target, layout_changes(command, old, target))
    assert _diff(text, patched) == [
        '-    --pipeline-model-parallel-layout "Et*4|(t*4|)*14tmL"',
        "+    --pipeline-model-parallel-layout 'Et*3|(t*4|)*14t*2mL'"]
