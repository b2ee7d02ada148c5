"""The standby launch (autotune.trials.standby, autotune.worker.standby): a cold launch made
ahead of the fresh run, against process doubles (a fake torchrun, standby ranks without torch:
tests/doubles/standby_rank.py says what each does), and the search starting it."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from doubles.fake_backend import FakeBackend, small_cluster, small_model, small_space

from autotune.layouts.layout import Layout
from autotune.search import SearchConfig, run_search
from autotune.search.backends import STANDBY_DIR, Isolation, WorkerBackend
from autotune.specs.model import ModelSpec
from autotune.trials.launchers import LOG_NAME, MultiNode
from autotune.trials.metrics import metrics_from_run
from autotune.trials.protocol import standby_ready_name
from autotune.trials.runner import TrialInterrupted
from autotune.trials.standby import Standby
from autotune.trials.trial import TrialMetrics, TrialSpec, TrialStatus
from tests.conftest import process_gone

DOUBLES = Path(__file__).parent / "doubles"
FAKE_TORCHRUN = (sys.executable, str(DOUBLES / "fake_torchrun.py"))
STANDBY_RANK = (str(DOUBLES / "standby_rank.py"),)
POOL_RANK = (str(DOUBLES / "pool_rank.py"),)
MODEL = ModelSpec(name="tiny", num_layers=4, hidden_size=64, num_attention_heads=4,
                  vocab_size=1000, seq_length=128, global_batch_size=8)
OK, CRASH, HANG = 1, 4, 5
"""Micro-batch sizes that tell the double what the trial does."""


def _spec(mbs: int = OK, dp: int = 2) -> TrialSpec:
    return TrialSpec(model=MODEL, layout=Layout(dp=dp, mbs=mbs, gbs=8 * mbs * dp))


def _standby(tmp_path: Path, nproc: int = 2) -> Standby:
    standby = Standby(tmp_path / STANDBY_DIR, nproc, launcher=FAKE_TORCHRUN,
                      worker=STANDBY_RANK, grace_s=1.0)
    standby.start()
    return standby


def _pids(folder: Path) -> set[int]:
    return {int(p.read_text()) for p in folder.glob("pid-rank*")}


def _wait_ready(standby: Standby, within_s: float = 20) -> None:
    end = time.monotonic() + within_s
    while not standby.ready:
        assert time.monotonic() < end, "the standby never said it was ready"
        time.sleep(0.02)


def test_the_trial_runs_in_the_processes_started_ahead(tmp_path: Path) -> None:
    with _standby(tmp_path) as standby:
        _wait_ready(standby)
        started = _pids(standby.root)
        output = standby.run(_spec(), tmp_path / "trials" / "9", 20)
        assert output is not None and not standby.running
    metrics = metrics_from_run(output)
    assert metrics.status is TrialStatus.OK and metrics.warm is False
    assert _pids(output.trial_dir) == started and len(started) == 2
    assert (output.trial_dir / "trial.json").exists()
    assert "AUTOTUNE_STARTED" in (output.trial_dir / LOG_NAME).read_text()
    assert all(process_gone(pid) for pid in started)
    # One trial a standby.
    assert standby.run(_spec(), tmp_path / "trials" / "10", 20) is None


@pytest.mark.parametrize(("env", "within_s", "ran"), [
    # Its imports touched CUDA: it ends before it is ready; the trial is not run there.
    ({"STANDBY_DOUBLE_CUDA": "1"}, 20.0, False),
    # Still importing at the hand-over: waited for, sooner than a launch of its own.
    ({"STANDBY_DOUBLE_IMPORT_S": "1"}, 20.0, True),
    # Never ready within the trial's time: not run there either.
    ({"STANDBY_DOUBLE_IMPORT_S": "30"}, 1.0, False),
])
def test_a_standby_not_ready_hands_the_trial_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], within_s: float,
        ran: bool) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with _standby(tmp_path) as standby:
        pids = _pids(standby.root) if standby.root.exists() else set()
        output = standby.run(_spec(), tmp_path / "trials" / "0", within_s)
        assert (output is not None) is ran
        if output is not None:
            assert metrics_from_run(output).status is TrialStatus.OK
    assert not standby.running and all(process_gone(pid) for pid in pids)


@pytest.mark.parametrize(("mbs", "status", "timed_out"), [
    (CRASH, TrialStatus.CRASH, False),
    (HANG, TrialStatus.TIMEOUT, True),
])
def test_a_trial_that_fails_in_the_standby_fails_as_a_cold_one(
        tmp_path: Path, mbs: int, status: TrialStatus, timed_out: bool) -> None:
    with _standby(tmp_path) as standby:
        _wait_ready(standby)
        pids = _pids(standby.root)
        output = standby.run(_spec(mbs), tmp_path / "trials" / "0", 3)
    assert output is not None and output.timed_out is timed_out
    assert metrics_from_run(output).status is status
    assert all(process_gone(pid) for pid in pids)
    if timed_out:  # the ranks' stacks, as a cold trial that timed out keeps them
        assert list(output.trial_dir.glob("stacks-rank*.txt"))


@pytest.mark.parametrize("ready", [True, False])
def test_close_stops_an_unused_standby(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       ready: bool) -> None:
    if not ready:
        monkeypatch.setenv("STANDBY_DOUBLE_IMPORT_S", "60")  # still "importing": signalled
    standby = _standby(tmp_path)
    if ready:
        _wait_ready(standby)
    else:
        time.sleep(0.5)
    pids = _pids(standby.root)
    start = time.monotonic()
    standby.close()
    assert time.monotonic() - start < 5
    assert not standby.running and all(process_gone(pid) for pid in pids)


def test_ctrl_c_while_the_trial_runs_stops_it(tmp_path: Path) -> None:
    import _thread
    import threading

    with _standby(tmp_path) as standby:
        _wait_ready(standby)
        pids = _pids(standby.root)
        timer = threading.Timer(1.0, _thread.interrupt_main)
        timer.start()
        try:
            with pytest.raises(TrialInterrupted) as info:
                standby.run(_spec(HANG), tmp_path / "trials" / "0", 30)
        finally:
            timer.cancel()
    assert info.value.output.interrupted and all(process_gone(pid) for pid in pids)


def test_the_fresh_run_uses_the_standby_and_stops_the_pool(tmp_path: Path) -> None:
    backend = WorkerBackend(isolation=Isolation.WARM, launcher=FAKE_TORCHRUN,
                            worker=(str(DOUBLES / "ok.py"),), pool_worker=POOL_RANK,
                            standby_worker=STANDBY_RANK)
    trials = tmp_path / "study" / "trials"
    try:
        backend.stand_by(trials, 1)
        standby = backend.standbys[((tmp_path / "study" / STANDBY_DIR).resolve(), 1)]
        warm = backend.run(_spec(dp=1), trials / "0", 20)
        _wait_ready(standby)
        fresh = backend.run_fresh(_spec(dp=1), trials / "1", 20)
        assert warm.warm is True and fresh.warm is False and fresh.status is TrialStatus.OK
        assert not backend.pool(trials / "0", 1).running
        assert _pids(trials / "1") == _pids(standby.root)
        assert not backend.standbys  # used once
        # Without a standby (used, or never started), the fresh run is a launch of its own.
        again = backend.run_fresh(_spec(dp=1), trials / "2", 20)
        assert again.status is TrialStatus.OK and not list((trials / "2").glob("pid-rank*"))
    finally:
        backend.close()


@pytest.mark.parametrize(("isolation", "multi"), [
    (Isolation.COLD, None),
    (Isolation.WARM, MultiNode(launcher="torchrun", nodes=2, gpus_per_node=1,
                               rdzv_endpoint="h:1")),
])
def test_no_standby_where_every_trial_is_a_launch_of_its_own(
        tmp_path: Path, isolation: Isolation, multi: MultiNode | None) -> None:
    backend = WorkerBackend(multi, isolation, launcher=FAKE_TORCHRUN,
                            standby_worker=STANDBY_RANK)
    backend.stand_by(tmp_path / "study" / "trials", 2)
    assert not backend.standbys and not (tmp_path / "study" / STANDBY_DIR).exists()


def test_a_launcher_that_cannot_start_leaves_the_search_as_it_was(tmp_path: Path) -> None:
    backend = WorkerBackend(launcher=("/nonexistent/torchrun",), standby_worker=STANDBY_RANK)
    backend.stand_by(tmp_path / "study" / "trials", 1)
    assert not backend.standbys


# --- The worker's side, in this process (torch on the CPU: CUDA is never initialised) -------

def test_the_worker_stands_by_until_its_job_and_times_the_wait(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    from autotune.trials.protocol import PoolJob, write_pool_job
    from autotune.worker.standby import stand_by

    write_pool_job(tmp_path, PoolJob(0, tmp_path / "trial.json", tmp_path / "out"))
    job, phases = stand_by(tmp_path, 0, time.perf_counter())
    assert job == PoolJob(0, tmp_path / "trial.json", tmp_path / "out")
    assert (tmp_path / standby_ready_name(0)).exists()
    assert set(phases) == {"startup_s", "standby_import_s", "standby_wait_s"}


def test_a_worker_whose_imports_touched_cuda_never_says_ready(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from autotune.worker.standby import CudaTouched, stand_by

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(CudaTouched):
        stand_by(tmp_path, 0, time.perf_counter())
    assert not (tmp_path / standby_ready_name(0)).exists()


@pytest.mark.parametrize(("argv", "ok"), [
    (["--standby", "d"], True),
    (["--standby", "d", "--serve", "p"], False),
    (["--standby", "d", "--spec", "t.json", "--out-dir", "o"], False),
])
def test_the_worker_takes_standby_alone(argv: list[str], ok: bool) -> None:
    from autotune.worker.__main__ import parse_args

    if ok:
        assert parse_args(argv).standby == Path("d")
    else:
        with pytest.raises(SystemExit):
            parse_args(argv)


# --- The search starts one when it will end with a fresh run ---------------------------------

@dataclass
class StandbyBackend(FakeBackend):
    """FakeBackend with a warm pool's fresh run and standby: records the calls."""

    stood_by: list[tuple[Path, int]] = field(default_factory=list)
    fresh: list[Layout] = field(default_factory=list)

    def stand_by(self, trials_dir: Path, nproc: int) -> None:
        self.stood_by.append((trials_dir, nproc))

    def run_fresh(self, spec: TrialSpec, trial_dir: Path, timeout_s: float) -> TrialMetrics:
        self.fresh.append(spec.layout)
        return self.run(spec, trial_dir, timeout_s)


@pytest.mark.parametrize(("overrides", "stands_by"), [
    ({}, True),
    ({"finalists": 0}, False),
    ({"finalist_runs": 1}, False),
    ({"sampler": "grid"}, False),
])
def test_the_search_starts_a_standby_when_it_ends_with_a_fresh_run(
        tmp_path: Path, overrides: dict[str, Any], stands_by: bool) -> None:
    cluster = small_cluster(memory_gib=40.0)
    backend = StandbyBackend(cluster)
    space = small_space(tp=[1], pp=[1], mbs=[2, 4, 8], distributed_optimizer=[False],
                        overlap_param_gather=[False])
    cfg = SearchConfig(**{"model": small_model(), "cluster": cluster, "space": space,
                          "backend": backend, "results_dir": tmp_path, "study_name": "s",
                          "sampler": "ranked", "stop_rule": "none", **overrides})
    run_search(cfg)
    expected = [(tmp_path / "s" / "trials", cluster.num_gpus)] if stands_by else []
    assert backend.stood_by == expected
    assert bool(backend.fresh) is stands_by
