"""CPU tests of the whole search loop (ask -> gate -> run -> tell) over a scripted backend.

The fake backend (tests/doubles/fake_backend.py) is not `predicted`, so these studies live in real
SQLite storage with heartbeats, as real trials do.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest
from doubles.fake_backend import (
    GIB,
    FakeBackend,
    small_cluster,
    small_model,
    small_space,
)
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import ConfigError
from autotune.layouts.layout import Layout
from autotune.megatron.identity import representatives
from autotune.predict.gate import DEFAULT_ERROR_BAND, MemoryGate, mbs_family
from autotune.predict.memory import estimate_memory
from autotune.search import SearchConfig, SearchResult, TrialRecord, run_search
from autotune.search.backends import SimulateBackend
from autotune.search.loop import Search
from autotune.search.space import enumerate_space
from autotune.search.storage import Heartbeat
from autotune.trials.trial import TrialStatus

REPO = Path(__file__).resolve().parents[1]
FAKE_SCRIPT = Path(__file__).resolve().parent / "doubles" / "fake_backend.py"
CLUSTER = small_cluster()
MODEL = small_model()
SPACE = small_space()


def config(tmp_path: Path, backend: Any, **overrides: Any) -> SearchConfig:
    # These tests count launches of the loop's other rules; the model's stop rule would end
    # them sooner (tests/test_stop_rule.py).
    values: dict[str, Any] = {"model": MODEL, "cluster": CLUSTER, "space": SPACE,
                              "backend": backend, "results_dir": tmp_path, "study_name": "s",
                              "sampler": "tpe", "stop_rule": "none",
                              # They count the search's own launches: finalists' repeats are
                              # tests/test_finalists.py's.
                              "finalists": 0}
    return SearchConfig(**{**values, **overrides})


def stored(tmp_path: Path, name: str = "s") -> list[FrozenTrial]:
    url = f"sqlite:///{(tmp_path / name / 'study.db').resolve()}"
    return optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)


def constraint(trial: FrozenTrial) -> float:
    # Optuna 5 keeps trial.set_constraint(key, value) as the system attr "constraints:<key>".
    return float(trial.system_attrs["constraints:memory_gib"])


def predicted_peak(s: Layout) -> float:
    return estimate_memory(MODEL, s, CLUSTER).peak_bytes


def launched(result: SearchResult) -> list[TrialRecord]:
    return [r for r in result.records if r.launched]


def fits(s: Layout) -> bool:
    return MemoryGate(MODEL, CLUSTER).decide(s).launch


Run = tuple[FakeBackend, SearchResult, Path]
"""A search's backend (its calls), its result and its results folder."""


