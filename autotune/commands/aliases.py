"""Megatron-LM's own flag names as aliases of autotune's options, derived from the flag table.

A Megatron user types `--tensor-model-parallel-size 2`, `--micro-batch-size 4` or
`--seq-length 4096`; autotune's options are `--tp`, `--mbs` and `--seq-len`. A field's alias is
the flag `megatron_args.FLAG_TABLE` emits for it with the same value spelling, found by emitting
the arguments of a layout (or model) that differs from a base in that field alone: the flag
whose value becomes the field's new value (for two different values, so that a coincidence
cannot pass), or for a boolean the switch that appears. The table is the only place that spells
the flags; nothing here repeats one.

A field whose Megatron-LM value is spelled otherwise gets no alias, since an alias must take
the option's own values: impl (`--transformer-impl transformer_engine` for te) and
recompute_modules (`--recompute-modules core_attn mlp` for core_attn+mlp).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from autotune.dimensions import Recompute
from autotune.errors import AutotuneError
from autotune.layouts.layout import DIMENSIONS, Layout
from autotune.megatron.megatron_args import FLAG_TABLE, known_flags, megatron_lm_args
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model

__all__ = ["MODEL_FIELDS", "field_for_name", "megatron_flag", "megatron_flags", "option_names"]

MODEL_FIELDS = ("seq_length", "global_batch_size")
"""The model fields the command line overrides (--seq-len, --global-batch-size)."""

_PROBE_MODEL = "gpt2"
"""A preset to emit arguments for; any model does, the flags do not depend on it."""
_INT_PROBES = (2, 3)
_BASES = (Layout(), Layout(recompute=Recompute.FULL), Layout(recompute=Recompute.SELECTIVE))
"""Layouts to change one field of: recompute_method and recompute_num_layers are emitted only
with full recompute, recompute_modules only with selective."""

Args = list[tuple[str, str | None]]


def _pairs(args: Sequence[str]) -> Args:
    """(flag, the word after it or None for a switch) for each flag of an argument list."""
    flags = known_flags()
    out: Args = []
    for i, word in enumerate(args):
        flag = flags.get(word)
        if flag is not None:
            value = args[i + 1] if flag.takes_value and i + 1 < len(args) else None
            out.append((word, value))
    return out


def _emitted(model: ModelSpec, layout: Layout) -> Args | None:
    try:
        return _pairs(megatron_lm_args(model, layout))
    except AutotuneError:  # a value Megatron-LM has no spelling for (impl sdpa)
        return None


def _probes(default: Any) -> list[Any]:
    if isinstance(default, bool):
        return [not default]
    if isinstance(default, int):
        return [default + v for v in _INT_PROBES]
    return [m for m in type(default) if m != default]


def _own_row(field: str) -> Callable[[str], int]:
    """Sort key: the flag of the table row named after the field first (--seq-length, not
    --max-position-embeddings, which follows the sequence too)."""
    own = {flag.name for row in FLAG_TABLE if row.name == field for flag in row.flags}
    return lambda flag: 0 if flag in own else 1


def _match(field: str, base: Args, changed: list[tuple[Any, Args]]) -> str | None:
    """The flag that carries every probed value of `field` (or, for a boolean, appears)."""
    found: set[str] | None = None
    for value, args in changed:
        new = set(args) - set(base)
        if isinstance(value, bool):
            flags = {f for f, v in new if v is None} if value else set()
        else:
            flags = {f for f, v in new if v == str(value)}
        found = flags if found is None else found & flags
    return min(found, key=_own_row(field)) if found else None


def _derive_layout_flag(model: ModelSpec, field: str) -> str | None:
    dim = DIMENSIONS[field]
    for base_layout in _BASES:
        base = _emitted(model, base_layout)
        if base is None:
            continue
        default = getattr(base_layout, field)
        changed = [(v, args) for v in _probes(dim.kind(default) if dim.choices else default)
                   if (args := _emitted(model, replace(base_layout, **{field: v}))) is not None]
        # Every value of an enum must come out as its own spelling, or the alias would
        # accept values it spells otherwise.
        if not changed or (dim.choices and len(changed) < len(_probes(default))):
            continue
        flag = _match(field, base, changed)
        if flag is not None:
            return flag
    return None


def _derive_model_flag(model: ModelSpec, field: str) -> str | None:
    base = _emitted(model, Layout(gbs=model.global_batch_size))
    assert base is not None
    changed = []
    for delta in _INT_PROBES:
        value = getattr(model, field) * delta
        other = model.with_overrides(**{field: value})
        args = _emitted(other, Layout(gbs=other.global_batch_size))
        assert args is not None
        changed.append((value, args))
    return _match(field, base, changed)


@functools.cache
def megatron_flags() -> dict[str, str]:
    """Field (a Layout dimension or one of MODEL_FIELDS) -> the Megatron-LM flag that sets it
    with the same values, for each field that has one."""
    model = load_model(_PROBE_MODEL)
    flags: dict[str, str] = {}
    for field in DIMENSIONS:
        if field == "dp":  # follows from the GPUs; Megatron-LM has no flag for it either
            continue
        found = _derive_layout_flag(model, field)
        if found is not None:
            flags[field] = found
    for field in MODEL_FIELDS:
        found = _derive_model_flag(model, field)
        if found is not None:
            flags[field] = found
    return flags


def megatron_flag(field: str) -> str | None:
    return megatron_flags().get(field)


def option_names(field: str, *names: str) -> tuple[str, ...]:
    """An option's names (`--tp`) followed by its Megatron-LM spelling where that is another
    (`--tensor-model-parallel-size`). A name may be click's `--on/--off` pair."""
    flag = megatron_flag(field)
    spelled = {part.strip() for name in names for part in name.split("/")}
    return names if flag is None or flag in spelled else (*names, flag)


def field_for_name(name: str) -> str | None:
    """The Layout dimension a user's name means: the field (`sequence_parallel`), its option
    with or without dashes (`sp`, `--first-stage-layers`) or its Megatron-LM flag
    (`tensor-model-parallel-size`); None for no dimension."""
    bare = name.strip().lstrip("-").replace("_", "-")
    for field, dim in DIMENSIONS.items():
        spellings = {field.replace("_", "-"), dim.option.lstrip("-")}
        flag = megatron_flag(field)
        if flag is not None:
            spellings.add(flag.lstrip("-"))
        if bare in spellings:
            return field
    return None
