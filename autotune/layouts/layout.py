"""A parallel layout (`Layout`) and the rules Megatron applies to it.

Each rule mirrors a check in megatron-core 0.16.1 or Megatron-LM; the source is named beside it.
Rules carry a level: a rule of level k reads only the fields chosen at levels <= k, so the
enumerator in `space` can reject a partial layout before it expands the deeper dimensions.
The core fields and rules (parallel sizes, batch) are here; the levers' (the pipeline split,
recompute, offload, optimizer, implementation, ...) are in their modules under autotune/levers/.
`stage_layers` and `chunk_layers` (the pipeline split's) are re-exported for the rules and
models that read a stage's layers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields, replace
from typing import Any

from autotune.dimensions import (
    LEVELS,
    Dimension,
    Impl,
    Recompute,
    RecomputeMethod,
    RecomputeModules,
    always,
    dimension,
    flag_label,
    unless_default,
)
from autotune.errors import InvalidLayoutError
from autotune.levers import LeverFields, pipeline_split
from autotune.levers import rules as lever_rules
from autotune.levers.base import Rule
from autotune.levers.pipeline_split import chunk_layers, stage_layers
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec

__all__ = [
    "DATA_PARALLEL_OPTIONS",
    "DIMENSIONS",
    "LAYOUT_DEFAULTS",
    "RULES",
    "RULE_LEVELS",
    "SEARCHED",
    "Impl",
    "Layout",
    "Recompute",
    "RecomputeMethod",
    "RecomputeModules",
    "Rule",
    "Violation",
    "check",
    "chunk_layers",
    "stage_layers",
    "validate",
]


@dataclass(frozen=True, kw_only=True)
class _Sizes:
    """The parallel sizes: the first fields of a Layout."""

    __slots__ = ()
    tp: int = dimension(1, level=0, label=always("tp"), flag="--tp", help=(
        "Tensor parallel size (Megatron `--tensor-model-parallel-size`)."))
    pp: int = dimension(1, level=0, label=always("pp"), flag="--pp", help=(
        "Pipeline parallel size."))
    dp: int = dimension(1, level=None, label=always("dp"), help=(
        "Data parallel size: world / (tp * pp * cp), derived from the GPU count."))
    cp: int = dimension(1, level=0, label=unless_default("cp", 1), flag="--cp", help=(
        "Context parallel size: the sequence is split over cp GPUs."))
    ep: int = dimension(1, level=2, label=unless_default("ep", 1), flag="--ep", help=(
        "Expert parallel size (MoE): experts split over ep ranks of the data-parallel group."))
    vpp: int = dimension(1, level=1, label=unless_default("vpp", 1), flag="--vpp", help=(
        "Virtual pipeline stages (model chunks) per pipeline rank; 1: no interleaving."))


@dataclass(frozen=True, kw_only=True)
class _Batch:
    """The batch and sequence parallelism: a Layout's fields after the pipeline split's."""

    __slots__ = ()
    mbs: int = dimension(1, level=4, label=always("mbs"), flag="--mbs", help=(
        "Micro-batch size in sequences."))
    gbs: int = dimension(1, level=None, label=None, folded_into="the model", help=(
        "Global batch size in sequences (the model's; estimate's --gbs overrides it)."))
    sequence_parallel: bool = dimension(False, level=3, label=flag_label("sp"), flag="--sp",
                                        help="Sequence parallelism (needs tp > 1).")


@dataclass(frozen=True, kw_only=True)  # no slots: with_fields copies the __dict__
class Layout(LeverFields, _Batch, pipeline_split.Fields, _Sizes):
    """One Megatron parallel layout plus the batch and memory options that go with it.

    Each field's metadata (help, enumeration level, label, estimate flag) is declared once,
    with `dimension(...)`: the core fields in `_Sizes` and `_Batch`, a lever's in its module
    under autotune/levers/ (LeverFields). A dataclass orders fields by the reversed method
    resolution order: the sizes, the pipeline split (named again here, so that it comes
    before the batch), the batch, then the other levers in registry order. That order is
    every label's (`describe()`) and a study's parameters', so it stays as it was when the
    pipeline split was a core field; DIMENSIONS below collects the fields for every
    consumer."""

    def __post_init__(self) -> None:
        # with_fields does the same for the fields it changes (and nothing else: what is
        # added here belongs there too).
        _members(self.__dict__, _ENUM_KINDS)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step and pipeline: gbs / (mbs * dp)."""
        return self.gbs // (self.mbs * self.dp)

    @property
    def expert_dp(self) -> int:
        """Megatron's expert-data-parallel size, with expert TP = TP: world / (tp * ep * pp)."""
        return self.world_size // (self.tp * self.ep * self.pp)

    def describe(self) -> str:
        """A compact label naming every non-default choice, each dimension's label in field
        order: `tp2 pp2 dp2 mbs4 sp rc=full(block/2) do ogr opg cef sdpa`."""
        parts = [dim.label(self, getattr(self, dim.name)) for dim in DIMENSIONS.values()
                 if dim.label is not None]
        return " ".join(p for p in parts if p)


