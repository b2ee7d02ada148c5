"""Text parsed as YAML or JSON with bounded work: what a hostile file can cost is capped.

YAML aliases are refused (an "anchor bomb" of nested aliases expands to billions of nodes while
the file stays a few hundred bytes; no input of autotune needs one), nesting is capped at
MAX_DEPTH (Python's recursive parsers would otherwise end in RecursionError), a key given twice
is refused (the parsers keep the last silently), and JSON's NaN / Infinity literals and numbers
that overflow a float are refused where they are read.

Numbers are read alike in YAML and JSON (`whole_if_exponent`): `1e3` is a number in both (PyYAML's
YAML 1.1 resolver wants a dot, `1.0e+3`, and read `1e3` as the string '1e3'), and a number written
with an exponent that is a whole number (`1e3`, `1.5e3`, `4.096e3`) is that integer, so `gbs: 1e3`
is the count 1000. Without an exponent a decimal point still means a real: `8.0` is not a count.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

import yaml

from autotune.errors import ConfigError

__all__ = ["EXACT_MAX", "MAX_DEPTH", "parse_json", "parse_yaml", "whole_if_exponent"]

MAX_DEPTH = 32
"""The deepest nesting of lists and mappings read; autotune's inputs nest three levels."""
EXACT_MAX = 2**53
"""The largest whole number a float holds exactly: `1e3` past it stays a real (and a count's
bound, autotune.inputs.bounds.COUNT_MAX = 2**40, refuses it by name)."""

_EXPONENT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
"""A real with an exponent, with or without a dot (YAML 1.2's float; YAML 1.1 wants the dot)."""


def whole_if_exponent(text: str, value: float) -> int | float:
    """`value`, read from `text`, as an int when `text` has an exponent and the value is a whole
    number a float holds exactly (`1e3` -> 1000, `1.5e3` -> 1500); else the float itself."""
    if ("e" in text or "E" in text) and value.is_integer() and abs(value) <= EXACT_MAX:
        return int(value)
    return value


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's pure-Python safe loader with no aliases, bounded depth and unique keys (the
    C loader composes in C, where none of this can be checked), reading numbers as JSON does
    (the module's docstring)."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise _Refused(f"YAML alias *{event.anchor} (line {event.start_mark.line + 1}): "
                           "aliases are not accepted")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels (line {mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str | int | float | bool):
                continue  # an unhashable key: the mapping's own construction refuses it
            if key in seen:
                raise _Refused(f"key {key!r} is given twice (line "
                               f"{key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml_float(loader: _BoundedLoader, node: Any) -> int | float:
    value = yaml.SafeLoader.construct_yaml_float(loader, node)
    text = str(node.value).replace("_", "")
    if not math.isfinite(value) and _EXPONENT.match(text):  # not .inf / .nan, written as such
        raise _Refused(f"{text} overflows a float (line {node.start_mark.line + 1})")
    return whole_if_exponent(text, value) if math.isfinite(value) else value


_BoundedLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT,
                                     list("-+0123456789."))
_BoundedLoader.add_constructor("tag:yaml.org,2002:float", _yaml_float)


class _Refused(Exception):
    """A bound broken while parsing; parse_yaml / parse_json name the source."""


def parse_yaml(text: str, source: str) -> Any:
    """The YAML document in `text` (from `source`, for messages), or ConfigError in one line."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader subclass
    except _Refused as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{source}: malformed YAML{where}") from None
    except RecursionError:  # a bound above should have stopped it first
        raise ConfigError(f"{source}: nested too deeply") from None


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not a number autotune reads")


def _float(text: str) -> int | float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"{text} overflows a float")
    return whole_if_exponent(text, value)


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise _Refused(f"key {key!r} is given twice")
        data[key] = value
    return data


def _children(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        yield from value.values()
    elif isinstance(value, list):
        yield from value


def _depth_ok(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:  # iterative: the check itself must not recurse
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > MAX_DEPTH:
                return False
            stack.extend((child, depth + 1) for child in _children(node))
    return True


def parse_json(text: str, source: str) -> Any:
    """The JSON document in `text` (from `source`, for messages), or ConfigError in one line."""
    try:
        data = json.loads(text, parse_constant=_constant, parse_float=_float,
                          object_pairs_hook=_pairs)
    except _Refused as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: malformed JSON ({exc.msg}, line {exc.lineno})") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4300)
        raise ConfigError(f"{source}: {' '.join(str(exc).split())}") from None
    if not _depth_ok(data):
        raise ConfigError(f"{source}: nested deeper than {MAX_DEPTH} levels")
    return data
