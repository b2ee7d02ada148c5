"""tools/measured_from_study.py: a device call's trials as tests/data/measured_trials.json rows.
Session 26's rows were written by it; run again on the committed results it writes them again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.measured import DATA_PATH

ROOT = Path(__file__).resolve().parents[1]
S26 = ROOT / "results" / "benchmarks" / "2026-11-29-h200x4-issue30-s26"
RECIPE_FIELDS = ("gbs=16,mbs=1,distributed_optimizer=1,overlap_grad_reduce=1,"
                 "overlap_param_gather=1,recompute=full,recompute_method=block,"
                 "recompute_num_layers=5,fp8=hybrid,fp8_recipe=tensorwise,impl=te")


def _tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "tools/measured_from_study.py", *args], cwd=ROOT,
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def _committed(prefix: str) -> list[dict[str, Any]]:
    rows = json.loads(DATA_PATH.read_text())["trials"]
    return [t for t in rows if t["source"].startswith(prefix + "/")]


@pytest.fixture(scope="module")
def xl_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("xl4")
    with tarfile.open(S26 / "gpt2-xl" / "results.tgz") as tar:
        tar.extractall(out, filter="data")
    return out / "r_xl4" / "xl4-s26"


def test_a_study_gives_the_committed_rows(xl_study: Path) -> None:
    # OK launches only: duplicates, predicted-slow and predicted-OOM trials are left out, the
    # four finalist repeats kept; gpt2-xl at its default sequence, as the older gpt2 rows.
    out = _tool("study", str(xl_study), "s26-xl4-search", "--omit-default-seq")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["source"] for r in rows] == [f"s26-xl4-search/{n}" for n in
                                           (0, 1, 8, 12, 24, 33, 34, 35, 36, 37)]
    assert rows == _committed("s26-xl4-search")
    assert all("seq_length" not in r and "rope_fusion" not in r for r in rows)


def test_a_device_layouts_line_gives_the_committed_row() -> None:
    out = _tool("layouts", str(S26 / "llama3-8b" / "recipe-hand.txt"), "s26-l8b4-recipe",
                "llama3-8b", "4", "h200", "--seq-len", "8192", RECIPE_FIELDS)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == _committed("s26-l8b4-recipe")


@pytest.mark.parametrize(("args", "message"), [
    # The layout given must print the line's label (here: no recompute).
    (["layouts", str(S26 / "llama3-8b" / "recipe-hand.txt"), "p", "llama3-8b", "4", "h200",
      "gbs=16,mbs=1,impl=te"], "LAYOUT prints"),
    (["study", str(S26), "p"], "no study.db"),
], ids=["label", "no-study"])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    out = _tool(*args)
    assert out.returncode == 2 and message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_the_wrong_model_is_refused(xl_study: Path) -> None:
    out = _tool("study", str(xl_study), "p", "--model", "gpt2-large")
    assert out.returncode == 2 and "is not the study's model" in out.stderr


def test_into_refuses_a_source_already_there(xl_study: Path, tmp_path: Path) -> None:
    data = tmp_path / "measured_trials.json"
    data.write_text(DATA_PATH.read_text())
    out = _tool("study", str(xl_study), "s26-xl4-search", "--into", str(data))
    assert out.returncode == 2 and "already holds s26-xl4-search/0" in out.stderr
    assert data.read_text() == DATA_PATH.read_text()
    out = _tool("study", str(xl_study), "again", "--omit-default-seq", "--into", str(data))
    assert out.returncode == 0, out.stderr
    added = json.loads(data.read_text())["trials"][-10:]
    assert [r["source"] for r in added][:2] == ["again/0", "again/1"]
    assert [r["strategy"] for r in added] == [r["strategy"] for r in
                                              _committed("s26-xl4-search")]
