"""A study's parameters and the layouts they stand for.

Every valid layout is a point of the study's categorical dimensions: the dimensions whose valid
candidates number more than one are the study's parameters (free), the others are the same in
every trial (fixed). Candidate lists are fixed per study (the study name hashes the space).
Several valid layouts may be the same run (autotune.megatron.identity: they give Megatron the same
configuration); each maps to one of them, and the search knows only those.

A dimension the space marks `derive` (autotune.search.derive) is a parameter only where the
space also lists values for it (`offload_layers: [0, derive]`: the sampler picks between no
offload and the derived count); the resolved value is not a parameter but part of the layout,
its record and its run parameters, so the search can move it (autotune.search.ladder) without
Optuna's distributions changing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution

from autotune.dimensions import plain
from autotune.errors import ConfigError
from autotune.layouts.layout import DIMENSIONS, LAYOUT_DEFAULTS, Layout, with_fields
from autotune.megatron.identity import representatives
from autotune.search.config import SearchConfig
from autotune.search.derive import DERIVABLE, DERIVE
from autotune.search.space import enumerate_space
from autotune.specs.model import ModelSpec

__all__ = ["FrozenParams", "LayoutMap", "freeze_params", "layout_params"]

FrozenParams = tuple[Any, ...]
"""A trial's parameters in a hashable form (freeze_params)."""


def layout_params(layout: Layout, free: Mapping[str, tuple[Any, ...]]) -> dict[str, Any]:
    """The study parameters of a layout: its values of the free dimensions."""
    return {dim: plain(getattr(layout, dim)) for dim in free}


def freeze_params(params: Mapping[str, Any]) -> FrozenParams:
    return tuple(sorted(params.items()))


