"""A study's parameters and the layouts they stand for.

Every valid layout is a point of the study's categorical dimensions: the dimensions whose valid
candidates number more than one are the study's parameters (free), the others are the same in
every trial (fixed). Candidate lists are fixed per study (the study name hashes the space).
Several valid layouts may be the same run (autotune.identity: they give Megatron the same
configuration); each maps to one of them, and the search knows only those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution

from autotune.dimensions import plain
from autotune.errors import ConfigError
from autotune.identity import representatives
from autotune.layout import LAYOUT_DEFAULTS, Layout
from autotune.model import ModelSpec
from autotune.search.config import SearchConfig
from autotune.space import enumerate_space

__all__ = ["LayoutMap", "ParamsKey", "layout_params", "params_key"]

ParamsKey = tuple[Any, ...]
"""A hashable form of a trial's parameters."""


def layout_params(layout: Layout, free: Mapping[str, tuple[Any, ...]]) -> dict[str, Any]:
    """The study parameters of a layout: its values of the free dimensions."""
    return {dim: plain(getattr(layout, dim)) for dim in free}


def params_key(params: Mapping[str, Any]) -> ParamsKey:
    return tuple(sorted(params.items()))


class LayoutMap:
    """The study's dimensions and the two-way mapping between parameters and layouts."""

    def __init__(self, valid: Sequence[Layout], candidates: Mapping[str, tuple[Any, ...]],
                 *, model: ModelSpec) -> None:
        """`valid`: every valid layout of the space; `candidates`: per dimension of the space,
        the values that appear in a valid layout; `model`: what the layouts train."""
        self.gbs = model.global_batch_size
        self.candidates = {d: tuple(plain(x) for x in v) for d, v in candidates.items()}
        """Per dimension of the space, its candidates in a valid layout (as stored)."""
        self.free = {d: v for d, v in candidates.items() if len(v) > 1}
        """The study's parameters, each with its candidates."""
        self.fixed = {d: v[0] for d, v in candidates.items() if len(v) == 1}
        self.distributions: dict[str, BaseDistribution] = {
            d: CategoricalDistribution([plain(x) for x in v]) for d, v in self.free.items()}
        # Each parameter combination of a valid layout maps to the layout that runs for it.
        runs = representatives(model, valid)
        self.by_key = {params_key(self.params(s)): runs[s] for s in valid}
        self.valid = list(dict.fromkeys(self.by_key.values()))
        """One layout of each set of valid layouts that are the same run."""

    @classmethod
    def of(cls, cfg: SearchConfig) -> LayoutMap:
        """The map of the configured space, model and GPUs."""
        summary = enumerate_space(cfg.space, cfg.model, cfg.cluster)
        if not summary.valid:
            raise ConfigError(f"no valid layout of {cfg.model.name} on "
                              f"{cfg.cluster.num_gpus} GPUs in this search space")
        candidates = {d: tuple(summary.valid_values(d)) for d in cfg.space.candidates}
        return cls(summary.valid, candidates, model=cfg.model)

    def params(self, s: Layout) -> dict[str, Any]:
        return layout_params(s, self.free)

    def layout(self, params: Mapping[str, Any]) -> Layout | None:
        """The layout that runs for a trial's parameters (one per run key); None when they
        break a rule."""
        # A trial stored before the space freed a dimension (e.g. cross_entropy_fusion added
        # to the YAML for --resume) has no parameter for it: it ran with Layout's default.
        return self.by_key.get(params_key({d: params.get(d, LAYOUT_DEFAULTS[d])
                                           for d in self.free}))

    def proposal(self, params: Mapping[str, Any]) -> Layout:
        """The layout a proposal that breaks a rule names, for its INVALID record: its
        parameters and the fixed dimensions, everything else (dp) at Layout's default."""
        values = {**params, **self.fixed}
        return Layout(gbs=self.gbs, **{k: v for k, v in values.items()
                                       if k in Layout.__dataclass_fields__})

    def is_valid(self, s: Layout) -> bool:
        return params_key(self.params(s)) in self.by_key

    def key(self, s: Layout) -> ParamsKey:
        """Equal for two valid layouts that are the same run.

        Only a valid layout is mapped to the layout that runs for it: an INVALID record's
        layout is built from the proposal's parameters with dp left at 1, and mapping it
        could give the key of a real layout, which would then never run."""
        raw = params_key(self.params(s))
        valid = self.by_key.get(raw)
        return raw if valid is None else params_key(self.params(valid))

    def params_key(self, params: Mapping[str, Any]) -> ParamsKey:
        """`key` of the layout that a trial's parameters stand for."""
        s = self.layout(params)
        return params_key(params) if s is None else self.key(s)
