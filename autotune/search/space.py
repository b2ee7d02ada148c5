"""Search spaces: candidate lists per dimension (YAML), and the enumeration of valid layouts."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from autotune.dimensions import LEVELS
from autotune.errors import ConfigError
from autotune.inputs.documents import parse_yaml
from autotune.inputs.files import MAX_YAML_BYTES, read_text
from autotune.inputs.untrusted import shown
from autotune.layouts.layout import (
    RULE_LEVELS,
    RULES,
    SEARCHED,
    Layout,
    Rule,
    derive_dp,
    with_fields,
)
from autotune.levers.fp8 import may_outgrow_bf16
from autotune.predict.cost import CostEstimate
from autotune.predict.memory import MemoryParams, memory_key
from autotune.predict.memory_memo import MemoryMemo
from autotune.search.derive import (
    DERIVABLE,
    DERIVE,
    DIVISORS,
    ENUMERABLE,
    MEMORY_BLIND,
    best_split,
    divisor_values,
    joint_candidates,
    joint_dims,
    resolve,
    safe_limit_bytes,
)
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.presets import search_spaces_dir

__all__ = ["DIMENSIONS", "BatchShortfall", "SearchSpace", "SpaceSummary", "any_valid",
           "batch_shortfall", "enumerate_space", "load_space"]

DIMENSIONS = SEARCHED
"""The dimensions a space file may list, with their levels (autotune.layouts.layout.DIMENSIONS)."""
MAX_CANDIDATES = 64
"""Candidates one dimension may list: the default space's longest list has 8; the product of
a few lists of thousands would take the enumeration days."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """Candidates per dimension. A dimension missing from the file keeps Layout's default."""

    candidates: dict[str, tuple[Any, ...]]
    source: str = "default"
    chosen: frozenset[str] = frozenset()
    """The dimensions whose candidates the user chose: every one their own space file lists,
    and each pin (autotune.commands.pins). A shipped space chooses nothing for them: a plan
    ranks only what the export writes where they did not ask otherwise (autotune.search.impls)."""

    def size(self) -> int:
        """Combinations of the listed candidates (`divisors` and `derive` count as one)."""
        return math.prod(len(v) for v in self.candidates.values())

    @property
    def derived(self) -> tuple[str, ...]:
        """The dimensions whose candidates include `derive` (autotune.search.derive)."""
        return tuple(d for d, v in self.candidates.items() if DERIVE in v)

    def literal(self, dim: str) -> tuple[Any, ...]:
        """`dim`'s listed values, without the markers."""
        return tuple(v for v in self.candidates.get(dim, ()) if v not in (DERIVE, DIVISORS))

    def at_level(self, level: int) -> dict[str, tuple[Any, ...]]:
        return {k: v for k, v in self.candidates.items() if DIMENSIONS[k].level == level}


def _check_value(dim: str, value: Any, source: str) -> Any:
    choices = DIMENSIONS[dim].choices
    if isinstance(value, bool) and choices is not None and ("on" if value else "off") in choices:
        # YAML 1.1 (PyYAML) reads a bare `off` or `on` as a boolean: `fp8: [off]` means the
        # choice spelled so.
        value = "on" if value else "off"
    elif isinstance(value, bool) and choices is not None:
        # `fp8: [on]`: a choice-valued dimension given a YAML boolean that is not a choice.
        raise ConfigError(f"{source}: {dim} candidates must be one of "
                          f"{', '.join(map(str, choices))}, got {str(value).lower()} (YAML "
                          f"reads a bare on/off, yes/no or true/false as a boolean)")
    if value in (DERIVE, DIVISORS):
        allowed = DERIVABLE if value == DERIVE else ENUMERABLE
        if dim not in allowed:
            raise ConfigError(f"{source}: {dim} cannot be `{value}`; only "
                              f"{', '.join(allowed)} can")
        return value
    problem = DIMENSIONS[dim].check(value)
    if problem is not None:
        raise ConfigError(f"{source}: {dim} candidates must be {problem}, got {shown(value)}")
    return DIMENSIONS[dim].coerce(value)