class LayoutMap:
    """The study's dimensions and the two-way mapping between parameters and layouts."""

    def __init__(self, valid: Sequence[Layout], candidates: Mapping[str, tuple[Any, ...]],
                 *, model: ModelSpec, via_derive: Mapping[Layout, tuple[str, ...]] | None = None
                 ) -> None:
        """`valid`: every valid layout of the space; `candidates`: per dimension of the space,
        the values that appear in a valid layout (`derive` for a derived dimension: the
        values listed beside it, and the marker where it resolved some layout); `model`: what
        the layouts train; `via_derive`: the valid layouts resolved from `derive`, with the
        dimensions resolved (SpaceSummary.via_derive)."""
        self.gbs = model.global_batch_size
        self.candidates = {d: tuple(plain(x) for x in v) for d, v in candidates.items()}
        """Per dimension of the space, its candidates in a valid layout (as stored)."""
        self.derived = tuple(d for d, v in candidates.items() if DERIVE in v)
        """The dimensions the space marks `derive`, resolved per layout."""
        self._listed = {d: frozenset(plain(x) for x in candidates[d] if x != DERIVE)
                        for d in self.derived}
        self.free = {d: v for d, v in candidates.items() if len(v) > 1}
        """The study's parameters, each with its candidates."""
        self.fixed = {d: v[0] for d, v in candidates.items() if len(v) == 1}
        self.distributions: dict[str, BaseDistribution] = {
            d: CategoricalDistribution([plain(x) for x in v]) for d, v in self.free.items()}
        # Each parameter combination of a valid layout maps to the layout that runs for it; a
        # layout resolved from `derive` is also reached by the parameter `derive`.
        runs = representatives(model, valid)
        self.by_params: dict[FrozenParams, Layout] = {}
        # freeze_params(self.params(s)) for every valid layout (200k in a plan of mixtral-8x7b
        # on 64 GPUs), built as the sorted tuple at once: the parameters in name order, a
        # derived one not listed as `derive`.
        names = sorted(self.free)
        position = {dim: i for i, dim in enumerate(names)}
        many = attrgetter(*names) if len(names) > 1 else None

        def read(s: Layout) -> tuple[Any, ...]:
            return many(s) if many is not None else tuple(getattr(s, d) for d in names)

        # Only an enum dimension's value is changed by `plain` (int and bool ones are plain).
        enums = [i for i, dim in enumerate(names) if DIMENSIONS[dim].choices is not None]
        derived = [(position[d], self._listed[d]) for d in self.derived if d in position]
        for s in valid:
            values = list(read(s))
            for i in enums:
                values[i] = plain(values[i])
            for i, listed in derived:
                if values[i] not in listed:
                    values[i] = DERIVE
            self.by_params.setdefault(tuple(zip(names, values, strict=True)), runs[s])
            for dim in (via_derive or {}).get(s, ()):
                if dim in position:
                    values_derived = list(values)
                    values_derived[position[dim]] = DERIVE
                    self.by_params.setdefault(tuple(zip(names, values_derived, strict=True)),
                                              runs[s])
        self.valid = list(dict.fromkeys(self.by_params.values()))
        """One layout of each set of valid layouts that are the same run."""
        enumerated = set(valid)
        self.checked = frozenset(s for s in self.valid if s in enumerated)
        """The layouts of `valid` that the enumeration checked against every rule (not one that
        the hand rules of autotune.megatron.identity changed): the gate need not check them
        again."""

    @classmethod
    def of(cls, cfg: SearchConfig) -> LayoutMap:
        """The map of the configured space, model and GPUs."""
        summary = enumerate_space(cfg.space, cfg.model, cfg.cluster, cfg.memory_params)
        if not summary.valid:
            raise ConfigError(f"no valid layout of {cfg.model.name} on "
                              f"{cfg.cluster.num_gpus} GPUs in this search space")
        derived = set(cfg.space.derived)
        candidates: dict[str, tuple[Any, ...]] = {}
        for d in cfg.space.candidates:
            if d in derived:
                listed = [v for v in cfg.space.literal(d) if v in summary.valid_values(d)]
                marker = (DERIVE,) if any(d in dims for dims in summary.via_derive.values()) \
                    else ()
                candidates[d] = (*listed, *marker) or (DERIVE,)
            else:
                candidates[d] = tuple(summary.valid_values(d))
        return cls(summary.valid, candidates, model=cfg.model, via_derive=summary.via_derive)

    def params(self, s: Layout) -> dict[str, Any]:
        """The study parameters of `s`: a derived dimension's value is `derive` unless the
        space lists it (the parameter is the choice; the count is the layout's)."""
        params = layout_params(s, self.free)
        for dim in self.derived:
            if dim in params and params[dim] not in self._listed[dim]:
                params[dim] = DERIVE
        return params

    def derived_values(self, s: Layout) -> dict[str, Any]:
        """`s`'s values of the derived dimensions: what its record and its run parameters add to
        its parameters."""
        return {dim: plain(getattr(s, dim)) for dim in self.derived}

    def with_derived(self, s: Layout, values: Mapping[str, Any] | None) -> Layout:
        """`s` with stored derived values (a trial queued by the ladder, a record read back):
        only the derived dimensions, each an int of the lever's range."""
        if not values or not self.derived:
            return s
        changes = {d: v for d, v in values.items() if d in DERIVABLE and d in self.derived
                   and isinstance(v, int) and not isinstance(v, bool)}
        return with_fields(s, **changes) if changes else s

    def layout(self, params: Mapping[str, Any],
               derived: Mapping[str, Any] | None = None) -> Layout | None:
        """The layout that runs for a trial's parameters (one per run key), with `derived`
        values where a trial carries its own (the ladder's); None when they break a rule."""
        # A trial stored before the space freed a dimension (e.g. cross_entropy_fusion added
        # to the YAML for --resume) has no parameter for it: it ran with Layout's default.
        s = self.by_params.get(freeze_params({d: params.get(d, LAYOUT_DEFAULTS[d])
                                              for d in self.free}))
        return None if s is None else self.with_derived(s, derived)

    def proposal(self, params: Mapping[str, Any]) -> Layout:
        """The layout a proposal that breaks a rule names, for its INVALID record: its
        parameters and the fixed dimensions, everything else (dp) at Layout's default."""
        values = {**params, **self.fixed}
        return Layout(gbs=self.gbs, **{k: v for k, v in values.items()
                                       if k in Layout.__dataclass_fields__})

    def is_valid(self, s: Layout) -> bool:
        return freeze_params(self.params(s)) in self.by_params

    def run_params(self, s: Layout) -> FrozenParams:
        """The parameters of the layout that runs for `s`, with `s`'s derived values: equal
        for two valid layouts that are the same run (one run key, autotune.megatron.identity).

        Only a valid layout is mapped to the layout that runs for it: an INVALID record's
        layout is built from the proposal's parameters with dp left at 1, and mapping it
        could give the run parameters of a real layout, which would then never run."""
        raw = freeze_params(self.params(s))
        valid = self.by_params.get(raw)
        run = raw if valid is None else freeze_params(self.params(valid))
        # Two counts of one derived lever are two runs (the ladder's rungs).
        return run + tuple(sorted(self.derived_values(s).items())) if self.derived else run

    def run_params_of(self, params: Mapping[str, Any]) -> FrozenParams:
        """`run_params` of the layout that a trial's parameters stand for."""
        s = self.layout(params)
        return freeze_params(params) if s is None else self.run_params(s)
