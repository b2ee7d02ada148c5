"""Pinned dimensions of a search: `--tp 2`, `--pp 1,2`, `--sp`, `--fix recompute=none,full`.

A pin replaces the space's candidates of one dimension with the values given, so the search
only tries layouts with them. The study name hashes the candidates
(autotune.search.storage.default_study_name), so a pinned search is a study of its own and
never resumes or mixes with the unpinned one. A pin no valid layout can take is refused in one
line by the caller, with the rule that binds (autotune.cli).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from autotune.commands.aliases import field_for_name
from autotune.errors import ConfigError
from autotune.layouts.layout import DIMENSIONS, SEARCHED
from autotune.search.space import SearchSpace

__all__ = ["FIX_OPTION", "Pins", "describe_pins", "parse_pins", "pin_space"]

FIX_OPTION = "--fix"

Pins = dict[str, tuple[Any, ...]]
"""Dimension -> the only values the search may take for it, in the order given."""


def _values(field: str, text: str, where: str) -> tuple[Any, ...]:
    dim = DIMENSIONS[field]
    words = [w.strip() for w in text.split(",")]
    if not text.strip() or any(not w for w in words):
        raise ConfigError(f"{where}: give one value or a comma-separated list "
                          f"(e.g. {dim.option} {dim.default if dim.choices else '1,2'})")
    values = []
    for word in words:
        try:
            value = dim.parse(word)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        problem = dim.check(value.value if dim.choices else value)
        if problem is not None:
            raise ConfigError(f"{where}: {field} values must be {problem}, got {word!r}")
        values.append(dim.coerce(value))
    return tuple(dict.fromkeys(values))  # a value given twice is one candidate


def _searched(field: str, where: str) -> str:
    if field in SEARCHED:
        return field
    if field == "dp":
        raise ConfigError(f"{where}: dp is not searched, it follows from the GPUs "
                          "(--gpus / (tp x pp x cp)); pin tp, pp and cp instead")
    raise ConfigError(f"{where}: {field} is the model's; set it with --global-batch-size")


def parse_pins(options: Mapping[str, Any], fixes: Iterable[str]) -> Pins:
    """Pins from the dimension options (field -> a comma list, a bool for a switch, or None
    when not given) and the `--fix DIM=VALUES` texts; a dimension pinned twice, an unknown
    one or a value it cannot take is one line."""
    pins: Pins = {}
    for field, given in options.items():
        if given is None:
            continue
        where = DIMENSIONS[field].option
        pins[_searched(field, where)] = ((given,) if isinstance(given, bool)
                                         else _values(field, str(given), f"{where} {given}"))
    for text in fixes:
        where = f"{FIX_OPTION} {text}"
        name, sep, values = text.partition("=")
        if not sep:
            raise ConfigError(f"{where}: expected DIM=VALUES, e.g. {FIX_OPTION} tp=2 or "
                              f"{FIX_OPTION} recompute=none,full")
        named = field_for_name(name)
        if named is None:
            raise ConfigError(f"{where}: unknown dimension {name.strip()!r}; known: "
                              f"{', '.join(SEARCHED)}")
        field = _searched(named, where)
        if field in pins:
            raise ConfigError(f"{where}: {field} is pinned twice")
        pins[field] = _values(field, values, where)
    return pins


def pin_space(space: SearchSpace, pins: Pins) -> SearchSpace:
    """The space with each pinned dimension's candidates replaced by its pin."""
    if not pins:
        return space
    return replace(space, candidates={**space.candidates, **pins},
                   source=f"{space.source} + {describe_pins(pins)}",
                   chosen=space.chosen | frozenset(pins))


def describe_pins(pins: Pins) -> str:
    """`tp=2 pp=1,2`: the pins as `--fix` takes them."""
    def word(value: Any) -> str:
        return str(value).lower() if isinstance(value, bool) else str(value)
    return " ".join(f"{field}={','.join(map(word, values))}" for field, values in pins.items())
