"""The types a Megatron-LM flag row is made of: one row per group of flags, read both ways.

A row (`FlagRow`) says how a `ModelSpec` and a `Layout` emit its flags and how their values
read back into model and layout fields. autotune.megatron.megatron_args assembles `FLAG_TABLE` from
its own rows and the levers' (autotune.levers: each lever module declares its rows beside its
fields); this module sits below both, so that a lever can declare rows without importing the
table. Pure: no I/O, no torch.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.errors import ConfigError, MissingFlagError
from autotune.inputs.numbers import integer_text, number_text

if TYPE_CHECKING:
    from autotune.layouts.layout import Layout
    from autotune.specs.model import ModelSpec

__all__ = ["Emit", "Flag", "FlagRow", "Given", "Part", "Place", "Read", "RunOptions", "switch",
           "value"]


class Part(enum.StrEnum):
    """What a row's flags describe: the model's shape, the parallel layout (what a search
    changes), or the run itself (precision, learning rate, logging, data), which a user's own
    command keeps as it is."""

    MODEL = "model"
    LAYOUT = "layout"
    RUN = "run"


class Place(enum.StrEnum):
    """Where a lever's rows sit in the flag table, beside the core rows of their subject: an
    exported command reads in that order (and keeps the order it had before the lever moved
    into autotune.levers)."""

    PIPELINE = "pipeline"
    """After the pipeline sizes: how the layers split over the stages."""
    MEMORY = "memory"
    """After the batch: what the layers keep of their activations (recompute, offload)."""
    OPTIONS = "options"
    """After the precision: the optimizer, overlap, fusion and FP8 levers."""
    IMPLEMENTATION = "implementation"
    """Last of the layout: the transformer implementation and its spec's flags."""


@dataclass(frozen=True, slots=True)
class Flag:
    """One Megatron-LM flag: its spelling and whether a value follows it."""

    name: str
    takes_value: bool = True
    many: bool = False
    """nargs '+': every word up to the next flag is one of its values (read as one value,
    joined by spaces)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """The run around the layout: what megatron_lm_args takes besides the model and layout."""

    train_iters: int | None = None
    mock_data: bool = True
    lr: float = 1.0e-4
    seed: int = 1234
    log_interval: int = 1
    distributed_timeout_minutes: int | None = None


class Given:
    """The flag values of one command, as Megatron-LM's argparse would see them (the last
    occurrence of a flag wins; a switch's value is None), with one-line errors naming `source`."""

    def __init__(self, values: Mapping[str, str | None], source: str) -> None:
        self.values = dict(values)
        self.source = source

    def has(self, name: str) -> bool:
        return name in self.values

    def text(self, name: str, default: str | None = None) -> str | None:
        value = self.values.get(name)
        return default if value is None else value

    def integer(self, name: str, default: int | None = None) -> int | None:
        value = self.values.get(name)
        return default if value is None else integer_text(value, f"{self.source}: {name}")

    def number(self, name: str, default: float) -> float:
        value = self.values.get(name)
        return default if value is None else number_text(value, f"{self.source}: {name}")

    def choice(self, name: str, choices: Sequence[str], default: str) -> str:
        value = self.text(name, default)
        assert value is not None
        if value not in choices:
            raise ConfigError(f"{self.source}: {name} {value} is not one autotune models "
                              f"({', '.join(choices)})")
        return value

    def required(self, name: str) -> int:
        value = self.integer(name)
        if value is None:
            raise MissingFlagError(f"{self.source}: the command has no {name}, which "
                                   "autotune needs for the model's shape", name)
        return value


Emit = Callable[["ModelSpec", "Layout", RunOptions], list[str]]
Read = Callable[[Given], dict[str, Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class FlagRow:
    """Flags that belong together: how a model and layout emit them, how their values read
    back into ModelSpec / Layout fields (None: they set none, and a user's values stay)."""

    name: str
    part: Part
    flags: tuple[Flag, ...]
    emit: Emit
    read: Read | None = None
    reads: tuple[str, ...] = ()
    """Fields `read` returns only when some of its flags are given (recompute_method, with full
    recompute): what a lever's contract counts as read back besides what `read` returns for a
    command without them (autotune.levers.base.contract_problems)."""


def value(name: str, field: str, part: Part, *, default: int | None = None,
           omit_at: int | None = None) -> FlagRow:
    """An integer field with a flag of its own; `omit_at`: not emitted at that value (the
    default Megatron-LM takes without it); `default`: read when the flag is absent."""
    owner = "model" if part == Part.MODEL else "layout"

    def emit(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
        value = getattr(m if owner == "model" else s, field)
        return [] if value == omit_at else [name, str(value)]

    def read(g: Given) -> dict[str, Any]:
        return {field: g.required(name) if default is None else g.integer(name, default)}

    return FlagRow(name=field, part=part, flags=(Flag(name),), emit=emit, read=read)


def switch(name: str, field: str, part: Part, *, on_means: bool = True) -> FlagRow:
    """A boolean field set by a store_true flag (`on_means` False: the flag turns it off)."""
    owner = "model" if part == Part.MODEL else "layout"

    def emit(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
        value = getattr(m if owner == "model" else s, field)
        return [name] if value == on_means else []

    def read(g: Given) -> dict[str, Any]:
        return {field: on_means if g.has(name) else not on_means}

    return FlagRow(name=field, part=part, flags=(Flag(name, takes_value=False),), emit=emit,
                   read=read)
