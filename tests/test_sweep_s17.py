"""Inputs session 17's sweep found taken in silence or misnamed (results/benchmarks/
2026-11-28-cpu-input-sweep-s17.md): each is now one line and exit 2, and nothing the user
already has is replaced."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from autotune.cli import main

SEED = Path(__file__).parent / "data" / "megatron" / "seed-tutorial.sh"


def _err(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, list[str]]:
    code = main(args)
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulated study searched from the seed tutorial's command (gpt2-xl, one GPU), with a
    copy of that command beside it."""
    tmp = tmp_path_factory.mktemp("s17")
    shutil.copy(SEED, tmp / "run.sh")
    assert main(["--from-megatron", str(tmp / "run.sh"), "--backend", "simulate", "--trials",
                 "2", "--results-dir", str(tmp / "r"), "--json"]) == 0
    return tmp


@pytest.mark.parametrize(("args", "says"), [
    # Options that shape a Megatron-LM command were dropped without a word where the format
    # writes none.
    (["--format", "json", "--megatron-lm", "/opt/Megatron-LM"],
     "--megatron-lm has no place with --format json: it writes the layout, no command"),
    (["--format", "json", "--train-iters", "5"], "--train-iters has no place with --format json"),
    (["--format", "json", "--megatron-version", "0.19"], "--megatron-version has no place"),
    (["--format", "json", "--nodes", "1"], "--nodes has no place with --format json"),
    (["--format", "torchrun", "--train-iters", "5"],
     "--train-iters has no place with --format torchrun: it writes autotune's worker, not "
     "Megatron-LM"),
    (["--format", "torchrun", "--megatron-lm", "/opt/M"], "--megatron-lm has no place"),
    # An empty version (an unset variable) was taken for the installed one.
    (["--megatron-version", ""], "megatron-core version '' is not a version number"),
])
def test_export_options_a_format_does_not_read(capsys: pytest.CaptureFixture[str],
                                               study: Path, args: list[str], says: str) -> None:
    code, err = _err(capsys, ["export", "--results-dir", str(study / "r"), *args])
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("autotune: error: ") and says in err[0], err[0]


@pytest.mark.parametrize("via_link", [False, True], ids=["same path", "a link to it"])
def test_export_keeps_the_users_own_command(capsys: pytest.CaptureFixture[str], study: Path,
                                            tmp_path: Path, via_link: bool) -> None:
    """`export --from-megatron run.sh -o run.sh` replaced the user's command with the edited
    copy: the original was gone."""
    mine = study / "run.sh"
    before = mine.read_bytes()
    target = mine
    if via_link:
        target = tmp_path / "link.sh"
        target.symlink_to(mine)
    code, err = _err(capsys, ["export", "--results-dir", str(study / "r"), "--from-megatron",
                              str(mine), "-o", str(target)])
    assert code == 2 and len(err) == 1, err
    assert f"-o {target} is your --from-megatron command; refusing to overwrite it" in err[0]
    assert mine.read_bytes() == before
    assert main(["export", "--results-dir", str(study / "r"), "--from-megatron", str(mine),
                 "-o", str(tmp_path / "tuned.sh")]) == 0


@pytest.mark.parametrize(("args", "says"), [
    # '' was read as the folder '.': "autotune: error:  is a folder; give a preset name".
    (["estimate", "", "--gpus", "1"], "the model '' is empty; give a preset name"),
    (["estimate", "  ", "--gpus", "1"], "the model '  ' is empty"),
    (["", "--gpus", "1", "--backend", "simulate"], "the model '' is empty"),
    (["estimate", "tests", "--gpus", "1"], "tests is a folder; give a preset name"),
])
def test_an_empty_model_is_named(capsys: pytest.CaptureFixture[str], args: list[str],
                                 says: str) -> None:
    code, err = _err(capsys, args)
    assert code == 2 and len(err) == 1, err
    assert err[0] == f"autotune: error: {says}" or says in err[0], err[0]


@pytest.mark.parametrize(("what", "says"), [
    # A file given as the results folder was said not to exist.
    ("results-file", "results folder {t}/f.json is not a folder"),
    ("missing", "results folder {t}/nope does not exist"),
    # -o a folder was found only after the fit (exit 1, an OSError's line).
    ("out-folder", "-o {t} is a folder; give the file to write"),
    ("out-missing-folder", "-o {t}/no/c.json: {t}/no does not exist"),
])
def test_calibrate_paths(capsys: pytest.CaptureFixture[str], tmp_path: Path, what: str,
                         says: str) -> None:
    (tmp_path / "f.json").write_text("{}")
    folder, out = str(tmp_path), str(tmp_path / "c.json")
    if what == "results-file":
        folder = str(tmp_path / "f.json")
    elif what == "missing":
        folder = str(tmp_path / "nope")
    elif what == "out-folder":
        out = str(tmp_path)
    else:
        out = str(tmp_path / "no" / "c.json")
    code, err = _err(capsys, ["calibrate", "--results-dir", folder, "-o", out])
    assert code == 2 and len(err) == 1, err
    assert err[0] == f"autotune: error: {says.format(t=tmp_path)}", err[0]