DIMENSIONS: dict[str, Dimension] = {
    f.name: replace(f.metadata["dimension"], name=f.name) for f in fields(Layout)}
"""Every Layout field's Dimension, in field order: the one table the space, estimate's
options, the export, the best-trial rows and tools/ derive from."""
_ENUM_KINDS: dict[str, type] = {name: dim.kind for name, dim in DIMENSIONS.items()
                                 if dim.choices is not None}
"""The enum fields, each with its StrEnum."""


def _members(attrs: dict[str, Any], names: Iterable[str]) -> None:
    """The values of the enum fields among `names` in a layout's attributes made members:
    values read back from YAML, JSON or Optuna's storage are plain strings, and a layout
    prints, hashes and compares one way."""
    for name in names:
        kind = _ENUM_KINDS.get(name)
        # The common case, a member already (or no enum field), costs nothing.
        if kind is not None and attrs[name].__class__ is not kind:
            attrs[name] = DIMENSIONS[name].coerce(attrs[name])


SEARCHED: dict[str, Dimension] = {n: d for n, d in DIMENSIONS.items() if d.level is not None}
"""The dimensions a search space may list, with their enumeration levels."""

LAYOUT_DEFAULTS: dict[str, Any] = {name: dim.default for name, dim in DIMENSIONS.items()}
"""Each Layout field's default: what a trial stored before a field existed ran with, and the
type a layout file's value must have."""


@dataclass(frozen=True, slots=True)
class Violation:
    """A broken rule: `rule` groups violations, `message` carries the numbers."""

    rule: str
    message: str


# Levels: 0 = tp, pp, cp, dp; 1 = vpp, the first/last stage's layers (autotune.levers.
# pipeline_split); 2 = ep; 3 = sequence_parallel; 4 = mbs; 5 = recompute, offload, optimizer,
# overlap, implementation (autotune.levers); 6 = precision (autotune.levers.fp8).


