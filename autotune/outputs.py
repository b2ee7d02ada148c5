"""Files autotune writes for the user (report.md, trials.csv, plots, exported scripts,
calibration.json): whole or not at all.

Each is written to a temporary file beside its destination and renamed over it once complete
(a rename within one folder is atomic), so a full disk, a Ctrl-C or a crash leaves the old file
or none, never an empty or truncated one. An OSError (ENOSPC: "No space left on device") names
the destination, and the CLI prints it as one line.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["replacing", "write_text"]


@contextlib.contextmanager
def replacing(path: Path, *, executable: bool = False) -> Iterator[Path]:
    """A temporary path beside `path` for the block to write; renamed over `path` when the
    block ends (with the permissions of the file it replaces, else the umask's; executable
    too where asked), removed when it fails."""
    path = Path(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        try:
            mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            umask = os.umask(0)  # read it: os has no getter; set back at once
            os.umask(umask)
            mode = 0o666 & ~umask
        tmp.chmod(mode | 0o111 if executable else mode)
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        # The destination, not the temporary name, is what the user knows.
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str, *, executable: bool = False) -> None:
    """`text` into `path`, atomically (see `replacing`)."""
    with replacing(path, executable=executable) as tmp, tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())  # the rename must not reach the disk before the bytes
