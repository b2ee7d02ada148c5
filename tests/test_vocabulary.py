"""Issue 14, item 7: one vocabulary across the subcommands. Both batch-size spellings, estimate's
defaults said aloud, bare `autotune`, `--version`, one --storage example, the label legend,
shipped spaces by name, and `estimate --layout FILE` without MODEL and --gpus."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from autotune import __version__
from autotune.cli import STORAGE_EXAMPLE, main
from autotune.commands.estimate import SEARCH_DIFFERS
from autotune.layouts.layout import DIMENSIONS, Layout
from autotune.layouts.legend import legend_entries, legend_lines, legend_text
from autotune.specs.presets import search_spaces_dir

ROOT = Path(__file__).resolve().parents[1]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, out: str, err: str, message: str) -> None:
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("autotune: error: ")
    assert message in err


# -- --gbs and --global-batch-size, in both commands -------------------------------------------


@pytest.mark.parametrize("flag", ["--gbs", "--global-batch-size"])
@pytest.mark.parametrize(("command", "expected"), [
    (["gpt2-xl", "--gpus", "8", "--dry-run"], "global batch 128"),
    (["search", "gpt2-xl", "--gpus", "8", "--dry-run"], "global batch 128"),
    (["estimate", "gpt2-xl", "--gpus", "8"], "gbs 128,"),
])
def test_both_batch_size_spellings_work_everywhere(capsys: pytest.CaptureFixture[str],
                                                   command: list[str], expected: str,
                                                   flag: str) -> None:
    code, out, err = run(capsys, *command, flag, "128")
    assert code == 0, err
    assert expected in out


@pytest.mark.parametrize("command", [["search"], ["estimate"]])
def test_help_documents_one_spelling_and_names_the_alias(capsys: pytest.CaptureFixture[str],
                                                         command: list[str]) -> None:
    code, out, _ = run(capsys, *command, "--help")
    assert code == 0
    flat = " ".join(out.split())
    assert "--global-batch-size, --gbs" in flat and "(--gbs is the same option)" in flat


# -- estimate's defaults are not the search's: said in its help and output ----------------------


def test_estimate_help_says_its_defaults_are_not_the_searchs(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "--help")
    flat = " ".join(out.split())
    assert code == 0
    assert "estimate's defaults: impl local, no distributed optimizer" in flat
    assert "pass --impl sdpa --distributed-optimizer" in flat


@pytest.mark.parametrize(("flags", "said", "unsaid"), [
    ([], ["impl local", "no distributed optimizer", "no overlap grad reduce",
          "pass --impl sdpa --distributed-optimizer --overlap-grad-reduce"], []),
    (["--impl", "sdpa"], ["no distributed optimizer"], ["impl local", "--impl sdpa"]),
    # Given explicitly, even at the default value: the user chose it.
    (["--impl", "local"], ["no distributed optimizer"], ["impl local"]),
    (["--impl", "te", "--distributed-optimizer", "--overlap-grad-reduce"], [],
     ["estimate's defaults"]),
])
def test_estimate_output_names_the_defaults_it_used(capsys: pytest.CaptureFixture[str],
                                                    flags: list[str], said: list[str],
                                                    unsaid: list[str]) -> None:
    code, out, err = run(capsys, "estimate", "gpt2-xl", "--gpus", "8", *flags)
    assert code == 0, err
    note = [line for line in out.splitlines() if "estimate's defaults" in line]
    assert len(note) == (1 if said else 0)
    for text in said:
        assert text in note[0]
    for text in unsaid:
        assert not note or text not in note[0]


def test_the_note_covers_options_the_search_space_varies() -> None:
    from autotune.search.space import load_space

    candidates = load_space(None).candidates
    for name in SEARCH_DIFFERS:
        assert set(candidates[name]) - {DIMENSIONS[name].default}, name


def test_estimate_json_stays_machine_readable(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "gpt2-xl", "--gpus", "8", "--json")
    assert code == 0
    assert "defaults" not in json.loads(out)


# -- bare autotune, --version -------------------------------------------------------------------


def test_bare_autotune_prints_its_help_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys)
    assert code == 0 and err == ""
    assert out.startswith("Usage: autotune")
    assert "Commands:" in out and "estimate" in out and "Layout labels" in out
    _, full, _ = run(capsys, "--help")
    assert out == full


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--version")
    assert code == 0 and err == ""
    assert out.strip() == f"autotune {__version__}"
    _, help_text, _ = run(capsys, "--help")
    assert "--version" in help_text


# -- one --storage example ------------------------------------------------------------------


def test_storage_example_is_the_readmes(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "search", "--help")
    assert f"e.g. {STORAGE_EXAMPLE}" in " ".join(out.split())
    readme = (ROOT / "README.md").read_text()
    assert f"--storage {STORAGE_EXAMPLE}" in readme
    examples = set(re.findall(r"--storage (\S+?)`", readme))
    assert examples <= {STORAGE_EXAMPLE, "postgresql+psycopg://..."}, examples


# -- the label legend, from the dimension table --------------------------------------------


def _example(dim: Any) -> Any:
    if dim.kind is bool:
        return not dim.default
    if dim.kind is int:
        return dim.default + 3
    return [m for m in dim.kind if m != dim.default][-1]


def _labels() -> list[str]:
    """describe() of layouts where each dimension in turn (and what folds into it) differs
    from its default, and of every enum value: every word a label can have."""
    labels = [Layout().describe()]
    for name, dim in DIMENSIONS.items():
        values = list(dim.kind) if dim.choices else [_example(dim)]
        folded = {d.name: _example(d) for d in DIMENSIONS.values() if d.folded_into == name}
        for value in values:
            labels.append(replace(Layout(), **{name: value}).describe())
            if folded:
                labels.append(replace(Layout(), **{name: value, **folded}).describe())
    return labels


@pytest.mark.parametrize("label", _labels())
def test_every_word_of_a_label_is_in_the_legend(label: str) -> None:
    entries = legend_entries()
    for word in label.split():
        assert any(e.pattern.fullmatch(word) for e in entries), word


@pytest.mark.parametrize(("abbreviation", "meaning"), [
    ("tpN", "Tensor parallel size"), ("do", "optimizer state"), ("ogr", "gradient reduce"),
    ("opg", "parameter all-gather"), ("sp", "Sequence parallelism"), ("cef", "cross entropy"),
    ("vppN", "Virtual pipeline"), ("rc=selective|rc=full", "recomputation"),
    ("local|te|sdpa", "scaled_dot_product_attention"),
])
def test_help_explains_the_abbreviations(capsys: pytest.CaptureFixture[str], abbreviation: str,
                                         meaning: str) -> None:
    _, out, _ = run(capsys, "--help")
    line = next(i for i, text in enumerate(out.splitlines())
                if text.split() and text.split()[0].startswith(abbreviation))
    assert meaning in " ".join(out.splitlines()[line:line + 4])


def test_legend_entries_are_one_per_labelled_dimension() -> None:
    labelled = [d for d in DIMENSIONS.values() if d.label is not None]
    assert len(legend_entries()) == len(labelled)
    assert all(len(line) <= 88 for line in legend_lines())


def test_table_legend_names_only_what_the_labels_use() -> None:
    text = legend_text(["tp2 pp1 dp4 mbs8 do sdpa"])
    assert "tpN =" in text and "do =" in text and "local|te|sdpa =" in text
    assert "ogr" not in text and "vppN" not in text
    assert legend_text([]) == ""


# -- --space by name -------------------------------------------------------------------------


def _shipped() -> list[str]:
    return sorted(f.name.removesuffix(".yaml") for f in search_spaces_dir().iterdir()
                  if f.name.endswith(".yaml"))


@pytest.mark.parametrize("name", ["one-node", "one-node.yaml", "single-gpu", "default"])
def test_space_finds_a_shipped_file_by_name(capsys: pytest.CaptureFixture[str],
                                            name: str) -> None:
    code, out, err = run(capsys, "gpt2", "--gpus", "1", "--space", name, "--dry-run")
    assert code == 0, err
    stem = name.removesuffix(".yaml")
    assert f"{stem}.yaml" in out.splitlines()[1]


def test_a_path_still_wins_over_a_shipped_name(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("one-node").write_text("tp: [1]\nmbs: [1, 2]\n")  # a local file of that name
    code, out, _ = run(capsys, "gpt2", "--gpus", "1", "--space", "one-node", "--dry-run")
    assert code == 0
    assert "search space one-node: 2 dimensions" in out


@pytest.mark.parametrize(("name", "message"), [
    ("two-node", "--space two-node: no such file, nor a shipped search space (shipped: "
                 + ", ".join(_shipped())),
    ("no/such.yaml", "does not exist"),
])
def test_unknown_space_lists_the_shipped_ones(capsys: pytest.CaptureFixture[str], name: str,
                                              message: str) -> None:
    one_line_error(*run(capsys, "gpt2", "--gpus", "1", "--space", name, "--dry-run"), message)


# -- estimate --layout FILE without MODEL and --gpus ------------------------------------------


ESTIMATE = ["estimate", "gpt2-xl", "--gpus", "8", "--pp", "2", "--mbs", "4", "--impl", "sdpa",
            "--json"]


@pytest.fixture
def exported(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """A layout file as `autotune export --format json` writes it: the layout's fields with the
    model and machine it is for."""
    code, out, _ = run(capsys, *ESTIMATE)
    assert code == 0
    data = json.loads(out)
    return {**data["layout"], "model": "gpt2-xl", "gpus": 8, "gpu": data["gpu"],
            "seq_length": 1024, "gpus_per_node": 8}


@pytest.mark.parametrize("given", [[], ["gpt2-xl"], ["--gpus", "8"], ["gpt2-xl", "--gpus", "8"]])
def test_layout_file_supplies_model_and_gpus(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path, exported: dict[str, Any],
                                             given: list[str]) -> None:
    path = tmp_path / "layout.json"
    path.write_text(json.dumps(exported))
    code, out, err = run(capsys, "estimate", *given, "--layout", str(path), "--json")
    assert code == 0, err
    # The note on estimate's defaults names the options left at their defaults: a layout file
    # sets every one of them, the command line of ESTIMATE does not.
    def without_note(text: str) -> dict[str, Any]:
        return {k: v for k, v in json.loads(text).items() if k != "defaults_note"}
    assert without_note(out) == without_note(run(capsys, *ESTIMATE)[1])


@pytest.mark.parametrize(("drop", "args", "message"), [
    (("model",), ["--gpus", "8"], "Missing argument 'MODEL' (the --layout file names no model)"),
    (("gpus",), ["gpt2-xl"], "Missing option '--gpus' (the --layout file gives no GPU count)"),
    ((), ["gpt2", "--gpus", "8"], "is a layout of gpt2-xl, not of gpt2"),
    ((), ["--gpus", "4"], "is for 8 GPUs; --gpus says 4"),
])
def test_layout_file_without_what_is_needed_is_one_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, exported: dict[str, Any],
        drop: tuple[str, ...], args: list[str], message: str) -> None:
    path = tmp_path / "layout.json"
    path.write_text(json.dumps({k: v for k, v in exported.items() if k not in drop}))
    one_line_error(*run(capsys, "estimate", *args, "--layout", str(path)), message)


@pytest.mark.parametrize(("args", "message"), [
    ([], "Missing argument 'MODEL'"),
    (["gpt2-xl"], "Missing option '--gpus'"),
])
def test_estimate_without_layout_still_needs_model_and_gpus(capsys: pytest.CaptureFixture[str],
                                                            args: list[str],
                                                            message: str) -> None:
    code, out, err = run(capsys, "estimate", *args)
    one_line_error(code, out, err, message)
    assert "--layout file" not in err