def _world(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    inner = s.tp * s.pp * s.cp
    if c.num_gpus % inner:
        return f"tp={s.tp} x pp={s.pp} x cp={s.cp} = {inner} must divide the {c.num_gpus} GPUs"
    if s.world_size != c.num_gpus:
        return (f"tp={s.tp} x pp={s.pp} x cp={s.cp} x dp={s.dp} = {s.world_size} "
                f"must equal the {c.num_gpus} GPUs")
    return None


def _tp_node(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # Alpa's heuristic and the PTD-P paper: tensor parallelism only inside a node (NVLink).
    if s.tp > c.gpus_per_node:
        return f"tp={s.tp} must not exceed gpus_per_node={c.gpus_per_node}"
    if c.num_gpus > c.gpus_per_node and c.gpus_per_node % s.tp:
        # Megatron's tp groups are tp consecutive ranks (parallel_state.RankGenerator, tp
        # innermost): with nodes of 6, a tp-4 group holds ranks 4-7 of two nodes, and its
        # all-reduces, which the cost model prices at NVLink speed, would cross the network.
        return (f"tp={s.tp} must divide gpus_per_node={c.gpus_per_node} on several nodes (a "
                "tensor-parallel group would span two nodes)")
    return None


def _tp_heads(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # megatron/core/transformer/transformer_config.py, TransformerConfig.__post_init__.
    if m.num_attention_heads % s.tp:
        return f"tp={s.tp} must divide num_attention_heads={m.num_attention_heads}"
    return None


def _tp_groups(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # megatron-core TransformerConfig.__post_init__ raises ValueError unless num_query_groups
    # is a multiple of tp (every release autotune exports for; KV heads are not replicated).
    g = m.query_groups
    if g % s.tp:
        return f"num_query_groups={g} must be a multiple of tp={s.tp}"
    return None


def _cp_seq(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # Megatron-LM arguments.py: the sequence splits into 2*cp chunks for load balance.
    if s.cp > 1 and m.seq_length % (2 * s.cp):
        return f"seq_length={m.seq_length} must be divisible by 2*cp={2 * s.cp}"
    return None


def _vpp_pp(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # Megatron-LM arguments.py: the interleaved schedule needs pipeline parallelism.
    if s.vpp > 1 and s.pp < 2:
        return f"vpp={s.vpp} needs pp >= 2, got pp={s.pp}"
    return None


def _vpp_layers(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # get_num_layers_to_build: layers per pipeline rank divisible by the virtual stages; with
    # an uneven split, TransformerConfig.__post_init__ checks the first, last and middle ranks.
    if s.vpp == 1:
        return None
    if not s.uneven:
        if (m.num_layers // s.pp) % s.vpp:
            return (f"vpp={s.vpp} must divide the {m.num_layers // s.pp} layers per pipeline "
                    f"stage (num_layers={m.num_layers}, pp={s.pp})")
        return None
    if s.embedding_loss_split:
        slots = pipeline_split.split_slots(s, m)
        if slots % s.vpp:
            return (f"vpp={s.vpp} must divide the {slots} layers per pipeline stage "
                    f"(num_layers={m.num_layers} + embedding + loss, pp={s.pp})")
        return None
    counts = sorted(set(stage_layers(s, m)))
    if any(n % s.vpp for n in counts):
        listed = ", ".join(map(str, counts))
        return f"vpp={s.vpp} must divide the layers of every pipeline stage ({listed})"
    return None


def _ep_dense(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # TransformerConfig.__post_init__: "num_moe_experts must be non None to use expert-parallel".
    if s.ep > 1 and not m.is_moe:
        return f"ep={s.ep} needs a mixture-of-experts model; {m.name} has no experts"
    return None


def _ep_experts(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # megatron/core/transformer/moe/moe_layer.py: experts split evenly over the ep ranks.
    if m.is_moe and m.num_experts is not None and m.num_experts % s.ep:
        return f"ep={s.ep} must divide num_experts={m.num_experts}"
    return None


def _ep_world(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # megatron/core/parallel_state.py: the expert grid is etp x ep x edp x pp with etp = tp.
    if s.ep > 1 and c.num_gpus % (s.tp * s.ep * s.pp):
        return (f"tp={s.tp} x ep={s.ep} x pp={s.pp} = {s.tp * s.ep * s.pp} must divide the "
                f"{c.num_gpus} GPUs (expert-data-parallel group)")
    return None


def _sp_tp(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # megatron/core/model_parallel_config.py: no sequence parallelism without TP.
    if s.sequence_parallel and s.tp < 2:
        return "sequence_parallel needs tp >= 2, got tp=1"
    return None


def _sp_seq(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # Sequence parallelism scatters each cp chunk of the sequence over the tp ranks.
    if s.sequence_parallel and (m.seq_length // s.cp) % s.tp:
        return (f"tp={s.tp} must divide the sequence chunk seq_length/cp="
                f"{m.seq_length // s.cp} with sequence_parallel")
    return None


def _moe_sp(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # Megatron-LM arguments.py: "When using MoE and tensor parallelism, sequence parallelism
    # must be used."
    if m.is_moe and s.tp > 1 and not s.sequence_parallel:
        return f"a mixture-of-experts model with tp={s.tp} needs sequence_parallel"
    return None


def _gbs_batch(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # megatron/core/num_microbatches_calculator.py, ConstantNumMicroBatchesCalculator.
    if s.gbs % (s.mbs * s.dp):
        return f"mbs={s.mbs} x dp={s.dp} = {s.mbs * s.dp} must divide global_batch_size={s.gbs}"
    return None


def _vpp_microbatches(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # megatron/core/pipeline_parallel/schedules.py, interleaved 1F1B: with the default group of
    # pp contiguous micro-batches, the micro-batch count must be a multiple of pp.
    if s.vpp > 1 and s.num_microbatches % s.pp:
        return (f"the interleaved schedule needs num_microbatches={s.num_microbatches} "
                f"(gbs/(mbs*dp)) to be a multiple of pp={s.pp}")
    return None


_RULES: tuple[Rule, ...] = (
    Rule("world", 0, "dp x tp x pp x cp must equal the GPU count", _world),
    Rule("tp_node", 0, "tp must fit in one node (Alpa): at most, and on several nodes dividing, "
         "the GPUs per node", _tp_node),
    Rule("tp_heads", 0, "tp must divide num_attention_heads", _tp_heads),
    Rule("tp_groups", 0, "num_query_groups must be a multiple of tp", _tp_groups),
    Rule("cp_seq", 0, "seq_length must be divisible by 2*cp", _cp_seq),
    Rule("vpp_pp", 1, "vpp needs pp >= 2", _vpp_pp),
    Rule("vpp_layers", 1, "vpp must divide the layers per pipeline stage", _vpp_layers),
    Rule("ep_dense", 2, "ep > 1 needs a mixture-of-experts model", _ep_dense),
    Rule("ep_experts", 2, "ep must divide num_experts", _ep_experts),
    Rule("ep_world", 2, "tp x ep x pp must divide the GPU count", _ep_world),
    Rule("sp_tp", 3, "sequence_parallel needs tp >= 2", _sp_tp),
    Rule("sp_seq", 3, "tp must divide the sequence chunk with sequence_parallel", _sp_seq),
    Rule("moe_sp", 3, "MoE with tp > 1 needs sequence_parallel", _moe_sp),
    Rule("gbs_batch", 4, "mbs x dp must divide the global batch", _gbs_batch),
    Rule("vpp_microbatches", 4, "interleaving needs micro-batches in multiples of pp",
         _vpp_microbatches),
)

RULES: tuple[Rule, ...] = tuple(sorted((*lever_rules(), *_RULES), key=lambda rule: rule.level))
"""Megatron's checks in level order: within a level the levers' (autotune.levers, in registry
order), then the core's. Sorting is stable, so that order stays: the pipeline split's pp_layers
runs before vpp_layers, which reads the stage counts it allows."""

RULE_LEVELS: dict[str, int] = {rule.name: rule.level for rule in RULES}


def iter_violations(layout: Layout, model: ModelSpec, cluster: ClusterSpec,
                    max_level: int = LEVELS - 1) -> Iterator[Violation]:
    """Broken rules up to `max_level`, in Megatron's order."""
    sizes = {k: getattr(layout, k) for k in ("tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "gbs")}
    if min(sizes.values()) < 1:
        listed = ", ".join(f"{k}={v}" for k, v in sizes.items())
        yield Violation("positive", f"every size must be >= 1: {listed}")
        return
    for rule in RULES:
        if rule.level > max_level:
            break
        message = rule.check(layout, model, cluster)
        if message is not None:
            yield Violation(rule.name, message)


def check(layout: Layout, model: ModelSpec, cluster: ClusterSpec) -> list[Violation]:
    """Every rule the layout breaks; empty when Megatron would accept it."""
    return list(iter_violations(layout, model, cluster))


def validate(layout: Layout, model: ModelSpec, cluster: ClusterSpec) -> Layout:
    """The layout itself, or InvalidLayoutError naming the first broken rule."""
    for violation in iter_violations(layout, model, cluster):
        raise InvalidLayoutError(violation.message)
    return layout


def derive_dp(num_gpus: int, *, tp: int, pp: int, cp: int) -> int:
    """dp = world / (tp * pp * cp), at least 1. When the GPUs do not split evenly the result
    breaks the `world` rule, which then names the numbers."""
    return max(1, num_gpus // max(1, tp * pp * cp))


DATA_PARALLEL_OPTIONS = ("distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather")
"""Options that act only on gradients and parameters across data-parallel replicas."""


_FIELD_NAMES = tuple(f.name for f in fields(Layout))
_MISSING = object()
_NEW = object.__new__


def with_fields(layout: Layout, **values: object) -> Layout:
    """A copy with some fields changed (dataclasses.replace, typed loosely for the enumerator);
    `layout` itself where none changes (it is immutable).

    The enumerator, the derived values' resolver and the gate call this a million times for a
    large plan (gpt-1t on 3072 GPUs, mixtral-8x7b on 64): half of them change nothing, and the
    others copy the layout's attributes at once."""
    for name, value in values.items():
        current = getattr(layout, name, _MISSING)  # not a field: refused below
        if current is not value and (current.__class__ is not value.__class__
                                     or current != value):
            break
    else:
        return layout
    if layout.__class__ is not Layout:  # a subclass may add fields of its own
        return replace(layout, **values)  # type: ignore[arg-type]
    # What Layout(**fields) does (the generated __init__ sets each field, then __post_init__),
    # without passing 26 keyword arguments one by one: 6x faster (Layout has no slots for it;
    # a tenth of a mixtral-8x7b plan on 64 GPUs was Layout.__init__).
    copy = _NEW(Layout)
    attrs = copy.__dict__
    attrs.update(layout.__dict__)
    if not values.keys() <= attrs.keys():
        raise TypeError(f"Layout has no field {', '.join(values.keys() - attrs.keys())}")
    attrs.update(values)
    # __post_init__ on the changed fields alone: the others are `layout`'s, members already
    # (the enumerator copies a layout per combination, over 400k for gpt-1t on 3072
    # GPUs).
    _members(attrs, values)
    return copy
