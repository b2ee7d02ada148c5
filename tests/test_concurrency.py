"""Two autotune processes on one SQLite study: the second is refused in one line while the first
holds the study (autotune.search.lock), and the study is left as the first writes it.

Real processes (tests/doubles/cli_driver.py), paused at exact points by marker files: the lock is
an OS lock, so only other processes test it. PostgreSQL studies are shared instead
(tests/test_postgres.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
from pathlib import Path

import pytest
from doubles.driven import Driven, Finished, consistent, run, space_file, stored
from doubles.driven import search_args as search
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import ConfigError
from autotune.search.lock import lock_study, sqlite_file

REFUSED = "autotune: error: study s is in use by another autotune process (pid {pid})"


@pytest.fixture
def space(tmp_path: Path) -> str:
    return space_file(tmp_path)


def digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def refused(done: Finished, pid: int) -> None:
    code, err = done.code, done.err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(REFUSED.format(pid=pid)), err
    assert "PostgreSQL" in lines[0]


def unique_layouts(results: Path) -> list[FrozenTrial]:
    return consistent(stored(results, "s"))


# Heartbeats once an hour: the paused first process writes nothing while the second tries.
QUIET = {"AUTOTUNE_HEARTBEAT_INTERVAL_S": "3600"}


@pytest.mark.parametrize("resume", [False, True])
def test_a_second_run_on_a_busy_study_is_refused(tmp_path: Path, space: str,
                                                 resume: bool) -> None:
    results, marker = tmp_path / "results", tmp_path / "marker"
    first = Driven(search(results, space, "--trials", "4", "--sampler", "grid"),
                   pause=f"run:2:{marker}", env=QUIET)
    try:
        first.paused()
        db = results / "s" / "study.db"
        before = digest(db)
        second = run(search(results, space, "--trials", "4", "--sampler", "grid",
                            *(["--resume"] if resume else [])))
        refused(second, first.proc.pid)
        assert digest(db) == before, "the refused run touched the study"
    finally:
        first.resume()
    done = first.finish()
    assert done.code == 0, done.err
    trials = unique_layouts(results)
    # --trials 4 counts the search's own trials; its finalists' repeats come on top.
    assert len([t for t in trials if t.state is TrialState.COMPLETE
                and t.user_attrs["record"].get("repeat_of") is None]) == 4


def test_two_runs_creating_one_new_study(tmp_path: Path, space: str) -> None:
    """The first holds the lock before the database exists: the second never races it to
    create the tables (`table study_user_attributes already exists`)."""
    results, marker = tmp_path / "results", tmp_path / "marker"
    first = Driven(search(results, space, "--trials", "2"), pause=f"open:1:{marker}")
    try:
        first.paused()
        second = run(search(results, space, "--trials", "2"))
        refused(second, first.proc.pid)
        assert not (results / "s" / "study.db").exists()
    finally:
        first.resume()
    done = first.finish()
    assert done.code == 0, done.err
    unique_layouts(results)


@pytest.mark.parametrize("where", ["run:5", "insert:1"])
def test_a_second_plan_is_refused_while_the_first_plans_or_writes(
        tmp_path: Path, space: str, where: str) -> None:
    """The planning path and its bulk writer: two grid plans once wrote every trial twice."""
    results, marker = tmp_path / "results", tmp_path / "marker"
    args = search(results, space, "--sampler", "grid", model="gpt2-xl", backend="simulate")
    first = Driven(args, pause=f"{where}:{marker}")
    try:
        first.paused()
        refused(run(args), first.proc.pid)
        refused(run([*args, "--resume"]), first.proc.pid)
    finally:
        first.resume()
    done = first.finish()
    assert done.code == 0, done.err
    trials = unique_layouts(results)
    assert len(trials) == 30  # each distinct run of the grid once

    again = run(args)  # the lock went with the first process: a plan shows its study again
    assert again.code == 0, again.err
    assert len(unique_layouts(results)) == 30


def test_a_killed_run_never_blocks_the_next(tmp_path: Path, space: str) -> None:
    """The OS drops the lock of a process that dies, however it dies."""
    results, marker = tmp_path / "results", tmp_path / "marker"
    first = Driven(search(results, space, "--trials", "2"), pause=f"open:1:{marker}")
    first.paused()
    os.kill(first.proc.pid, signal.SIGKILL)
    assert first.finish().code == -signal.SIGKILL
    done = run(search(results, space, "--trials", "2"))
    assert done.code == 0, done.err
    unique_layouts(results)


# -- the lock itself, in this process ------------------------------------------------------


def test_the_lock_file_of_an_sqlite_url(tmp_path: Path) -> None:
    db = tmp_path / "plans.db"
    assert sqlite_file(f"sqlite:///{db}") == db.resolve()
    for url in ("sqlite://", "sqlite:///:memory:", "postgresql+psycopg://u@h/db", "not a url"):
        assert sqlite_file(url) is None
        assert lock_study("s", url) is None  # nothing to lock: PostgreSQL studies are shared
    assert lock_study("s", f"sqlite:///{tmp_path / 'missing' / 'x.db'}") is None

    lock = lock_study("s", f"sqlite:///{db}")
    assert lock is not None and lock.path == tmp_path / "plans.lock"
    again = lock_study("s", f"sqlite:///{db}")  # this process may open its study twice
    assert again is lock and lock.holders == 2
    again.release()
    # Another open file of it (as another process has) cannot take it while this one holds it.
    with lock.path.open() as other:
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.release()
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with the last holder
        with pytest.raises(ConfigError, match=r"^study s is in use by another autotune "
                                              rf"process \(pid {os.getpid()}\)"):
            lock_study("s", f"sqlite:///{db}")
