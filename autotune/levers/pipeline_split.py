"""An uneven pipeline split: the first and last pipeline stages' own layer counts.

megatron-core 0.16.1 builds the first and last pipeline ranks with
`num_layers_in_first_pipeline_stage` / `num_layers_in_last_pipeline_stage` layers and splits the
rest evenly over the middle ranks (TransformerConfig.__post_init__, "Uneven PP";
transformer_block.py get_num_layers_to_build); Megatron-LM spells them
`--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers` (arguments.py
_add_distributed_args). Fewer layers on the first stage offset the embedding and the most
micro-batches in flight, fewer on the last the output layer and the loss. A stage's weights,
activations and time all scale with its layer count, so the lever's terms are the counts
themselves (`stage_layers`), which autotune.predict.memory and autotune.predict.cost read stage by
stage.

The other uneven split megatron-core offers counts the input embedding and the loss as one layer
each (`account_for_embedding_in_pipeline_split`, `account_for_loss_in_pipeline_split`;
Megatron-LM `--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split`):
num_layers + 2 slots split evenly over the pipeline ranks, vpp chunks each, so the first and last
ranks hold one transformer layer fewer. NVIDIA's Llama 3.1 405B recipes (126 layers, pp 8 vpp 8)
run with both (Megatron-Bridge recipes/llama/llama3.py): autotune takes them together.

A space may mark the end stages' counts `derive` (the default space does): `split_choices`
lists the splits megatron-core accepts for the layout (the even one, the embedding/loss one,
the end stages' own counts), autotune.search.derive.joint_candidates keeps those the memory
and cost models rank first at pp's level, and the enumeration takes the one of least predicted
step among them once the rest of the layout is set (derive.best_split). A pp that does not
divide the layers (DeepSeek-V3's 61) is then reached without a hand-written list of counts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypeVar

from autotune.dimensions import dimension, flag_label, unless_default
from autotune.errors import ConfigError
from autotune.levers.base import CostState, Derivable, Lever, MemoryState, Rule, Seed, evolve
from autotune.levers.flags import Flag, FlagRow, Given, Part, Place, RunOptions, value

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from autotune.layouts.layout import Layout
    from autotune.predict.cost import CostParams
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.model import ModelSpec

_T = TypeVar("_T", bound="DataclassInstance")

__all__ = ["LEVER", "SHARE_SLACK", "Fields", "chunk_layers", "chunk_sizes", "common_divisors",
           "even_layers", "kind_shares", "mix_kinds", "split_choices", "split_slots",
           "stage_kind_shares", "stage_layer_kinds", "stage_layers", "term_names"]


@dataclass(frozen=True, kw_only=True)
class Fields:
    __slots__ = ()
    first_stage_layers: int = dimension(0, level=1, label=unless_default("first", 0), minimum=0,
                                        help=(
        "Transformer layers on the first pipeline stage (`--decoder-first-pipeline-num-"
        "layers`); 0: an even split. Fewer layers there offset the embedding and the most "
        "micro-batches in flight."))
    last_stage_layers: int = dimension(0, level=1, label=unless_default("last", 0), minimum=0,
                                       help=(
        "Transformer layers on the last pipeline stage (`--decoder-last-pipeline-num-layers`); "
        "0: an even split. Fewer layers there offset the output layer and the loss."))
    embedding_loss_split: bool = dimension(False, level=1, label=flag_label("els"), help=(
        "Count the embedding and the loss as a layer each in the pipeline split "
        "(`--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split`): "
        "num_layers + 2 split evenly, the first and last stages one layer fewer."))

    @property
    def uneven(self) -> bool:
        """The first or last pipeline stage has a layer count of its own."""
        return bool(self.first_stage_layers or self.last_stage_layers
                    or self.embedding_loss_split)


def even_layers(s: Layout, m: ModelSpec) -> tuple[int, ...]:
    """Transformer layers on each pipeline rank without the lever: num_layers / pp each
    (get_num_layers_to_build). What autotune.predict.memory and autotune.predict.cost start
    from."""
    return (m.num_layers // s.pp,) * s.pp


def split_slots(s: Layout, m: ModelSpec) -> int:
    """The slots of each pipeline rank under embedding_loss_split: num_layers + 2 (the
    embedding and the loss counted as layers) over pp. Meaningful where pp divides them."""
    return (m.num_layers + 2) // s.pp


def stage_layers(s: Layout, m: ModelSpec) -> tuple[int, ...]:
    """Transformer layers on each pipeline rank, first to last: an even split, or the first
    and last stages' own counts with the rest shared by the middle ranks (TransformerConfig.
    __post_init__, "Uneven PP"; transformer_block.py get_num_layers_to_build). Meaningful for
    a layout that passes the rule `pp_layers`."""
    if not s.uneven or s.pp == 1:
        return even_layers(s, m)
    if s.embedding_loss_split:
        slots = split_slots(s, m)
        return (slots - 1, *(slots,) * (s.pp - 2), slots - 1)
    first, last = s.first_stage_layers, s.last_stage_layers
    middle = s.pp - bool(first) - bool(last)
    rest = m.num_layers - first - last
    share = rest // middle if middle else 0
    if s.pp == 2 and not (first and last):
        # One stage named: the other holds the rest.
        return (first, rest) if first else (rest, last)
    return (first or share, *(share,) * (s.pp - 2), last or share)


def chunk_sizes(s: Layout, m: ModelSpec) -> tuple[tuple[int, ...], ...]:
    """Transformer layers of each model chunk, per pipeline rank and virtual stage: a rank's
    layers split evenly over its vpp chunks; with embedding_loss_split the first chunk of the
    first rank and the last chunk of the last rank give a slot to the embedding or the loss."""
    if s.embedding_loss_split and s.pp > 1:
        slots = (m.num_layers + 2) // (s.pp * s.vpp)
        sizes = [[slots] * s.vpp for _ in range(s.pp)]
        sizes[0][0] -= 1
        sizes[-1][-1] -= 1
        return tuple(tuple(row) for row in sizes)
    return tuple((n // s.vpp,) * s.vpp for n in stage_layers(s, m))


_KINDS: dict[tuple[Any, ...], tuple[tuple[int, int], ...]] = {}
"""stage_layer_kinds' answers by the model and the fields that place its layers (those
chunk_sizes and stage_layers read): the memory and cost models ask them of each estimate,
nearly every one of a new layout, where a cache by the whole layout missed (a plan of
DeepSeek-V3 on 1,024 GPUs: 97k misses of 685k questions, 28 us each)."""
_KINDS_KEPT = 4096


def stage_layer_kinds(s: Layout, m: ModelSpec) -> tuple[tuple[int, int], ...]:
    """(dense, MoE) transformer layers on each pipeline rank. Model chunks hold consecutive
    layers in the order virtual stage by virtual stage, rank by rank within one (megatron-core
    transformer_layer.py get_transformer_layer_offset), so a rank's layers are its chunks'."""
    key = (m, s.pp, s.vpp, s.first_stage_layers, s.last_stage_layers, s.embedding_loss_split)
    found = _KINDS.get(key)
    if found is None:
        if len(_KINDS) >= _KINDS_KEPT:
            _KINDS.clear()
        found = _KINDS[key] = _stage_layer_kinds(s, m)
    return found


def _stage_layer_kinds(s: Layout, m: ModelSpec) -> tuple[tuple[int, int], ...]:
    sizes = chunk_sizes(s, m)
    kinds = [[0, 0] for _ in range(s.pp)]
    start = 0
    for v in range(s.vpp):
        for i in range(s.pp):
            dense, moe = m.layer_kinds(start, start + sizes[i][v])
            kinds[i][0] += dense
            kinds[i][1] += moe
            start += sizes[i][v]
    return tuple((dense, moe) for dense, moe in kinds)


def stage_kind_shares(s: Layout, m: ModelSpec, stage: int) -> tuple[float, float]:
    """The shares of dense and MoE layers among pipeline stage `stage`'s layers (half each on
    a stage without layers, whose terms are its fixed part alone, the same for both kinds)."""
    return kind_shares(stage_layer_kinds(s, m)[stage])


def kind_shares(kinds: tuple[int, int]) -> tuple[float, float]:
    """The shares of (dense, MoE) layers `kinds` of one stage (stage_kind_shares)."""
    dense, moe = kinds
    n = dense + moe
    return (dense / n, moe / n) if n else (0.5, 0.5)


def mix_kinds(dense: _T, moe: _T, shares: tuple[float, float], **same: Any) -> _T:
    """A stage's terms (a dataclass of floats: memory's StageMemory, cost's per-stage times)
    from the same stage of a model of each kind of layer alone, weighted by the stage's
    `shares` of each kind; `same` the fields taken as they are. Each term is the stage's fixed
    part (the same in both) plus its layers' sum, so the weighted mean is exact for a term
    linear in the layers; the callers say which are not."""
    a, b = shares
    return type(dense)(**same, **{name: a * getattr(dense, name) + b * getattr(moe, name)
                                  for name in term_names(type(dense)) if name not in same})


@functools.cache
def term_names(kind: type) -> tuple[str, ...]:
    """The field names of a dataclass of terms, in order (dataclasses.fields, asked once per
    class: mix_kinds and mtp_terms.add_difference ran it 480k times in a plan of DeepSeek-V3
    on 1,024 GPUs)."""
    return tuple(f.name for f in fields(kind))


def chunk_layers(s: Layout, m: ModelSpec) -> tuple[int, ...]:
    """Transformer layers of the largest model chunk on each pipeline rank (stage_layers / vpp,
    rounded up: with embedding_loss_split a chunk of the first and last ranks holds the
    embedding or the loss in place of a layer)."""
    return tuple(-(-n // s.vpp) for n in stage_layers(s, m))


def common_divisors(counts: Iterable[int]) -> tuple[int, ...]:
    """The values that divide every count (uniform recompute groups of every chunk, the
    virtual stages of every pipeline stage)."""
    distinct = set(counts)
    low = min(distinct)
    return tuple(d for d in range(1, low + 1) if all(n % d == 0 for n in distinct)) \
        if low > 0 else ()


def _pp_layers(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # megatron/core/transformer/transformer_block.py, get_num_layers_to_build; with the first
    # or last stage's own count, TransformerConfig.__post_init__ ("Uneven PP").
    if not s.uneven:
        if m.num_layers % s.pp:
            return f"pp={s.pp} must divide num_layers={m.num_layers}"
        return None
    if s.embedding_loss_split:
        return _embedding_loss_split(s, m)
    first, last = s.first_stage_layers, s.last_stage_layers
    if s.pp < 2:
        return (f"first_stage_layers={first}/last_stage_layers={last} need pp >= 2: one "
                "stage holds every layer")
    named = bool(first) + bool(last)
    middle = s.pp - named
    rest = m.num_layers - first - last
    if s.pp == 2 and named == 1:
        middle = 1  # the stage not named holds the rest
    if middle == 0 and rest != 0:
        return (f"first_stage_layers={first} + last_stage_layers={last} must equal "
                f"num_layers={m.num_layers} with pp=2")
    if middle and (rest < middle or rest % middle):
        return (f"the {rest} layers left after first_stage_layers={first} and "
                f"last_stage_layers={last} must split evenly over the {middle} other "
                f"pipeline stages (num_layers={m.num_layers}, pp={s.pp})")
    return None


def _embedding_loss_split(s: Layout, m: ModelSpec) -> str | None:
    # TransformerConfig.__post_init__: not with the first/last stages' own counts; num_layers + 2
    # divisible by pp (with vpp, the slots per rank by vpp: the core's vpp_layers).
    if s.first_stage_layers or s.last_stage_layers:
        return (f"embedding_loss_split cannot be set with first_stage_layers="
                f"{s.first_stage_layers}/last_stage_layers={s.last_stage_layers}")
    if s.pp < 2:
        return "embedding_loss_split needs pp >= 2: one stage holds the embedding and the loss"
    if (m.num_layers + 2) % s.pp:
        return (f"pp={s.pp} must divide num_layers + 2 = {m.num_layers + 2} with "
                "embedding_loss_split")
    return None


def _split_needed(s: Layout, m: ModelSpec) -> bool:
    """Whether `embedding_loss_split: derive` takes the split for `s`: only where the even
    split cannot be (pp does not divide num_layers) and this one can (pp divides num_layers +
    2), as for Llama 3.1 405B's 126 layers at pp 4, 8, 16, 32 or 64. Where both can (pp 2) the
    two are the same run without interleaving (autotune.megatron.identity), and listing
    `[false, true]` doubles the space's combinations for that alone."""
    return (s.pp >= 2 and not (s.first_stage_layers or s.last_stage_layers)
            and m.num_layers % s.pp != 0 and (m.num_layers + 2) % s.pp == 0)


