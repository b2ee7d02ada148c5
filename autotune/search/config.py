"""What a search is asked to do (SearchConfig), and the Optuna sampler that follows from it."""

from __future__ import annotations

import enum
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import optuna

from autotune.errors import ConfigError, parse_choice
from autotune.layouts.layout import Layout
from autotune.predict.cost import CostParams
from autotune.predict.memory import MemoryParams
from autotune.search.backends import Backend
from autotune.search.finalists import FINALISTS
from autotune.search.space import SearchSpace
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.trials.trial import DEFAULT_STABLE_CV

__all__ = ["GRID_LIMIT", "RANKED_DEFAULT", "Sampler", "SearchConfig", "StopRule", "make_sampler",
           "sampler_name"]


class Sampler(enum.StrEnum):
    """Who proposes the layouts: tpe (after Alpa's seeds), grid (every valid layout), ranked
    (the analytical model's best first), or auto: tpe for real trials; for predictions grid
    when the space is small, else ranked."""

    AUTO = "auto"
    TPE = "tpe"
    GRID = "grid"
    RANKED = "ranked"

    @classmethod
    def parse(cls, name: str) -> Sampler:
        return parse_choice(cls, name, "sampler")


class StopRule(enum.StrEnum):
    """What decides that a real-run search has found its answer (autotune.search.stop_rule):
    model (the refitted cost model and its measured error skip layouts that cannot beat the
    best measured, stop the search when no untried one could, and trials stop timing once they
    cannot come within PRUNE_MARGIN of the best), or none (only --trials, --time-budget and
    --patience stop it; every proposal is launched and timed to its end)."""

    MODEL = "model"
    NONE = "none"

    @classmethod
    def parse(cls, name: str) -> StopRule:
        return parse_choice(cls, name, "stop rule")


GRID_LIMIT = 3000
"""With predictions, spaces of at most this many valid layouts are searched exhaustively."""
RANKED_DEFAULT = 200
"""Layouts the ranked sampler tries when --trials is not given."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchConfig:
    model: ModelSpec
    cluster: ClusterSpec
    space: SearchSpace
    backend: Backend
    results_dir: Path = Path("results")
    study_name: str | None = None
    storage: str | None = None
    """An Optuna RDB URL (postgresql://...); default SQLite at results/<study>/study.db."""
    sampler: Sampler = Sampler.AUTO
    """See Sampler; a plain name is accepted and checked."""
    n_trials: int | None = None
    """Stop once the study holds this many launched (or simulated) trials; a resumed study
    counts the ones it already has."""
    time_budget_s: float | None = None
    patience: int | None = None
    """Stop after this many launched trials without a better tokens/s."""
    resume: bool = False
    seed: int = 0
    train_steps: int = 10
    """The most timed steps per trial (fewer once the step time is stable, `stable_cv`)."""
    warmup_steps: int = 3
    stable_cv: float = DEFAULT_STABLE_CV
    """A trial stops timing once the mean of its last step times is known to within this
    fraction (TrialSpec.stable_cv; 0: always `train_steps`)."""
    stop_rule: StopRule = StopRule.MODEL
    """See StopRule; real runs only (a plan's figures are the model's own), and not with the
    grid sampler, whose point is to measure every layout. A plain name is accepted."""
    trial_timeout_s: float | None = None
    """Per-trial timeout; default derived from the predicted step time."""
    cost_params: CostParams | None = None
    memory_params: MemoryParams | None = None
    """Fitted constants (autotune calibrate --output FILE, then --calibration FILE)."""
    refit_after: int = 4
    """With this many measured trials, the cost constants are refitted to them, and the
    model that ranks and times the next trials is the fitted one (0: never)."""
    max_idle_asks: int = 40
    """Consecutive proposals that launch nothing before the model's best untried layout is
    enqueued instead."""
    finalists: int = FINALISTS
    """Before a real search stops (but on Ctrl-C or a spent --time-budget), its best this many
    layouts are measured again until each has `finalist_runs` runs, and the search decides on
    the repeated figures (autotune.search.finalists); 0: never."""
    finalist_runs: int = 3
    """Runs of each finalist, the first measurement included."""
    seeds: tuple[Layout, ...] = ()
    """Layouts tried first, before the sampler's own (Source.USER): a user's own layout, read
    from their Megatron-LM command (`--from-megatron`). Each must be a valid layout of the
    space (autotune.commands.from_megatron widens the space to hold it)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "sampler", Sampler.parse(self.sampler))
        object.__setattr__(self, "stop_rule", StopRule.parse(self.stop_rule))
        if self.finalists < 0 or self.finalist_runs < 1:
            raise ConfigError(f"finalists must be at least 0 and their runs at least 1, got "
                              f"{self.finalists} and {self.finalist_runs}")
        if not (math.isfinite(self.stable_cv) and 0 <= self.stable_cv < 1):
            raise ConfigError(f"--stable-cv must be at least 0 and below 1 (0: a fixed number "
                              f"of timed steps), got {self.stable_cv:g}")


def sampler_name(cfg: SearchConfig, valid: int) -> Sampler:
    """The sampler a search over `valid` layouts uses: `cfg.sampler`, with auto resolved."""
    if cfg.sampler != Sampler.AUTO:
        return cfg.sampler
    if not cfg.backend.predicted:
        return Sampler.TPE
    return Sampler.GRID if valid <= GRID_LIMIT else Sampler.RANKED


def make_sampler(name: Sampler, seed: int) -> optuna.samplers.BaseSampler:
    if name == Sampler.TPE:
        # Multivariate TPE models the interactions (tp x pp x mbs) that decide memory and speed;
        # `group` models each set of parameters that trials ask together, as the conditional
        # asks make them (autotune.search.layout_map, LayoutMap.ask). Optuna marks it
        # experimental.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                              n_startup_trials=8, constant_liar=True)
    if name in (Sampler.GRID, Sampler.RANKED):
        return optuna.samplers.RandomSampler(seed=seed)  # unused: every trial is enqueued
    raise ConfigError(f"sampler {name!r} must be resolved (sampler_name) before the study")
