"""One process per SQLite study: an OS lock beside its database.

Two processes on one SQLite study would each run every trial (each keeps its own queue and
SQLite has no shared view of what the other is running), and two creating the same new study
race on its tables. So a search holds an exclusive `flock` on `<database>.lock` (for the default
storage: results/<study>/study.lock) from before it opens the study until it ends; a second
search of that study is refused in one line before it touches the database. The operating
system releases the lock when the process dies, however it dies, so a crashed or killed run
never blocks `--resume`. Sharing a study between processes is PostgreSQL's job
(docs/SHARED_STUDIES.md): other storages take no lock here.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO

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
    handle: IO[str]
    holders: int = 1
    """Searches of this process that hold it: a process may open one study twice (tests do)."""
    released: bool = False

    def release(self) -> None:
        """Let go of this hold; the lock itself goes with the last one (or the process)."""
        if self.released:
            return
        self.holders -= 1
        if self.holders == 0:
            self.released = True
            _HELD.pop(self.path, None)
            self.handle.close()  # closing the file drops the flock


_HELD: dict[Path, StudyLock] = {}
"""The locks this process holds, by lock file: flock conflicts between two opens of one file
even within a process, so a second search of the same study here shares the first one's."""


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
        held.holders += 1
        return held
    try:
        handle = path.open("a+")  # never truncated before it is held: it names the holder
    except OSError as exc:
        raise ConfigError(f"cannot lock study {name}: {path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip()
        handle.close()
        pid = f" (pid {holder})" if holder.isdigit() else ""
        raise ConfigError(
            f"study {name} is in use by another autotune process{pid} ({database} is SQLite: "
            "one process per study); wait for it to end (--resume then continues the study), "
            "or share a study between processes through PostgreSQL "
            "(docs/SHARED_STUDIES.md)") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    lock = StudyLock(path=path, handle=handle)
    _HELD[path] = lock
    return lock
