"""Which search dimensions moved tokens/s: Optuna's parameter importances."""

from __future__ import annotations

import warnings

import optuna
from optuna.trial import TrialState

__all__ = ["MIN_TRIALS", "tokens_importances"]

MIN_TRIALS = 4
"""Fewer COMPLETE trials than this say nothing about importance."""


def tokens_importances(study: optuna.Study) -> dict[str, float] | str:
    """Importances of the parameters for tokens/s (objective 0) over COMPLETE trials, or a
    sentence saying why there are none."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.values]
    if len(done) < MIN_TRIALS:
        return (f"Too few COMPLETE trials for parameter importances ({len(done)}; "
                f"at least {MIN_TRIALS}).")
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
