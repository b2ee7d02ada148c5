"""The runner on test doubles (tests/doubles/): exit codes, timeouts, Ctrl-C, no leftovers."""

from __future__ import annotations

import _thread
import importlib.util
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autotune.errors import ConfigError, LaunchError
from autotune.layouts.layout import Layout
from autotune.megatron.megatron_args import flag_names
from autotune.specs.model import ModelSpec
from autotune.trials import ports
from autotune.trials.launchers import TORCHRUN
from autotune.trials.metrics import metrics_from_run
from autotune.trials.ports import free_port
from autotune.trials.protocol import NCCL_TIMEOUT_ENV
from autotune.trials.runner import (
    STACKS_WAIT_S,
    RunOutput,
    TrialInterrupted,
    megatron_lm_argv,
    run_command,
    run_megatron_lm_trial,
    run_trial,
    torchrun_argv,
    trial_env,
)
from autotune.trials.trial import TrialSpec, TrialStatus
from tests.conftest import process_gone

DOUBLES = Path(__file__).parent / "doubles"
HAS_TORCH = importlib.util.find_spec("torch") is not None
SLACK_S = 1.5
"""Allowance over timeout + grace for process start-up and the final sweep."""

MODEL = ModelSpec(name="tiny", num_layers=4, hidden_size=64, num_attention_heads=4,
                  vocab_size=1000, seq_length=128, global_batch_size=8)


def _double(name: str, *args: str) -> list[str]:
    return [sys.executable, str(DOUBLES / f"{name}.py"), *args]


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def _pids(trial_dir: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted(trial_dir.glob("*.pid"))]


# --- environment and argv -------------------------------------------------------------------


