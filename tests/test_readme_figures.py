"""Every figure the README quotes from autotune's own CPU output, against the real output; the
modules it names exist; and it says how to reach the `autotune` that `make run` installs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.search.space import enumerate_space, load_space
from autotune.specs.hardware import ClusterSpec
from autotune.specs.presets import load_model

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    return README.split(f"\n{title}\n", 1)[1].split("\n#", 1)[0]


def test_the_dry_run_block_is_the_commands_output(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.commands import search as search_command

    # The README quotes a machine without GPUs, where the dry run explains a plan.
    monkeypatch.setattr(search_command, "local_gpu_count", lambda: 0)
    section = _section("### Dry run")
    command = re.search(r"`autotune (gpt2-xl --gpus\s+8 --dry-run)`", section)
    assert command, "the Dry run section names its command"
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block
    assert main(command[1].split()) == 0
    real = capsys.readouterr().out.splitlines()
    quoted = [line for line in block[1].splitlines() if line.strip() != "..."]
    assert len(quoted) >= 7
    for line in quoted:
        assert line in real, f"README's dry run says {line!r}; the command prints otherwise"
    # The block keeps the output's order.
    assert [real.index(line) for line in quoted] == sorted(real.index(line) for line in quoted)


@pytest.mark.slow
def test_the_planning_layout_count_is_the_enumerations() -> None:
    stated = re.search(r"Planning gpt-1t on 3072\s+GPUs \(([\d,]+) valid layouts[,)]", README)
    assert stated, "README states gpt-1t's valid layouts on 3072 GPUs"
    # What `autotune gpt-1t --gpus 3072 --gpus-per-node 8 --dry-run` prints as `valid
    # layouts`, without its distinct-run count (seconds more on 2 cores).
    summary = enumerate_space(load_space(None), load_model("gpt-1t"),
                              ClusterSpec.make(3072, 8, None))
    assert int(stated[1].replace(",", "")) == len(summary.valid)


def test_every_module_the_readme_names_exists() -> None:
    named = set(re.findall(r"autotune/[\w/]+\.py", README))
    assert named, "README names modules"
    missing = sorted(path for path in named if not (ROOT / path).is_file())
    assert not missing, f"README names modules that do not exist: {missing}"
    for pattern in re.findall(r"autotune/[\w/]*\*\.py", README):  # memory*.py
        assert list(ROOT.glob(pattern)), pattern


def test_readme_says_how_to_reach_the_autotune_make_run_installs() -> None:
    makefile = (ROOT / "Makefile").read_text()
    venv = re.search(r"^VENV \?= (\S+)$", makefile, re.M)
    assert venv and "$(VENV)/bin/autotune" in makefile  # make run calls it there
    text = _section("## Two commands")
    assert f"source {venv[1]}/bin/activate" in text and f"{venv[1]}/bin/autotune" in text
