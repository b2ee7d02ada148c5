from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.commands.search import dry_run_space
from autotune.search.space import enumerate_space, load_space
from autotune.specs.hardware import ClusterSpec
from autotune.specs.presets import list_presets, load_model
from tests.conftest import heavy_imports_of


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_models_lists_every_preset_with_size(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "models")
    assert code == 0
    assert "gpt2-xl" in out and "1.6B" in out
    assert "mixtral-8x7b" in out and "MoE 8x top-2" in out
    assert len(out.strip().splitlines()) == 1 + len(list_presets())  # header + the presets


def test_dry_run_explains_the_space(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "gpt2-xl", "--gpus", "8", "--dry-run", "--backend", "simulate")
    assert code == 0
    space = dry_run_space(load_space(), "simulate")
    summary = enumerate_space(space, load_model("gpt2-xl"), ClusterSpec.make(8, 8, None))
    assert f"{summary.total:,} combinations" in out
    assert "tp=2 must divide num_attention_heads=25" in out
    assert "note: tp is limited to 1" in out


def test_dry_run_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "gpt2-xl", "--gpus", "8", "--dry-run", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["valid_values"]["tp"] == [1]
    assert data["valid"] + sum(g["count"] for g in data["rejected"].values()) == \
        data["combinations"]


def test_overrides_reach_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "gpt2-xl", "--gpus", "8", "--seq-len", "2048",
                       "--global-batch-size", "128", "--dry-run")
    assert code == 0
    assert "seq 2048, global batch 128" in out


BAD_INPUTS = [
    (["gpt2-xxl", "--gpus", "8", "--dry-run"], "unknown model 'gpt2-xxl'; did you mean gpt2-xl"),
    (["gpt2-xl", "--gpus", "0", "--dry-run"], "--gpus must be a positive integer, got 0"),
    (["gpt2-xl", "--gpus", "-4", "--dry-run"], "--gpus must be a positive integer"),
    (["gpt2-xl", "--gpus", "abc", "--dry-run"], "Invalid value for '--gpus'"),
    (["gpt2-xl", "--gpus", "2.5", "--dry-run"], "Invalid value for '--gpus'"),
    (["gpt2-xl", "--dry-run"], "Missing option '--gpus'"),
    (["gpt2-xl", "--gpus", "7", "--dry-run"], "no layout of gpt2-xl can use 7 GPUs"),
    (["gpt2-xl", "--gpus", "12", "--dry-run"], "--gpus 12 does not fill nodes of 8 GPUs"),
    (["gpt2-xl", "--gpus", "8", "--space", "/no/such.yaml", "--dry-run"], "does not exist"),
    (["gpt2-xl", "--gpus", "8", "--bogus"], "No such option: --bogus"),
    (["gpt2-xl", "--gpus", "8", "--seq-len", "0", "--dry-run"], "--seq-len must be"),
    (["no/such/model.yaml", "--gpus", "8", "--dry-run"], "does not exist"),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUTS)
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], args: list[str],
                                          message: str) -> None:
    code, out, err = run(capsys, *args)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("autotune: error: ")
    assert message in err


@pytest.mark.parametrize(("text", "message"), [
    ("tp: [1, 2\n", "malformed YAML"),
    ("tp: [1]\nwarp: [1]\n", "unknown dimension(s) warp"),
])
def test_bad_space_file_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
                               message: str) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    code, _, err = run(capsys, "gpt2-xl", "--gpus", "8", "--space", str(path), "--dry-run")
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    assert "models" in out and "search" in out


TORCH_FREE = [
    ["--help"],
    ["models"],
    ["gpt2-xl", "--gpus", "8", "--dry-run"],
]


@pytest.mark.parametrize("args", TORCH_FREE)
def test_cli_never_imports_torch(args: list[str]) -> None:
    code, heavy, err = heavy_imports_of(args)
    assert code == 0, err
    assert heavy == "HEAVY []"


def test_console_script_entry_point() -> None:
    proc = subprocess.run([sys.executable, "-m", "autotune.cli", "gpt2", "--gpus", "2",
                           "--dry-run"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "gpt2 on 2 GPUs" in proc.stdout


@pytest.mark.parametrize(("args", "code", "says"), [
    # A search option before the model: `autotune --gpus 8 MODEL` searched nothing and said
    # "No such option: --gpus".
    (["--gpus", "8", "gpt2", "--dry-run", "--backend", "simulate"], 0, "gpt2 on 8 GPUs"),
    (["--gpus=8", "gpt2", "--dry-run", "--backend", "simulate"], 0, "gpt2 on 8 GPUs"),
    (["--tp", "2", "gpt2", "--gpus", "8", "--dry-run", "--backend", "simulate"], 0,
     "tp=2"),
    (["--gpus", "8"], 2, "Missing argument 'MODEL' (or --from-megatron FILE)"),
    (["--bogus"], 2, "No such option: --bogus"),
    # autotune's own options stay its own.
    (["--version"], 0, "autotune "),
])
def test_options_before_the_model_reach_the_search(capsys: pytest.CaptureFixture[str],
                                                   args: list[str], code: int,
                                                   says: str) -> None:
    got, out, err = run(capsys, *args)
    assert got == code, err
    assert says in (out if code == 0 else err)
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 1
