"""Writing a planning study's finished trials to its storage in one transaction.

`optuna.Study.add_trials` on Optuna's RDB storage creates each trial in its own transaction
and checks each parameter against the study's earlier ones with a query: about 30 ORM round
trips and 34 ms per trial on a 2-core machine (a 5,292-layout grid of gpt-7.5b on 16 GPUs spent
181 of its 192 s there; gpt-1t on 3072 GPUs has 22,671 layouts). A plan's trials are final and
this process owns the study, so they are inserted here in one transaction into Optuna's own
tables (optuna/storages/_rdb/models.py), one bulk INSERT per table, numbered after the trials
already stored.

Nothing here reads Optuna's private modules or attributes: the caller hands in the RDBStorage
it opened the study with (optuna.Study has no public accessor for its storage), the tables are
reflected from the database with SQLAlchemy, and they are written only when the storage reports,
through RDBStorage's public `get_current_version()`, a schema version this module knows
(KNOWN_SCHEMAS: Optuna migrates its schema with alembic and names each version); a newer Optuna
with the same schema keeps the fast path, one with another schema (or another storage, or none
given) gets `add_trials`, with a warning. The
checks add_trial makes are made here too (each trial's state and values, its number of values,
each parameter's distribution against the one stored, with optuna.distributions' public
functions). tests/test_storage_bulk.py reads bulk-written trials back through Optuna and
compares them with the same trials written by `add_trials`, in several time zones.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.storages import BaseStorage, RDBStorage
from optuna.trial import FrozenTrial

from autotune.search.interrupts import deferred_interrupts

__all__ = ["add_finished_trials"]

log = logging.getLogger(__name__)


def add_finished_trials(study: optuna.Study, trials: Sequence[FrozenTrial], *,
                        storage: BaseStorage | None = None) -> None:
    """study.add_trials(trials), in one transaction where `storage` allows it: the storage the
    study was created with (optuna.create_study(storage=...)), an RDBStorage of a known schema.

    Attributes that JSON cannot hold raise TypeError before anything is written."""
    if not trials:
        return
    for t in trials:  # what the storage would store: fail on bad data before writing any
        json.dumps([t.user_attrs, t.system_attrs])
    try:
        with deferred_interrupts():  # a Ctrl-C waits for the commit (seconds at most)
            _insert(study, _rdb_storage(storage), trials)
    except Exception as exc:  # any surprise (the transaction rolled back): the public path
        log.warning("writing %d trials one by one (slower): the bulk insert failed: %r",
                    len(trials), exc)
        study.add_trials(trials)


KNOWN_SCHEMAS = ("v3.2.0.a",)
"""Optuna RDB schema versions whose tables `_insert` writes (optuna 3.2 to 5.x)."""
_TABLES = ("studies", "trials", "trial_params", "trial_values", "trial_user_attributes",
           "trial_system_attributes")


def _rdb_storage(storage: BaseStorage | None) -> RDBStorage:
    """`storage` as the RDBStorage this module writes, else TypeError (the caller then takes
    add_trials)."""
    if not isinstance(storage, RDBStorage):
        raise TypeError(f"not an RDB storage: {type(storage).__name__}")
    version = storage.get_current_version()
    if version not in KNOWN_SCHEMAS:
        raise TypeError(f"Optuna's schema {version} is not one this module writes "
                        f"({', '.join(KNOWN_SCHEMAS)})")
    return storage


def _stored_value(value: float) -> tuple[float | None, str]:
    """A trial value as Optuna's trial_values table holds it: infinities by their type."""
    if value == float("inf"):
        return None, "INF_POS"
    if value == float("-inf"):
        return None, "INF_NEG"
    if value != value:
        raise ValueError("a trial value is NaN")
    return value, "FINITE"


def _check(study: optuna.Study, trials: Sequence[FrozenTrial]) -> None:
    """What add_trial checks of each trial (create_trial's rules), then of its values."""
    from optuna.trial import TrialState

    for t in trials:
        if not t.state.is_finished() or t.intermediate_values:
            raise ValueError("only finished trials without intermediate values")
        if (t.state is TrialState.COMPLETE) != (t.values is not None):
            raise ValueError(f"a {t.state.name} trial {'needs' if t.values is None else 'has'}"
                             " values")
        if t.values is not None and len(t.values) != len(study.directions):
            raise ValueError(f"trial has {len(t.values)} values, the study "
                             f"{len(study.directions)} objectives")
        if set(t.params) != set(t.distributions):
            raise ValueError("a trial's parameters and distributions differ")
        for name, value in t.params.items():
            t.distributions[name].to_internal_repr(value)  # a choice it lacks: ValueError


def _check_distributions(connection: Any, tables: Any, study_id: int,
                         trials: Sequence[FrozenTrial]) -> None:
    """Raise, as Optuna's add_trial does, where a parameter's distribution is incompatible with
    the one the study already stores for it (a study resumed with other choices)."""
    from optuna.distributions import check_distribution_compatibility, json_to_distribution
    from sqlalchemy import select

    params, trials_table = tables["trial_params"], tables["trials"]
    stored = {name: json_to_distribution(text) for name, text in connection.execute(
        select(params.c.param_name, params.c.distribution_json)
        .join(trials_table, params.c.trial_id == trials_table.c.trial_id)
        .where(trials_table.c.study_id == study_id).distinct())}
    for t in trials:
        for name, dist in t.distributions.items():
            check_distribution_compatibility(stored.setdefault(name, dist), dist)


def _utc(value: datetime.datetime | None) -> datetime.datetime | None:
    # Optuna stores naive UTC and its datetime setters convert naive local times to it.
    return None if value is None else value.astimezone(datetime.UTC).replace(tzinfo=None)


def _insert(study: optuna.Study, rdb: RDBStorage, trials: Sequence[FrozenTrial]) -> None:
    from optuna.distributions import distribution_to_json
    from sqlalchemy import MetaData, func, insert, select

    _check(study, trials)
    study_id = rdb.get_study_id_from_name(study.study_name)  # KeyError: not its storage
    metadata = MetaData()
    metadata.reflect(bind=rdb.engine, only=_TABLES)
    tables = metadata.tables
    table = tables["trials"]
    with rdb.engine.begin() as connection:  # one transaction: all the trials or none
        studies = tables["studies"]
        # The same row lock Optuna takes to number a new trial (SQLite locks the database
        # on the first write anyway).
        connection.execute(select(studies.c.study_id).where(
            studies.c.study_id == study_id).with_for_update())
        first = connection.scalar(select(func.count()).select_from(table).where(
            table.c.study_id == study_id)) or 0
        _check_distributions(connection, tables, study_id, trials)
        # SQLAlchemy Core: one executemany per table.
        connection.execute(insert(table), [
            {"number": first + i, "study_id": study_id, "state": t.state.name,
             "datetime_start": _utc(t.datetime_start),
             "datetime_complete": _utc(t.datetime_complete)}
            for i, t in enumerate(trials)])
        ids: dict[int, int] = {number: trial_id for number, trial_id in connection.execute(
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
                stored, kind = _stored_value(value)
                values.append({"trial_id": trial_id, "objective": objective, "value": stored,
                               "value_type": kind})
            user += [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)}
                     for k, v in t.user_attrs.items()]
            system += [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)}
                       for k, v in t.system_attrs.items()]
        for name, rows in (("trial_params", params), ("trial_values", values),
                           ("trial_user_attributes", user),
                           ("trial_system_attributes", system)):
            if rows:
                connection.execute(insert(tables[name]), rows)