SHARE_SLACK = 2
"""Layers above the least share of a middle stage that a derived split still offers. Every
layer more on each middle stage is a layer more at the pipeline's pace, which only end stages
slower than the middle by that much (a large output layer and loss) could repay; the first
two cover those and keep the choices a handful (DeepSeek-V3's 61 layers at pp 16: 4)."""


def _even_choice(s: Layout, m: ModelSpec) -> bool:
    # get_num_layers_to_build: pp divides the layers, each stage's by vpp.
    return m.num_layers % s.pp == 0 and (m.num_layers // s.pp) % s.vpp == 0


def _slots_choice(s: Layout, m: ModelSpec) -> bool:
    # TransformerConfig.__post_init__: pp divides num_layers + 2, each rank's slots by vpp.
    slots = m.num_layers + 2
    return slots % s.pp == 0 and (slots // s.pp) % s.vpp == 0


def _end_counts(s: Layout, m: ModelSpec) -> list[tuple[int, int]]:
    """(first, last) stage counts, 0 where the end holds the middle stages' share (not named:
    the fewer flags), that TransformerConfig.__post_init__'s "Uneven PP" accepts: each named
    count positive and divisible by vpp, the layers left split evenly over the middle stages,
    each middle rank's by vpp. The ends hold at most the share (what they add, the embedding
    and the output layer with the loss, only makes them heavier), the share at most
    SHARE_SLACK above its least. pp 2 has no middle: one end named, the other holding the
    rest, within SHARE_SLACK of the halves."""
    n, pp, v = m.num_layers, s.pp, s.vpp
    found: list[tuple[int, int]] = []
    if pp == 2:
        # megatron-core: one end named leaves one "middle" stage, the other, holding the rest.
        half = -(-n // 2)
        for heavy in range(half, min(n - 1, half + SHARE_SLACK) + 1):
            light = n - heavy
            if light < 1 or light % v or heavy % v or light == heavy:
                continue
            found += [(0, light), (light, 0)]
        return found
    least = -(-n // pp)
    for share in range(least, least + SHARE_SLACK + 1):
        ends = n - (pp - 2) * share
        if share % v or ends < 2:
            continue
        for first in range(max(1, ends - share), min(share, ends - 1) + 1):
            last = ends - first
            if first % v or last % v or (first == share and last == share):
                continue
            found.append((0 if first == share else first, 0 if last == share else last))
    return found


def split_choices(s: Layout, m: ModelSpec, derived: frozenset[str]) -> tuple[dict[str, Any],
                                                                              ...]:
    """The pipeline splits Megatron accepts for `s` with the fields in `derived` free (the
    others kept as `s` holds them): the even split where pp divides the layers, the
    embedding/loss split where pp divides num_layers + 2 and `embedding_loss_split` is free
    (or set), and the first/last stages' own counts (_end_counts). Each a {field: value} of
    the three fields; none for pp 1. The even split first, then the slots, then the ends by
    rising share (the resolver's order among equals)."""
    if s.pp < 2:
        return ()
    names = ("first_stage_layers", "last_stage_layers", "embedding_loss_split")
    options: list[tuple[int, int, bool]] = []
    if _even_choice(s, m):
        options.append((0, 0, False))
    if _slots_choice(s, m):
        options.append((0, 0, True))
    options += [(first, last, False) for first, last in _end_counts(s, m)]
    held = {name: getattr(s, name) for name in names if name not in derived}
    chosen = [dict(zip(names, o, strict=True)) for o in options]
    return tuple(c for c in chosen if all(c[name] == value for name, value in held.items()))


def _end_values(name: str) -> Callable[[Layout, ModelSpec], tuple[int, ...]]:
    def values(s: Layout, m: ModelSpec) -> tuple[int, ...]:
        # The counts the joint choice may give `name` alone derived, the rest as `s` holds it.
        return tuple(sorted({c[name] for c in split_choices(s, m, frozenset((name,)))}))
    return values


def _ends_apply(s: Layout, m: ModelSpec) -> bool:
    return s.pp >= 2


def _emit(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    if s.embedding_loss_split:
        return ["--account-for-embedding-in-pipeline-split",
                "--account-for-loss-in-pipeline-split"]
    return []


def _read(g: Given) -> dict[str, Any]:
    # One of the two alone is a split autotune does not model: refused in one line rather than
    # read as either.
    embedding = g.has("--account-for-embedding-in-pipeline-split")
    loss = g.has("--account-for-loss-in-pipeline-split")
    if embedding != loss:
        given = "embedding" if embedding else "loss"
        raise ConfigError(f"{g.source}: --account-for-{given}-in-pipeline-split without the "
                          "other is a pipeline split autotune does not model (it takes "
                          "--account-for-embedding-in-pipeline-split and "
                          "--account-for-loss-in-pipeline-split together)")
    return {"embedding_loss_split": embedding}


def _core_config(m: ModelSpec, s: Layout) -> dict[str, dict[str, Any]]:
    # TransformerConfig's uneven split: None is an even split (Megatron-LM's default for
    # --decoder-first/last-pipeline-num-layers); get_num_layers_to_build reads both.
    return {"transformer": {"num_layers_in_first_pipeline_stage": s.first_stage_layers or None,
                            "num_layers_in_last_pipeline_stage": s.last_stage_layers or None,
                            "account_for_embedding_in_pipeline_split": s.embedding_loss_split,
                            "account_for_loss_in_pipeline_split": s.embedding_loss_split}}


def _memory(m: ModelSpec, s: Layout, state: MemoryState) -> MemoryState:
    # Each stage's weights, gradients, optimizer state and activations follow its layers.
    return evolve(state, stage_layers=stage_layers(s, m)) if s.uneven else state


def _cost(m: ModelSpec, s: Layout, c: ClusterSpec, p: CostParams,
          state: CostState) -> CostState:
    # Each stage's micro-batch takes its layers' time; the slowest stage sets the pace.
    return evolve(state, stage_layers=stage_layers(s, m)) if s.uneven else state


LEVER = Lever(
    name="pipeline_split",
    fields=Fields,
    # Level 1, with vpp: vpp_layers (autotune.layouts.layout) divides the counts this rule allows.
    rules=(Rule("pp_layers", 1, "pp must divide num_layers, or the first/last stages' own "
                "counts (or num_layers + 2 with embedding_loss_split) leave an even split",
                _pp_layers),),
    # An uneven split (arguments.py _add_distributed_args, core_v0.16.1): absent, an even
    # split; with vpp, --num-virtual-stages-per-pipeline-rank is the flag validate_args
    # accepts alongside them.
    flag_rows=(value("--decoder-first-pipeline-num-layers", "first_stage_layers", Part.LAYOUT,
                     default=0, omit_at=0),
               value("--decoder-last-pipeline-num-layers", "last_stage_layers", Part.LAYOUT,
                     default=0, omit_at=0),
               FlagRow(name="embedding_loss_split", part=Part.LAYOUT,
                       flags=(Flag("--account-for-embedding-in-pipeline-split",
                                   takes_value=False),
                              Flag("--account-for-loss-in-pipeline-split", takes_value=False)),
                       emit=_emit, read=_read)),
    flag_place=Place.PIPELINE,
    core_config=_core_config,
    memory=_memory,
    cost=_cost,
    seed=Seed.MEMORY,
    # `derive`: the split where only it lets pp divide the layers (_split_needed), else the
    # even split; one value, so the least-memory pick is it (monotone False: no ladder).
    derivable=(Derivable(name="embedding_loss_split", applies=_split_needed,
                         values=lambda s, m: (True,), monotone=lambda s: False, off=False,
                         rules=("pp_layers", "vpp_layers")),
               # `derive` for an end stage's count: the split of least predicted step time
               # among those of split_choices kept at pp's level that fit at the complete
               # layout (autotune.search.derive.joint_candidates, best_split), the
               # embedding/loss split among them where that field is `derive` too.
               *(Derivable(name=name, applies=_ends_apply, values=_end_values(name),
                           monotone=lambda s: False, off=0, rules=("pp_layers", "vpp_layers"),
                           joint=split_choices)
                 for name in ("first_stage_layers", "last_stage_layers"))),
)
