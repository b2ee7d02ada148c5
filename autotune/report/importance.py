"""Which search dimensions moved tokens/s: Optuna's parameter importances, and what they mean
for the sample they were computed on.

Importances are only as good as the trials under them: over TPE's adaptive sample they rank the
dimensions near the good layouts; over a grid they split the variance across every layout the
grid ran; over the model's ranked best layouts (or Alpa's seeds alone) they would describe how
that list was chosen, so they are left out.
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Iterable
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.search.records import RECORD_ATTR, Source

__all__ = ["MIN_TRIALS", "Sample", "importance_caption", "sample_of", "tokens_importances"]

MIN_TRIALS = 4
"""Fewer COMPLETE trials than this say nothing about importance."""


class Sample(enum.StrEnum):
    """What the COMPLETE trials are a sample of, by who proposed them."""

    ADAPTIVE = "adaptive"
    """TPE proposed some: an adaptive sample, dense near the good layouts."""
    GRID = "grid"
    """The grid: every valid layout in order (all of them unless the search stopped early)."""
    RANKED = "ranked"
    """The analytical model's best layouts, best first: not a sample of the space."""
    SEEDS = "seeds"
    """Only Alpa's seeds, the model's fallback picks and bisections: chosen, not sampled."""


def sample_of(sources: Iterable[str]) -> Sample:
    """The kind of sample trials proposed by `sources` (records' `source`) make."""
    seen = {Source.read(s) for s in sources}
    if Source.SAMPLER in seen:
        return Sample.ADAPTIVE
    if Source.GRID in seen:
        return Sample.GRID
    return Sample.RANKED if Source.RANKED in seen else Sample.SEEDS


def _source(trial: optuna.trial.FrozenTrial) -> str:
    record: Any = trial.user_attrs.get(RECORD_ATTR)
    if isinstance(record, dict) and record.get("source"):
        return str(record["source"])
    return str(trial.user_attrs.get("source", Source.SAMPLER))


_LEFT_OUT = {
    Sample.RANKED: "the analytical model's best layouts in its order (--sampler ranked)",
    Sample.SEEDS: "layouts chosen by Alpa's heuristics and the model, not by a sampler",
}


def tokens_importances(study: optuna.Study) -> dict[str, float] | str:
    """Importances of the parameters for tokens/s (objective 0) over COMPLETE trials, or a
    sentence saying why there are none (too few trials, nothing varied, or trials that are no
    sample of the space: a ranking or the seeds alone)."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.values]
    if len(done) < MIN_TRIALS:
        return (f"Too few COMPLETE trials for parameter importances ({len(done)}; "
                f"at least {MIN_TRIALS}).")
    sample = sample_of(_source(t) for t in done)
    if sample in _LEFT_OUT:
        return (f"Left out: the {len(done)} COMPLETE trials are {_LEFT_OUT[sample]}, not a "
                "sample of the search space; importances over them would describe how they "
                "were picked, not which dimensions move tokens/s.")
    names = {name for t in done for name in t.params}
    varied = {name for name in names if len({repr(t.params.get(name)) for t in done}) > 1}
    if not varied:
        return "No parameter took more than one value among the COMPLETE trials."
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ExperimentalWarning of the evaluators
            importances = optuna.importance.get_param_importances(
                study, params=sorted(varied), target=lambda t: t.values[0])
    except (ValueError, RuntimeError) as exc:
        return f"Parameter importances unavailable: {exc}"
    return {name: float(value) for name, value in importances.items()}


def importance_caption(sources: Iterable[str], predicted: bool) -> str:
    """What the importances of trials proposed by `sources` are, for the report."""
    of = "the analytical model's predicted tokens/s" if predicted else "the measured tokens/s"
    if sample_of(sources) is Sample.GRID:
        return (f"Computed over the grid's trials (every valid layout it ran, not a sample): "
                f"each dimension's share of the variance of {of} across them.")
    return (f"Computed over an adaptive sample: TPE proposed most trials near the good "
            f"layouts, so these rank the dimensions that mattered there for {of}, not across "
            "the whole space.")