def space_from_mapping(data: Any, source: str) -> SearchSpace:
    """A SearchSpace from parsed YAML, with every problem reported as a ConfigError."""
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{source}: expected a mapping of dimension: [candidates]")
    unknown = sorted(set(data) - set(DIMENSIONS))
    if unknown:
        raise ConfigError(f"{source}: unknown dimension(s) {', '.join(map(str, unknown))}; "
                          f"known: {', '.join(DIMENSIONS)}")
    candidates: dict[str, tuple[Any, ...]] = {}
    for dim in DIMENSIONS:
        if dim not in data:
            continue
        values = data[dim]
        if not isinstance(values, list):
            values = [values]
        if not values:
            raise ConfigError(f"{source}: {dim} needs at least one candidate")
        if len(values) > MAX_CANDIDATES:
            raise ConfigError(f"{source}: {dim} lists {len(values)} candidates; at most "
                              f"{MAX_CANDIDATES}")
        checked = tuple(_check_value(dim, v, source) for v in values)
        if len(set(checked)) != len(checked):
            raise ConfigError(f"{source}: {dim} lists a candidate twice")
        candidates[dim] = checked
    return SearchSpace(candidates=candidates, source=source)


def load_space(path: str | None = None) -> SearchSpace:
    """The space in `path`, or search_spaces/default.yaml."""
    if path is None:
        text = search_spaces_dir().joinpath("default.yaml").read_text()
        source = "default.yaml"
    else:
        file = Path(path)
        text = read_text(file, "search space file", max_bytes=MAX_YAML_BYTES)
        source = str(file)
    data = parse_yaml(text, source)
    space = space_from_mapping(data, source)
    if path is None or _shipped(Path(path)):
        return space
    return replace(space, chosen=frozenset(space.candidates))


def _shipped(path: Path) -> bool:
    """Whether `path` is one of autotune's own spaces (`--space one-node` resolves to one)."""
    try:
        return path.resolve().parent == Path(str(search_spaces_dir())).resolve()
    except OSError:
        return False


@dataclass(slots=True)
class RejectGroup:
    """Layouts rejected by one rule: how many, and a few of the messages."""

    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, count: int, message: str) -> None:
        self.count += count
        if message not in self.examples and len(self.examples) < 3:
            self.examples.append(message)


@dataclass(slots=True)
class SpaceSummary:
    """The result of enumerating a space for one model and cluster."""

    total: int
    valid: list[Layout]
    rejected: dict[str, RejectGroup]
    via_derive: dict[Layout, tuple[str, ...]] = field(default_factory=dict)
    """The valid layouts whose value of some dimension was resolved from `derive`, with
    those dimensions (a layout may also come from a listed value: then it is in both)."""
    costs: dict[Layout, CostEstimate] = field(default_factory=dict)
    """Cost estimates (the default constants) of valid layouts whose pipeline split the
    enumeration chose by them (derive.best_split): a plan's ranking need not price them
    again."""
    memory: MemoryMemo | None = None
    """The memory estimates the enumeration made (of the model, cluster and constants it was
    given), for the search's gate to read instead of estimating the same layouts again."""

    def valid_values(self, dim: str) -> list[Any]:
        """The candidates of `dim` that appear in at least one valid layout."""
        seen = {getattr(s, dim) for s in self.valid}
        return sorted(seen, key=lambda v: (str(type(v)), v))


def _product(options: dict[str, tuple[Any, ...]]) -> Iterator[dict[str, Any]]:
    names = list(options)
    for values in itertools.product(*(options[n] for n in names)):
        yield dict(zip(names, values, strict=True))


_LAST: list[tuple[tuple[SearchSpace, ModelSpec, ClusterSpec, MemoryParams | None],
                 SpaceSummary]] = []
"""The last enumeration and what it was of: the CLI checks a space before a search and the
search enumerates the same space again, which for thousands of GPUs took seconds each."""