@pytest.fixture(scope="module")
def grid_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The whole grid of SPACE, each layout met by the gate: read by several tests (about a
    hundred trials in SQLite, written one by one as real runs are)."""
    tmp = tmp_path_factory.mktemp("grid")
    backend = FakeBackend(CLUSTER)
    return backend, run_search(config(tmp, backend, sampler="grid")), tmp


@pytest.fixture(scope="module")
def capacity_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """TPE for 12 launches where the memory model underestimates: nothing over 9 GiB runs,
    though 12 GiB are predicted. Read by several tests."""
    tmp = tmp_path_factory.mktemp("capacity")
    backend = FakeBackend(CLUSTER, true_capacity_bytes=9 * GIB)
    return backend, run_search(config(tmp, backend, n_trials=12)), tmp


# -- the gate ---------------------------------------------------------------------------------


@pytest.mark.parametrize("sampler", ["grid", "tpe"])
def test_predicted_oom_is_pruned_with_a_constraint_and_never_launched(
        tmp_path: Path, sampler: str, request: pytest.FixtureRequest) -> None:
    if sampler == "grid":
        backend, result, tmp_path = request.getfixturevalue("grid_run")
    else:
        backend = FakeBackend(CLUSTER)
        result = run_search(config(tmp_path, backend, sampler=sampler, n_trials=12))

    assert backend.calls and all(fits(s) for s in backend.calls)
    predicted_oom = [t for t in stored(tmp_path)
                     if t.user_attrs["record"]["status"] == "PREDICTED_OOM"]
    if sampler == "grid":  # every distinct valid layout meets the gate
        valid = set(representatives(MODEL, enumerate_space(SPACE, MODEL, CLUSTER).valid).values())
        assert len(predicted_oom) == sum(not fits(s) for s in valid) > 0
    for trial in predicted_oom:
        assert trial.state is TrialState.PRUNED
        assert constraint(trial) > 0
        assert trial.user_attrs["record"]["strategy"] not in {s.describe()
                                                             for s in backend.calls}
    assert result.count(TrialStatus.PREDICTED_OOM) == len(
        [t for t in predicted_oom if "duplicate_of" not in t.user_attrs["record"]])


def test_real_oom_is_pruned_and_bisects_the_micro_batch_of_its_layout(tmp_path: Path) -> None:
    seed = Layout(tp=1, pp=1, dp=4, mbs=4, gbs=MODEL.global_batch_size,
                  distributed_optimizer=True, overlap_grad_reduce=True,
                  overlap_param_gather=True, impl="sdpa")
    # Memory for mbs 4 to be the largest predicted to fit within the gate's band (the band of
    # a GPU without measured trials, the widest measured: it moves as trials are added).
    cluster = small_cluster(memory_gib=estimate_memory(MODEL, seed, CLUSTER).peak_bytes
                            / GIB / (1 - DEFAULT_ERROR_BAND) * 1.01)
    backend = FakeBackend(cluster, oom=lambda s: mbs_family(s) == mbs_family(seed) and s.mbs >= 2)
    result = run_search(config(tmp_path, backend, n_trials=12, cluster=cluster))

    # The first Alpa seed (largest dp, largest mbs predicted to fit) runs out of memory; the
    # bisection retries mbs 2 (the middle of 1, 2), which fails too, then mbs 1, which runs.
    assert backend.calls[:3] == [seed, replace(seed, mbs=2), replace(seed, mbs=1)]
    sources = {r.layout: r.source for r in launched(result)}
    assert sources[replace(seed, mbs=2)] == sources[replace(seed, mbs=1)] == "oom-bisect"
    # No micro-batch at or above one that ran out of memory is ever launched again.
    smallest_oom: dict[Layout, int] = {}
    for s in backend.calls:
        assert s.mbs < smallest_oom.get(mbs_family(s), 10**9)
        if mbs_family(s) == mbs_family(seed) and s.mbs >= 2:
            smallest_oom[mbs_family(s)] = min(smallest_oom.get(mbs_family(s), s.mbs), s.mbs)
    # Launched OOMs: a sampler proposal of a failed layout is recorded as its duplicate.
    ooms = [t for t in stored(tmp_path) if t.user_attrs["record"]["status"] == "OOM"
            and t.user_attrs["record"].get("duplicate_of") is None]
    assert len(ooms) == 2
    assert all(t.state is TrialState.PRUNED and constraint(t) > 0 for t in ooms)


def test_bisection_climbs_back_after_a_success_below_the_oom(tmp_path: Path) -> None:
    # With 40 GiB the first seed runs mbs 16; mbs >= 8 runs out of memory. Bisection: 16 fails,
    # 4 (the middle of 1, 2, 4, 8) runs, 8 (between 4 and 16) fails, nothing is left between.
    cluster = small_cluster(memory_gib=40)
    seed = Layout(tp=1, pp=1, dp=4, mbs=16, gbs=MODEL.global_batch_size,
                  distributed_optimizer=True, overlap_grad_reduce=True,
                  overlap_param_gather=True, impl="sdpa")
    backend = FakeBackend(cluster, oom=lambda s: mbs_family(s) == mbs_family(seed) and s.mbs >= 8)
    run_search(config(tmp_path, backend, cluster=cluster, n_trials=6))
    assert backend.calls[:3] == [seed, replace(seed, mbs=4), replace(seed, mbs=8)]
    assert mbs_family(seed) not in {mbs_family(s) for s in backend.calls[3:]}


def test_a_real_oom_teaches_the_gate_a_smaller_capacity(capacity_run: Run) -> None:
    # The memory model underestimates: nothing over 9 GiB runs, though 12 GiB are predicted.
    backend, result, _ = capacity_run

    learned: float | None = None
    for s in backend.calls:
        peak = predicted_peak(s)
        if learned is not None:
            assert peak < learned, f"{s.describe()} predicted {peak / GIB:.2f} GiB was launched"
        if peak > 9 * GIB:
            learned = peak if learned is None else min(learned, peak)
    assert learned is not None and result.count(TrialStatus.OOM) >= 1
    reasons = [r.reason for r in result.records if r.status is TrialStatus.PREDICTED_OOM]
    assert any("learned capacity" in reason for reason in reasons)


def test_an_oom_below_a_measured_fit_never_rules_out_a_layout(tmp_path: Path) -> None:
    # The H100 study: a warm worker's leftovers make one layout run out of memory though a
    # layout predicted to need as much fit before it. The grid still launches every layout
    # predicted to fit, each once.
    largest_fit = 0.0
    noise: list[Layout] = []

    def oom(s: Layout) -> bool:
        nonlocal largest_fit
        if not noise and predicted_peak(s) <= largest_fit:
            noise.append(s)
            return True
        largest_fit = max(largest_fit, predicted_peak(s))
        return False

    backend = FakeBackend(CLUSTER, oom=oom)
    result = run_search(config(tmp_path, backend, sampler="grid"))

    valid = set(representatives(MODEL, enumerate_space(SPACE, MODEL, CLUSTER).valid).values())
    expected = [s for s in valid if fits(s)]
    assert sorted(backend.calls, key=repr) == sorted(expected, key=repr)
    assert len(noise) == 1
    [failed] = [r for r in result.records
                if r.status is TrialStatus.OOM and r.duplicate_of is None]
    assert failed.layout == noise[0]
    assert "CUDA out of memory (fake); OOM at " in failed.reason
    assert failed.reason.endswith("GiB that fit: not used to tighten the gate")
    assert not any("learned capacity" in r.reason or "which ran out of memory" in r.reason
                   for r in result.records)


# -- no duplicates, stop conditions, samplers -----------------------------------------------


def test_no_layout_is_launched_twice_and_duplicates_are_recorded(capacity_run: Run) -> None:
    backend, result, tmp_path = capacity_run

    assert len(backend.calls) == len(set(backend.calls)) == 12
    by_number = {r.number: r for r in result.records}
    duplicates = [r for r in result.records if r.duplicate_of is not None]
    assert duplicates, "the sampler proposed no duplicate; the test needs a smaller space"
    for dup in duplicates:
        original = by_number[dup.duplicate_of]
        assert original.duplicate_of is None and original.number < dup.number
        assert (dup.layout, dup.status) == (original.layout, original.status)
        assert not dup.launched
    trials = {t.number: t for t in stored(tmp_path)}
    assert all(trials[d.number].user_attrs["record"]["duplicate_of"] == d.duplicate_of
               for d in duplicates)


def test_stops_after_n_launched_trials(tmp_path: Path) -> None:
    backend = FakeBackend(CLUSTER)
    result = run_search(config(tmp_path, backend, n_trials=7))
    assert len(backend.calls) == len(launched(result)) == 7
    assert result.stop_reason == "reached --trials 7"


def test_stops_after_patience_launches_without_improvement(tmp_path: Path) -> None:
    backend = FakeBackend(CLUSTER, tokens=lambda s: 1000.0)  # nothing ever beats the first
    result = run_search(config(tmp_path, backend, patience=4, n_trials=50))
    assert len(backend.calls) == 5
    assert "--patience" in result.stop_reason


def test_stops_at_the_time_budget(tmp_path: Path) -> None:
    now = [0.0]

    def slow_tokens(s: Layout) -> float:
        now[0] += 100.0  # each trial takes 100 s
        return 1000.0 * s.dp

    backend = FakeBackend(CLUSTER, tokens=slow_tokens)
    result = Search(config(tmp_path, backend, time_budget_s=250.0, n_trials=50),
                    clock=lambda: now[0]).run()
    assert len(backend.calls) == 3
    assert result.stop_reason == "reached --time-budget 250 s"


def test_grid_launches_every_layout_predicted_to_fit_once(grid_run: Run) -> None:
    backend, result, _ = grid_run

    # one run for each set of layouts that are the same run (do/ogr/opg with one DP rank)
    valid = set(representatives(MODEL, enumerate_space(SPACE, MODEL, CLUSTER).valid).values())
    expected = [s for s in valid if fits(s)]
    assert 0 < len(expected) < len(valid)
    assert sorted(backend.calls, key=repr) == sorted(expected, key=repr)
    assert len(result.records) == len(valid) == result.valid_layouts
    assert result.stop_reason == "every layout of the grid was tried"


# -- interruption and resume ------------------------------------------------------------------


def test_resume_after_the_process_is_killed_mid_trial(tmp_path: Path) -> None:
    marker = tmp_path / "running"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(FAKE_SCRIPT), str(tmp_path), str(marker), "6"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "the third trial never started"
            time.sleep(0.05)
        running = [t for t in stored(tmp_path, "killed") if t.state is TrialState.RUNNING]
        assert len(running) == 1
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate()
    killed = running[0].number
    before = stored(tmp_path, "killed")
    finished = {t.user_attrs["record"]["strategy"] for t in before if t.state.is_finished()}
    assert len(finished) == 2

    # The killed trial stopped beating; a short grace period lets this resume fail it.
    time.sleep(2.5)  # heartbeats have one-second resolution in SQLite
    backend = FakeBackend(CLUSTER)
    result = Search(config(tmp_path, backend, study_name="killed", n_trials=6, resume=True),
                    heartbeat=Heartbeat(interval_s=1, grace_s=1)).run()

    after = stored(tmp_path, "killed")
    assert after[killed].state is TrialState.FAIL
    assert not [t for t in after if t.state is TrialState.RUNNING]
    assert not finished & {s.describe() for s in backend.calls}, "a finished trial re-ran"
    assert len(backend.calls) == 4
    assert len(launched(result)) == 6 and result.stop_reason == "reached --trials 6"
    # The layout that was killed is tried again: it never produced a result.
    assert marker.read_text() in {s.describe() for s in backend.calls}


@pytest.mark.parametrize("where", ["backend", "gate"])
def test_ctrl_c_leaves_a_consistent_study_that_resumes(
        tmp_path: Path, where: str) -> None:
    backend = FakeBackend(CLUSTER, interrupt_on_call=3 if where == "backend" else None)
    search = Search(config(tmp_path, backend, n_trials=5))
    if where == "gate":  # between the ask and the launch of the third trial
        real, count = search.knowledge.predict, [0]

        def interrupting(s: Layout) -> Any:
            count[0] += 1
            if count[0] == 3:  # the third launch's predicted step time (its timeout)
                raise KeyboardInterrupt
            return real(s)

        search.knowledge.predict = interrupting  # type: ignore[method-assign]
    result = search.run()
    assert result.interrupted and "--resume" in result.stop_reason
    trials = stored(tmp_path)
    assert not [t for t in trials if t.state is TrialState.RUNNING]
    assert trials[-1].state is TrialState.FAIL

    first = [s for s in backend.calls[:2]]
    again = FakeBackend(CLUSTER)
    resumed = run_search(config(tmp_path, again, n_trials=5, resume=True))
    assert not resumed.interrupted and resumed.stop_reason == "reached --trials 5"
    assert not set(first) & set(again.calls)
    assert len(again.calls) == 3 and len(launched(resumed)) == 5


@pytest.mark.parametrize(("resume", "message"), [
    (False, "already exists"),
    (True, "--resume: no study"),
])
def test_study_exists_only_with_resume(tmp_path: Path, resume: bool, message: str) -> None:
    if not resume:
        run_search(config(tmp_path, FakeBackend(CLUSTER), n_trials=2))
    backend = FakeBackend(CLUSTER)
    with pytest.raises(ConfigError, match=message):
        run_search(config(tmp_path, backend, n_trials=2, resume=resume,
                          study_name="s" if not resume else "new"))
    assert backend.calls == []
    if not resume:
        assert len(stored(tmp_path)) >= 2  # nothing lost


def test_simulate_study_is_written_once_at_the_end_and_resumes_without_duplicates(
        tmp_path: Path) -> None:
    backend = SimulateBackend(CLUSTER)
    during: list[int] = []

    def observer(record: TrialRecord, result: SearchResult) -> None:
        if not during:  # the in-memory study is not written trial by trial
            during.append(len(stored(tmp_path)))

    result = run_search(config(tmp_path, backend, sampler="auto"), observer)
    trials = stored(tmp_path)
    assert during == [0]
    assert len(trials) == len(result.records) == result.valid_layouts
    assert all(t.state.is_finished() for t in trials)
    assert result.best(1)[0].metrics is not None and result.best(1)[0].metrics.predicted

    resumed = run_search(config(tmp_path, backend, sampler="auto", resume=True))
    assert len(stored(tmp_path)) == len(trials)
    assert not launched(resumed)[len(launched(result)):]
    assert [r.number for r in resumed.records] == [r.number for r in result.records]


def test_the_cost_model_is_refitted_to_measured_trials(tmp_path: Path) -> None:
    # The fake machine runs every layout at 2/3 of the speed the default model predicts.
    from autotune.predict.cost import CostParams, estimate_cost

    def slower(s: Layout) -> float:
        return estimate_cost(MODEL, s, CLUSTER).tokens_per_s * 2 / 3

    result = run_search(config(tmp_path, FakeBackend(CLUSTER, tokens=slower), n_trials=6))
    measured = [r for r in launched(result) if r.tokens_per_s is not None]
    assert len(measured) >= 4
    assert result.fitted_on == len(measured)
    assert result.cost_params is not None and result.cost_params != CostParams()
    for r in measured:  # the refitted model predicts this machine within 10%
        fitted = estimate_cost(MODEL, r.layout, CLUSTER, result.cost_params).tokens_per_s
        assert fitted == pytest.approx(r.tokens_per_s, rel=0.10)


# -- launch failures ----------------------------------------------------------------------------


class _RendezvousFailsFirst:
    """Wraps FakeBackend: the first `failures` launches die in torchrun's rendezvous."""

    def __init__(self, inner: FakeBackend, failures: int) -> None:
        self.inner, self.failures, self.launches = inner, failures, 0
        self.name, self.predicted = "fake", False

    def close(self) -> None:
        self.inner.close()

    def run(self, spec: Any, trial_dir: Path, timeout_s: float) -> Any:
        from autotune.trials.metrics import RENDEZVOUS_FAILED
        from autotune.trials.trial import TrialMetrics

        self.launches += 1
        trial_dir.mkdir(parents=True, exist_ok=True)
        (trial_dir / "log.txt").write_text(f"launch {self.launches}\n")
        if self.launches <= self.failures:
            return TrialMetrics(status=TrialStatus.CRASH, wall_time_s=60.0, launch_failed=True,
                                error=f"{RENDEZVOUS_FAILED}: TCP client failed to connect")
        return replace(self.inner.run(spec, trial_dir, timeout_s), wall_time_s=20.0)


