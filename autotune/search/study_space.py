"""A study keeps the space it was searched over.

Optuna fixes a categorical parameter's choices for the life of a study, and autotune reads a
trial's layout back from its parameters with the space of the run that reads it. A study
reused with another space (`--study NAME --space other.yaml`) would end, minutes in, in Optuna's
`CategoricalDistribution does not support dynamic value space`, or worse, map old trials to
other layouts. The space's candidates per dimension (those that appear in a valid layout) are
stored with the study; a run whose candidates differ for a dimension both have is refused in
one line before any trial. A dimension the stored space did not have may be added (its old
trials ran at Layout's default, autotune.search.layout_map).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna

from autotune.errors import ConfigError
from autotune.inputs.untrusted import for_terminal

__all__ = ["SPACE_ATTR", "keep_space"]

SPACE_ATTR = "space"
"""The study's user attribute holding {dimension: [candidates]} and the space file's name."""


def _from_trials(study: optuna.Study) -> dict[str, list[Any]]:
    """The free dimensions' choices as the trials hold them: a study of an earlier version."""
    found: dict[str, list[Any]] = {}
    for trial in study.get_trials(deepcopy=False):
        for name, dist in trial.distributions.items():
            if isinstance(dist, optuna.distributions.CategoricalDistribution):
                found.setdefault(name, list(dist.choices))
    return found


def _shown(values: list[Any]) -> str:
    return for_terminal("[" + ", ".join(map(str, values)) + "]")[:80]


def keep_space(study: optuna.Study, candidates: Mapping[str, tuple[Any, ...]],
               source: str) -> None:
    """Refuse (ConfigError) a space whose candidates differ from the study's, else store
    this one (what the study had and this run adds)."""
    new = {dim: [*values] for dim, values in candidates.items()}
    attr = study.user_attrs.get(SPACE_ATTR)
    stored_source = "an earlier run"
    if isinstance(attr, dict) and isinstance(attr.get("candidates"), dict):
        stored: dict[str, list[Any]] = attr["candidates"]
        stored_source = str(attr.get("source", stored_source))
    else:
        # No record of the space: the choices Optuna holds for the free dimensions.
        stored = _from_trials(study)
        new_free = {d: v for d, v in new.items() if len(v) > 1}
        stored = {d: v for d, v in stored.items() if d in new_free or d not in new}
    differs = [dim for dim in stored.keys() & new.keys() if stored[dim] != new[dim]]
    if differs:
        dim = sorted(differs)[0]
        raise ConfigError(
            f"study {study.study_name} was searched over {dim} {_shown(stored[dim])} (space "
            f"{for_terminal(stored_source)}); this run's space gives {dim} {_shown(new[dim])}: "
            "run it with the space it was searched over, or give another --study")
    study.set_user_attr(SPACE_ATTR, {"candidates": {**stored, **new}, "source": source})
