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


def _study(path: Path, name: str) -> optuna.Study:
    return optuna.create_study(study_name=name, storage=f"sqlite:///{path}",
                               directions=["maximize", "minimize"], load_if_exists=True)


def _view(t: FrozenTrial) -> tuple[object, ...]:
    return (t.number, t.state, t.values, t.params, t.distributions, t.user_attrs,
            t.system_attrs, t.datetime_start, t.datetime_complete)


def test_bulk_written_trials_read_back_as_add_trials_writes_them(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    trials = _trials(10)
    reference, bulk = _study(tmp_path / "a.db", "s"), _study(tmp_path / "b.db", "s")
    reference.add_trials(trials[:4])
    reference.add_trials(trials[4:])
    with caplog.at_level(logging.DEBUG, logger="autotune.search.bulk"):
        add_finished_trials(bulk, trials[:4])
        add_finished_trials(bulk, trials[4:])  # numbered after the trials already stored
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


def test_a_failed_bulk_write_leaves_nothing_half_written(tmp_path: Path) -> None:
    study = _study(tmp_path / "c.db", "s")
    bad = _trials(3)
    bad[2].user_attrs["record"] = {"unserialisable": object()}  # the third cannot be stored
    with pytest.raises(TypeError):
        add_finished_trials(study, bad)
    assert optuna.load_study(study_name="s",
                             storage=f"sqlite:///{tmp_path / 'c.db'}").get_trials() == []


def test_choices_incompatible_with_the_stored_ones_are_refused_as_optuna_does(
        tmp_path: Path) -> None:
    study = _study(tmp_path / "d.db", "s")
    add_finished_trials(study, _trials(3))
    narrower = _trials(1)
    narrower[0].distributions["tp"] = CategoricalDistribution([1, 2])  # another space
    for write in (study.add_trials, lambda trials: add_finished_trials(study, trials)):
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
        reference, bulk = _study(tmp_path / "a.db", "s"), _study(tmp_path / "b.db", "s")
        reference.add_trials(trials)
        add_finished_trials(bulk, trials)
        assert [_view(t) for t in bulk.get_trials()] == [_view(t) for t in
                                                          reference.get_trials()]
    finally:
        monkeypatch.undo()
        time.tzset()