def enumerate_space(space: SearchSpace, model: ModelSpec, cluster: ClusterSpec,
                    params: MemoryParams | None = None) -> SpaceSummary:
    """Every combination of the space, split into valid layouts and rejections by rule
    (`_enumerate`); the same question twice in a row is answered from the first answer.
    `params`: the memory constants that resolve `derive` (the defaults when None)."""
    key = (space, model, cluster, params)
    if not _LAST or _LAST[0][0] != key:
        _LAST[:] = [(key, _enumerate(space, model, cluster, params))]
    summary = _LAST[0][1]
    # A copy of the lists: a caller may change its summary, never the remembered one.
    return SpaceSummary(total=summary.total, valid=list(summary.valid),
                        rejected=dict(summary.rejected), via_derive=dict(summary.via_derive),
                        costs=dict(summary.costs), memory=summary.memory)


def any_valid(space: SearchSpace, model: ModelSpec, cluster: ClusterSpec,
              params: MemoryParams | None = None) -> bool:
    """Whether some layout of the space passes every rule: the enumeration, stopped at the
    first valid layout. The CLI's check before a search: the search enumerates the space it
    searches itself (the backend's, autotune.commands.search._runnable_space, which may differ
    in impl and fp8), and a second whole enumeration took a third of a gpt-1t plan on 3072
    GPUs; the whole one is needed only to say why no layout is valid."""
    return bool(_enumerate(space, model, cluster, params, first=True).valid)


def _choices(options: dict[str, tuple[Any, ...]], partial: Layout,
             model: ModelSpec) -> Iterator[dict[str, Any]]:
    """One level's combinations; a `divisors` dimension takes the values Megatron accepts
    with the level's other choices (vpp: the stage layers the uneven split leaves)."""
    listed = {d: v for d, v in options.items() if v != (DIVISORS,)}
    enumerated = [d for d, v in options.items() if v == (DIVISORS,)]
    for choice in _product(listed):
        if not enumerated:
            yield choice
            continue
        with_choice = with_fields(partial, **choice)
        values = {d: divisor_values(d, with_choice, model) or (1,) for d in enumerated}
        for extra in _product(values):
            yield {**choice, **extra}


class _Kept(NamedTuple):
    """The pipeline splits a level keeps for the complete layout to choose from (the fields
    of derive.JointCandidates): none where one split is all there is."""

    tied: tuple[dict[str, Any], ...]
    roomiest: dict[str, Any] | None


_NONE_KEPT = _Kept((), None)


