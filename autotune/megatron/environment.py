"""The run's environment that levers set (autotune.levers.base.Lever.environment): what the
exported scripts export, the worker applies, and `--from-megatron` reads from a user's script.

A setting such as the caching allocator's expandable segments changes what fits as a flag does,
but Megatron-LM never sees it: the process reads it from its environment. So it is part of a
layout's run (autotune.megatron.identity) and of every script that launches one.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.levers import LEVERS

if TYPE_CHECKING:
    from autotune.layouts.layout import Layout

__all__ = ["environment_fields", "export_lines", "run_environment"]


def run_environment(layout: Layout) -> dict[str, str]:
    """The variables the run of `layout` needs, by name (empty: none beyond the defaults)."""
    env: dict[str, str] = {}
    for lever in LEVERS:
        if lever.environment is not None:
            env.update(lever.environment(layout))
    return env


def environment_fields(env: Mapping[str, str]) -> dict[str, Any]:
    """The layout fields a script's environment gives (every such lever's field, at its
    default where the script does not set its variable)."""
    out: dict[str, Any] = {}
    for lever in LEVERS:
        if lever.read_environment is not None:
            out.update(lever.read_environment(env))
    return out


def export_lines(layout: Layout) -> list[str]:
    """`export NAME=value` lines for a script that launches `layout`."""
    return [f"export {name}={shlex.quote(value)}"
            for name, value in run_environment(layout).items()]
