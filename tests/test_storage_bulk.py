"""autotune.search.bulk: a planning study's trials written in one transaction read back exactly
as Optuna's own add_trials writes them."""

from __future__ import annotations

import datetime
import logging
import time
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState, create_trial

from autotune.search.bulk import add_finished_trials

DISTS = {"tp": CategoricalDistribution([1, 2, 4]), "impl": CategoricalDistribution(
    ["local", "sdpa"]), "sp": CategoricalDistribution([False, True])}


def _trials(n: int) -> list[FrozenTrial]:
    start = datetime.datetime(2026, 11, 21, 12, 0, 0)
    out = []
    for i in range(n):
        state = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)[i % 3]
        trial = create_trial(
            state=state,
            values=[1000.0 + i, float("inf") if i == 4 else -2.5 * i]
            if state is TrialState.COMPLETE else None,
            params={"tp": (1, 2, 4)[i % 3], "impl": ("local", "sdpa")[i % 2], "sp": i % 2 == 0},
            distributions=DISTS,
            user_attrs={"record": {"status": "OK", "strategy": f"tp{i}", "nested": [1, None]}},
            system_attrs={"constraints:memory_gib": 0.5 * i} if state is TrialState.PRUNED
            else {})
        trial.datetime_start = start + datetime.timedelta(seconds=i)
        trial.datetime_complete = start + datetime.timedelta(seconds=i, milliseconds=5)
        out.append(trial)
    return out


def _opened(path: Path, name: str) -> tuple[optuna.Study, RDBStorage]:
    """A study and the storage it was created with, which the bulk path is handed (Optuna's
    Study has no public accessor for it)."""
    storage = RDBStorage(f"sqlite:///{path}")
    return optuna.create_study(study_name=name, storage=storage,
                               directions=["maximize", "minimize"], load_if_exists=True), storage


def _study(path: Path, name: str) -> optuna.Study:
    return _opened(path, name)[0]


def _view(t: FrozenTrial) -> tuple[object, ...]:
    return (t.number, t.state, t.values, t.params, t.distributions, t.user_attrs,
            t.system_attrs, t.datetime_start, t.datetime_complete)


def test_bulk_written_trials_read_back_as_add_trials_writes_them(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    trials = _trials(10)
    reference, (bulk, storage) = _study(tmp_path / "a.db", "s"), _opened(tmp_path / "b.db", "s")
    reference.add_trials(trials[:4])
    reference.add_trials(trials[4:])
    with caplog.at_level(logging.DEBUG, logger="autotune.search.bulk"):
        add_finished_trials(bulk, trials[:4], storage=storage)
        # Numbered after the trials already stored.
        add_finished_trials(bulk, trials[4:], storage=storage)
    assert "one by one" not in caplog.text  # the bulk path itself wrote them
    fresh = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'b.db'}")
    expected = [_view(t) for t in reference.get_trials()]
    assert [_view(t) for t in fresh.get_trials()] == expected
    assert [_view(t) for t in bulk.get_trials()] == expected  # the writer's own cache too


def test_other_storages_take_optunas_own_path(caplog: pytest.LogCaptureFixture) -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])  # in memory
    with caplog.at_level(logging.DEBUG, logger="autotune.search.bulk"):
        add_finished_trials(study, _trials(3))
    assert [t.number for t in study.get_trials()] == [0, 1, 2]
    assert "writing 3 trials one by one" in caplog.text


@pytest.mark.parametrize("given", ["none", "another database"])
def test_without_the_study_s_own_rdb_storage_optunas_path_writes_them(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, given: str) -> None:
    """Nothing reaches into the study for its storage: without the one it was created with,
    the trials go through add_trials, and land in the study's own database."""
    study = _study(tmp_path / "e.db", "s")
    other = None if given == "none" else _opened(tmp_path / "other.db", "elsewhere")[1]
    with caplog.at_level(logging.DEBUG, logger="autotune.search.bulk"):
        add_finished_trials(study, _trials(3), storage=other)
    assert "writing 3 trials one by one" in caplog.text
    assert len(optuna.load_study(study_name="s",
                                 storage=f"sqlite:///{tmp_path / 'e.db'}").get_trials()) == 3
    if other is not None:
        assert optuna.load_study(study_name="elsewhere", storage=other).get_trials() == []


def test_a_failed_bulk_write_leaves_nothing_half_written(tmp_path: Path) -> None:
    study, storage = _opened(tmp_path / "c.db", "s")
    bad = _trials(3)
    bad[2].user_attrs["record"] = {"unserialisable": object()}  # the third cannot be stored
    with pytest.raises(TypeError):
        add_finished_trials(study, bad, storage=storage)
    assert optuna.load_study(study_name="s",
                             storage=f"sqlite:///{tmp_path / 'c.db'}").get_trials() == []


def test_choices_incompatible_with_the_stored_ones_are_refused_as_optuna_does(
        tmp_path: Path) -> None:
    study, storage = _opened(tmp_path / "d.db", "s")
    add_finished_trials(study, _trials(3), storage=storage)
    narrower = _trials(1)
    narrower[0].distributions["tp"] = CategoricalDistribution([1, 2])  # another space
    for write in (study.add_trials,
                  lambda trials: add_finished_trials(study, trials, storage=storage)):
        with pytest.raises(ValueError):
            write(narrower)
    assert len(optuna.load_study(study_name="s",
                                 storage=f"sqlite:///{tmp_path / 'd.db'}").get_trials()) == 3


@pytest.mark.parametrize("zone", ["America/New_York", "Asia/Kolkata"])
def test_times_read_back_unchanged_in_any_time_zone(tmp_path: Path, zone: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        trials = _trials(4)
        reference, (bulk, storage) = (_study(tmp_path / "a.db", "s"),
                                      _opened(tmp_path / "b.db", "s"))
        reference.add_trials(trials)
        add_finished_trials(bulk, trials, storage=storage)
        assert [_view(t) for t in bulk.get_trials()] == [_view(t) for t in
                                                          reference.get_trials()]
    finally:
        monkeypatch.undo()
        time.tzset()
