"""One process per SQLite study: an OS lock beside its database.

Two processes on one SQLite study would each run every trial (each keeps its own queue and
SQLite has no shared view of what the other is running), and two creating the same new study
race on its tables. So a search holds an exclusive lock on `<database>.lock` (for the default
storage: results/<study>/study.lock) from before it opens the study until it ends; a second
search of that study is refused in one line before it touches the database. The lock is
filelock's FileLock, an `flock` on Unix: the operating system releases it when the process
dies, however it dies, so a crashed or killed run never blocks `--resume` (its soft-lock
fallback, a file that a crash would leave behind, is turned off). Sharing a study between
processes is PostgreSQL's job (docs/SHARED_STUDIES.md): other storages take no lock here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import filelock

from autotune.errors import ConfigError

__all__ = ["StudyLock", "lock_study", "sqlite_file"]

LOCK_SUFFIX = ".lock"


def sqlite_file(url: str) -> Path | None:
    """The database file of an SQLite URL (absolute); None for an in-memory database or any
    other storage."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # not a URL SQLAlchemy reads: opening the storage will say so
        return None
    if parsed.get_backend_name() != "sqlite":
        return None
    database = parsed.database or ""
    if database.startswith("file:"):  # an SQLite URI filename (?uri=true)
        database = database[len("file:"):].split("?", 1)[0]
    if database in ("", ":memory:"):
        return None
    return Path(database).resolve()


@dataclass(slots=True, eq=False)
class StudyLock:
    """The lock on one SQLite database, held by this process (see the module)."""

    path: Path
    lock: filelock.FileLock
    released: bool = False

    @property
    def holders(self) -> int:
        """Searches of this process that hold it: a process may open one study twice (tests
        do); FileLock counts the holds of one lock object."""
        return self.lock.lock_counter

    def release(self) -> None:
        """Let go of this hold; the lock itself goes with the last one (or the process)."""
        if self.released:
            return
        self.lock.release()
        if not self.lock.is_locked:
            self.released = True
            _HELD.pop(self.path, None)


_HELD: dict[Path, StudyLock] = {}
"""The locks this process holds, by lock file: flock conflicts between two opens of one file
even within a process, so a second search of the same study here shares the first one's."""


def _write_holder(fd: int) -> None:
    """The holder's pid in the lock file, for the message a second process prints; written
    only once the lock is held (FileLock opens the file without truncating it)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def _holder(path: Path) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return ""
    return f" (pid {text})" if text.isdigit() else ""


def lock_study(name: str, url: str) -> StudyLock | None:
    """Lock the SQLite database of study `name` for this process, or ConfigError in one line
    when another process holds it. None: not an SQLite file (nothing to lock), or its folder
    does not exist (opening the storage will say so)."""
    database = sqlite_file(url)
    if database is None or not database.parent.is_dir():
        return None
    path = database.with_suffix(LOCK_SUFFIX)
    held = _HELD.get(path)
    if held is not None:
        held.lock.acquire()
        return held
    lock = filelock.FileLock(path, timeout=0, fallback_to_soft=False, preserve_lock_file=True,
                             thread_local=False, on_acquired=_write_holder)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise ConfigError(
            f"study {name} is in use by another autotune process{_holder(path)} ({database} is "
            "SQLite: one process per study); wait for it to end (--resume then continues the "
            "study), or share a study between processes through PostgreSQL "
            "(docs/SHARED_STUDIES.md)") from None
    except OSError as exc:
        raise ConfigError(f"cannot lock study {name}: {path}: {exc.strerror or exc}") from None
    study_lock = StudyLock(path=path, lock=lock)
    _HELD[path] = study_lock
    return study_lock
