"""After the sampler repeats a layout already tried, the model's best untried layout is the next
trial (autotune.search.scheduling, Scheduler.after_repeat)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from doubles.fake_backend import small_cluster, small_model, small_space

from autotune.layouts.layout import Layout
from autotune.predict.cost import estimate_cost
from autotune.predict.gate import MemoryGate
from autotune.search import SearchConfig
from autotune.search.backends import SimulateBackend
from autotune.search.layout_map import LayoutMap
from autotune.search.ledger import LayoutQueue
from autotune.search.loop import Search
from autotune.search.records import SearchResult, Source, TrialRecord
from autotune.search.scheduling import Scheduler
from autotune.search.stop_rule import ModelStop
from autotune.trials.trial import TrialMetrics, TrialStatus

CLUSTER, MODEL = small_cluster(), small_model()
A, B, C = (Layout(tp=1, pp=1, dp=4, mbs=m, gbs=MODEL.global_batch_size) for m in (1, 2, 4))
RANKED = [(A, 300.0), (B, 200.0), (C, 100.0)]


def _ran(number: int, s: Layout, source: Source = Source.SAMPLER) -> TrialRecord:
    return TrialRecord(number=number, layout=s, status=TrialStatus.OK, source=source,
                       metrics=TrialMetrics(status=TrialStatus.OK, tokens_per_s=100.0))


def _scheduler(records: list[TrialRecord], tried: set[Layout], queue: LayoutQueue
               ) -> Scheduler:
    # The rule off (a plan, --stop-rule none): closest_untried is the ranking's first untried.
    stop = ModelStop(active=False, records=records, fitted=lambda: False,
                     predict=lambda s: 0.0, ranked=lambda: list(RANKED),
                     tried=lambda s: s in tried)
    result = SearchResult(study_name="s", storage="", valid_layouts=3, cluster=CLUSTER)
    result.records.extend(records)
    parts: Any = SimpleNamespace(stop=stop, queue=queue, ledger=SimpleNamespace(result=result))
    return Scheduler(parts, executor=Any, sampler=Any)


REPEAT = replace(_ran(1, A), duplicate_of=0)


@pytest.mark.parametrize(("last", "tried", "queued", "expected"), [
    # A repeat: the fastest untried layout next.
    (REPEAT, {A}, [], (B, Source.MODEL)),
    (REPEAT, {A, B}, [], (C, Source.MODEL)),
    # None left untried: nothing queued, the sampler asks on (its fallback ends the search).
    (REPEAT, {A, B, C}, [], None),
    # Not a repeat: a new layout, or a layout another searcher runs now (DUPLICATE, queued again
    # by the executor itself).
    (_ran(1, B), {A, B}, [], None),
    (replace(_ran(1, A), status=TrialStatus.DUPLICATE, duplicate_of=0, metrics=None), {A}, [],
     None),
    # Something is queued already (a bisection, a derived rung): it goes first, untouched.
    (REPEAT, {A}, [(C, Source.OOM_BISECT)], (C, Source.OOM_BISECT)),
])
def test_a_repeat_queues_the_models_best_untried_layout(
        last: TrialRecord, tried: set[Layout], queued: list[tuple[Layout, Source]],
        expected: tuple[Layout, Source] | None) -> None:
    queue = LayoutQueue()
    for s, source in queued:
        queue.push(s, source)
    _scheduler([_ran(0, A), last], tried, queue).after_repeat(last.number)
    assert (queue.pop() if queue else None) == expected
    assert not queue


def test_only_the_trial_just_told_counts() -> None:
    """A repeat read back earlier (another searcher's, a resume) is not this ask's outcome."""
    queue = LayoutQueue()
    _scheduler([_ran(0, A), REPEAT], {A}, queue).after_repeat(2)
    assert not queue


def _plan(tmp_path: Path, space: dict[str, list[object]], **overrides: Any) -> Search:
    cfg = SearchConfig(model=MODEL, cluster=CLUSTER, space=small_space(**space),
                       backend=SimulateBackend(CLUSTER), results_dir=tmp_path, study_name="s",
                       sampler="tpe", finalists=0, **overrides)
    return Search(cfg)


def _expected_next(layouts: LayoutMap, gate: MemoryGate, before: list[TrialRecord]) -> float:
    """The committed model's fastest fitting layout that no record in `before` tried (a plan
    never refits: its figures are the model's own)."""
    tried = {layouts.run_params(r.layout) for r in before
             if r.duplicate_of is None and r.status is not TrialStatus.PREDICTED_SLOW}
    return max(estimate_cost(MODEL, s, CLUSTER).tokens_per_s for s in layouts.valid
               if layouts.run_params(s) not in tried and gate.decide(s).launch)


@pytest.mark.parametrize("seed", [0, 1])
def test_in_a_search_each_repeat_is_followed_by_the_models_pick(tmp_path: Path,
                                                                 seed: int) -> None:
    """A TPE plan on 90 layouts: every sampler repeat is followed by the fastest untried fitting
    layout, which is new, and TPE asks again after it."""
    search = _plan(tmp_path, {}, n_trials=40, seed=seed)
    records = search.run().records
    gate = MemoryGate(MODEL, CLUSTER)
    repeats = [i for i, r in enumerate(records[:-1])
               if r.duplicate_of is not None and r.source is Source.SAMPLER]
    assert repeats  # TPE repeats on a space this small: the case is exercised
    for i in repeats:
        picked = records[i + 1]
        assert picked.source is Source.MODEL and picked.duplicate_of is None
        assert picked.predicted_tokens_per_s == pytest.approx(
            _expected_next(search.layouts, gate, records[:i + 1]))
    # No pick without a repeat before it (the idle fallback needs 40 idle asks, never reached).
    picks = [i for i, r in enumerate(records) if r.source is Source.MODEL]
    assert picks == [i + 1 for i in repeats]


def test_with_every_layout_tried_repeats_queue_nothing(tmp_path: Path) -> None:
    """Four layouts: once all are tried each proposal repeats one, nothing is left to queue,
    and the search ends by its fallback's reason after max_idle_asks asks."""
    space = {"tp": [1], "pp": [1], "mbs": [1, 2], "sequence_parallel": [False],
             "overlap_param_gather": [False]}
    search = _plan(tmp_path, space, n_trials=50, max_idle_asks=5)
    assert len(search.layouts.valid) == 4
    result = search.run()
    fresh = [r for r in result.records if r.duplicate_of is None]
    assert len(fresh) == 4
    last_fresh = result.records.index(fresh[-1])
    assert all(r.source is Source.SAMPLER and r.duplicate_of is not None
               for r in result.records[last_fresh + 1:])
    assert result.stop_reason == "every layout predicted to fit has been tried"
