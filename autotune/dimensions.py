"""What a layout's dimensions are: their value types and the metadata each carries once.

Every field of `autotune.layouts.layout.Layout` is declared with `dimension(...)`, which keeps its
default, help text, enumeration level, label in `Layout.describe()` and command-line flag in
the dataclass field's metadata. `autotune.layouts.layout.DIMENSIONS` collects them; the search
space, `estimate`'s options, the JSON export, the best-trial rows and tools/ are derived from it
instead of keeping lists of their own. Adding a dimension is one field here plus the domain
knowledge (rule, Megatron-LM flag, worker config, memory, cost), and
tests/test_dimension_contract.py fails until every consumer reads it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LEVELS", "MEGATRON_RECOMPUTE_MODULES", "MOE_SIDE_MODULES", "RECOMPUTE_MODULES",
           "Dimension", "Impl", "Label", "Recompute", "RecomputeMethod", "RecomputeModules",
           "always", "dimension", "flag_label", "plain", "unless_default", "value_label"]

LEVELS = 7
"""Enumeration levels: 0 tp, pp, cp (dp follows); 1 vpp and the first/last stage's layers; 2 ep;
3 sequence parallel; 4 mbs; 5 recompute, offload, optimizer, overlap and implementation; 6
precision (FP8, whose rules read the implementation and the recompute of level 5). A validity
rule of level k reads only the fields of levels <= k (autotune.layouts.layout.RULES), so the
enumerator rejects a partial layout before it expands the deeper levels."""


class Recompute(enum.StrEnum):
    """Activation recomputation granularity (Megatron-LM `--recompute-granularity`)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class RecomputeMethod(enum.StrEnum):
    """How full recompute picks its layers (`--recompute-method`)."""

    UNIFORM = "uniform"
    BLOCK = "block"


RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "moe",
                     "shared_experts")
"""The modules selective recompute can checkpoint in autotune's models, in the order a set of
them is spelled (`core_attn+mlp`): every one of megatron-core 0.16.1's TransformerConfig.
recompute_modules choices (MEGATRON_RECOMPUTE_MODULES)."""
MEGATRON_RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                              "shared_experts")
"""Every module megatron-core 0.16.1 takes in recompute_modules (TransformerConfig.__post_init__
asserts the set): another name stops Megatron-LM at start-up."""
MOE_SIDE_MODULES = ("moe_act", "moe", "shared_experts")
"""The modules that act inside an MoE layer (experts.py, moe_layer.py): `moe` checkpoints the
whole layer, so it goes with neither of the others (RecomputeModules)."""


