"""SQLite without fsync, for the test process and the doubles it starts (cli_driver.py,
fake_backend.py): PRAGMA synchronous=OFF on every SQLite connection SQLAlchemy opens.

Every ask, parameter and tell of a real-run study is a commit, and on a busy disk each commit's
fsync took 10 ms or more: the search tests spent most of their time waiting for the disk. No
test is about surviving a power cut; a killed process loses nothing either way (its writes are
in the operating system's cache), so the interrupt and kill tests keep their meaning.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

__all__ = ["sqlite_without_fsync"]


def _no_fsync(connection: Any, _record: Any) -> None:
    if isinstance(connection, sqlite3.Connection):
        connection.execute("PRAGMA synchronous=OFF")


def sqlite_without_fsync() -> Callable[[], None]:
    """Turn fsync off for the SQLite connections this process opens from now on; the function
    returned turns it back on."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    event.listen(Engine, "connect", _no_fsync)
    return lambda: event.remove(Engine, "connect", _no_fsync)
