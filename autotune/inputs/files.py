"""A file the user named, read as UTF-8 text: regular files only, and at most a size limit; or
one to write, checked before anything is computed or written (output_file)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from autotune.errors import ConfigError

__all__ = ["MAX_INPUT_BYTES", "MAX_YAML_BYTES", "output_file", "read_bytes", "read_text",
           "usable_name"]

MAX_INPUT_BYTES = 2**20
"""The largest input file read (1 MiB): the largest real inputs, a Hugging Face config.json or a
Megatron-LM script, are kilobytes; a bigger file is a mistake (or /dev/zero by another name)."""
MAX_YAML_BYTES = 256 * 2**10
"""The largest YAML file read (256 KiB): PyYAML's pure-Python loader (the one that can refuse
aliases, autotune.inputs.documents) reads about 100 KiB a second; presets are under 2 KiB."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return f"{name}, not a regular file"
    return "not a regular file"


def read_text(path: Path | str, what: str, *, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of a file the user named (`what`: "model file", ...), or ConfigError in
    one line (read_bytes)."""
    return read_bytes(path, what, max_bytes=max_bytes).decode("utf-8")


def read_bytes(path: Path | str, what: str, *, max_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a file the user named, checked to be UTF-8 text, or ConfigError in one
    line: missing, a folder, not a regular file (a FIFO, /dev/zero: refused without reading, so
    nothing blocks or fills memory), larger than `max_bytes`, unreadable, or not UTF-8 text.
    The one reader of every input file (a Megatron-LM script too:
    autotune.megatron.launch_site)."""
    try:
        # O_NONBLOCK: opening a FIFO with no writer would block; fstat then refuses it unread.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a folder, not a file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ConfigError(f"{what} {path} is a folder, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{what} {path} is {_kind(info.st_mode)}; give a regular file")
        if info.st_size > max_bytes:
            raise ConfigError(f"{what} {path} is larger than {_size(max_bytes)} "
                              f"({info.st_size:,} bytes)")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)  # a file that grew since fstat is still bounded
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ConfigError(f"{what} {path} is larger than {_size(max_bytes)}")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at "
                          f"offset {exc.start})") from None
    return data


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n % 2**20 == 0 else f"{n // 2**10} KiB"


def usable_name(text: str, option: str, what: str = "path") -> None:
    """A path the user typed, refused in one line when it is empty (an unset variable) or
    holds a control character (no path anyone meant; it would break the line it is shown on)."""
    if not text or not text.isprintable():
        raise ConfigError(f"{option} {text!r} is not a usable {what} (empty or with a control "
                          "character)")


def output_file(output: str, option: str = "-o") -> Path:
    """A file the user named for autotune to write (`option`: how they named it), checked
    before any work is done: a printable name, not a folder, in a folder that exists and can
    be written. Whether it may be replaced is the caller's (a study's own files may not)."""
    usable_name(output, option, "file name")
    path = Path(output)
    if path.is_dir():
        raise ConfigError(f"{option} {output} is a folder; give the file to write")
    parent = path.parent
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise ConfigError(f"{option} {output}: {parent} {what}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {output}: the folder {parent} is not writable")
    return path
