"""The warm pool (autotune.trials.pool) against process doubles: a fake torchrun and pool ranks
that speak the pool protocol without torch (tests/doubles/pool_rank.py says what each trial
does)."""

from __future__ import annotations

import _thread
import importlib.util
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from autotune.errors import ConfigError
from autotune.layouts.layout import Layout
from autotune.search.backends import POOL_DIR, WARM_FAILURE_DIR, Isolation, WorkerBackend
from autotune.specs.model import ModelSpec
from autotune.trials.metrics import metrics_from_run
from autotune.trials.pool import WarmPool
from autotune.trials.protocol import (
    POOL_PARENT_ENV,
    STACKS_NAME,
    TRIAL_MARKER,
    PoolJob,
    write_pool_job,
)
from autotune.trials.runner import TORCHRUN, RunOutput, TrialInterrupted
from autotune.trials.trial import StopReason, TrialSpec, TrialStatus
from tests.conftest import process_gone

DOUBLES = Path(__file__).parent / "doubles"
FAKE_TORCHRUN = (sys.executable, str(DOUBLES / "fake_torchrun.py"))
RANK = (str(DOUBLES / "pool_rank.py"),)
HAS_TORCH = importlib.util.find_spec("torch") is not None

MODEL = ModelSpec(name="tiny", num_layers=4, hidden_size=64, num_attention_heads=4,
                  vocab_size=1000, seq_length=128, global_batch_size=8)
OK, OOM, CRASH, HANG, NOT_SERVING, RELEASE_HANGS = 1, 3, 4, 5, 6, 7
"""Micro-batch sizes that tell the double rank what the trial does."""


def _spec(mbs: int, dp: int = 2) -> TrialSpec:
    return TrialSpec(model=MODEL, layout=Layout(dp=dp, mbs=mbs, gbs=8 * mbs * dp))


def _pool(tmp_path: Path, nproc: int = 2, **kwargs: object) -> WarmPool:
    return WarmPool(tmp_path / "pool", nproc, launcher=FAKE_TORCHRUN, worker=RANK,
                    grace_s=1.0, **kwargs)  # type: ignore[arg-type]


def _pids(trial_dir: Path) -> set[int]:
    return {int(p.read_text()) for p in trial_dir.glob("pid-*")}


def _run(pool: WarmPool, tmp_path: Path, n: int, mbs: int, timeout_s: float = 20) -> RunOutput:
    return pool.run(_spec(mbs, pool.nproc), tmp_path / "trials" / str(n), timeout_s)


def test_trials_reuse_the_same_ranks_and_each_log_holds_its_own_slice(tmp_path: Path) -> None:
    with _pool(tmp_path) as pool:
        first, second = (_run(pool, tmp_path, n, OK) for n in (0, 1))
        assert pool.starts == 1
        ranks = _pids(first.trial_dir)
        assert len(ranks) == 2 and _pids(second.trial_dir) == ranks
        for output, seq in ((first, 0), (second, 1)):
            metrics = metrics_from_run(output)
            assert metrics.status is TrialStatus.OK and metrics.warm is True
            assert metrics.stop_reason is StopReason.STABLE
            log = output.log_path.read_text()
            assert f"{TRIAL_MARKER} seq={seq} rank=0" in log
            assert f"seq={1 - seq} " not in log  # the other trial's lines are not in this log
        assert (second.trial_dir / "trial.json").exists()
    assert all(process_gone(pid) for pid in ranks)


def test_a_recovered_oom_keeps_the_pool(tmp_path: Path) -> None:
    with _pool(tmp_path, nproc=1) as pool:
        before = _run(pool, tmp_path, 0, OK)
        oom = _run(pool, tmp_path, 1, OOM)
        after = _run(pool, tmp_path, 2, OK)
        assert metrics_from_run(oom).status is TrialStatus.OOM
        assert metrics_from_run(after).status is TrialStatus.OK
        assert pool.starts == 1 and _pids(before.trial_dir) == _pids(after.trial_dir)


@pytest.mark.parametrize(("impls", "starts"), [
    (("sdpa", "te"), 2),              # te's first use after sdpa: fresh ranks
    (("sdpa", "sdpa", "te", "te"), 2),  # once: the second te follows a te
    (("te", "sdpa", "te"), 1),        # te ran first in these ranks
    (("local", "te"), 1),
    (("sdpa", "local"), 1),
    (("te", "te"), 1),
])
def test_the_first_te_trial_after_sdpa_trials_starts_fresh_ranks(
        tmp_path: Path, impls: tuple[str, ...], starts: int) -> None:
    with _pool(tmp_path, nproc=1) as pool:
        outputs = [pool.run(TrialSpec(model=MODEL, layout=Layout(mbs=OK, gbs=8, impl=impl)),
                            tmp_path / "trials" / str(n), 20) for n, impl in enumerate(impls)]
        assert all(metrics_from_run(o).status is TrialStatus.OK for o in outputs)
        assert pool.starts == starts
        last = outputs[-1].trial_dir
        assert _pids(last).isdisjoint(_pids(outputs[0].trial_dir)) is (starts == 2)


