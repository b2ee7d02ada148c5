"""The exception hierarchy: the CLI turns each into one line on stderr and an exit code."""

from __future__ import annotations

__all__ = ["AutotuneError", "ConfigError", "InvalidLayoutError", "LaunchError"]


class AutotuneError(Exception):
    """Base class of every error autotune raises on purpose."""

    exit_code: int = 1


class ConfigError(AutotuneError):
    """Bad user input: an unknown preset, a malformed YAML file, an impossible flag value."""

    exit_code = 2


class InvalidLayoutError(AutotuneError):
    """A parallel layout that Megatron would reject; the message names the rule and the numbers."""

    exit_code = 2


class LaunchError(AutotuneError):
    """A trial could not be started (missing torchrun, no GPU, a worker that cannot import)."""

    exit_code = 1