@pytest.mark.parametrize(("failures", "status", "launches", "wall"), [
    (1, TrialStatus.OK, 2, 80.0),      # relaunched once: the layout gets its measurement
    (2, TrialStatus.CRASH, 2, 120.0),  # a second failure is recorded, not retried forever
])
def test_a_launch_that_never_reached_its_rendezvous_is_relaunched_once(
        tmp_path: Path, failures: int, status: TrialStatus, launches: int, wall: float) -> None:
    backend = _RendezvousFailsFirst(FakeBackend(CLUSTER), failures)
    result = run_search(config(tmp_path, backend, n_trials=1))
    [record] = launched(result)
    assert record.status is status
    assert backend.launches == launches
    assert record.metrics is not None and record.metrics.wall_time_s == wall
    trial_dir = tmp_path / "s" / "trials" / str(record.number)
    assert (trial_dir / "log-launch-failed.txt").read_text() == "launch 1\n"
    assert (trial_dir / "log.txt").read_text() == "launch 2\n"


def test_resume_after_the_space_frees_a_new_dimension(tmp_path: Path) -> None:
    # Trials stored before cross_entropy_fusion was in the space ran with its default (off);
    # resuming with it freed must replay them as such, not fail on the missing parameter.
    first = run_search(config(tmp_path, FakeBackend(CLUSTER), n_trials=3))
    backend = FakeBackend(CLUSTER)
    wider = small_space(cross_entropy_fusion=[False, True])
    second = run_search(config(tmp_path, backend, space=wider, resume=True, n_trials=6))
    old = {r.layout for r in launched(first)}
    assert all(not s.cross_entropy_fusion for s in old)
    assert not old & set(backend.calls)  # nothing that ran before runs again
    assert len(launched(second)) >= len(launched(first))