def test_trial_env_forces_the_nccl_and_cuda_settings() -> None:
    base = {"PATH": "/bin", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_NVLS_ENABLE": "1"}
    env = trial_env(base, nccl_timeout_s=45)
    assert env["PATH"] == "/bin"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert env["TORCH_NCCL_BLOCKING_WAIT"] == "0"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert env["OMP_NUM_THREADS"] == "1"
    assert env[NCCL_TIMEOUT_ENV] == "45"
    assert base["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"  # the caller's mapping is untouched


def test_trial_env_keeps_the_users_omp_threads_and_defaults_to_os_environ(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    monkeypatch.setenv("AUTOTUNE_TEST_MARKER", "yes")
    env = trial_env()
    assert env["OMP_NUM_THREADS"] == "6"
    assert env["AUTOTUNE_TEST_MARKER"] == "yes"
    assert env[NCCL_TIMEOUT_ENV] == "120"


def test_trial_env_rejects_a_nonpositive_timeout() -> None:
    with pytest.raises(ConfigError):
        trial_env({}, nccl_timeout_s=0)


def test_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_free_port_stays_out_of_the_ephemeral_range() -> None:
    # Ports the kernel hands out as source ports can be taken before torchrun binds them.
    low, high = (int(x) for x in
                 Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2])
    ports = {free_port(rng=random.Random(seed)) for seed in range(20)}
    assert all(20000 <= p < low or high < p < 65536 for p in ports)
    assert len(ports) > 1  # random: concurrent workers rarely pick the same


@pytest.mark.parametrize(("ephemeral", "allowed"), [
    ((15000, 60999), range(61000, 65536)),   # nothing free below: above the range
    ((32768, 65535), range(20000, 32768)),   # nothing above: below it
])
def test_free_port_uses_whichever_side_of_the_range_exists(
        monkeypatch: pytest.MonkeyPatch, ephemeral: tuple[int, int], allowed: range) -> None:
    monkeypatch.setattr(ports, "_ephemeral_range", lambda: ephemeral)
    assert all(free_port(rng=random.Random(seed)) in allowed for seed in range(10))


@pytest.mark.parametrize(("listener", "seed"), [
    ("127.0.0.1", 7),   # the port taken on the rendezvous address itself
    ("127.0.0.2", 11),  # TCPStore binds the wildcard address: another loopback address blocks it
])
def test_free_port_skips_a_taken_port(listener: str, seed: int) -> None:
    taken = free_port(rng=random.Random(seed))
    with socket.socket() as sock:
        sock.bind((listener, taken))
        sock.listen()
        assert free_port(rng=random.Random(seed)) != taken


def test_torchrun_argv(tmp_path: Path) -> None:
    spec = TrialSpec(model=MODEL, layout=Layout(tp=2, dp=2, gbs=8))
    assert torchrun_argv(spec, tmp_path, 4, 29500) == [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--nnodes", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29500",
        "-m", "autotune.worker", "--spec", str(tmp_path / "trial.json"),
        "--out-dir", str(tmp_path)]


def test_torchrun_argv_with_other_launcher_and_worker(tmp_path: Path) -> None:
    spec = TrialSpec(model=MODEL, layout=Layout())
    argv = torchrun_argv(spec, tmp_path, 1, 1234, launcher=("torchrun",),
                         worker=("/w/double.py", "--detach"))
    assert argv[:2] == ["torchrun", "--nproc-per-node"]
    assert argv[9:] == ["/w/double.py", "--detach", "--spec", str(tmp_path / "trial.json"),
                        "--out-dir", str(tmp_path)]


def test_torchrun_argv_needs_nproc_equal_to_the_world(tmp_path: Path) -> None:
    spec = TrialSpec(model=MODEL, layout=Layout(tp=2, dp=2))
    with pytest.raises(ConfigError, match="nproc=2"):
        torchrun_argv(spec, tmp_path, 2, 29500)


def test_megatron_lm_argv(tmp_path: Path) -> None:
    spec = TrialSpec(model=MODEL, layout=Layout(tp=2, dp=2, gbs=8, impl="te"),
                     train_steps=10, warmup_steps=3)
    argv = megatron_lm_argv(tmp_path / "Megatron-LM", spec, 4, 29501, nccl_timeout_s=90)
    prefix = [*TORCHRUN, "--nproc-per-node", "4", "--nnodes", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", "127.0.0.1:29501", str(tmp_path / "Megatron-LM/pretrain_gpt.py")]
    assert argv[:len(prefix)] == prefix
    args = argv[len(prefix):]
    assert args[args.index("--train-iters") + 1] == "13"
    assert args[args.index("--distributed-timeout-minutes") + 1] == "2"
    assert args[args.index("--tensor-model-parallel-size") + 1] == "2"
    assert "--mock-data" in args
    names = flag_names(args)
    assert len(names) == len(set(names))


def test_megatron_lm_trial_needs_a_checkout(tmp_path: Path) -> None:
    spec = TrialSpec(model=MODEL, layout=Layout())
    with pytest.raises(LaunchError, match=r"pretrain_gpt\.py"):
        run_megatron_lm_trial(tmp_path, spec, tmp_path / "t", timeout_s=5)


# --- running test doubles -------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "returncode", "status", "in_error"), [
    (_double("ok"), 0, TrialStatus.OK, None),
    (_double("crash"), 1, TrialStatus.CRASH, "shape mismatch"),
    (_double("oom"), 3, TrialStatus.OOM, "rank 0: OOM: CUDA out of memory"),
    (_double("oom", "--no-file"), 3, TrialStatus.OOM, "CUDA out of memory"),
], ids=["ok", "crash", "oom", "oom-no-file"])
def test_run_and_classify(tmp_path: Path, argv: list[str], returncode: int,
                          status: TrialStatus, in_error: str | None) -> None:
    output = run_command([*argv, "--out-dir", str(tmp_path)], tmp_path, timeout_s=20)
    assert output.returncode == returncode
    assert not output.timed_out and not output.interrupted
    assert _group_gone(output.pid)
    metrics = metrics_from_run(output)
    assert metrics.status is status
    assert metrics.wall_time_s == output.wall_time_s
    if in_error is None:
        assert metrics.error is None
    else:
        assert metrics.error is not None and in_error in metrics.error


def test_log_holds_stdout_and_stderr(tmp_path: Path) -> None:
    output = run_command([*_double("crash"), "--out-dir", str(tmp_path)], tmp_path, timeout_s=20)
    log = output.log_path.read_text()
    assert output.log_path == tmp_path / "log.txt"
    assert "building the model" in log  # stdout
    assert "RuntimeError: shape mismatch" in log  # stderr


def test_trial_env_reaches_the_process(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import os; print('NVLS=' + os.environ['NCCL_NVLS_ENABLE'])"]
    output = run_command(argv, tmp_path, timeout_s=20, env=trial_env())
    assert "NVLS=0" in output.log_path.read_text()


def test_timeout_stops_a_hung_process(tmp_path: Path) -> None:
    output = run_command(_double("hang"), tmp_path, timeout_s=1, grace_s=5)
    assert output.timed_out
    assert output.returncode == -signal.SIGTERM  # went at SIGTERM, no need for the grace
    assert 1 <= output.wall_time_s < 1 + SLACK_S
    assert _group_gone(output.pid)
    metrics = metrics_from_run(output)
    assert metrics.status is TrialStatus.TIMEOUT
    assert "timed out" in output.log_path.read_text()


def test_timeout_asks_the_ranks_for_their_stacks_first(tmp_path: Path) -> None:
    output = run_command(_double("hang", "--out-dir", str(tmp_path)), tmp_path, timeout_s=1,
                         grace_s=5)
    assert output.timed_out
    assert 1 + STACKS_WAIT_S <= output.wall_time_s < 1 + STACKS_WAIT_S + SLACK_S
    assert "asked ranks 0 for their Python stacks" in output.log_path.read_text()
    assert "wait_for_a_collective_that_never_completes" in (
        tmp_path / "stacks-rank0.txt").read_text()
    metrics = metrics_from_run(output)
    assert metrics.status is TrialStatus.TIMEOUT
    assert metrics.error is not None
    headline = metrics.error.splitlines()[0]
    assert "where the ranks were: rank 0: doubles/hang.py:" in headline
    assert headline.endswith("wait_for_a_collective_that_never_completes")


def test_ctrl_c_while_the_ranks_write_their_stacks_still_stops_the_trial(tmp_path: Path) -> None:
    timer = threading.Timer(1 + STACKS_WAIT_S / 2, _thread.interrupt_main)  # inside the wait
    timer.start()
    try:
        with pytest.raises(TrialInterrupted) as info:
            run_command(_double("hang", "--out-dir", str(tmp_path)), tmp_path, timeout_s=1,
                        grace_s=5)
    finally:
        timer.cancel()
    output: RunOutput = info.value.output
    assert output.interrupted and output.timed_out
    assert output.returncode == -signal.SIGTERM
    assert _group_gone(output.pid)


def test_stacks_are_asked_only_of_processes_in_the_trial(tmp_path: Path) -> None:
    # A log naming a pid outside the trial (a reused or foreign pid) must not get the signal:
    # SIGUSR1 would kill this bystander.
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        argv = _double("hang", "--out-dir", str(tmp_path), "--claim-pid", str(bystander.pid))
        output = run_command(argv, tmp_path, timeout_s=1, grace_s=5)
        assert output.timed_out
        assert "asked ranks" not in output.log_path.read_text()
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("detach", [False, True], ids=["same-group", "own-session"])
def test_timeout_kills_a_sigterm_ignoring_tree(tmp_path: Path, detach: bool) -> None:
    argv = _double("stubborn", "--out-dir", str(tmp_path), *(["--detach"] if detach else []))
    output = run_command(argv, tmp_path, timeout_s=1, grace_s=1)
    assert output.timed_out
    assert output.returncode == -signal.SIGKILL
    assert 2 <= output.wall_time_s < 2 + SLACK_S
    pids = _pids(tmp_path)
    assert len(pids) == 2  # child and grandchild had started
    assert all(process_gone(pid) for pid in pids)
    assert _group_gone(output.pid)
    assert metrics_from_run(output).status is TrialStatus.TIMEOUT


def test_ctrl_c_stops_the_tree_and_is_reraised(tmp_path: Path) -> None:
    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            run_command(_double("stubborn", "--out-dir", str(tmp_path)), tmp_path,
                        timeout_s=30, grace_s=0.5)
    finally:
        timer.cancel()
    assert isinstance(info.value, TrialInterrupted)
    output: RunOutput = info.value.output
    assert output.interrupted and not output.timed_out
    assert output.wall_time_s < 0.5 + 0.5 + SLACK_S
    assert all(process_gone(pid) for pid in _pids(tmp_path))
    assert _group_gone(output.pid)


def test_missing_executable_is_a_launch_error(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="cannot start"):
        run_command([str(tmp_path / "no-such-program")], tmp_path, timeout_s=5)


@pytest.mark.parametrize(("timeout_s", "grace_s"), [(0, 1), (-1, 1), (1, -1)])
def test_bad_limits_are_config_errors(tmp_path: Path, timeout_s: float, grace_s: float) -> None:
    with pytest.raises(ConfigError):
        run_command(_double("ok"), tmp_path, timeout_s=timeout_s, grace_s=grace_s)


# --- through real torchrun (CPU torch is enough: the doubles never touch a GPU) --------------


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch for torchrun")
def test_torchrun_workers_in_their_own_sessions_are_killed(tmp_path: Path) -> None:
    # torchrun starts every worker with start_new_session=True, so they are not in torchrun's
    # process group; with SIGTERM ignored they also outlive torchrun's own shutdown.
    spec = TrialSpec(model=MODEL, layout=Layout(dp=2, gbs=8))
    argv = torchrun_argv(spec, tmp_path, 2, free_port(),
                         worker=(str(DOUBLES / "stubborn.py"), "--detach"))
    start = time.monotonic()
    output = run_command(argv, tmp_path, timeout_s=6, grace_s=1, env=trial_env())
    assert output.timed_out
    assert time.monotonic() - start < 6 + 1 + SLACK_S
    pids = _pids(tmp_path)
    assert len(pids) == 4, output.log_path.read_text()  # 2 workers + 2 grandchildren started
    assert all(process_gone(pid) for pid in pids)
    assert _group_gone(output.pid)


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch for torchrun")
def test_run_trial_under_torchrun_classifies_an_oom(tmp_path: Path) -> None:
    spec = TrialSpec(model=MODEL, layout=Layout(dp=2, gbs=8))
    output = run_trial(spec, tmp_path, timeout_s=30, grace_s=1,
                       worker=(str(DOUBLES / "oom.py"),))
    assert TrialSpec.from_json((tmp_path / "trial.json").read_text()) == spec
    assert output.returncode != 0 and not output.timed_out
    assert _group_gone(output.pid)
    metrics = metrics_from_run(output)
    assert metrics.status is TrialStatus.OOM, metrics.error
