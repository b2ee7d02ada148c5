"""A parsed mapping checked against the dataclass it becomes, with pydantic.

`build(cls, data, source)` validates `data` against `cls`'s fields: their types strictly (a
string is not a number, "false" is not a bool, 3.0 is not a count), the ranges their
annotations carry (autotune.inputs.bounds), finiteness (NaN and Infinity are refused), no unknown
field and no missing one; then `cls(**values)` runs the dataclass's own cross-field rules
(`__post_init__`). Defaults stay the dataclass's: a field the mapping leaves out is left to it.
Every problem is one ConfigError line that names the source and the field.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Annotated, Any, TypeVar, Union, cast

from autotune.errors import ConfigError
from autotune.inputs.untrusted import for_terminal, shown

__all__ = ["build", "check"]

T = TypeVar("T")
_PRIMITIVES = (bool, int, float, str)


def _strict(hint: Any) -> Any:
    """`hint` with Strict() on every primitive inside it, and nested dataclasses replaced by
    their schema models (pydantic's strict mode would want instances of them)."""
    from pydantic import Strict

    origin = typing.get_origin(hint)
    if origin is Annotated:
        base, *meta = typing.get_args(hint)
        return Annotated[(_strict(base), *meta)] if base not in _PRIMITIVES \
            else Annotated[(base, Strict(), *meta)]
    if hint in _PRIMITIVES:
        return Annotated[hint, Strict()]
    if origin in (Union, types.UnionType):
        return Union[tuple(_strict(a) for a in typing.get_args(hint))]  # noqa: UP007
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple[_strict(args[0]), ...]  # type: ignore[misc]
        return tuple[tuple(_strict(a) for a in args)]  # type: ignore[misc]
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _model(hint)
    return hint  # an enum (its values are accepted, lax), None, Any


@functools.cache
def _model(cls: Any) -> Any:
    """The pydantic model of dataclass `cls` (built once per class, on first use)."""
    from pydantic import ConfigDict, create_model

    hints = typing.get_type_hints(cls, include_extras=True)
    spec: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = ...
        spec[f.name] = (_strict(hints[f.name]), default)
    config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)
    return create_model(f"{cls.__name__}Schema", __config__=config, **spec)


def _plain(value: Any, hint: Any) -> Any:
    """A validated value back as the dataclass field's type (nested dataclasses rebuilt)."""
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        target = next(t for t in _dataclasses_in(hint) if _model(t) is type(value))
        return _instance(target, value)
    if isinstance(value, tuple):
        inner = typing.get_args(_unwrap(hint))
        return tuple(_plain(v, inner[0] if inner else Any) for v in value)
    return value


def _unwrap(hint: Any) -> Any:
    """`hint` without Annotated and None: tuple[X, ...] | None -> tuple[X, ...]."""
    if typing.get_origin(hint) is Annotated:
        return _unwrap(typing.get_args(hint)[0])
    if typing.get_origin(hint) in (Union, types.UnionType):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        return _unwrap(rest[0]) if len(rest) == 1 else hint
    return hint


def _dataclasses_in(hint: Any) -> list[type]:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return [hint]
    return [t for a in typing.get_args(hint) for t in _dataclasses_in(a)]


def _instance(cls: type[T], model: Any) -> T:
    hints = typing.get_type_hints(cls, include_extras=True)
    values = {name: _plain(getattr(model, name), hints[name])
              for name in model.model_fields_set}
    return cls(**values)


_RULES: dict[str, str] = {
    "int_type": "an integer", "bool_type": "true or false", "float_type": "a number",
    "string_type": "a string", "finite_number": "a finite number",
    "greater_than": "greater than {gt}", "greater_than_equal": "at least {ge}",
    "less_than": "less than {lt}", "less_than_equal": "at most {le}",
    "string_too_short": "at least {min_length} characters",
    "string_too_long": "at most {max_length} characters",
    "tuple_type": "a list", "dict_type": "a mapping", "model_type": "a mapping",
    "enum": "one of {expected}", "none_required": "null",
}
"""pydantic's error types as what the value must be, in the words of autotune's messages."""


def _must(error: dict[str, Any], field: Any) -> str:
    """What the value must be; `field` is the type of the field it was given for (a float
    field given 0 wants a positive number, not an integer)."""
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "greater_than" and ctx.get("gt") == 0 and isinstance(error.get("input"), int):
        return "a positive number" if _unwrap(field) is float else "a positive integer"
    rule = _RULES.get(kind)
    if rule is None:  # a rule without words of ours: pydantic's own, lower-cased
        msg = str(error["msg"])
        return msg[:1].lower() + msg[1:]
    return rule.format(**ctx) if ctx else rule


def _message(exc: Any, cls: Any, source: str, what: str, prefix: str) -> str:
    errors = exc.errors(include_url=False)
    extra = [prefix + ".".join(map(str, e["loc"])) for e in errors
             if e["type"] == "extra_forbidden"]
    if extra:
        return f"{source}: unknown {what} field(s) {for_terminal(', '.join(extra))[:200]}"
    missing = [prefix + ".".join(map(str, e["loc"])) for e in errors if e["type"] == "missing"]
    if missing:
        return f"{source}: missing {what} field(s) {', '.join(missing)}"
    first = errors[0]
    # A union (`int | None`) reports one error per member: the first names the real type.
    where = ".".join(str(part) for part in first["loc"] if not _is_member_tag(part))
    # The field's type, for a top-level field (a nested one's error keeps the input's words).
    field = typing.get_type_hints(cls, include_extras=True).get(where)
    return (f"{source}: {prefix}{where} must be {_must(first, field)}, got "
            f"{shown(first.get('input'))}")


def _is_member_tag(part: object) -> bool:
    """pydantic's location tags of union members and constrained types (`constrained-int`,
    `none`), which are not part of the field's name."""
    return isinstance(part, str) and (part in ("none", "int", "float", "str", "bool")
                                      or part.startswith(("constrained-", "function-")))


def check(cls: type[T], data: object, source: str, *, what: str,
          prefix: str = "") -> dict[str, Any]:
    """The fields `data` gives, checked against dataclass `cls` (see the module), as the
    dataclass's values; `what` names the kind in messages (`model`, `calibration`), `prefix`
    goes before a field's name (`cost.`: where the mapping sits in its file)."""
    from pydantic import ValidationError

    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of {what} fields, got "
                          f"{type(data).__name__}")
    try:
        model = _model(cast(Any, cls)).model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_message(exc, cls, source, what, prefix)) from None
    hints = typing.get_type_hints(cls, include_extras=True)
    return {name: _plain(getattr(model, name), hints[name]) for name in model.model_fields_set}


def build(cls: type[T], data: object, source: str, *, what: str, prefix: str = "") -> T:
    """`cls(**check(...))`: the dataclass of a checked mapping, its own rules run too."""
    return cls(**check(cls, data, source, what=what, prefix=prefix))