class RecomputeModules(enum.StrEnum):
    """The modules selective recompute checkpoints (Megatron-LM `--recompute-modules`, `a+b` for
    several, in RECOMPUTE_MODULES' order): any subset of the attention side (core_attn,
    layernorm, mla_up_proj), with the dense MLP (mlp) or not, with one of the MoE layer's
    choices or none: the experts' activation (moe_act), the shared expert (shared_experts), both,
    or the whole MoE layer (moe). `moe` with moe_act or shared_experts is left out: `moe`
    recomputes the layer they are part of (moe_layer.py), so the pair frees what `moe` alone
    does and reruns the inner region twice. `mlp` acts on dense layers only
    (transformer_layer.py: `if not self.is_moe_layer`), the others of the MLP side on MoE layers
    only: `mlp` with one of them is for a model of both kinds of layer (ModelSpec.moe_layer_freq;
    levers.recompute.acting_layout gives each kind its own). Which act on a model is the rule
    recompute_modules' (levers.recompute): a value naming a module that acts on none of its
    layers is refused, so a search lists only values that act. The first fifteen members are
    the spellings studies stored before mla_up_proj and shared_experts were modelled."""

    CORE_ATTN = "core_attn"
    CORE_ATTN__MLP = "core_attn+mlp"
    CORE_ATTN__MOE_ACT = "core_attn+moe_act"
    CORE_ATTN__MOE = "core_attn+moe"
    LAYERNORM = "layernorm"
    LAYERNORM__MLP = "layernorm+mlp"
    LAYERNORM__MOE_ACT = "layernorm+moe_act"
    LAYERNORM__MOE = "layernorm+moe"
    CORE_ATTN__LAYERNORM = "core_attn+layernorm"
    CORE_ATTN__LAYERNORM__MLP = "core_attn+layernorm+mlp"
    CORE_ATTN__LAYERNORM__MOE_ACT = "core_attn+layernorm+moe_act"
    CORE_ATTN__LAYERNORM__MOE = "core_attn+layernorm+moe"
    MLP = "mlp"
    MOE_ACT = "moe_act"
    MOE = "moe"
    SHARED_EXPERTS = "shared_experts"
    MOE_ACT__SHARED_EXPERTS = "moe_act+shared_experts"
    MLP__MOE_ACT = "mlp+moe_act"
    MLP__MOE = "mlp+moe"
    MLP__SHARED_EXPERTS = "mlp+shared_experts"
    MLP__MOE_ACT__SHARED_EXPERTS = "mlp+moe_act+shared_experts"
    CORE_ATTN__SHARED_EXPERTS = "core_attn+shared_experts"
    CORE_ATTN__MOE_ACT__SHARED_EXPERTS = "core_attn+moe_act+shared_experts"
    CORE_ATTN__MLP__MOE_ACT = "core_attn+mlp+moe_act"
    CORE_ATTN__MLP__MOE = "core_attn+mlp+moe"
    CORE_ATTN__MLP__SHARED_EXPERTS = "core_attn+mlp+shared_experts"
    CORE_ATTN__MLP__MOE_ACT__SHARED_EXPERTS = "core_attn+mlp+moe_act+shared_experts"
    LAYERNORM__SHARED_EXPERTS = "layernorm+shared_experts"
    LAYERNORM__MOE_ACT__SHARED_EXPERTS = "layernorm+moe_act+shared_experts"
    LAYERNORM__MLP__MOE_ACT = "layernorm+mlp+moe_act"
    LAYERNORM__MLP__MOE = "layernorm+mlp+moe"
    LAYERNORM__MLP__SHARED_EXPERTS = "layernorm+mlp+shared_experts"
    LAYERNORM__MLP__MOE_ACT__SHARED_EXPERTS = "layernorm+mlp+moe_act+shared_experts"
    MLA_UP_PROJ = "mla_up_proj"
    MLA_UP_PROJ__MOE_ACT = "mla_up_proj+moe_act"
    MLA_UP_PROJ__MOE = "mla_up_proj+moe"
    MLA_UP_PROJ__SHARED_EXPERTS = "mla_up_proj+shared_experts"
    MLA_UP_PROJ__MOE_ACT__SHARED_EXPERTS = "mla_up_proj+moe_act+shared_experts"
    MLA_UP_PROJ__MLP = "mla_up_proj+mlp"
    MLA_UP_PROJ__MLP__MOE_ACT = "mla_up_proj+mlp+moe_act"
    MLA_UP_PROJ__MLP__MOE = "mla_up_proj+mlp+moe"
    MLA_UP_PROJ__MLP__SHARED_EXPERTS = "mla_up_proj+mlp+shared_experts"
    MLA_UP_PROJ__MLP__MOE_ACT__SHARED_EXPERTS = "mla_up_proj+mlp+moe_act+shared_experts"
    CORE_ATTN__LAYERNORM__SHARED_EXPERTS = "core_attn+layernorm+shared_experts"
    CORE_ATTN__LAYERNORM__MOE_ACT__SHARED_EXPERTS = "core_attn+layernorm+moe_act+shared_experts"
    CORE_ATTN__LAYERNORM__MLP__MOE_ACT = "core_attn+layernorm+mlp+moe_act"
    CORE_ATTN__LAYERNORM__MLP__MOE = "core_attn+layernorm+mlp+moe"
    CORE_ATTN__LAYERNORM__MLP__SHARED_EXPERTS = "core_attn+layernorm+mlp+shared_experts"
    CORE_ATTN__LAYERNORM__MLP__MOE_ACT__SHARED_EXPERTS = (
        "core_attn+layernorm+mlp+moe_act+shared_experts")
    CORE_ATTN__MLA_UP_PROJ = "core_attn+mla_up_proj"
    CORE_ATTN__MLA_UP_PROJ__MOE_ACT = "core_attn+mla_up_proj+moe_act"
    CORE_ATTN__MLA_UP_PROJ__MOE = "core_attn+mla_up_proj+moe"
    CORE_ATTN__MLA_UP_PROJ__SHARED_EXPERTS = "core_attn+mla_up_proj+shared_experts"
    CORE_ATTN__MLA_UP_PROJ__MOE_ACT__SHARED_EXPERTS = (
        "core_attn+mla_up_proj+moe_act+shared_experts")
    CORE_ATTN__MLA_UP_PROJ__MLP = "core_attn+mla_up_proj+mlp"
    CORE_ATTN__MLA_UP_PROJ__MLP__MOE_ACT = "core_attn+mla_up_proj+mlp+moe_act"
    CORE_ATTN__MLA_UP_PROJ__MLP__MOE = "core_attn+mla_up_proj+mlp+moe"
    CORE_ATTN__MLA_UP_PROJ__MLP__SHARED_EXPERTS = "core_attn+mla_up_proj+mlp+shared_experts"
    CORE_ATTN__MLA_UP_PROJ__MLP__MOE_ACT__SHARED_EXPERTS = (
        "core_attn+mla_up_proj+mlp+moe_act+shared_experts")
    LAYERNORM__MLA_UP_PROJ = "layernorm+mla_up_proj"
    LAYERNORM__MLA_UP_PROJ__MOE_ACT = "layernorm+mla_up_proj+moe_act"
    LAYERNORM__MLA_UP_PROJ__MOE = "layernorm+mla_up_proj+moe"
    LAYERNORM__MLA_UP_PROJ__SHARED_EXPERTS = "layernorm+mla_up_proj+shared_experts"
    LAYERNORM__MLA_UP_PROJ__MOE_ACT__SHARED_EXPERTS = (
        "layernorm+mla_up_proj+moe_act+shared_experts")
    LAYERNORM__MLA_UP_PROJ__MLP = "layernorm+mla_up_proj+mlp"
    LAYERNORM__MLA_UP_PROJ__MLP__MOE_ACT = "layernorm+mla_up_proj+mlp+moe_act"
    LAYERNORM__MLA_UP_PROJ__MLP__MOE = "layernorm+mla_up_proj+mlp+moe"
    LAYERNORM__MLA_UP_PROJ__MLP__SHARED_EXPERTS = "layernorm+mla_up_proj+mlp+shared_experts"
    LAYERNORM__MLA_UP_PROJ__MLP__MOE_ACT__SHARED_EXPERTS = (
        "layernorm+mla_up_proj+mlp+moe_act+shared_experts")
    CORE_ATTN__LAYERNORM__MLA_UP_PROJ = "core_attn+layernorm+mla_up_proj"
    CORE_ATTN__LAYERNORM__MLA_UP_PROJ__MOE_ACT = "core_attn+layernorm+mla_up_proj+moe_act"
    CORE_ATTN__LAYERNORM__MLA_UP_PROJ__MOE = "core_attn+layernorm+mla_up_proj+moe"
    CORE_ATTN__LAYERNORM__MLA_UP_PROJ__SHARED_EXPERTS = (
        "core_attn+layernorm+mla_up_proj+shared_experts")
    CORE_ATTN__LAYERNORM__MLA_UP_PROJ__MOE_ACT__SHARED_EXPERTS = (
        "core_attn+layernorm+mla_up_proj+moe_act+shared_experts")
    CORE_ATTN__LAYERNORM__MLA_UP_PROJ__MLP = "core_attn+layernorm+mla_up_proj+mlp"
    CORE_ATTN__LAYERNORM__MLA_UP_PROJ__MLP__MOE_ACT = "core_attn+layernorm+mla_up_proj+mlp+moe_act"
    CORE_ATTN__LAYERNORM__MLA_UP_PROJ__MLP__MOE = "core_attn+layernorm+mla_up_proj+mlp+moe"
    CORE_ATTN__LAYERNORM__MLA_UP_PROJ__MLP__SHARED_EXPERTS = (
        "core_attn+layernorm+mla_up_proj+mlp+shared_experts")
    CORE_ATTN__LAYERNORM__MLA_UP_PROJ__MLP__MOE_ACT__SHARED_EXPERTS = (
        "core_attn+layernorm+mla_up_proj+mlp+moe_act+shared_experts")

    @property
    def modules(self) -> tuple[str, ...]:
        return tuple(self.value.split("+"))


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
    """The Layout field (filled in by autotune.layouts.layout from the dataclass)."""
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
    minimum: int = 1
    """The smallest value of an int dimension: 1 for sizes, 0 where 0 means `off` (Megatron's
    None or 0: an even pipeline split, no offloaded layer)."""
    metavar: str | None = None
    """How the command line shows the values where listing every choice would not help
    (RecomputeModules' 79 sets); None: the choices."""

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
        that the validity rules name it (autotune.layouts.layout, rules recompute_kind and
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
            ok = (isinstance(value, int) and not isinstance(value, bool)
                  and value >= self.minimum)
            return None if ok else ("positive integers" if self.minimum == 1
                                    else f"integers >= {self.minimum}")
        assert self.choices is not None
        among = f"among {', '.join(self.choices)}"
        # A number or null names the choices too (`fp8: [1e3]` is the number 1000 to YAML).
        return None if value in self.choices else among if isinstance(value, str) \
            else f"strings {among}"

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
              folded_into: str | None = None, flag: str | None = None,
              minimum: int = 1, metavar: str | None = None) -> Any:
    """A Layout field whose metadata is its Dimension (typed Any, as dataclasses.field is)."""
    meta = Dimension(default=default, help=help, level=level, label=label,
                     folded_into=folded_into, flag=flag, minimum=minimum, metavar=metavar)
    return field(default=default, metadata={"dimension": meta})
