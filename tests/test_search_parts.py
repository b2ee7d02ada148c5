"""The search's parts on their own: the params <-> layout map, the two study stores, the ledger
and the queue (tests/test_search.py runs them together)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from doubles.fake_backend import FakeBackend, small_cluster, small_model, small_space
from optuna.trial import TrialState

from autotune.layouts.layout import Layout
from autotune.megatron.identity import representatives
from autotune.search import SearchConfig
from autotune.search.backends import SimulateBackend
from autotune.search.layout_map import LayoutMap
from autotune.search.ledger import LayoutQueue, Ledger
from autotune.search.records import SearchResult, Source, TrialRecord, stored_record
from autotune.search.space import enumerate_space
from autotune.search.storage import DIRECTIONS
from autotune.search.store import PlanningStore, RealRunStore, StudyStore, open_store
from autotune.trials.trial import TrialMetrics, TrialStatus

CLUSTER, MODEL, SPACE = small_cluster(), small_model(), small_space()
GIB = 2**30


def config(tmp_path: Path, backend: object, **overrides: object) -> SearchConfig:
    values: dict[str, object] = {"model": MODEL, "cluster": CLUSTER, "space": SPACE,
                                 "backend": backend, "results_dir": tmp_path,
                                 "study_name": "s", "finalists": 0, **overrides}
    return SearchConfig(**values)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def layouts() -> LayoutMap:
    return LayoutMap.of(config(Path("unused"), FakeBackend(CLUSTER)))


def test_parameters_and_layouts_map_both_ways(layouts: LayoutMap) -> None:
    valid = enumerate_space(SPACE, MODEL, CLUSTER).valid
    runs = representatives(MODEL, valid)
    assert set(layouts.valid) == set(runs.values())
    assert set(layouts.free) == {"tp", "pp", "mbs", "sequence_parallel",
                                 "distributed_optimizer", "overlap_param_gather"}
    assert layouts.fixed == {"overlap_grad_reduce": True, "recompute": "none", "impl": "sdpa"}
    for s in valid:
        # Every valid layout's parameters stand for the layout that runs for it.
        assert layouts.layout(layouts.params(s)) == runs[s]
        assert layouts.run_params(s) == layouts.run_params(runs[s]) == layouts.run_params_of(
            layouts.params(s))
        assert layouts.is_valid(s)


def test_a_proposal_that_breaks_a_rule_keeps_its_own_run_params(layouts: LayoutMap) -> None:
    bad = {"tp": 1, "pp": 1, "mbs": 1, "sequence_parallel": True,  # sp needs tp > 1
           "distributed_optimizer": False, "overlap_param_gather": False}
    assert layouts.layout(bad) is None
    proposal = layouts.proposal(bad)
    assert proposal.sequence_parallel and proposal.impl == "sdpa" and proposal.dp == 1
    assert not layouts.is_valid(proposal)
    assert layouts.run_params(proposal) not in {layouts.run_params(s) for s in layouts.valid}


def test_a_parameter_the_space_freed_later_reads_as_its_default() -> None:
    wider = LayoutMap.of(config(Path("unused"), FakeBackend(CLUSTER),
                                space=small_space(cross_entropy_fusion=[False, True])))
    s = next(v for v in wider.valid if not v.cross_entropy_fusion)
    old = {k: v for k, v in wider.params(s).items() if k != "cross_entropy_fusion"}
    assert wider.layout(old) == s


def test_planning_and_real_runs_are_two_stores(tmp_path: Path, layouts: LayoutMap) -> None:
    real = open_store(config(tmp_path, FakeBackend(CLUSTER)), layouts, "tpe")
    plan = open_store(config(tmp_path, SimulateBackend(CLUSTER), study_name="p"), layouts,
                      "grid")
    assert isinstance(real, RealRunStore) and real.measured
    assert isinstance(plan, PlanningStore) and not plan.measured
    # The plan's trials reach the storage when it closes, not before.
    trial = plan.ask()
    plan.tell(trial, TrialRecord(number=trial.number, layout=layouts.valid[0],
                                 status=TrialStatus.INVALID, source="grid"))
    stored = optuna.load_study(study_name="p", storage=plan.url)
    assert stored.get_trials() == []
    plan.close()
    assert [t.state for t in stored.get_trials()] == [TrialState.PRUNED]


@pytest.mark.parametrize(("status", "state"), [
    (TrialStatus.OK, TrialState.COMPLETE), (TrialStatus.OOM, TrialState.PRUNED),
    (TrialStatus.PREDICTED_OOM, TrialState.PRUNED), (TrialStatus.INVALID, TrialState.PRUNED),
    (TrialStatus.PREDICTED_SLOW, TrialState.PRUNED),
    (TrialStatus.CRASH, TrialState.FAIL), (TrialStatus.TIMEOUT, TrialState.FAIL),
    (TrialStatus.NCCL_ERROR, TrialState.FAIL), (TrialStatus.DUPLICATE, TrialState.FAIL),
    (TrialStatus.INTERRUPTED, TrialState.FAIL)])
def test_tell_writes_the_record_and_the_state_optuna_learns_from(
        layouts: LayoutMap, status: TrialStatus, state: TrialState) -> None:
    store: StudyStore = RealRunStore(optuna.create_study(directions=list(DIRECTIONS)), layouts,
                                     name="s", url="memory", capacity_bytes=12 * GIB)
    s = layouts.valid[0]
    store.enqueue(s, Source.GRID)
    trial = store.ask()
    metrics = TrialMetrics(status=status, tokens_per_s=1e4, peak_allocated_bytes=10 * GIB)
    record = TrialRecord(number=trial.number, layout=s, status=status, source=Source.GRID,
                         metrics=metrics, predicted_peak_bytes=13 * GIB)
    store.tell(trial, record)
    [frozen] = store.study.get_trials()
    assert frozen.state is state and stored_record(frozen) == record
    assert store.last_told == trial.number and trial.number in store.known
    if state is TrialState.COMPLETE:
        assert frozen.values == [1e4, 10.0]
        assert frozen.system_attrs["constraints:memory_gib"] == pytest.approx(-2.0)
    elif state is TrialState.PRUNED:  # infeasible: the predicted GiB over the capacity
        assert frozen.system_attrs["constraints:memory_gib"] == pytest.approx(1.0)


def test_the_ledger_counts_launches_and_patience(layouts: LayoutMap) -> None:
    learned: list[tuple[int, bool]] = []
    seen: list[int] = []
    ledger = Ledger(SearchResult(study_name="s", storage="x"), layouts,
                    learn=lambda r, told: learned.append((r.number, told)),
                    observer=lambda r, result: seen.append(r.number))
    a, b = layouts.valid[:2]

    def ok(number: int, s: Layout, tokens: float) -> TrialRecord:
        return TrialRecord(number=number, layout=s, status=TrialStatus.OK, source="x",
                           metrics=TrialMetrics(status=TrialStatus.OK, tokens_per_s=tokens))

    ledger.note(ok(0, a, 500.0), told=False)  # read back: counts for --trials, not patience
    assert (ledger.launched, ledger.best_tokens, ledger.since_best) == (1, 500.0, 0)
    ledger.note(ok(1, b, 400.0))
    ledger.note(TrialRecord(number=2, layout=b, status=TrialStatus.OK, source="x",
                            duplicate_of=1))  # a duplicate is not a launch
    assert (ledger.launched, ledger.best_tokens, ledger.since_best) == (2, 500.0, 1)
    assert ledger.tried(a) and ledger.tried(b) and ledger.seen[layouts.run_params(b)].number == 1
    assert learned == [(0, False), (1, True), (2, True)] and seen == [0, 1, 2]


def test_the_queue_puts_a_bisection_first(layouts: LayoutMap) -> None:
    queue = LayoutQueue()
    a, b, c = layouts.valid[:3]
    queue.push(a, "alpa")
    queue.push(b, "alpa")
    queue.push(c, "oom-bisect", first=True)
    assert [queue.pop() for _ in range(len(queue))] == [
        (c, "oom-bisect"), (a, "alpa"), (b, "alpa")]
    assert not queue
