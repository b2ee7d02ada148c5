"""`$((...))` in a --from-megatron script: never evaluated. In a value autotune needs, one line
naming the line and the flag; elsewhere a warning, and the export carries it as written."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.errors import ConfigError
from autotune.layouts.layout import Layout
from autotune.megatron.megatron_command import (
    arithmetic_warning,
    layout_changes,
    megatron_layout,
    read_megatron_command,
)
from autotune.megatron.script_patch import patch_script
from autotune.report.scripts import megatron_lm_script
from autotune.specs.presets import load_model

XL = load_model("gpt2-xl")
MINE = Layout(mbs=16, gbs=64, impl="te")


def _script(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    text = megatron_lm_script(XL, MINE, title=["mine"], nodes=1)
    for old, new in edits:
        assert old in text
        text = text.replace(old, new, 1)
    path = tmp_path / "run.sh"
    path.write_text(text)
    return path


def _launch_line(path: Path) -> int:
    return next(k for k, line in enumerate(path.read_text().splitlines(), 1)
                if line.startswith("torchrun"))


def _line_of(path: Path, start: str) -> int:
    return next(k for k, line in enumerate(path.read_text().splitlines(), 1)
                if line.startswith(start))


@pytest.mark.parametrize(("edits", "written_on"), [
    # In the flag itself: the launch's line.
    ([("--seq-length 1024", "--seq-length $((512*2))")], "torchrun"),
    ([("--micro-batch-size 16", "--micro-batch-size $((8+8))")], "torchrun"),
    # Through a variable set to it, directly or through another: the line of the assignment
    # that holds the arithmetic, where the number is to be written.
    ([("torchrun", "SEQ=$((512*2))\ntorchrun"), ("--seq-length 1024", "--seq-length $SEQ")],
     "SEQ="),
    ([("torchrun", "A=$((512*2))\nSEQ=${A}\ntorchrun"),
      ("--seq-length 1024", "--seq-length $SEQ")], "A="),
])
def test_arithmetic_in_a_value_autotune_needs_is_one_line_naming_it(
        tmp_path: Path, edits: list[tuple[str, str]], written_on: str) -> None:
    path = _script(tmp_path, *edits)
    with pytest.raises(ConfigError) as caught:
        read_megatron_command(str(path))
    message = str(caught.value)
    assert message.startswith(f"{path}: line {_line_of(path, written_on)}: ")
    assert "$((" in message and "never runs" in message and "needs its value" in message
    assert "write the number there" in message and "\n" not in message
    if written_on != "torchrun":
        assert f"--seq-length on line {_launch_line(path)}" in message


UNNEEDED = [("    --train-iters 100", "    --train-iters $((50*2))"),
            ("torchrun", "EVERY=$((10*100))\ntorchrun"),
            ("--eval-interval 1000", "--eval-interval ${EVERY}")]


def test_arithmetic_in_a_value_autotune_does_not_need_is_warned_and_carried(
        tmp_path: Path) -> None:
    path = _script(tmp_path, *UNNEEDED)
    command = read_megatron_command(str(path))
    warning = arithmetic_warning(command)
    assert warning is not None and f"line {_launch_line(path)}:" in warning
    assert "--train-iters $((50*2))" in warning
    assert f"--eval-interval $((10*100)) (set on line {_line_of(path, 'EVERY=')})" in warning
    assert "carries it as written" in warning
    # The export edits only what changes: the arithmetic stays as the user typed it, where it
    # stood (the shell running the exported script evaluates it, as it did the user's).
    old = megatron_layout(command, 1)
    new = replace(old, mbs=8)
    out = patch_script(command, new, layout_changes(command, old, new))
    assert "--train-iters $((50*2))" in out and "EVERY=$((10*100))" in out
    assert "--eval-interval ${EVERY}" in out and "--micro-batch-size 8" in out


def test_a_script_without_arithmetic_has_no_warning(tmp_path: Path) -> None:
    assert arithmetic_warning(read_megatron_command(str(_script(tmp_path)))) is None


def test_the_search_warns_once_and_runs(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = _script(tmp_path, *UNNEEDED)
    assert main(["--from-megatron", str(path), "--backend", "simulate", "--gpu", "h100-80gb",
                 "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert err.count("arithmetic, which autotune never runs") == 1