@pytest.mark.parametrize(("mbs", "status"), [(CRASH, TrialStatus.CRASH),
                                             (NOT_SERVING, TrialStatus.OK)])
def test_a_pool_in_doubt_is_started_again_for_the_next_trial(
        tmp_path: Path, mbs: int, status: TrialStatus) -> None:
    with _pool(tmp_path) as pool:
        before = _run(pool, tmp_path, 0, OK)
        doubt = _run(pool, tmp_path, 1, mbs)
        assert metrics_from_run(doubt).status is status
        assert not pool.running
        assert all(process_gone(pid) for pid in _pids(before.trial_dir))
        after = _run(pool, tmp_path, 2, OK)
        assert metrics_from_run(after).status is TrialStatus.OK
        assert pool.starts == 2 and _pids(after.trial_dir).isdisjoint(_pids(before.trial_dir))


def test_a_hung_trial_times_out_with_its_stacks_and_the_pool_restarts(tmp_path: Path) -> None:
    with _pool(tmp_path) as pool:
        _run(pool, tmp_path, 0, OK)
        start = time.monotonic()
        hung = _run(pool, tmp_path, 1, HANG, timeout_s=2)
        assert time.monotonic() - start < 2 + 1 + 2 + 3  # timeout, stacks wait, grace, slack
        metrics = metrics_from_run(hung)
        assert hung.timed_out and metrics.status is TrialStatus.TIMEOUT
        assert all(process_gone(pid) for pid in _pids(hung.trial_dir))
        assert sorted(p.name for p in hung.trial_dir.glob(STACKS_NAME.format(rank="*"))) == [
            STACKS_NAME.format(rank=r) for r in (0, 1)]
        assert metrics_from_run(_run(pool, tmp_path, 2, OK)).status is TrialStatus.OK
        assert pool.starts == 2


def test_a_result_whose_release_hangs_stands_and_the_pool_restarts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("autotune.trials.pool.RELEASE_S", 1.0)
    with _pool(tmp_path) as pool:
        stuck = _run(pool, tmp_path, 0, RELEASE_HANGS, timeout_s=30)
        assert not stuck.timed_out and metrics_from_run(stuck).status is TrialStatus.OK
        assert not pool.running and all(process_gone(pid) for pid in _pids(stuck.trial_dir))
        assert "did not release it" in (tmp_path / "pool" / "0" / "log.txt").read_text()
        assert metrics_from_run(_run(pool, tmp_path, 1, OK)).status is TrialStatus.OK
        assert pool.starts == 2


