"""The lever registry: one module per lever, each declaring all of its Megatron knowledge.

`LEVERS` lists them in the order the models apply their terms (autotune.levers.base explains
what a lever declares): the pipeline split, recompute and activation offload, the optimizer,
overlap, fusion and precision levers, and the transformer implementation. `LeverFields` joins
their Layout fields and `LeverConstants` their cost constants: autotune.layouts.layout.Layout and
autotune.predict.cost.CostParams inherit them, so the fields are typed like the rest. A dataclass
orders inherited fields by the reversed method resolution order, so both list their bases last
lever first (autotune.layouts.layout places the pipeline split's fields among the core ones).

The consumers read the registry instead of keeping lists of their own: autotune.layouts.layout
(fields and rules), autotune.megatron.megatron_args (flag rows, at each lever's `flag_place`),
autotune.megatron.core_config (core-config keys), autotune.predict.memory and autotune.predict.cost
(the terms, in this order), autotune.search.heuristics (the seeds) and autotune.search.derive
(derivable counts).

Adding a lever: its module, one line in each of the three lists below, its candidates in
search_spaces/ and its tests (tests/test_dimension_contract.py checks it against the contract).
autotune.search.derive (values resolved from the memory model) sits in search/; it
imports the models, so nothing here imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.levers import (
    activation_offload,
    allocator,
    cross_entropy,
    distributed_optimizer,
    fp8,
    grad_reduce,
    nan_checks,
    optimizer_offload,
    overlap,
    pipeline_split,
    precision_optimizer,
    recompute,
    transformer_impl,
)
from autotune.levers.base import Lever, Requires, Rule

__all__ = ["LEVERS", "LeverConstants", "LeverFields", "calibrated", "requirements", "rules",
           "unpriced"]

LEVERS: tuple[Lever, ...] = (
    pipeline_split.LEVER,
    recompute.LEVER,
    activation_offload.LEVER,
    distributed_optimizer.LEVER,
    overlap.LEVER,
    cross_entropy.LEVER,
    precision_optimizer.LEVER,
    grad_reduce.LEVER,
    nan_checks.LEVER,
    optimizer_offload.LEVER,
    fp8.LEVER,
    transformer_impl.LEVER,
    allocator.LEVER,
)
"""In the order the models apply their terms, and the validity rules of one level run (the
pipeline split's before the core's vpp rules, autotune.layouts.layout.RULES)."""


@dataclass(frozen=True, kw_only=True)
class LeverFields(allocator.Fields, transformer_impl.Fields, fp8.Fields, optimizer_offload.Fields,
                  nan_checks.Fields, grad_reduce.Fields, precision_optimizer.Fields,
                  cross_entropy.Fields,
                  overlap.Fields, distributed_optimizer.Fields, activation_offload.Fields,
                  recompute.Fields, pipeline_split.Fields):
    """Every lever's Layout fields, in LEVERS order."""

    __slots__ = ()


@dataclass(frozen=True, kw_only=True)
class LeverConstants(transformer_impl.Constants, fp8.Constants, optimizer_offload.Constants):
    """Every lever's cost constants (autotune.predict.cost.CostParams inherits them)."""

    __slots__ = ()


def rules() -> tuple[Rule, ...]:
    """The levers' validity rules, in LEVERS order."""
    return tuple(rule for lever in LEVERS for rule in lever.all_rules())


def requirements() -> tuple[Requires, ...]:
    return tuple(r for lever in LEVERS for r in lever.requires)


def calibrated() -> tuple[str, ...]:
    """The levers' constants that every calibration fits (Lever.calibrated), in LEVERS order."""
    return tuple(name for lever in LEVERS for name in lever.calibrated)


def unpriced() -> tuple[str, ...]:
    """The Layout fields of the levers whose time the cost model leaves out (Lever.unpriced_time:
    the NaN checks), in LEVERS order: the model predicts layouts that differ only there alike,
    so only a measurement ranks them."""
    return tuple(name for lever in LEVERS if lever.unpriced_time for name in lever.field_names)