def _enumerate(space: SearchSpace, model: ModelSpec, cluster: ClusterSpec,
               params: MemoryParams | None = None, *, until: int = LEVELS,
               lazy: bool = True, first: bool = False) -> SpaceSummary:
    """Rules are checked level by level, so a layout rejected at level k is counted once for
    all combinations of the deeper dimensions instead of being expanded. A `derive` choice is
    resolved (autotune.search.derive.resolve) before the rules of its level read it.
    `until`: the levels enumerated; below LEVELS the valid layouts are the partial ones that
    pass every rule of the levels before it (their deeper fields at Layout's defaults).
    `lazy`: resolve a derived count only for a layout that the rules reading no count pass,
    and once for layouts that differ only in fields no memory estimate reads (the same
    result; False resolves every combination first, as tests compare).
    `first`: stop at the first valid layout (any_valid; the total and rejections then count
    only what was reached)."""
    levels = [space.at_level(level) for level in range(LEVELS)]
    # The dimensions of each level that may be `derive`: most levels have none (the FP8
    # level's, with most of a plan's combinations), and their choices need no search for it.
    derivable = [tuple(d for d, v in options.items() if DERIVE in v) for options in levels]
    deeper = [math.prod(len(v) for lv in levels[k + 1:] for v in lv.values())
              for k in range(LEVELS)]
    rejected: dict[str, RejectGroup] = {}
    valid: list[Layout] = []
    via_derive: dict[Layout, tuple[str, ...]] = {}
    base = Layout(gbs=model.global_batch_size)
    rules_at = [[rule for rule in RULES if rule.level == level] for level in range(LEVELS)]
    # By the allocator (level 5, with the derived counts): expandable segments' band is narrower.
    limits = {on: safe_limit_bytes(cluster, expandable=on) for on in (False, True)}
    # Every memory estimate of the enumeration, once per memory_key: the derived counts'
    # bisections, the pipeline split's choice, the raises; the search's gate reads them after
    # (SpaceSummary.memory).
    memo = MemoryMemo(model, cluster, params)
    peak_of = memo.peak_bytes
    # A level's rules are checked on the layout with its derived counts at their placeholders
    # (the levers' defaults) before the counts are resolved (a bisection of memory estimates
    # each): where the first rule broken reads no derived count (Derivable.rules), the
    # resolved layout breaks it too, and every rule before it passes there (one that reads
    # no count answers alike; one that reads a count passes every value the resolver gives,
    # and at the placeholder the resolver leaves, passed already), so the layout is rejected
    # by it unresolved. Otherwise the count is resolved and the rules that read it are checked
    # again (all of them where one broke at the placeholder).
    split: dict[tuple[int, tuple[str, ...]], tuple[frozenset[str], list[Rule]]] = {}
    # A count derived at its level is resolved with the deeper fields at their defaults (FP8,
    # level 6, off). Where a deeper choice needs more memory (FP8's weight copies: Llama-3.2-3B
    # at seq 8192 on an H100 fits with 12 layers recomputed in bf16 and needs 18 with FP8),
    # the count derived for bf16 would leave the layout predicted out of memory and no count
    # that fits it in the space: the count is raised to the fewest that fits there. One
    # estimate for a layout that still fits (a count too high for a choice that needs less
    # is left to the ladder, which moves it down by what trials measure).

    raised: dict[tuple[object, ...], dict[str, Any]] = {}
    """By memory_key: the counts _raised gave (layouts that differ only in fields no estimate
    reads, the overlap flags, raise alike: gpt-1t's plan on 3,072 GPUs took 20.8 s CPU without
    it, 19.0 s with it, one run each)."""

    def _raised(layout: Layout, counts: tuple[str, ...]) -> Layout:
        # FP8 is the only deeper level that reads memory; without its weight copies it needs
        # no more than the bf16 layout the count fits (autotune.levers.fp8.may_outgrow_bf16):
        # half of a default plan's FP8 layouts, an estimate each spared.
        if not may_outgrow_bf16(layout):
            return layout
        dims = tuple(d for d in counts
                     if DERIVABLE[d].applies(layout, model) and DERIVABLE[d].monotone(layout))
        if not dims:
            return layout
        key = memory_key(layout)
        known = raised.get(key)
        if known is None:
            limit_here = limits[layout.expandable_segments]
            if peak_of(layout) > limit_here:  # the split's choice reads the same memo
                layout = resolve(layout, dims, model, cluster, limit_bytes=limit_here,
                                 params=params, floor={d: getattr(layout, d) for d in dims},
                                 memo=memo)
            known = raised[key] = {d: getattr(layout, d) for d in dims}
        return with_fields(layout, **known)

    def rules_for(level: int, derived: tuple[str, ...]) -> tuple[frozenset[str], list[Rule]]:
        """The names of the level's rules that read a count of `derived`, and those rules."""
        key = (level, derived)
        if key not in split:
            reading = frozenset(name for d in derived for name in DERIVABLE[d].rules)
            split[key] = (reading, [r for r in rules_at[level] if r.name in reading])
        return split[key]

    # The pipeline split (a joint choice, resolve_joint) is made at its level with the deeper
    # fields at their defaults, where several splits may tie (joint_candidates): those are
    # carried down as `splits` and the complete layout takes the best of them (best_split),
    # each with the deeper counts it derives, checked against the rules that read a derived
    # count (Derivable.rules: the split's pp_layers and vpp_layers, recompute's chunk rules,
    # which read the stages' layers too): the only ones another split or the counts it derives
    # can break; every other reads the same fields.
    reading_counts = {name for d in DERIVABLE.values() for name in d.rules}
    later = [rule for rule in RULES if rule.name in reading_counts]
    # The layouts (by memory_key at mbs 1) none of whose splits fits: a layout's peak grows
    # with its micro-batch (what is in flight, min(pp, m) x mbs sequences, never falls;
    # autotune.predict.memory), so the same layout at a larger micro-batch (the mbs level is
    # enumerated before the deeper ones) fits with none either, and which of them it keeps
    # matters to no ranking (the gate refuses each). Per family, the least such micro-batch.
    crowded: dict[tuple[object, ...], int] = {}
    costs: dict[Layout, CostEstimate] = {}
    recounted: dict[tuple[object, ...], dict[str, Any]] = {}  # an alternative's deeper counts

    def resolved(layout: Layout, derived: tuple[str, ...]) -> tuple[Layout, _Kept]:
        """`layout` with `derived` resolved, and the joint split's candidates where more than
        one is kept (their fields; none otherwise)."""
        joint = joint_dims(derived)
        options = _NONE_KEPT
        if joint:
            found = joint_candidates(layout, joint, model, cluster,
                                     limit_bytes=limits[layout.expandable_segments],
                                     params=params, memo=memo)
            layout = found.tied[0]
            if len(found.tied) > 1 or found.roomiest is not None:
                def fields(c: Layout) -> dict[str, Any]:
                    return {d: getattr(c, d) for d in joint}
                options = _Kept(tuple(map(fields, found.tied)),
                                None if found.roomiest is None else fields(found.roomiest))
            derived = tuple(d for d in derived if d not in joint)
        if derived:
            layout = resolve(layout, derived, model, cluster,
                             limit_bytes=limits[layout.expandable_segments], params=params,
                             memo=memo)
        return layout, options

    def settle(layout: Layout, kept: _Kept, derived: tuple[str, ...]) -> Layout:
        """The best of `layout` with each split `kept` holds (best_split): the tied ones, and
        the roomiest where none of them fits; each alternative with the other counts in
        `derived` resolved again for its stages and passing the rules that read them."""
        family = memory_key(with_fields(layout, mbs=1))
        if layout.mbs >= crowded.get(family, layout.mbs + 1):
            return layout
        limit = limits[layout.expandable_segments]  # a split leaves the allocator as it is
        deeper = tuple(d for d in derived if d not in kept.tied[0])

        def alternatives(splits: Iterable[dict[str, Any]]) -> list[Layout]:
            options = []
            for split in splits:
                alt = with_fields(layout, **split)
                if alt != layout:
                    if deeper:
                        # Layouts that differ only in MEMORY_BLIND fields resolve alike.
                        key = (deeper, memory_key(alt))
                        known = recounted.get(key)
                        if known is None:
                            alt = resolve(alt, deeper, model, cluster, limit_bytes=limit,
                                          params=params, memo=memo)
                            recounted[key] = {d: getattr(alt, d) for d in deeper}
                        else:
                            alt = with_fields(alt, **known)
                    if any(rule.check(alt, model, cluster) is not None for rule in later):
                        continue
                options.append(alt)
            return options

        # Only the splits the level kept: weighing every split megatron-core accepts at every
        # layout took DeepSeek-V3's enumeration on 1,024 GPUs from 6 to 122 s CPU (24 splits
        # at pp 4), 97 s where only the layouts a kept split lets fit weigh them all.
        options = alternatives(kept.tied)
        if kept.roomiest is not None and all(peak_of(alt) > limit for alt in options):
            options += alternatives((kept.roomiest,))
        if all(peak_of(alt) > limit for alt in options):
            crowded[family] = min(layout.mbs, crowded.get(family, layout.mbs))
        return best_split(options, model, cluster, limit_bytes=limit, params=params,
                          memo=memo, costs=costs)

    def expand(level: int, partial: Layout, earlier: tuple[str, ...],
               splits: _Kept = _NONE_KEPT) -> bool:
        """`earlier`: the dimensions a shallower level resolved from `derive` for `partial`,
        carried down so that the valid layout records every one (not only the last level's);
        `splits`: the pipeline splits a shallower level kept for it (resolved above).
        Returns whether to stop (`first` and a valid layout found)."""
        # The counts resolved for `partial`, by the choice's fields that memory reads: choices
        # that differ only in MEMORY_BLIND fields resolve alike, once.
        counts: dict[tuple[Any, ...], tuple[dict[str, Any], _Kept]] = {}
        # The counts a shallower level derived, which a deeper choice may have to raise
        # (_raised); the joint split is settled apart (settle).
        counts_before = tuple(d for d in earlier if DERIVABLE[d].joint is None)
        for choice in _choices(levels[level], partial, model):
            derived = tuple(d for d in derivable[level] if choice[d] == DERIVE)
            if derived:
                # A placeholder the resolver replaces: the lever's default.
                choice = {**choice, **{d: DERIVABLE[d].off for d in derived}}
            layout = with_fields(partial, **choice)
            rules = rules_at[level]
            kept = splits
            if derived and level and lazy:
                # Level 0 (dp follows) has no derivable dimension.
                reading, rules = rules_for(level, derived)
                broken = None
                for rule in rules_at[level]:
                    broken = rule.check(layout, model, cluster)
                    if broken is not None:
                        break
                if broken is not None and rule.name not in reading:
                    rejected.setdefault(rule.name, RejectGroup()).add(deeper[level], broken)
                    continue
                # A derived placeholder equals a listed default (offload_layers: [0, derive]).
                key = (derived, *(v for d, v in choice.items() if d not in MEMORY_BLIND))
                known = counts.get(key)
                if known is None:
                    layout, options = resolved(layout, derived)
                    counts[key] = ({d: getattr(layout, d) for d in derived}, options)
                else:
                    layout = with_fields(layout, **known[0])
                    options = known[1]
                kept = options if options.tied else splits
                if broken is not None:
                    rules = rules_at[level]
            elif derived:
                layout, options = resolved(layout, derived)
                kept = options if options.tied else splits
            if counts_before and any(v != getattr(partial, d) for d, v in choice.items()
                                     if d not in MEMORY_BLIND):
                layout = _raised(layout, counts_before)
            if level == 0:
                layout = with_fields(layout, dp=derive_dp(
                    cluster.num_gpus, tp=layout.tp, pp=layout.pp, cp=layout.cp))
            # Candidates are positive (checked on load), so only this level's rules remain.
            for rule in rules:
                message = rule.check(layout, model, cluster)
                if message is not None:
                    rejected.setdefault(rule.name, RejectGroup()).add(deeper[level], message)
                    break
            else:
                if level + 1 < until:
                    if expand(level + 1, layout, earlier + derived, kept):
                        return True
                else:
                    if kept.tied and until == LEVELS and not first:
                        layout = settle(layout, kept, earlier + derived)
                    valid.append(layout)
                    if earlier + derived:
                        via_derive[layout] = earlier + derived
                    if first:
                        return True
        return False

    expand(0, base, ())
    # A `divisors` dimension has as many values as the layout it completes allows: counted
    # where the enumeration reached it, as one where a rule rejected the layout before.
    total = len(valid) + sum(group.count for group in rejected.values())
    return SpaceSummary(total=total, valid=valid, rejected=rejected, via_derive=via_derive,
                        costs=costs, memory=memo)


