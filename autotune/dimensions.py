"""What a layout's dimensions are: their value types and the metadata each carries once.

Every field of `autotune.layout.Layout` is declared with `dimension(...)`, which keeps its
default, help text, enumeration level, label in `Layout.describe()` and command-line flag in
the dataclass field's metadata. `autotune.layout.DIMENSIONS` collects them; the search space,
`estimate`'s options, the JSON export, the best-trial rows and tools/ are derived from it instead
of keeping lists of their own. Adding a dimension is one field here plus the domain knowledge
(rule, Megatron-LM flag, worker config, memory, cost), and tests/test_dimension_contract.py fails
until every consumer reads it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LEVELS", "Dimension", "Impl", "Label", "Recompute", "RecomputeMethod", "always",
           "dimension", "flag_label", "plain", "unless_default", "value_label"]

LEVELS = 6
"""Enumeration levels: 0 tp, pp, cp (dp follows); 1 vpp; 2 ep; 3 sequence parallel; 4 mbs;
5 recompute, optimizer, overlap and implementation. A validity rule of level k reads only the
fields of levels <= k (autotune.layout.RULES), so the enumerator rejects a partial layout
before it expands the deeper levels."""


class Recompute(enum.StrEnum):
    """Activation recomputation granularity (Megatron-LM `--recompute-granularity`)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class RecomputeMethod(enum.StrEnum):
    """How full recompute picks its layers (`--recompute-method`)."""

    UNIFORM = "uniform"
    BLOCK = "block"


class Impl(enum.StrEnum):
    """Transformer implementation: megatron-core's local spec, Transformer Engine's spec, or
    autotune's local spec with PyTorch scaled_dot_product_attention as core attention."""

    LOCAL = "local"
    TE = "te"
    SDPA = "sdpa"


def plain(value: Any) -> Any:
    """An enum member as its plain value, anything else unchanged: what JSON and Optuna's
    storage hold (a plain str copies and compares far faster than a member, which counts when a
    plan tells tens of thousands of trials)."""
    return value.value if isinstance(value, enum.Enum) else value


Label = Callable[[Any, Any], str | None]
"""(layout, value) -> this dimension's part of `Layout.describe()`, or None for no part."""


def always(prefix: str) -> Label:
    """`tp2`: the value after a short prefix, in every label."""
    return lambda s, value: f"{prefix}{value}"


def unless_default(prefix: str, default: Any) -> Label:
    """`vpp2`: like `always`, left out at the default."""
    return lambda s, value: None if value == default else f"{prefix}{value}"


def flag_label(short: str) -> Label:
    """`sp`: a short word when the option is on."""
    return lambda s, value: short if value else None


def value_label() -> Label:
    """`sdpa`: the value itself."""
    return lambda s, value: str(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Dimension:
    """One Layout field's metadata."""

    name: str = ""
    """The Layout field (filled in by autotune.layout from the dataclass)."""
    default: Any
    help: str
    level: int | None
    """Enumeration level (LEVELS); None for a field the space does not search (dp follows
    from the GPUs, gbs from the model)."""
    label: Label | None
    """Its part of describe(); None where another dimension's label shows it (`folded_into`)."""
    folded_into: str | None = None
    flag: str | None = None
    """`autotune estimate`'s option; None for a field it does not take (dp is derived)."""

    @property
    def kind(self) -> type:
        """int, bool, or the StrEnum of the allowed values."""
        return type(self.default)

    @property
    def choices(self) -> tuple[str, ...] | None:
        kind = self.kind
        return tuple(m.value for m in kind) if issubclass(kind, enum.Enum) else None

    @property
    def option(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def coerce(self, value: Any) -> Any:
        """A value of an enum dimension as its member (plain strings come from YAML, JSON
        and Optuna's storage); anything else unchanged. An unknown string stays as it is, so
        that the validity rules name it (autotune.layout, rules recompute_kind and
        impl_known)."""
        kind = self.kind
        if issubclass(kind, enum.Enum) and not isinstance(value, kind):
            try:
                return kind(value)
            except ValueError:
                return value
        return value

    def check(self, value: Any) -> str | None:
        """Why `value` cannot be a value of this dimension, as what it must be (`positive
        integers`, `among none, selective, full`), or None."""
        kind = self.kind
        if kind is bool:
            return None if isinstance(value, bool) else "true or false"
        if kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
            return None if ok else "positive integers"
        assert self.choices is not None
        if not isinstance(value, str):
            return "strings"
        return None if value in self.choices else f"among {', '.join(self.choices)}"

    def parse(self, text: str) -> Any:
        """A value from command-line text (`true`/`1`, `4`, `full`); ValueError if it is none."""
        kind = self.kind
        if kind is bool:
            lowered = text.strip().lower()
            if lowered not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(f"{self.name}={text!r} must be true or false")
            return lowered in ("1", "true", "yes")
        if kind is int:
            try:
                value = int(text)
            except ValueError:
                raise ValueError(f"{self.name}={text!r} must be an integer") from None
            return value
        problem = self.check(text)
        if problem is not None:
            raise ValueError(f"{self.name}={text!r} must be {problem}")
        return kind(text)


def dimension(default: Any, *, help: str, level: int | None, label: Label | None,
              folded_into: str | None = None, flag: str | None = None) -> Any:
    """A Layout field whose metadata is its Dimension (typed Any, as dataclasses.field is)."""
    meta = Dimension(default=default, help=help, level=level, label=label,
                     folded_into=folded_into, flag=flag)
    return field(default=default, metadata={"dimension": meta})
