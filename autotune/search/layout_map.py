"""A study's parameters and the layouts they stand for.

Every valid layout is a point of the study's categorical dimensions: the dimensions whose valid
candidates number more than one are the study's parameters (free), the others are the same in
every trial (fixed). Candidate lists are fixed per study (the study name hashes the space).

Several valid layouts may be the same run (autotune.megatron.identity: they give Megatron the same
configuration); each maps to one of them, and the search knows only those.

The sampler asks the parameters one at a time, in the order the rules read them (their
enumeration level, then field order: `LayoutMap.ask`), and asks a parameter only where the
valid layouts that agree with the answers so far leave it more than one value: vpp and the
pipeline split's layers only at pp > 1, sequence parallelism only at tp > 1, the optimizer's
parameter gather only with the distributed optimizer, FP8 only with an implementation that has
it, ... (Optuna's conditional parameters). Where one value is left, the parameter is not asked and
the layout takes that value, so a proposal breaks a rule only where the rule leaves a parameter
several values but not all of its choices (cp 4 of 1, 2, 4 with tp 2 on 4 GPUs). The TPE
sampler is wrapped (ValidSampler) so that it proposes only a value that some valid layout has
with the earlier answers: the value is chosen before the trial stores it, so the stored
parameters are the layout that runs and no such proposal is INVALID. The rules stay where they
are (autotune.layouts.layout, autotune.levers): this reads them through the valid layouts of
the space. A parameter keeps its one distribution (all its candidates) in every trial that asks
it, so a study of an earlier version, whose trials hold every parameter, resumes unchanged.

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

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution

from autotune.dimensions import plain
from autotune.errors import ConfigError
from autotune.layouts.layout import DIMENSIONS, LAYOUT_DEFAULTS, Layout, with_fields
from autotune.megatron.identity import representatives
from autotune.predict.cost import CostEstimate
from autotune.predict.memory_memo import MemoryMemo
from autotune.search.config import Sampler, SearchConfig, make_sampler
from autotune.search.derive import DERIVABLE, DERIVE
from autotune.search.space import enumerate_space
from autotune.specs.model import ModelSpec

__all__ = ["ASKED_ATTR", "FrozenParams", "LayoutMap", "ValidSampler", "freeze_params",
           "layout_params", "search_sampler"]

FrozenParams = tuple[Any, ...]
"""A trial's parameters in a hashable form (freeze_params)."""
ASKED_ATTR = "asked"
"""A trial's user attribute, set once LayoutMap.ask has asked every parameter it asks: a
RUNNING trial of another searcher with fewer parameters than the study's is complete then
(autotune.search.shared)."""
_FIELD_ORDER = {name: i for i, name in enumerate(DIMENSIONS)}


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
        self.order = tuple(sorted(names, key=lambda d: (DIMENSIONS[d].level or 0,
                                                        _FIELD_ORDER[d])))
        """The parameters in the order they are asked: a rule of level k reads only the
        dimensions of levels <= k (autotune.layouts.layout), so the answers before a parameter
        decide which of its values a rule leaves."""
        self._next: dict[tuple[Any, ...], tuple[Any, ...]] | None = None
        self.valid = list(dict.fromkeys(self.by_params.values()))
        """One layout of each set of valid layouts that are the same run."""
        enumerated = set(valid)
        self.checked = frozenset(s for s in self.valid if s in enumerated)
        """The layouts of `valid` that the enumeration checked against every rule (not one that
        the hand rules of autotune.megatron.identity changed): the gate need not check them
        again."""
        self.costs: dict[Layout, CostEstimate] = {}
        """Cost estimates the enumeration made at the default constants (SpaceSummary.costs)."""
        self.memory: MemoryMemo | None = None
        """The memory estimates the enumeration made (SpaceSummary.memory), for the gate."""

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
        layouts = cls(summary.valid, candidates, model=cfg.model, via_derive=summary.via_derive)
        layouts.costs = summary.costs
        layouts.memory = summary.memory
        return layouts

    def _values_after(self) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        """Per answers to the first parameters of `order`, the values of the next one that some
        valid layout has with them (built at the first use: a grid or a ranking never needs it)."""
        if self._next is None:
            found: dict[tuple[Any, ...], dict[Any, None]] = {}
            at = [sorted(self.free).index(d) for d in self.order]
            for key in self.by_params:
                values = tuple(key[i][1] for i in at)
                for i in range(len(values)):
                    found.setdefault(values[:i], {})[values[i]] = None
            self._next = {prefix: tuple(v) for prefix, v in found.items()}
        return self._next

    def ask(self, trial: optuna.Trial) -> None:
        """Ask `trial`'s parameters (define-by-run), each only where the answers before it leave
        it more than one value (see the module). Asking stops at the first answer no valid
        layout has with the earlier ones: the proposal breaks a rule (`layout` says None)."""
        after = self._values_after()
        answers: tuple[Any, ...] = ()
        for dim in self.order:
            left = after.get(answers)
            if left is None:
                break
            value = left[0] if len(left) == 1 else \
                trial.suggest_categorical(dim, [plain(x) for x in self.free[dim]])
            answers += (value,)
        trial.set_user_attr(ASKED_ATTR, True)

    def allowed(self, params: Mapping[str, Any], dim: str) -> tuple[Any, ...] | None:
        """The values of parameter `dim` that some valid layout has with a trial's earlier
        answers `params` (those of the parameters before `dim` in `order`; one a trial was not
        asked takes the one value left); None where those answers already break a rule."""
        after = self._values_after()
        answers: tuple[Any, ...] = ()
        for d in self.order:
            left = after.get(answers)
            if left is None or d == dim:
                return left
            answers += (params[d] if d in params and len(left) > 1 else left[0],)
        return None

    def complete(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A trial's value of every parameter: those it was asked, and for each it was not, the
        value the answers before it leave (a trial of LayoutMap.ask), else Layout's default (a
        trial stored before the space freed the dimension: it ran with the default)."""
        if len(params) >= len(self.free) and all(d in params for d in self.free):
            return {d: params[d] for d in self.free}
        after = self._values_after()
        answers: tuple[Any, ...] = ()
        full: dict[str, Any] = {}
        for dim in self.order:
            left = after.get(answers)
            value = params.get(dim, LAYOUT_DEFAULTS[dim])
            if dim not in params and left is not None and len(left) == 1 \
                    and value not in left:
                value = left[0]
            full[dim] = value
            answers += (value,)
        return full

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
        # A parameter the trial was not asked takes the value its earlier answers leave, or
        # (a trial stored before the space freed a dimension, e.g. cross_entropy_fusion added
        # to the YAML for --resume) Layout's default, which it ran with (`complete`).
        s = self.by_params.get(freeze_params(self.complete(params)))
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


_TRIES = 8
"""How many proposals of a parameter ValidSampler asks its sampler for before it takes the
allowed value nearest the last one."""


class ValidSampler(optuna.samplers.BaseSampler):
    """A sampler (TPE) that proposes, for each parameter, only a value some valid layout has
    with the trial's earlier answers (LayoutMap.allowed): a rule that leaves a parameter several
    values but not all its candidates (tp x pp above the GPU count, cp 4 with tp 2 on 4 GPUs,
    mbs above gbs / dp) no longer makes an INVALID proposal.

    The parameter keeps its one distribution (every candidate); only the value proposed
    changes, before the trial stores it, so a trial's stored parameters are the layout that
    runs and TPE learns that layout's outcome. A value of the inner sampler's joint (relative)
    proposal that breaks a rule is dropped with every later one, which are then proposed one
    at a time; one proposal is asked up to _TRIES times of the inner sampler, then the allowed
    value nearest it in candidate order is taken (deterministic: the seeded inner sampler
    decides everything)."""

    def __init__(self, inner: optuna.samplers.BaseSampler, layouts: LayoutMap) -> None:
        self.inner = inner
        self.layouts = layouts

    def infer_relative_search_space(self, study: optuna.Study, trial: optuna.trial.FrozenTrial
                                    ) -> dict[str, BaseDistribution]:
        return self.inner.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        proposed = self.inner.sample_relative(study, trial, search_space)
        kept: dict[str, Any] = {}
        answers = dict(trial.params)
        for dim in self.layouts.order:
            left = self.layouts.allowed(answers, dim)
            if left is None:
                break
            if len(left) == 1:  # not asked
                answers[dim] = left[0]
                continue
            if dim not in proposed or proposed[dim] not in left:
                break
            kept[dim] = answers[dim] = proposed[dim]
        kept.update({d: v for d, v in proposed.items() if d not in self.layouts.free})
        return kept

    def sample_independent(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                           param_name: str, param_distribution: BaseDistribution) -> Any:
        value = self.inner.sample_independent(study, trial, param_name, param_distribution)
        left = self.layouts.allowed(trial.params, param_name) \
            if param_name in self.layouts.free else None
        if not left:
            return value
        for _ in range(_TRIES - 1):
            if value in left:
                return value
            value = self.inner.sample_independent(study, trial, param_name, param_distribution)
        if value in left:
            return value
        choices = [plain(x) for x in self.layouts.free[param_name]]
        at = choices.index(value) if value in choices else 0
        return min(left, key=lambda v: (abs(choices.index(v) - at), choices.index(v)))

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                    state: optuna.trial.TrialState, values: Sequence[float] | None) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()


def search_sampler(name: Sampler, seed: int, layouts: LayoutMap | None
                   ) -> optuna.samplers.BaseSampler:
    """The study's sampler (make_sampler); with `layouts`, TPE wrapped in ValidSampler."""
    inner = make_sampler(name, seed)
    return ValidSampler(inner, layouts) if name == Sampler.TPE and layouts is not None \
        else inner
