"""Numbers and files that entered unchecked, found by a CLI sweep (session 16): each is one
line and exit 2 where it enters, never a traceback (an OverflowError of the float arithmetic,
a UnicodeDecodeError) nor a silent default."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.cli import main
from autotune.inputs.bounds import COUNT_MAX
from autotune.layouts.layout import Layout
from autotune.report.scripts import megatron_lm_script
from autotune.specs.presets import load_model

HUGE = "1" + "0" * 320
"""More than a float holds: a batch or sequence of it overflowed the models' arithmetic."""
MINE = Layout(mbs=4, gbs=64, impl="te")


def _err(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, list[str]]:
    code = main(args)
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(("args", "says"), [
    (["estimate", "gpt2", "--gpus", "8", "--gbs", HUGE],
     "--global-batch-size must be at most 1,099,511,627,776 (2**40), got 1000"),
    (["estimate", "gpt2", "--gpus", "8", "--seq-len", HUGE], "--seq-len must be at most"),
    (["estimate", "gpt2", "--gpus", "8", "--seq-len", str(COUNT_MAX + 1)],
     f"--seq-len must be at most 1,099,511,627,776 (2**40), got {COUNT_MAX + 1}"),
    (["estimate", "gpt2", "--gpus", HUGE], "--gpus must be at most"),
    (["gpt2", "--gpus", "8", "--gbs", HUGE, "--backend", "simulate"],
     "--global-batch-size must be at most"),
    (["gpt2", "--gpus", str(2**50), "--backend", "simulate", "--dry-run"],
     f"--gpus must be at most 1,099,511,627,776 (2**40), got {2**50}"),
    (["gpt2", "--gpus", "8", "--nodes", HUGE, "--backend", "simulate"],
     "--nodes must be at most"),
    (["gpt2", "--gpus", "8", "--backend", "simulate", "--trials", HUGE],
     "--trials must be at most"),
    # The lower bound keeps its words.
    (["estimate", "gpt2", "--gpus", "0"], "--gpus must be a positive integer, got 0"),
    (["gpt2", "--gpus", "8", "--nodes", "0", "--backend", "simulate"],
     "--nodes must be a positive integer, got 0"),
    # `--gpu ""` (an unset variable) was taken for the default GPU.
    (["estimate", "gpt2", "--gpus", "8", "--gpu", ""], "unknown GPU ''; choose one of"),
])
def test_command_line_counts_keep_a_files_bounds(capsys: pytest.CaptureFixture[str],
                                                 args: list[str], says: str) -> None:
    code, err = _err(capsys, args)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("autotune: error: ") and says in err[0]
    assert len(err[0]) < 300  # a 321-digit number is cut, not printed whole


def test_the_largest_count_still_plans(capsys: pytest.CaptureFixture[str]) -> None:
    # At the bound: refused by the model (nothing fits), not by the option's range.
    code, err = _err(capsys, ["estimate", "gpt2", "--gpus", "8", "--seq-len", str(COUNT_MAX)])
    assert code == 0, err


def _script(tmp_path: Path, old: str, new: str) -> Path:
    text = megatron_lm_script(load_model("gpt2"), MINE, title=["mine"], nodes=1)
    assert old in text
    path = tmp_path / "run.sh"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize(("old", "new", "says"), [
    ("--global-batch-size 64", f"--global-batch-size {HUGE}",
     "--global-batch-size '1000"),
    ("--seq-length 1024", "--seq-length 100000000000000000000000000",
     "--seq-length '100000000000000000000000000' is larger than any count autotune reads"),
    ("--micro-batch-size 4", "--micro-batch-size 1e3", "--micro-batch-size '1e3' is not an "
                                                       "integer"),
    ("--bf16", "--bf16 --hidden-dropout nan", "--hidden-dropout 'nan' is not a finite number"),
])
def test_a_scripts_flag_values_keep_a_files_bounds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str,
        says: str) -> None:
    path = _script(tmp_path, old, new)
    code, err = _err(capsys, ["--from-megatron", str(path), "--backend", "simulate",
                              "--results-dir", str(tmp_path / "r")])
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"autotune: error: {path}: line ") and says in err[0]
    assert len(err[0]) < 300


@pytest.mark.parametrize(("text", "says"), [
    # A key the export never writes was dropped: its dimension took estimate's default.
    ('{"tp": 2, "pp_size": 2}', "unknown field(s) pp_size"),
    ('{"layout": {"tp": 2, "ppp": 2}}', "unknown field(s) ppp"),
    ("{}", "holds no layout field"),
    ('{"model": "gpt2", "gpus": 8}', "holds no layout field"),
])
def test_a_layout_file_with_no_or_unknown_fields_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, says: str) -> None:
    path = tmp_path / "layout.json"
    path.write_text(text)
    code, err = _err(capsys, ["estimate", "gpt2", "--gpus", "8", "--layout", str(path)])
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"autotune: error: layout file {path}") and says in err[0]


def test_an_exported_layout_and_estimates_own_json_read_back(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.report.scripts import layout_json

    path = tmp_path / "layout.json"
    path.write_text(layout_json(MINE, model="gpt2", gpus=16, gpu="h100-80gb",
                                tokens_per_s=1.0, predicted=True, study="s", trial=0,
                                seq_length=1024, gpus_per_node=8))
    assert main(["estimate", "--layout", str(path)]) == 0
    assert "gpt2 on 16 x h100-80gb" in capsys.readouterr().out
    assert main(["estimate", "gpt2", "--gpus", "8", "--tp", "2", "--json"]) == 0
    path.write_text(capsys.readouterr().out)
    assert main(["estimate", "gpt2", "--gpus", "8", "--layout", str(path)]) == 0
    assert "tp2" in capsys.readouterr().out


@pytest.mark.parametrize("layers", [10**12, 2**40])
def test_a_model_file_over_100t_parameters_is_one_line(tmp_path: Path, layers: int,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # Each count within its bound, the model is not: refused where the file is read, not
    # planned at 1e18 GiB per GPU (an option's own bound, --seq-len, still plans: above).
    model = tmp_path / "huge.yaml"
    model.write_text(f"name: huge\nnum_layers: {layers}\nhidden_size: 4096\n"
                     "num_attention_heads: 32\nvocab_size: 32000\nseq_length: 2048\n"
                     "global_batch_size: 8\n")
    code, err = _err(capsys, ["estimate", str(model), "--gpus", "8"])
    assert code == 2 and len(err) == 1, err
    assert "parameters, over the 100T" in err[0]
