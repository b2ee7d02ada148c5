"""`report --model` and `export --model` against the model a study stores: one that disagrees is
refused in one line naming both (it would label the study's figures with another model), one
that agrees changes nothing, and a study that stores no model takes it."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from autotune.cli import main
from autotune.layouts.layout import Layout
from autotune.search import SearchConfig, run_search
from autotune.search.backends import SimulateBackend
from autotune.search.space import space_from_mapping
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.presets import load_model, search_spaces_dir
from autotune.trials.trial import TrialSpec

CLUSTER = ClusterSpec(num_gpus=2, gpus_per_node=2, gpu=gpu_spec("h100-80gb"))
SPACE = space_from_mapping({"tp": [1, 2], "mbs": [1, 2]}, "test")
GPT2_YAML = (search_spaces_dir() / "models" / "gpt2.yaml").read_text()


def make_study(root: Path, name: str = "s", seq_len: int | None = None) -> Path:
    model = load_model("gpt2").with_overrides(seq_length=seq_len)
    run_search(SearchConfig(model=model, cluster=CLUSTER, space=SPACE,
                            backend=SimulateBackend(CLUSTER), results_dir=root,
                            study_name=name, sampler="grid"))
    return root / name


def forget_model(folder: Path) -> None:
    """The study as an older autotune (or another tool) left it: no model attribute."""
    url = f"sqlite:///{folder / 'study.db'}"
    optuna.load_study(study_name=folder.name, storage=url).set_user_attr("model", None)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def export(capsys: pytest.CaptureFixture[str], root: Path, *args: str) -> tuple[int, str, str]:
    return cli(capsys, "export", "--results-dir", str(root), "--study", "s", *args)


def report(capsys: pytest.CaptureFixture[str], root: Path, *args: str) -> tuple[int, str, str]:
    for module in ("pandas", "matplotlib", "plotly"):
        pytest.importorskip(module)
    return cli(capsys, "report", "--results-dir", str(root), "--study", "s", *args)


def one_line(err: str, *parts: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autotune: error: --model "), err
    for part in parts:
        assert part in lines[0], err


def yaml_model(tmp_path: Path, **changes: object) -> str:
    """gpt2's preset file with `changes` to its fields."""
    lines = [line for line in GPT2_YAML.splitlines()
             if line.split(":")[0].strip() not in changes]
    path = tmp_path / "model.yaml"
    path.write_text("\n".join([*lines, *(f"{k}: {v}" for k, v in changes.items())]) + "\n")
    return str(path)


@pytest.mark.parametrize("fmt", ["megatron-lm", "json"])
def test_export_refuses_another_model(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      fmt: str) -> None:
    root = tmp_path / "results"
    make_study(root)
    code, out, err = export(capsys, root, "--format", fmt, "--model", "gpt2-xl")
    assert code == 2 and out == ""
    one_line(err, "--model gpt2-xl disagrees with study s, searched for gpt2 "
                  "(study attributes)", "num_layers 48 against 12",
             "hidden_size 1600 against 768")


def test_report_refuses_another_model_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = make_study(tmp_path / "results")
    code, _, err = report(capsys, folder.parent, "--model", "gpt2-xl")
    assert code == 2
    one_line(err, "gpt2-xl", "searched for gpt2")
    assert not (folder / "report.md").exists()


def test_a_model_file_is_compared_by_its_fields(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "results"
    make_study(root, seq_len=2048)
    # Another name, or another shape, under the same file: refused.
    renamed = yaml_model(tmp_path, name="mygpt")
    code, _, err = export(capsys, root, "--format", "json", "--model", renamed)
    assert code == 2
    one_line(err, f"--model {renamed} (mygpt) disagrees", "name mygpt against gpt2")
    wider = yaml_model(tmp_path, hidden_size=1536)
    code, _, err = export(capsys, root, "--format", "json", "--model", wider)
    assert code == 2
    one_line(err, "hidden_size 1536 against 768")
    # The same model: accepted, and the study's own sequence length (a run setting) is kept.
    for same in ("gpt2", yaml_model(tmp_path, seq_length=4096)):
        code, out, err = export(capsys, root, "--format", "json", "--model", same)
        assert code == 0, err
        assert json.loads(out)["seq_length"] == 2048


def test_a_study_without_a_model_takes_the_one_given(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "results"
    folder = make_study(root)
    forget_model(folder)
    code, _, err = export(capsys, root, "--format", "megatron-lm")
    assert code == 2 and "pass --model" in err
    code, out, err = export(capsys, root, "--format", "megatron-lm", "--model", "gpt2")
    assert code == 0, err
    assert "--num-layers 12" in out
    # Nothing to disagree with: --model is what the study is read as.
    code, out, err = export(capsys, root, "--format", "json", "--model", "gpt2-xl")
    assert code == 0 and json.loads(out)["model"] == "gpt2-xl"
    code, _, err = report(capsys, root, "--model", "gpt2")
    assert code == 0, err


def test_a_model_from_trial_json_is_compared_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A real run writes trials/<n>/trial.json: its model counts as stored."""
    root = tmp_path / "results"
    folder = make_study(root)
    forget_model(folder)
    (folder / "trials" / "0").mkdir(parents=True)
    TrialSpec(model=load_model("gpt2"), layout=Layout(dp=2)).write(
        folder / "trials" / "0" / "trial.json")
    code, _, err = export(capsys, root, "--format", "json", "--model", "gpt2-medium")
    assert code == 2
    one_line(err, "searched for gpt2 (trials/*/trial.json)")
    code, _, err = export(capsys, root, "--format", "json", "--model", "gpt2")
    assert code == 0, err
