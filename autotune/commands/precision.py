"""`--precision`: which number formats a search may propose.

FP8 changes the numbers a training computes, not only its speed: a search proposes it only
where the user allowed it. A MODEL search's space decides unless `--precision bf16` pins it
off. A `--from-megatron` search keeps the command's own precision (bf16 stays bf16, an FP8
recipe stays that recipe) unless `--precision any` lets the space's FP8 candidates in; where
FP8 is predicted faster for the user's layout, one line says so and how to search it, and the
proposal is left as it is.
"""

from __future__ import annotations

import enum
from dataclasses import replace
from typing import TYPE_CHECKING

from autotune.commands.pins import Pins, describe_pins
from autotune.dimensions import Impl
from autotune.errors import ConfigError, InvalidLayoutError
from autotune.layouts.layout import Layout, validate
from autotune.levers.fp8 import Fp8, recipes_on
from autotune.predict.cost import estimate_cost
from autotune.predict.memory import estimate_memory

if TYPE_CHECKING:
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.model import ModelSpec

__all__ = ["PRECISION_HELP", "Precision", "fp8_hint", "kept_precision", "parse_precision"]

KEPT = ("fp8", "fp8_recipe")
"""The dimensions that are a command's precision: its format and scaling recipe. FP8 parameter
gathering is not among them: the weights a GEMM reads are FP8 either way, only their storage and
all-gather change."""


class Precision(enum.StrEnum):
    """bf16: no FP8 layout; any: the space's FP8 candidates too."""

    BF16 = "bf16"
    ANY = "any"


PRECISION_HELP = ("bf16: no FP8 layout (the same as --fix fp8=off); any: the space's FP8 "
                  "candidates too. Left out, a MODEL search's space decides (the default "
                  "space offers FP8 where Transformer Engine and the GPU run it) and "
                  "--from-megatron keeps your command's precision.")


def parse_precision(value: str | None, pins: Pins) -> Precision | None:
    """--precision as given (None: left out); a value it does not know, or bf16 beside a pin
    of fp8, is one line."""
    if value is None:
        return None
    try:
        precision = Precision(value)
    except ValueError:
        raise ConfigError(f"--precision {value}: give bf16 or any") from None
    if precision == Precision.BF16 and "fp8" in pins:
        raise ConfigError("--precision bf16 pins fp8=off; it cannot go with a pin of fp8 "
                          f"({describe_pins({'fp8': pins['fp8']})})")
    return precision


def kept_precision(layout: Layout, precision: Precision | None) -> Pins:
    """The pins a `--from-megatron` search over the user's `layout` takes: their precision
    unless --precision says otherwise. --precision bf16 on an FP8 command would search without
    the user's own layout: one line."""
    if precision == Precision.ANY:
        return {}
    if precision == Precision.BF16:
        if layout.fp8 != Fp8.OFF:
            raise ConfigError(f"--from-megatron: your command trains in FP8 (fp8={layout.fp8}); "
                              "--precision bf16 would search without your layout")
        return {"fp8": (Fp8.OFF,)}
    return {name: (getattr(layout, name),) for name in KEPT}


def fp8_hint(model: ModelSpec, cluster: ClusterSpec, layout: Layout) -> str | None:
    """One line where the user's bf16 `layout` is predicted faster in FP8 (through Transformer
    Engine, with the fastest recipe this GPU runs that fits); None where it is not, where the
    layout is FP8 already or where no FP8 variant of it is valid here."""
    if layout.fp8 != Fp8.OFF:
        return None
    base = estimate_cost(model, layout, cluster).tokens_per_s
    best: tuple[float, str] | None = None
    for recipe in recipes_on(cluster.gpu):
        variant = replace(layout, impl=Impl.TE, fp8=Fp8.HYBRID, fp8_recipe=recipe)
        try:
            validate(variant, model, cluster)
        except InvalidLayoutError:
            continue
        if not estimate_memory(model, variant, cluster).fits:
            continue
        speed = estimate_cost(model, variant, cluster).tokens_per_s
        if best is None or speed > best[0]:
            best = (speed, f"{variant.fp8}/{recipe}")
    if best is None or not base or best[0] <= base:
        return None
    return (f"FP8 ({best[1]}) is predicted {best[0] / base - 1:.0%} faster here; rerun with "
            f"--precision {Precision.ANY} to search it (it changes the numbers your training "
            "computes)")
