"""Regressions found by sweeping the CLI over presets, GPU counts and options (simulate)."""

from __future__ import annotations

import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from autotune.commands.from_megatron import _study_place

REDACTED = "postgresql+psycopg://user:***@host/db"


@pytest.mark.parametrize(("results_dir", "storage", "expected"), [
    # The default ./results: the export finds the study without being told.
    ("results", None, []),
    (None, None, []),
    # Another folder: the printed `autotune export --from-megatron ... --study S` line failed
    # with "unknown study" unless it named the folder (absolute, to run from anywhere).
    ("elsewhere", None, ["--results-dir", "{cwd}/elsewhere"]),
    ("{tmp}/r", None, ["--results-dir", "{tmp}/r"]),
    # A shared storage: the study is there, whatever the folder.
    ("{tmp}/r", "postgresql+psycopg://user:pw@host/db", ["--storage", REDACTED]),
])
def test_from_megatron_export_line_names_where_the_study_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, results_dir: str | None,
        storage: str | None, expected: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    fill = {"tmp": str(tmp_path.resolve()), "cwd": str(Path.cwd().resolve())}
    result = SimpleNamespace(storage=REDACTED)
    where = None if results_dir is None else results_dir.format(**fill)
    words = _study_place(where, storage, result)  # type: ignore[arg-type]
    assert words == [w.format(**fill) for w in expected]
    assert shlex.split(shlex.join(words)) == words


@pytest.mark.parametrize(("label", "says"), [
    # `autotune --help` and the search's table legend said "fp8pg = With fp8": the condition of
    # the help text, not what the label means.
    ("fp8pg", "Keep the GEMM weights in FP8"),
    ("sp", "Sequence parallelism"),
])
def test_legend_says_what_a_label_means(label: str, says: str) -> None:
    from autotune.layouts.legend import legend_entries

    entry = next(e for e in legend_entries([label]) if e.shown == label)
    assert entry.meaning.startswith(says)
    assert entry.meaning.lower() != "with fp8"
