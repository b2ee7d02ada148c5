"""A study's state across runs (issue 27, item 3): it keeps its space, RUNNING trials that no
process will finish are failed on resume, and a full disk is one line that leaves no empty
file behind."""

from __future__ import annotations

import errno
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotune.cli import main
from autotune.search.storage import fail_orphans

PLAN = ["gpt2", "--gpus", "2", "--backend", "simulate", "--trials", "3", "--study", "s"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().err


def load(root: Path) -> optuna.Study:
    return optuna.load_study(study_name="s", storage=f"sqlite:///{root / 's' / 'study.db'}")


@pytest.fixture
def root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A planned study `s` searched over tp [1, 2], mbs [1, 2, 4]."""
    space = tmp_path / "space.yaml"
    space.write_text("tp: [1, 2]\nmbs: [1, 2, 4]\n")
    results = tmp_path / "results"
    code, err = run(capsys, *PLAN, "--space", str(space), "--results-dir", str(results))
    assert code == 0, err
    return results


@pytest.mark.parametrize(("space", "fragment"), [
    ("tp: [1]\nmbs: [1, 2, 4]\n", "was searched over tp [1, 2]"),
    ("tp: [1, 2]\nmbs: [1, 2]\n", "this run's space gives mbs [1, 2]"),
])
def test_another_space_on_a_study_is_one_line(root: Path, tmp_path: Path, space: str,
                                              fragment: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other.yaml"
    other.write_text(space)
    before = len(load(root).trials)
    code, err = run(capsys, *PLAN, "--space", str(other), "--results-dir", str(root))
    assert code == 2
    assert len(err.splitlines()) == 1 and fragment in err and "Traceback" not in err
    assert "run it with the space it was searched over" in err
    assert len(load(root).trials) == before  # nothing was added


def test_the_same_space_and_an_added_dimension_continue(root: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    wider = tmp_path / "wider.yaml"
    wider.write_text("tp: [1, 2]\nmbs: [1, 2, 4]\ncross_entropy_fusion: [false, true]\n")
    code, err = run(capsys, *PLAN, "--space", str(wider), "--results-dir", str(root),
                    "--trials", "5")
    assert code == 0, err
    assert load(root).user_attrs["space"]["candidates"]["mbs"] == [1, 2, 4]


def test_a_trial_left_running_is_failed_on_resume(root: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # A process killed while the sampler ran: a RUNNING trial, no parameters, no heartbeat.
    orphan = load(root).ask()
    assert load(root).trials[orphan.number].state is TrialState.RUNNING
    space = tmp_path / "space.yaml"
    code, err = run(capsys, *PLAN, "--space", str(space), "--results-dir", str(root),
                    "--resume", "--trials", "5")
    assert code == 0, err
    states = {t.number: t.state for t in load(root).trials}
    assert states[orphan.number] is TrialState.FAIL
    assert TrialState.RUNNING not in states.values()


@pytest.mark.parametrize(("everything", "grace_s", "failed"), [
    (True, 3600, True),     # an SQLite study this process holds: no one else can run it
    (False, 3600, False),   # shared: a searcher may be sampling it right now
    (False, -1, True),      # shared, and older than the grace period without parameters
])
def test_fail_orphans(everything: bool, grace_s: float, failed: bool) -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])
    trial = study.ask()
    assert fail_orphans(study, everything=everything, grace_s=grace_s) == \
        ([trial.number] if failed else [])
    state = study.trials[trial.number].state
    assert state is (TrialState.FAIL if failed else TrialState.RUNNING)


# -- a full disk ------------------------------------------------------------------------------


def _no_space(*_: object, **__: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_full_disk_on_export_leaves_no_file(root: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("autotune.outputs.os.fsync", _no_space)
    out = tmp_path / "launch.sh"
    code, err = run(capsys, "export", "--results-dir", str(root), "--study", "s",
                    "--format", "megatron-lm", "-o", str(out))
    assert code == 2
    last = err.splitlines()[-1]  # after the line that names the trial exported
    assert last.endswith("launch.sh: cannot write it (No space left on device)")
    assert "Traceback" not in err
    assert list(tmp_path.glob("*launch.sh*")) == []  # neither the script nor its temp file


def test_full_disk_on_report_keeps_the_old_report(root: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("pandas")
    pytest.importorskip("plotly")
    pytest.importorskip("matplotlib")
    folder = root / "s"
    (folder / "report.md").write_text("the old report\n")
    monkeypatch.setattr("autotune.outputs.os.fsync", _no_space)
    code, err = run(capsys, "report", "--results-dir", str(root), "--study", "s")
    assert code == 1
    assert err == f"autotune: error: No space left on device: {folder / 'report.md'}\n"
    assert (folder / "report.md").read_text() == "the old report\n"
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert all(p.stat().st_size > 0 for p in folder.iterdir() if p.is_file())


def test_full_database_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.search.store import PlanningStore

    def full(self: PlanningStore) -> None:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as exc:
            raise optuna.exceptions.StorageInternalError("An exception is raised during "
                                                         "the commit.") from exc

    monkeypatch.setattr(PlanningStore, "close", full)
    code, err = run(capsys, *PLAN, "--results-dir", str(tmp_path / "r"))
    assert code == 1
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "could not be written (database or disk is full); free disk space" in err


# -- a storage that fails while report or export reads it --------------------------------------


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A planned study `s`, read (never changed) by the tests below."""
    results = tmp_path_factory.mktemp("planned") / "results"
    assert main([*PLAN, "--results-dir", str(results)]) == 0
    return results


def _driver_error(kind: str) -> Exception:
    """The error the database driver raises for each failure (SQLite's texts, and psycopg's
    for a server that cannot be reached)."""
    if kind == "unreachable":
        return ConnectionRefusedError('connection to server at "db.example" (10.0.0.9), port '
                                      "5432 failed: Connection refused")
    text = {"locked": "database is locked", "damaged": "database disk image is malformed",
            "full": "database or disk is full"}[kind]
    return (sqlite3.DatabaseError if kind == "damaged" else sqlite3.OperationalError)(text)


def _raising(kind: str, stage: str) -> Callable[..., Any]:
    """A stand-in that fails as Optuna's RDB storage does: SQLAlchemy's OperationalError from
    the driver's while it connects (`open`), wrapped in StorageInternalError once the study is
    being read (`read`)."""
    from sqlalchemy.exc import OperationalError

    def fail(*_: Any, **__: Any) -> Any:
        try:
            try:
                raise _driver_error(kind)
            except Exception as driver:
                raise OperationalError("SELECT ...", {}, driver) from driver
        except OperationalError as exc:
            if stage == "open":
                raise
            raise optuna.exceptions.StorageInternalError(
                "An exception is raised during the commit.") from exc
    return fail


HINTS = {"locked": "another process is writing it", "damaged": "the database file is damaged",
         "full": "free disk space", "unreachable": "check that the database can be reached"}
COMMANDS = {"report": ["report"], "export": ["export", "--format", "json", "-o"]}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("stage", ["open", "read"])
@pytest.mark.parametrize("kind", sorted(HINTS))
def test_a_storage_failure_while_reading_is_one_line(
        planned: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], kind: str, stage: str, command: str) -> None:
    if command == "report":
        pytest.importorskip("pandas")
    if stage == "open":
        monkeypatch.setattr(optuna, "load_study", _raising(kind, stage))
    else:
        monkeypatch.setattr(optuna.Study, "get_trials", _raising(kind, stage))
    out = tmp_path / "layout.json"
    args = [*COMMANDS[command], *([str(out)] if command == "export" else [])]
    before = sorted(p.name for p in (planned / "s").iterdir())
    code, err = run(capsys, *args, "--results-dir", str(planned), "--study", "s")
    assert code == 1
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    db = (planned / "s" / "study.db").resolve()
    assert err.startswith(f"autotune: error: the study's storage sqlite:///{db} could not "
                          "be read (")
    assert HINTS[kind] in err
    assert not out.exists()
    assert sorted(p.name for p in (planned / "s").iterdir()) == before  # no report written


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_damaged_database_file_is_one_line(planned: Path, tmp_path: Path, command: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    if command == "report":
        pytest.importorskip("pandas")
    copy = tmp_path / "results"
    shutil.copytree(planned, copy)
    db = copy / "s" / "study.db"
    data = db.read_bytes()
    db.write_bytes(data[:len(data) // 2])  # a copy cut short: its tables are incomplete
    out = tmp_path / "layout.json"
    args = [*COMMANDS[command], *([str(out)] if command == "export" else [])]
    code, err = run(capsys, *args, "--results-dir", str(copy), "--study", "s")
    assert code == 1
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "(database disk image is malformed); the database file is damaged" in err
    assert not out.exists() and not (copy / "s" / "report.md").exists()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unreachable_server_is_one_line(tmp_path: Path, command: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("psycopg")
    if command == "report":
        pytest.importorskip("pandas")
    url = "postgresql+psycopg://u:s3cret@127.0.0.1:1/db?connect_timeout=2"  # nothing listens
    out = tmp_path / "layout.json"
    args = [*COMMANDS[command], *([str(out)] if command == "export" else [])]
    code, err = run(capsys, *args, "--storage", url, "--results-dir", str(tmp_path / "r"))
    assert code != 0
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "s3cret" not in err and "127.0.0.1:1/db" in err
    assert not out.exists()
