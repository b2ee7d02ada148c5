"""Writing a planning study's finished trials to its storage in one transaction.

`optuna.Study.add_trials` on Optuna's RDB storage creates each trial in its own transaction
and checks each parameter against the study's earlier ones with a query: about 30 ORM round
trips and 34 ms per trial on a 2-core machine (a 5,292-layout grid of gpt-7.5b on 16 GPUs spent
181 of its 192 s there; gpt-1t on 3072 GPUs has 22,671 layouts). A plan's trials are final and
this process owns the study, so they are inserted here in one transaction into Optuna's own
tables (optuna/storages/_rdb/models.py), one bulk INSERT per table, numbered after the trials
already stored.

Those tables are not public API (pyproject pins optuna below 6). Anything this code does not
recognise (another storage, another Optuna) raises before the commit, and the trials go through
`add_trials` instead, with a warning. The checks add_trial makes are made here too (each
trial's consistency, its number of values, each parameter's distribution against the one
stored). tests/test_storage_bulk.py reads bulk-written trials back through Optuna and compares
them with the same trials written by `add_trials`, in several time zones.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.search.interrupts import deferred_interrupts

__all__ = ["add_finished_trials"]

log = logging.getLogger(__name__)


def add_finished_trials(study: optuna.Study, trials: Sequence[FrozenTrial]) -> None:
    """study.add_trials(trials), in one transaction where the storage allows it.

    Attributes that JSON cannot hold raise TypeError before anything is written."""
    if not trials:
        return
    for t in trials:  # what the storage would store: fail on bad data before writing any
        json.dumps([t.user_attrs, t.system_attrs])
    try:
        with deferred_interrupts():  # a Ctrl-C waits for the commit (seconds at most)
            _insert(study, trials)
    except Exception as exc:  # any surprise (the transaction rolled back): the public path
        log.warning("writing %d trials one by one (slower): the bulk insert failed: %r",
                    len(trials), exc)
        study.add_trials(trials)


def _check_distributions(session: Any, models: Any, study_id: int,
                         trials: Sequence[FrozenTrial]) -> None:
    """Raise, as Optuna's add_trial does, where a parameter's distribution is incompatible with
    the one the study already stores for it (a study resumed with other choices)."""
    from optuna.distributions import check_distribution_compatibility, json_to_distribution
    from sqlalchemy import select

    params, trials_table = models.TrialParamModel.__table__, models.TrialModel.__table__
    stored = {name: json_to_distribution(text) for name, text in session.execute(
        select(params.c.param_name, params.c.distribution_json)
        .join(trials_table, params.c.trial_id == trials_table.c.trial_id)
        .where(trials_table.c.study_id == study_id).distinct())}
    for t in trials:
        for name, dist in t.distributions.items():
            check_distribution_compatibility(stored.setdefault(name, dist), dist)


def _utc(value: datetime.datetime | None) -> datetime.datetime | None:
    # TrialModel stores naive UTC and its datetime setters convert naive local times to it.
    return None if value is None else value.astimezone(datetime.UTC).replace(tzinfo=None)


def _insert(study: optuna.Study, trials: Sequence[FrozenTrial]) -> None:
    from optuna.distributions import distribution_to_json
    from optuna.storages import RDBStorage
    from optuna.storages._cached_storage import _CachedStorage
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session
    from sqlalchemy import func, insert, select

    storage = study._storage
    rdb = storage._backend if isinstance(storage, _CachedStorage) else storage
    if not isinstance(rdb, RDBStorage):
        raise TypeError(f"not an RDB storage: {type(rdb).__name__}")
    if any(not t.state.is_finished() or t.intermediate_values for t in trials):
        raise ValueError("only finished trials without intermediate values")
    for t in trials:  # what add_trial checks of each trial, then of its values
        t._validate()
        if t.values is not None and len(t.values) != len(study.directions):
            raise ValueError(f"trial has {len(t.values)} values, the study "
                             f"{len(study.directions)} objectives")
    study_id = study._study_id
    table = models.TrialModel.__table__
    with _create_scoped_session(rdb.scoped_session) as session:
        # The same lock Optuna takes to number a new trial.
        models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
        first = session.scalar(select(func.count()).select_from(table).where(
            table.c.study_id == study_id)) or 0
        _check_distributions(session, models, study_id, trials)
        # SQLAlchemy Core, not ORM objects: one executemany per table.
        session.execute(insert(table), [
            {"number": first + i, "study_id": study_id, "state": t.state,
             "datetime_start": _utc(t.datetime_start),
             "datetime_complete": _utc(t.datetime_complete)}
            for i, t in enumerate(trials)])
        ids: dict[int, int] = {number: trial_id for number, trial_id in session.execute(
            select(table.c.number, table.c.trial_id).where(table.c.study_id == study_id,
                                                           table.c.number >= first))}
        params, values, user, system = [], [], [], []
        for i, t in enumerate(trials):
            trial_id = ids[first + i]
            params += [{"trial_id": trial_id, "param_name": name,
                        "param_value": t.distributions[name].to_internal_repr(value),
                        "distribution_json": distribution_to_json(t.distributions[name])}
                       for name, value in t.params.items()]
            for objective, value in enumerate(t.values or []):
                stored, kind = models.TrialValueModel.value_to_stored_repr(value)
                values.append({"trial_id": trial_id, "objective": objective, "value": stored,
                               "value_type": kind})
            user += [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)}
                     for k, v in t.user_attrs.items()]
            system += [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)}
                       for k, v in t.system_attrs.items()]
        for model, rows in ((models.TrialParamModel, params), (models.TrialValueModel, values),
                            (models.TrialUserAttributeModel, user),
                            (models.TrialSystemAttributeModel, system)):
            if rows:
                session.execute(insert(model.__table__), rows)
