"""`python cli_driver.py ARGS...`: autotune's command line (autotune.cli.main, its exit status
and stderr as the console script's) in a process that the interrupt and concurrency tests
(tests/test_interrupts.py, tests/test_concurrency.py) signal, kill or run twice at once.

`--backend worker` runs the scripted FakeBackend (tests/doubles/fake_backend.py) on a machine
that says it has 8 GPUs; `--backend simulate` is the real one. The environment sets two hooks,
each `WHERE:N[:MARKER]`, that act at the N-th passage of a point WHERE:
- enumerate: the CLI enumerates the space (before any study is opened);
- open: the search opens its study, its SQLite lock already held, the database not yet touched;
- run: a trial runs in the backend (fake or simulate);
- pruned: a trial was just told PRUNED (optuna's Study.tell returned);
- insert: a plan's trials are being written in one transaction (search.bulk).
AUTOTUNE_TEST_PAUSE=WHERE:N:MARKER writes MARKER there and waits until MARKER.go exists (or the
process is interrupted or killed); AUTOTUNE_TEST_SIGINT=WHERE:N sends the process SIGINT
there, as a Ctrl-C at exactly that moment would.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for `doubles`

import optuna
from doubles.fake_backend import FakeBackend
from doubles.no_fsync import sqlite_without_fsync
from optuna.trial import TrialState

import autotune.cli
import autotune.commands.search as search_command
import autotune.search.bulk
import autotune.search.store

PASSED: Counter[str] = Counter()


def _hook(name: str) -> tuple[str, int, Path | None] | None:
    value = os.environ.get(name)
    if not value:
        return None
    where, n, *marker = value.split(":", 2)
    return where, int(n), Path(marker[0]) if marker else None


PAUSE = _hook("AUTOTUNE_TEST_PAUSE")
SIGINT = _hook("AUTOTUNE_TEST_SIGINT")


def passing(where: str) -> None:
    """A point WHERE is passed: pause or interrupt here if a hook says so."""
    PASSED[where] += 1
    if SIGINT is not None and SIGINT[:2] == (where, PASSED[where]):
        os.kill(os.getpid(), signal.SIGINT)
    if PAUSE is not None and PAUSE[:2] == (where, PASSED[where]):
        marker = PAUSE[2]
        assert marker is not None
        marker.write_text(str(os.getpid()))
        go = marker.with_name(marker.name + ".go")
        while not go.exists():
            time.sleep(0.02)


def before(where: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        passing(where)
        return function(*args, **kwargs)
    return wrapped


class Hooked:
    """A backend whose runs pass the point `run`."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        passing("run")
        return self.backend.run(*args, **kwargs)


def install() -> None:
    sqlite_without_fsync()  # as in the test process (doubles/no_fsync.py)
    autotune.cli.enumerate_space = before("enumerate", autotune.cli.enumerate_space)
    # A search's check (the whole enumeration is the search's own, LayoutMap.of).
    autotune.cli.any_valid = before("enumerate", autotune.cli.any_valid)
    autotune.search.store.open_study = before("open", autotune.search.store.open_study)
    autotune.search.store.open_planning_study = before(
        "open", autotune.search.store.open_planning_study)
    autotune.search.bulk._insert = before("insert", autotune.search.bulk._insert)

    real_make = search_command.make_backend

    def make_backend(name: Any, cluster: Any, *args: Any, **kwargs: Any) -> Any:
        backend = (FakeBackend(cluster) if name == "worker"
                   else real_make(name, cluster, *args, **kwargs))
        return Hooked(backend)

    search_command.make_backend = make_backend
    search_command.local_gpu_count = lambda: 8

    real_tell = optuna.Study.tell

    def tell(self: optuna.Study, *args: Any, **kwargs: Any) -> Any:
        told = real_tell(self, *args, **kwargs)
        if told.state is TrialState.PRUNED:
            passing("pruned")
        return told

    optuna.Study.tell = tell  # type: ignore[method-assign]


if __name__ == "__main__":
    install()
    sys.exit(autotune.cli.main(sys.argv[1:]))