@dataclass(frozen=True, slots=True)
class BatchShortfall:
    """Every data-parallel size the GPUs leave misses a factor of the global batch."""

    dps: tuple[int, ...]
    """The data-parallel sizes of the layouts that pass every rule before the batch's."""
    gbs: int
    factor: int
    """The smallest factor one of them lacks (dp / gcd(dp, gbs))."""
    batches: tuple[int, ...]
    """The nearest global batches below and above `gbs` that one of them divides."""

    def describe(self, model: ModelSpec, gpus: int) -> str:
        sizes = ", ".join(map(str, self.dps[:-1])) + (" or " if len(self.dps) > 1 else "") \
            + str(self.dps[-1])
        batches = " or ".join(map(str, self.batches))
        return (f"no layout of {model.name} can use {gpus} GPUs: Megatron needs mbs x dp to "
                f"divide global_batch_size={self.gbs}, and every layout's dp ({sizes}: the "
                "GPUs over the tp, pp and cp the model and space allow) has a factor the batch "
                f"lacks (the smallest: {self.factor}); give --gbs a multiple of "
                f"{self.factor} (e.g. {batches}) or a GPU count without the factor {self.factor}")


def batch_shortfall(space: SearchSpace, model: ModelSpec,
                    cluster: ClusterSpec) -> BatchShortfall | None:
    """Why no layout takes the global batch, when that is what rules every layout out: each
    data-parallel size the GPUs leave (after the tp, pp and cp the model and space allow) has a
    factor the global batch lacks (the rule `gbs_batch`: mbs x dp must divide it; 24 GPUs and
    a batch of 512 for a model of 32 layers: dp is 3, 6, 12 or 24). None when some
    data-parallel size divides the batch (another rule of the batch's level binds) or no
    layout reaches that level."""
    reached = _enumerate(space, model, cluster, until=RULE_LEVELS["gbs_batch"]).valid
    dps = sorted({s.dp for s in reached})
    gbs = model.global_batch_size
    if not dps or any(gbs % dp == 0 for dp in dps):
        return None
    factor = min(dp // math.gcd(dp, gbs) for dp in dps)
    takers = [dp for dp in dps if dp // math.gcd(dp, gbs) == factor]
    # gbs x factor / 2^k: the factor times the batch, its powers of two given up one by one
    # (512 and 3: 1536, 768, 384, ...); the nearest below and above that one of them divides.
    scaled = [gbs * factor >> k for k in range((gbs & -gbs).bit_length())]
    fitting = [b for b in scaled if any(b % dp == 0 for dp in takers)]
    near = (max((b for b in fitting if b < gbs), default=None),
            min((b for b in fitting if b > gbs), default=None))
    return BatchShortfall(dps=tuple(dps), gbs=gbs, factor=factor,
                          batches=tuple(b for b in near if b is not None))


def describe_limits(summary: SpaceSummary, space: SearchSpace, model: ModelSpec,
                    cluster: ClusterSpec) -> list[str]:
    """Sentences about dimensions the model or cluster restricts (`tp is limited to 1 ...`)."""
    notes: list[str] = []
    for dim in ("tp", "pp", "cp", "ep", "vpp"):
        offered = space.candidates.get(dim, ())
        allowed = summary.valid_values(dim)
        if len(offered) > 1 and len(allowed) < len(offered) and summary.valid:
            notes.append(_limit_sentence(dim, allowed, model, cluster))
    return notes


def _limit_sentence(dim: str, allowed: Sequence[Any], model: ModelSpec,
                    cluster: ClusterSpec) -> str:
    values = ", ".join(str(v) for v in allowed)
    head = f"{dim} is limited to {values}"
    if dim == "tp":
        node = (f"divide the {cluster.gpus_per_node} GPUs of a node"
                if cluster.num_gpus > cluster.gpus_per_node
                else f"fit in a node of {cluster.gpus_per_node} GPUs")
        return (f"{head}: tp must divide num_attention_heads={model.num_attention_heads}"
                f" (and num_query_groups={model.query_groups}) and {node}")
    if dim == "pp":
        return (f"{head}: pp must divide the GPU count, and num_layers={model.num_layers} "
                "or, with the pipeline split, the layers the end stages leave")
    if dim == "cp":
        return f"{head}: cp needs Transformer Engine attention and seq_length divisible by 2*cp"
    if dim == "ep":
        return (f"{head}: {model.name} has no experts" if not model.is_moe
                else f"{head}: ep must divide num_experts={model.num_experts} and the GPUs")
    return f"{head}: vpp must divide the layers per pipeline stage and needs pp >= 2"