def test_ctrl_c_stops_the_pool_and_is_reraised(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    timer = threading.Timer(1.0, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(TrialInterrupted) as info:
            _run(pool, tmp_path, 0, HANG)
    finally:
        timer.cancel()
    output = info.value.output
    assert output.interrupted and not pool.running
    assert all(process_gone(pid) for pid in _pids(output.trial_dir))


def test_idle_ranks_leave_when_the_orchestrator_is_gone(tmp_path: Path) -> None:
    from autotune.worker.serve import next_job

    (tmp_path / "pool").mkdir()
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    os.environ[POOL_PARENT_ENV] = f"{os.uname().nodename}:{dead}"
    try:
        start = time.monotonic()
        assert next_job(tmp_path / "pool", 0) is None
        assert time.monotonic() - start < 3
        os.environ[POOL_PARENT_ENV] = f"{os.uname().nodename}:{os.getpid()}"
        write_pool_job(tmp_path / "pool", PoolJob(0, tmp_path / "t.json", tmp_path))
        job = next_job(tmp_path / "pool", 0)
        assert job == PoolJob(0, tmp_path / "t.json", tmp_path)
    finally:
        del os.environ[POOL_PARENT_ENV]


@pytest.mark.parametrize(("world", "message"), [(4, "the pool has 2 ranks")])
def test_a_layout_of_another_world_size_is_refused(tmp_path: Path, world: int,
                                                    message: str) -> None:
    with _pool(tmp_path) as pool, pytest.raises(ConfigError, match=message):
        pool.run(_spec(OK, dp=world), tmp_path / "t", 10)


def test_the_worker_backend_keeps_one_pool_per_study_and_closes_it(tmp_path: Path) -> None:
    backend = WorkerBackend(isolation=Isolation.WARM)
    trials = tmp_path / "study" / "trials"
    pool = backend.pool(trials / "0", 2)
    assert backend.pool(trials / "7", 2) is pool
    assert pool.root == (tmp_path / "study" / POOL_DIR).resolve() and pool.nproc == 2
    backend.close()
    assert not pool.running


@pytest.mark.parametrize(("warm", "cold_worker", "status"), [
    (OOM, "ok.py", TrialStatus.OK),
    (OOM, "oom.py", TrialStatus.OOM),
    (CRASH, "ok.py", TrialStatus.OK),
    (CRASH, "crash.py", TrialStatus.CRASH),
])
def test_a_failure_in_the_pool_is_confirmed_in_a_fresh_process(
        tmp_path: Path, warm: int, cold_worker: str, status: TrialStatus) -> None:
    """The pool's leftovers can cause an OOM or a crash: the trial runs again alone, with the
    pool stopped, and the fresh run's outcome is the trial's; the warm run's files are kept
    aside."""
    backend = WorkerBackend(isolation=Isolation.WARM, launcher=FAKE_TORCHRUN,
                            worker=(str(DOUBLES / cold_worker),), pool_worker=RANK)
    trials = tmp_path / "study" / "trials"
    try:
        first = backend.run(_spec(OK, dp=1), trials / "0", 20)
        pool = backend.pool(trials / "0", 1)
        again = backend.run(_spec(warm, dp=1), trials / "1", 20)
        assert first.warm is True and not pool.running
        assert again.status is status and again.warm is not True
        kept = trials / "1" / WARM_FAILURE_DIR
        assert (kept / "log.txt").exists() and list(kept.glob("failure-rank*.json"))
        assert (trials / "1" / "trial.json").exists()
        after = backend.run(_spec(OK, dp=1), trials / "2", 20)
        assert after.status is TrialStatus.OK and after.warm is True and pool.starts == 2
    finally:
        backend.close()


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch for torchrun")
def test_under_the_real_torchrun(tmp_path: Path) -> None:
    with WarmPool(tmp_path / "pool", 2, launcher=TORCHRUN, worker=RANK, grace_s=1) as pool:
        outputs = [_run(pool, tmp_path, n, OK, timeout_s=60) for n in (0, 1)]
        assert [metrics_from_run(o).status for o in outputs] == [TrialStatus.OK] * 2
        assert _pids(outputs[0].trial_dir) == _pids(outputs[1].trial_dir)
        assert pool.starts == 1


def test_a_trials_groups_are_destroyed_in_the_order_they_were_made() -> None:
    from autotune.worker.serve import trial_groups

    class Group:  # hashed by identity, as process groups are: a set would scramble them
        pass

    world, *made = [Group() for _ in range(6)]
    assert trial_groups([world], [world, *made]) == made
    assert trial_groups([world, *made], [world, *made]) == []


class _FakeManager:
    resets = 0

    @classmethod
    def reset(cls) -> None:
        cls.resets += 1


@pytest.mark.parametrize(("module", "expected"), [
    ("transformer_engine.pytorch.quantization", True),  # TE >= 2.8
    ("transformer_engine.pytorch.fp8", True),  # older TE: the same manager there
    (None, False),  # a pool without TE: nothing imported, nothing to reset
])
def test_a_released_trial_leaves_no_fp8_state_to_the_next(
        monkeypatch: pytest.MonkeyPatch, module: str | None, expected: bool) -> None:
    from types import ModuleType

    from autotune.worker import serve

    for name in serve._TE_FP8_STATE_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    _FakeManager.resets = 0
    if module is not None:
        fake = ModuleType(module)
        fake.FP8GlobalStateManager = _FakeManager  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, module, fake)
    assert serve.reset_fp8_state() is expected
    assert _FakeManager.resets == int(expected)
    assert "transformer_engine" not in sys.modules or module is not None


def _module_with_cached_method(name: str) -> tuple[object, type]:
    """A module `name` whose class caches a method keyed by self, as megatron-core's
    RotaryEmbedding.forward does, and a module-level cached function beside it."""
    import functools
    from types import ModuleType

    class Rotary:
        @functools.lru_cache(maxsize=32)  # noqa: B019 - the leak under test
        def forward(self, n: int) -> list[int]:
            return [n] * n

    @functools.cache
    def pool() -> object:
        return object()

    Rotary.__module__ = name
    module = ModuleType(name)
    module.Rotary = Rotary  # type: ignore[attr-defined]
    module.pool = pool  # type: ignore[attr-defined]
    return module, Rotary


@pytest.mark.parametrize(("package", "emptied"), [
    ("megatron.core.models.fake_rope", True),
    ("transformer_engine.pytorch.fake", True),
    ("somebody_else.fake", False),  # not a package the pool owns: left as it is
])
def test_a_released_trial_leaves_no_instance_in_a_method_cache(
        monkeypatch: pytest.MonkeyPatch, package: str, emptied: bool) -> None:
    import gc
    import weakref

    from autotune.worker import serve

    module, rotary = _module_with_cached_method(package)
    monkeypatch.setitem(sys.modules, package, module)
    trial_module = rotary()
    trial_module.forward(4)
    alive = weakref.ref(trial_module)
    kept_pool = vars(module)["pool"]()
    del trial_module
    gc.collect()
    assert alive() is not None  # the class's cache holds the trial's instance

    serve.clear_method_caches()
    gc.collect()
    assert (alive() is None) is emptied
    assert vars(module)["pool"]() is kept_pool  # module-level caches are not touched


def test_ranks_that_keep_memory_are_reported_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="autotune.trials.pool"), _pool(tmp_path) as pool:
        for n in range(2):
            _run(pool, tmp_path, n, NOT_SERVING)
        _run(pool, tmp_path, 2, OK)
        assert pool.starts == 3
    kept = [r.getMessage() for r in caplog.records if "kept GPU memory" in r.getMessage()]
    assert len(kept) == 1 and str(tmp_path / "trials" / "0") in kept[0]
