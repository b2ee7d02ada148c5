"""The exception hierarchy: the CLI turns each into one line on stderr and an exit code."""

from __future__ import annotations

import enum
from typing import TypeVar

__all__ = ["INTERRUPTED_EXIT", "AutotuneError", "ConfigError", "Interrupted",
           "InvalidLayoutError", "LaunchError", "MissingFlagError", "StorageError",
           "parse_choice"]

E = TypeVar("E", bound=enum.StrEnum)


class AutotuneError(Exception):
    """Base class of every error autotune raises on purpose."""

    exit_code: int = 1


class ConfigError(AutotuneError):
    """Bad user input: an unknown preset, a malformed YAML file, an impossible flag value."""

    exit_code = 2


class MissingFlagError(ConfigError):
    """A command that lacks a flag autotune must read (`the command has no --num-layers`).
    A type of its own so that a caller can add what only it knows, such as that the script's
    own arguments ("$@") may give the flag, without matching the message's words."""

    def __init__(self, message: str, flag: str) -> None:
        super().__init__(message)
        self.flag = flag

    def __reduce__(self) -> tuple[type[MissingFlagError], tuple[str, str]]:
        # Exception's own reduce calls the class with self.args (the message alone), which
        # this __init__ refuses: a copy or a pickle would fail instead of carrying the flag.
        return type(self), (str(self), self.flag)


class InvalidLayoutError(AutotuneError):
    """A parallel layout that Megatron would reject; the message names the rule and the numbers."""

    exit_code = 2


INTERRUPTED_EXIT = 130
"""The exit status of a command ended by Ctrl-C: 128 + SIGINT, as shells report it."""


class Interrupted(AutotuneError):
    """Ctrl-C ended the command; the message says what was kept (the CLI prints
    `autotune: interrupted: ...` and exits 130, as a shell does after SIGINT)."""

    exit_code = INTERRUPTED_EXIT


class LaunchError(AutotuneError):
    """A trial could not be started (missing torchrun, no GPU, a worker that cannot import)."""

    exit_code = 1


class StorageError(AutotuneError):
    """The study's storage failed to write (a full disk, a lost database server); what was
    told before is kept, and --resume continues."""

    exit_code = 1


def parse_choice(kind: type[E], value: str, what: str) -> E:
    """`value` as a member of `kind`, or ConfigError: `unknown sampler 'x'; choose auto, tpe,
    grid or ranked`."""
    try:
        return kind(value)
    except ValueError:
        names = [m.value for m in kind]
        raise ConfigError(f"unknown {what} {value!r}; choose {', '.join(names[:-1])} or "
                          f"{names[-1]}") from None
