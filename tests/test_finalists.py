"""Finalists measured again before a search stops (autotune.search.finalists): which repeats
run, in what order, the leader once fresh, resume without redoing them, and the ranking decided
on the repeated figures, throttled runs left out."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from doubles.fake_backend import FakeBackend, small_cluster, small_model, small_space

from autotune.layouts.layout import Layout
from autotune.search import SearchConfig, run_search
from autotune.search.finalists import FINALISTS, plan, ranking_line, settled
from autotune.search.records import Figure, SearchResult, Source, TrialRecord
from autotune.trials.trial import ClockSummary, TrialMetrics, TrialSpec, TrialStatus

CLUSTER = small_cluster(memory_gib=40.0)
MODEL = small_model()
SPACE = small_space(tp=[1], pp=[1], mbs=[2, 4, 8], distributed_optimizer=[False],
                    overlap_param_gather=[False])


def _record(number: int, mbs: int, tokens: float | None, *, repeat_of: int | None = None,
            warm: bool = True, throttled: bool = False, cv: float = 0.01) -> TrialRecord:
    clocks = ClockSummary(samples=3, reasons=("hw_thermal",) if throttled else ("sw_power_cap",))
    metrics = None if tokens is None else TrialMetrics(
        status=TrialStatus.OK, tokens_per_s=tokens, warm=warm, step_time_cv=cv, clocks=clocks)
    return TrialRecord(number=number, layout=Layout(mbs=mbs, gbs=64), status=TrialStatus.OK,
                       source=Source.FINALIST if repeat_of is not None else Source.SAMPLER,
                       metrics=metrics, repeat_of=repeat_of)


def _result(*records: TrialRecord) -> SearchResult:
    return SearchResult(study_name="s", storage="mem", records=list(records))


def test_the_plan_runs_the_best_three_in_fresh_orders_the_leader_once_fresh() -> None:
    result = _result(_record(0, 2, 100.0), _record(1, 4, 120.0), _record(2, 8, 110.0),
                     _record(3, 16, 90.0))
    order = [(r.of.number, r.fresh) for r in plan(result, finalists=3, runs=3)]
    # Round 1: the last first; round 2 rotated by one; the leader's (#1) last repeat fresh and
    # last of all, so that no warm repeat follows the fresh process (it would start the pool
    # again).
    assert order == [(0, False), (2, False), (1, False), (2, False), (0, False), (1, True)]


@pytest.mark.parametrize(("done", "left"), [
    ((), 6),
    # A resumed search: two repeats of the leader (one of them fresh) and one of #2 are there.
    ((("1", False), ("1", True), ("2", True)), 3),
    ((("0", True), ("0", True), ("1", False), ("1", True), ("2", True), ("2", True)), 0),
])
def test_a_resume_runs_only_the_repeats_still_missing(done: tuple[tuple[str, bool], ...],
                                                      left: int) -> None:
    records = [_record(0, 2, 100.0), _record(1, 4, 120.0), _record(2, 8, 110.0)]
    records += [_record(10 + i, records[int(of)].layout.mbs, 115.0, repeat_of=int(of),
                        warm=warm) for i, (of, warm) in enumerate(done)]
    repeats = plan(_result(*records), finalists=3, runs=3)
    assert len(repeats) == left
    # The leader's fresh run is not asked for again once one is on record.
    fresh_before = any(of == "1" and not warm for of, warm in done)
    assert sum(r.fresh for r in repeats) == (0 if fresh_before or not left else 1)
    # Nothing runs after the fresh process.
    assert all(not r.fresh for r in repeats[:-1])


def test_the_ranking_is_decided_on_the_repeated_figures_throttled_runs_left_out() -> None:
    result = _result(
        _record(0, 2, 130.0, throttled=False),                 # lucky first run
        _record(1, 4, 120.0),
        _record(2, 2, 100.0, repeat_of=0), _record(3, 2, 101.0, repeat_of=0),
        _record(4, 4, 119.0, repeat_of=1),
        _record(5, 4, 60.0, repeat_of=1, throttled=True),      # throttled: not counted
    )
    assert [r.number for r in result.best(2)] == [1, 0]
    figure = result.figure(result.best(1)[0])
    assert figure is not None and figure.tokens_per_s == pytest.approx(119.5)
    assert figure.runs == (120.0, 119.0, 60.0) and not figure.throttled
    line = ranking_line(result)
    assert line is not None and "mbs4" in line.split(" beats ")[0]
    assert "beats" in line and "over 3 runs each" in line


def test_a_figure_of_one_run_carries_the_trials_own_noise() -> None:
    figure = Figure.of([_record(0, 2, 100.0, cv=0.04)])
    assert figure is not None and figure.error == 0.04 and figure.runs == (100.0,)


def test_within_the_noise_is_said() -> None:
    result = _result(_record(0, 2, 100.0), _record(1, 4, 101.0),
                     _record(2, 2, 104.0, repeat_of=0), _record(3, 4, 97.0, repeat_of=1))
    line = ranking_line(result)
    assert line is not None and "within the noise" in line


@dataclass
class FreshBackend(FakeBackend):
    """FakeBackend with run_fresh (a warm pool's cold run): records which calls were fresh."""

    fresh: list[Layout] = field(default_factory=list)
    throttle_mbs: int | None = None
    """The first run of the layout with this micro-batch is measured while throttled."""

    def run_fresh(self, spec: TrialSpec, trial_dir: Path, timeout_s: float) -> TrialMetrics:
        self.fresh.append(spec.layout)
        return self.run(spec, trial_dir, timeout_s)

    def run(self, spec: TrialSpec, trial_dir: Path, timeout_s: float) -> TrialMetrics:
        metrics = super().run(spec, trial_dir, timeout_s)
        if spec.layout.mbs == self.throttle_mbs and \
                [c.mbs for c in self.calls].count(spec.layout.mbs) == 1:
            clocks = ClockSummary(samples=5, reasons=("hw_thermal",))
            metrics = replace(metrics, clocks=clocks)
        return metrics


def _config(tmp_path: Path, backend: Any, **overrides: Any) -> SearchConfig:
    values: dict[str, Any] = {"model": MODEL, "cluster": CLUSTER, "space": SPACE,
                              "backend": backend, "results_dir": tmp_path, "study_name": "s",
                              "sampler": "ranked", "stop_rule": "none"}
    return SearchConfig(**{**values, **overrides})


def test_a_search_measures_its_finalists_again_and_resume_does_not_redo_them(
        tmp_path: Path) -> None:
    # A close call (0.4% apart), so that no round is skipped (finalists.settled).
    backend = FreshBackend(CLUSTER, tokens=lambda s: 1000.0 + s.mbs)
    result = run_search(_config(tmp_path, backend))
    first = [r for r in result.records if r.repeat_of is None and r.launched]
    repeats = [r for r in result.records if r.repeat_of is not None]
    top = result.best(FINALISTS)
    assert len(repeats) == 2 * len(top) and {r.repeat_of for r in repeats} == \
        {r.number for r in top}
    assert all(r.source is Source.FINALIST for r in repeats)
    assert backend.fresh == [top[0].layout]  # the leader once in a fresh process
    assert len(backend.calls) == len(first) + len(repeats)
    assert ranking_line(result) is not None
    # Resumed: every finalist has its runs, nothing runs again.
    again = FreshBackend(CLUSTER, tokens=lambda s: 1000.0 + s.mbs)
    resumed = run_search(_config(tmp_path, again, resume=True))
    kept = [r for r in resumed.records if r.repeat_of is not None]
    assert again.calls == [] and len(kept) == len(repeats)


@pytest.mark.parametrize(("budget", "finalists", "repeats"), [
    (None, 0, 0),        # turned off
    (0.0, 3, 0),         # a spent --time-budget: no repeats
])
def test_no_finalists_when_off_or_out_of_time(tmp_path: Path, budget: float | None,
                                              finalists: int, repeats: int) -> None:
    backend = FreshBackend(CLUSTER)
    result = run_search(_config(tmp_path, backend, finalists=finalists,
                                time_budget_s=budget))
    assert sum(1 for r in result.records if r.repeat_of is not None) == repeats


def test_a_throttled_leader_is_measured_again_before_it_is_crowned(tmp_path: Path) -> None:
    backend = FreshBackend(CLUSTER, throttle_mbs=8, tokens=lambda s: 1000.0 * s.mbs)
    result = run_search(_config(tmp_path, backend, finalists=1))
    best = result.best(1)[0]
    assert best.layout.mbs == 8 and best.throttled  # its first run was throttled
    figure = result.figure(best)
    assert figure is not None and len(figure.runs) == 3 and not figure.throttled


def test_a_grid_measures_every_layout_once_and_repeats_none(tmp_path: Path) -> None:
    backend = FreshBackend(CLUSTER)
    result = run_search(_config(tmp_path, backend, sampler="grid"))
    assert not [r for r in result.records if r.repeat_of is not None]
    assert len(backend.calls) == len({c for c in backend.calls})


@pytest.mark.parametrize(("leader", "runner_up", "expected"), [
    ((120.0, 120.0), (100.0, 100.0), True),     # 20% apart, each repeating: decided
    ((120.0,), (100.0, 100.0), False),          # the leader measured once
    ((103.0, 103.0), (100.0, 100.0), False),    # 3%: under twice the floored error (3.5%)
    ((104.0, 104.0), (100.0, 100.0), True),     # 4%: over it
    ((130.0, 100.0), (100.0, 101.0), False),    # the leader's own runs disagree
])
def test_settled_when_the_gap_is_twice_its_floored_error(
        leader: tuple[float, ...], runner_up: tuple[float, ...], expected: bool) -> None:
    records = [_record(0, 4, leader[0]), _record(1, 2, runner_up[0])]
    records += [_record(10 + i, 4, v, repeat_of=0) for i, v in enumerate(leader[1:])]
    records += [_record(20 + i, 2, v, repeat_of=1) for i, v in enumerate(runner_up[1:])]
    assert settled(_result(*records)) is expected


def test_a_lone_layout_is_settled() -> None:
    assert settled(_result(_record(0, 4, 100.0)))


@pytest.mark.parametrize(("tokens", "repeats"), [
    (lambda s: 1000.0 * s.mbs, 3),     # decided after one round: then the leader's fresh run
    (lambda s: 1000.0 + s.mbs, 4),     # 0.4% apart: every repeat runs
])
def test_a_settled_call_skips_the_last_round_but_not_the_fresh_run(
        tmp_path: Path, tokens: Any, repeats: int) -> None:
    backend = FreshBackend(CLUSTER, tokens=tokens)
    result = run_search(_config(tmp_path, backend))
    top = result.best(FINALISTS)
    assert sum(1 for r in result.records if r.repeat_of is not None) == repeats
    assert backend.fresh == [top[0].layout]
    # The fresh run is the last launch of the search.
    assert backend.calls[-1] == top[0].layout