def test_report_rows_of_old_trials_get_the_new_field_s_default(tmp_path: Path) -> None:
    from autotune.report.load import trial_row

    run_search(config(tmp_path, FakeBackend(CLUSTER), n_trials=1))
    [done] = [t for t in stored(tmp_path) if t.state is TrialState.COMPLETE]
    record = dict(done.user_attrs["record"])
    record["layout"] = {k: v for k, v in record["layout"].items()
                        if k != "cross_entropy_fusion"}  # as stored before the field existed
    old = optuna.trial.create_trial(state=TrialState.COMPLETE, values=done.values,
                                    params=done.params, distributions=done.distributions,
                                    user_attrs={"record": record})
    row = trial_row(old)
    assert row["cross_entropy_fusion"] is False
    assert row["tp"] == done.user_attrs["record"]["layout"]["tp"]


def test_an_invalid_proposal_never_hides_the_valid_layout_it_resembles(tmp_path: Path) -> None:
    # An INVALID record's layout is built from the proposal with dp left at 1; its key must
    # not be the run key of a real layout (here tp1 pp1 dp4 mbs1 ogr), which would then
    # be told a duplicate of the INVALID trial and never run.
    backend = FakeBackend(CLUSTER)
    search = Search(config(tmp_path, backend, n_trials=2))
    layouts, study = search.layouts, search.store.study
    valid = next(v for v in layouts.valid if (v.tp, v.pp, v.mbs) == (1, 1, 1)
                 and not (v.sequence_parallel or v.distributed_optimizer))
    bad = {"tp": 1, "pp": 1, "mbs": 1, "sequence_parallel": False,
           "distributed_optimizer": False, "overlap_param_gather": True}  # opg needs do
    for params in (bad, layouts.params(valid)):
        study.enqueue_trial({k: v for k, v in params.items() if k in layouts.free})
        search.executor.finish(study.ask(layouts.distributions))
    invalid, ran = search.result.records
    assert invalid.status is TrialStatus.INVALID
    assert ran.duplicate_of is None and ran.status is TrialStatus.OK
    assert backend.calls == [valid]
