"""Classification of finished runs and Megatron-LM log parsing, on files written here."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from autotune.layouts.layout import Layout
from autotune.specs.model import ModelSpec
from autotune.trials.metrics import (
    classify_run,
    error_excerpt,
    innermost_frame,
    metrics_from_megatron_log,
    metrics_from_run,
    parse_megatron_log,
    stack_summary,
)
from autotune.trials.runner import RunOutput
from autotune.trials.trial import TrialMetrics, TrialSpec, TrialStatus

OOM_TRACE = ("[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
             "GPU 1 has a total capacity of 79.19 GiB of which 1.06 GiB is free.")
NCCL_WATCHDOG = ("[rank0]:[E1121 10:00:00.000000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog "
                 "caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE) "
                 "ran for 120000 milliseconds before timing out.")
NCCL_ERROR = ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3357, "
              "unhandled system error")
DESTROY_WARNING = ("[rank0]:[W1121 10:00:00.000000 ProcessGroupNCCL.cpp:1496] Warning: WARNING: "
                   "destroy_process_group() was not called before program exit, which can leak "
                   "resources.")
TRACEBACK = "Traceback (most recent call last):\nRuntimeError: shape mismatch"


def _output(tmp_path: Path, *, returncode: int = 1, timed_out: bool = False,
            interrupted: bool = False, log: str = "", wall_time_s: float = 3.0) -> RunOutput:
    (tmp_path / "log.txt").write_text(log)
    return RunOutput(argv=("worker",), pid=12345, returncode=returncode, timed_out=timed_out,
                     interrupted=interrupted, wall_time_s=wall_time_s,
                     log_path=tmp_path / "log.txt", trial_dir=tmp_path)


def _failure_file(tmp_path: Path, rank: int, status: str, error: str = "boom") -> None:
    (tmp_path / f"failure-rank{rank}.json").write_text(
        json.dumps({"rank": rank, "status": status, "error": error}))


RENDEZVOUS = ("[W1121 22:32:46.058154928 TCPStore.cpp:340] [c10d] TCP client failed to "
              "connect/validate to host 127.0.0.1:53267 - retrying (try=0, timeout=60000ms, "
              "delay=42189ms): The client socket has timed out after 60000ms while trying to "
              "connect to (127.0.0.1, 53267).")

TEARDOWN = ("W1121 torch/distributed/elastic/rendezvous/dynamic_rendezvous.py] The node "
            "'host_1_0' has failed to shutdown the rendezvous 'autotune-1-s-0' due to an error "
            "of type RendezvousConnectionError.")

# (returncode, timed_out, failure files, log) -> status
CASES = [
    pytest.param(1, False, [(0, "OOM")], "", TrialStatus.OOM, id="file-oom"),
    pytest.param(1, False, [(0, "NCCL_ERROR"), (1, "OOM")], "", TrialStatus.OOM,
                 id="files-oom-beats-nccl"),
    pytest.param(1, False, [(2, "CRASH")], "", TrialStatus.CRASH, id="file-crash"),
    pytest.param(1, False, [(0, "NCCL_ERROR")], "", TrialStatus.NCCL_ERROR, id="file-nccl"),
    pytest.param(1, False, [], OOM_TRACE, TrialStatus.OOM, id="log-cuda-oom"),
    pytest.param(1, False, [], "torch.OutOfMemoryError", TrialStatus.OOM, id="log-oom-class"),
    pytest.param(1, False, [], "RuntimeError: CUDA error: out of memory", TrialStatus.OOM,
                 id="log-cuda-error-oom"),
    pytest.param(1, False, [], f"{NCCL_WATCHDOG}\n{OOM_TRACE}", TrialStatus.OOM,
                 id="log-oom-beats-nccl"),
    pytest.param(1, False, [(0, "NCCL_ERROR")], OOM_TRACE, TrialStatus.OOM,
                 id="log-oom-beats-nccl-file"),
    pytest.param(1, False, [], NCCL_WATCHDOG, TrialStatus.NCCL_ERROR, id="log-watchdog"),
    pytest.param(1, False, [], NCCL_ERROR, TrialStatus.NCCL_ERROR, id="log-nccl-error"),
    pytest.param(1, False, [], f"{TRACEBACK}\n{DESTROY_WARNING}", TrialStatus.CRASH,
                 id="destroy-warning-is-not-nccl"),
    pytest.param(1, False, [], "AUTOTUNE_STATUS rank=3 status=NCCL_ERROR", TrialStatus.NCCL_ERROR,
                 id="status-line-nccl"),
    pytest.param(1, False, [], "AUTOTUNE_STATUS rank=1 status=OOM", TrialStatus.OOM,
                 id="status-line-oom"),
    pytest.param(3, False, [], "", TrialStatus.OOM, id="exit-code-3"),
    pytest.param(4, False, [], TRACEBACK, TrialStatus.CRASH, id="exit-code-4"),
    pytest.param(-9, False, [], "", TrialStatus.CRASH, id="killed"),
    pytest.param(-9, True, [], "waiting", TrialStatus.TIMEOUT, id="timeout"),
    pytest.param(-15, True, [], NCCL_WATCHDOG, TrialStatus.TIMEOUT, id="timeout-beats-nccl"),
    pytest.param(-9, True, [(1, "OOM")], "", TrialStatus.OOM, id="oom-beats-timeout"),
    pytest.param(0, True, [], "", TrialStatus.TIMEOUT, id="timeout-exit-0"),
    # Seen on 4 x H200: the agent's store port was taken, it waited as a client until killed.
    pytest.param(-15, True, [], RENDEZVOUS, TrialStatus.CRASH, id="rendezvous-is-not-timeout"),
    pytest.param(1, False, [], RENDEZVOUS, TrialStatus.CRASH, id="rendezvous-error"),
    pytest.param(-9, True, [(0, "OOM")], RENDEZVOUS, TrialStatus.OOM, id="oom-beats-rendezvous"),
    # A rank started: whatever failed later, the launch did not (e.g. a peer's store gone).
    pytest.param(-15, True, [], f"AUTOTUNE_STARTED rank=0\n{RENDEZVOUS}", TrialStatus.TIMEOUT,
                 id="started-then-timeout"),
    pytest.param(1, False, [], f"using world size: 2, data-parallel size: 2\n{RENDEZVOUS}",
                 TrialStatus.CRASH, id="megatron-started-then-crash"),
    # torchrun's normal multi-node teardown is not a launch failure.
    pytest.param(-15, True, [], "step 3\n" + TEARDOWN, TrialStatus.TIMEOUT,
                 id="teardown-warning-is-not-rendezvous"),
]

RENDEZVOUS_HEADLINE = "torchrun rendezvous failed (a launch problem, not the layout)"


@pytest.mark.parametrize("log", [f"AUTOTUNE_STARTED rank=0\n{RENDEZVOUS}",
                                 f"using world size: 2, data-parallel size: 2\n{RENDEZVOUS}",
                                 f"step 3\n{TEARDOWN}"])
def test_only_a_launch_where_no_rank_started_is_a_rendezvous_failure(tmp_path: Path,
                                                                       log: str) -> None:
    metrics = metrics_from_run(_output(tmp_path, returncode=1, timed_out=False, log=log))
    assert not (metrics.error or "").startswith(RENDEZVOUS_HEADLINE)
    assert not metrics.launch_failed


def test_rendezvous_failure_names_the_launch(tmp_path: Path) -> None:
    metrics = metrics_from_run(_output(tmp_path, returncode=-15, timed_out=True, log=RENDEZVOUS))
    assert metrics.status is TrialStatus.CRASH and metrics.launch_failed
    assert metrics.error is not None and metrics.error.startswith(RENDEZVOUS_HEADLINE)
    # the flag survives the round trip through a stored record
    assert TrialMetrics.from_dict(metrics.to_dict()).launch_failed


@pytest.mark.parametrize(("returncode", "timed_out", "files", "log", "expected"), CASES)
def test_failure_classification(tmp_path: Path, returncode: int, timed_out: bool,
                                files: list[tuple[int, str]], log: str,
                                expected: TrialStatus) -> None:
    for rank, status in files:
        _failure_file(tmp_path, rank, status)
    output = _output(tmp_path, returncode=returncode, timed_out=timed_out, log=log)
    metrics = metrics_from_run(output)
    assert metrics.status is expected
    assert metrics.launch_failed is (expected is TrialStatus.CRASH and log == RENDEZVOUS
                                     and not files)
    assert metrics.wall_time_s == output.wall_time_s
    assert metrics.error


def test_success_reads_result_json_and_fills_wall_time(tmp_path: Path) -> None:
    result = TrialMetrics(status=TrialStatus.OK, step_time_s=0.5, tokens_per_s=1e5)
    (tmp_path / "result.json").write_text(json.dumps(result.to_dict()))
    metrics = metrics_from_run(_output(tmp_path, returncode=0, wall_time_s=42.0))
    assert metrics.status is TrialStatus.OK
    assert metrics.step_time_s == 0.5
    assert metrics.wall_time_s == 42.0


@pytest.mark.parametrize(("content", "reason"), [
    (None, "wrote no result.json"),
    ("{not json", "unreadable"),
    (json.dumps({"step_time_s": 1.0}), "unreadable"),
    (json.dumps({"status": "CRASH"}), "status CRASH"),
])
def test_exit_0_without_a_usable_result_is_a_crash(tmp_path: Path, content: str | None,
                                                   reason: str) -> None:
    if content is not None:
        (tmp_path / "result.json").write_text(content)
    metrics = metrics_from_run(_output(tmp_path, returncode=0))
    assert metrics.status is TrialStatus.CRASH
    assert metrics.error is not None and reason in metrics.error


def test_interrupted_is_a_crash_that_says_so(tmp_path: Path) -> None:
    status, message, _ = classify_run(_output(tmp_path, returncode=-15, interrupted=True))
    assert status is TrialStatus.CRASH
    assert "interrupted" in message


def test_error_names_the_failing_rank_and_keeps_the_log_tail(tmp_path: Path) -> None:
    _failure_file(tmp_path, 1, "OOM", "CUDA out of memory. Tried to allocate 2.00 GiB")
    log = "\n".join(f"line {i}" for i in range(100))
    metrics = metrics_from_run(_output(tmp_path, log=log))
    assert metrics.error is not None
    first, *tail = metrics.error.splitlines()
    assert first == "rank 1: OOM: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert tail == [f"line {i}" for i in range(60, 100)]


def test_unreadable_failure_file_falls_back_to_the_log(tmp_path: Path) -> None:
    (tmp_path / "failure-rank0.json").write_text('{"rank": 0, "sta')  # killed mid-write
    metrics = metrics_from_run(_output(tmp_path, log=OOM_TRACE))
    assert metrics.status is TrialStatus.OOM


def test_missing_log_is_no_error(tmp_path: Path) -> None:
    output = RunOutput(argv=("x",), pid=1, returncode=1, timed_out=False, interrupted=False,
                       wall_time_s=1.0, log_path=tmp_path / "absent.txt", trial_dir=tmp_path)
    assert metrics_from_run(output).status is TrialStatus.CRASH


@pytest.mark.parametrize("lines", [0, 1, 40])
def test_error_excerpt_keeps_the_last_lines(lines: int) -> None:
    text = "\n".join(str(i) for i in range(50))
    assert error_excerpt(text, lines) == "\n".join(str(i) for i in range(50 - lines, 50))


# A Megatron-LM log as training.py (training_log) and utils.py (report_memory) print it, with
# torchrun's per-rank prefixes on some lines and unrelated noise between.
MEGATRON_LOG = """\
using world size: 4, data-parallel size: 2, context-parallel size: 1, tensor-model-parallel size: 2
> building NullTokenizer tokenizer ...
 > padded vocab (size: 50257) with 47 dummy tokens (new size: 50304)
 [2025-11-21 10:00:01.000000] iteration        1/       6 | consumed samples:           64 | \
elapsed time per iteration (ms): 5012.3 | throughput per GPU (TFLOP/s/GPU): 20.1 | \
learning rate: 1.000000E-04 | global batch size:    64 | lm loss: 1.098765E+01 | \
loss scale: 1.0 | grad norm: 12.345 | number of skipped iterations:   0 | \
number of nan iterations:   0 |
[Rank 0] (after 1 iterations) memory (MB) | allocated: 1000.00 | max allocated: 3000.00 | \
reserved: 3500.00 | max reserved: 3500.00
[Rank 1] (after 1 iterations) memory (MB) | allocated: 1000.00 | max allocated: 3100.00 | \
reserved: 3600.00 | max reserved: 3600.00
 [2025-11-21 10:00:02.000000] iteration        2/       6 | consumed samples:          128 | \
elapsed time per iteration (ms): 900.0 | throughput per GPU (TFLOP/s/GPU): 111.0 | \
learning rate: 1.000000E-04 | global batch size:    64 | lm loss: 1.087654E+01 | \
loss scale: 1.0 | grad norm: 11.111 | number of skipped iterations:   0 | \
number of nan iterations:   0 |
[Rank 0] (after 2 iterations) memory (MB) | allocated: 1100.00 | max allocated: 4096.00 | \
reserved: 5000.00 | max reserved: 5120.00
[default1]:[Rank 1] (after 2 iterations) memory (MB) | allocated: 1100.00 | max allocated: \
4200.50 | reserved: 5100.00 | max reserved: 5200.00 | total device memory used: 6000.00
 [2025-11-21 10:00:03.000000] iteration        3/       6 | consumed samples:          192 | \
elapsed time per iteration (ms): 800.0 | throughput per GPU (TFLOP/s/GPU): 125.0 | \
learning rate: 1.000000E-04 | global batch size:    64 | lm loss: 1.076543E+01 | \
loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |
[default3]: [2025-11-21 10:00:04.000000] iteration        4/       6 | consumed samples: \
256 | elapsed time per iteration (ms): 820.0 | throughput per GPU (TFLOP/s/GPU): 122.0 | \
learning rate: 1.000000E-04 | global batch size:    64 | lm loss: 1.065432E+01 | \
loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |
 [2025-11-21 10:00:05.000000] iteration        5/       6 | consumed samples:          320 | \
elapsed time per iteration (ms): 810.0 | throughput per GPU (TFLOP/s/GPU): 123.5 | \
learning rate: 1.000000E-04 | global batch size:    64 | lm loss: 1.054321E+01 | \
loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |
 [2025-11-21 10:00:06.000000] iteration        6/       6 | consumed samples:          384 | \
elapsed time per iteration (ms): 860.0 | throughput per GPU (TFLOP/s/GPU): 116.3 | \
learning rate: 1.000000E-04 | global batch size:    64 | lm loss: 1.043210E+01 | \
loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |
[after training is done] datetime: 2025-11-21 10:00:07
"""

MODEL = ModelSpec(name="gpt2", num_layers=12, hidden_size=768, num_attention_heads=12,
                  vocab_size=50257, seq_length=1024, global_batch_size=64)
SPEC = TrialSpec(model=MODEL, layout=Layout(tp=2, dp=2, mbs=4, gbs=64), train_steps=4,
                 warmup_steps=2, gpu_peak_bf16_flops=989e12)


def test_parse_megatron_log_iterations() -> None:
    parsed = parse_megatron_log(MEGATRON_LOG)
    its = parsed["iterations"]
    assert [it["iteration"] for it in its] == [1, 2, 3, 4, 5, 6]
    assert {it["train_iters"] for it in its} == {6}
    assert [it["elapsed_ms"] for it in its] == [5012.3, 900.0, 800.0, 820.0, 810.0, 860.0]
    assert [it["tflops_per_gpu"] for it in its] == [20.1, 111.0, 125.0, 122.0, 123.5, 116.3]
    assert its[0]["lm_loss"] == pytest.approx(10.98765)
    assert {it["nan_iterations"] for it in its} == {0}


def test_parse_megatron_log_memory_keeps_each_ranks_largest_report() -> None:
    memory = parse_megatron_log(MEGATRON_LOG)["memory"]
    assert sorted(memory) == [0, 1]
    assert memory[0] == {"after_iterations": 2, "allocated_mb": 1100.0,
                         "max_allocated_mb": 4096.0, "reserved_mb": 5000.0,
                         "max_reserved_mb": 5120.0, "device_used_mb": None}
    assert memory[1]["max_allocated_mb"] == 4200.5
    assert memory[1]["device_used_mb"] == 6000.0


def test_parse_megatron_log_without_throughput_or_loss() -> None:
    line = (" iteration        3/      10 | consumed samples:          192 | elapsed time per "
            "iteration (ms): 812.5 | learning rate: 1.000000E-04 | global batch size:    64 |")
    (it,) = parse_megatron_log(line)["iterations"]
    assert it["elapsed_ms"] == 812.5
    assert it["tflops_per_gpu"] is None
    assert it["lm_loss"] is None


def test_parse_megatron_log_ignores_other_text() -> None:
    assert parse_megatron_log("nothing here\niteration of the loop\n") == {
        "iterations": [], "memory": {}}


def test_metrics_from_megatron_log(tmp_path: Path) -> None:
    metrics = metrics_from_megatron_log(_output(tmp_path, returncode=0, log=MEGATRON_LOG,
                                                wall_time_s=30.0), SPEC)
    assert metrics.status is TrialStatus.OK
    # Warm-up iterations 1-2 dropped: median of 800, 820, 810, 860 ms.
    assert metrics.step_time_s == pytest.approx(0.815)
    assert metrics.step_time_p90_s == pytest.approx(0.848)
    assert metrics.tokens_per_s == pytest.approx(64 * 1024 / 0.815)
    assert metrics.tflops_per_gpu == pytest.approx(122.75)
    assert metrics.mfu == pytest.approx(122.75e12 / 989e12)
    assert metrics.peak_allocated_bytes == round(4200.5 * 2**20)
    assert metrics.peak_reserved_bytes == 5200 * 2**20
    assert metrics.device_used_bytes == 6000 * 2**20
    assert [r.rank for r in metrics.ranks] == [0, 1]
    assert metrics.ranks[0].peak_allocated_bytes == 4096 * 2**20
    assert metrics.loss_finite is True
    assert metrics.wall_time_s == 30.0


def test_megatron_nan_loss_is_not_finite(tmp_path: Path) -> None:
    log = MEGATRON_LOG.replace("lm loss: 1.054321E+01", "lm loss: nan").replace(
        "number of nan iterations:   0 |\n [2025-11-21 10:00:06",
        "number of nan iterations:   1 |\n [2025-11-21 10:00:06")
    metrics = metrics_from_megatron_log(_output(tmp_path, returncode=0, log=log), SPEC)
    assert metrics.loss_finite is False
    assert math.isfinite(metrics.step_time_s or math.nan)


def test_megatron_run_without_timed_iterations_is_a_crash(tmp_path: Path) -> None:
    log = MEGATRON_LOG.split(" [2025-11-21 10:00:03")[0]
    metrics = metrics_from_megatron_log(_output(tmp_path, returncode=0, log=log), SPEC)
    assert metrics.status is TrialStatus.CRASH
    assert metrics.error is not None and "warm-up" in metrics.error


def test_megatron_failure_is_classified_like_a_worker_failure(tmp_path: Path) -> None:
    log = MEGATRON_LOG.split(" [2025-11-21 10:00:03")[0] + OOM_TRACE
    metrics = metrics_from_megatron_log(_output(tmp_path, returncode=1, log=log), SPEC)
    assert metrics.status is TrialStatus.OOM


# --- where a timed-out trial's ranks were -------------------------------------------------

_MAIN_IN_P2P = """\
Thread 0x00007f10aa7fc640 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 359 in wait
  File "/opt/torch/_inductor/compile_worker/subproc_pool.py", line 60 in _recv_msg

Current thread 0x00007f10c3a3e740 (most recent call first):
  File "/s/megatron/core/pipeline_parallel/p2p_communication.py", line 345 in _batched_p2p_ops
  File "/tmp/site/megatron/core/pipeline_parallel/p2p_communication.py", line 512 in _communicate
  File "/work/autotune/worker/train.py", line 118 in _step
"""
_SIGNAL_IN_HELPER_THREAD = """\
Current thread 0x00007f10aa7fc640 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 359 in wait

Thread 0x00007f10c3a3e740 (most recent call first):
  File "/tmp/site/torch/distributed/distributed_c10d.py", line 4879 in barrier
  File "/work/autotune/worker/run.py", line 60 in _init_distributed
"""


@pytest.mark.parametrize(("dump", "frame"), [
    (_MAIN_IN_P2P, "pipeline_parallel/p2p_communication.py:345 _batched_p2p_ops"),
    (_SIGNAL_IN_HELPER_THREAD, "distributed/distributed_c10d.py:4879 barrier"),
    ('Current thread 0x01 (most recent call first):\n  File "x.py", line 3 in <module>\n',
     "x.py:3 <module>"),
    ("", None),
    ("Fatal Python error: something else\n", None),
])
def test_innermost_frame_of_the_main_thread(dump: str, frame: str | None) -> None:
    assert innermost_frame(dump) == frame


def test_stack_summary_lists_ranks_in_order(tmp_path: Path) -> None:
    (tmp_path / "stacks-rank10.txt").write_text(_SIGNAL_IN_HELPER_THREAD)
    (tmp_path / "stacks-rank2.txt").write_text(_MAIN_IN_P2P)
    (tmp_path / "stacks-rank3.txt").write_text("")  # never signalled: no dump
    (tmp_path / "stacks-rankX.txt").write_text(_MAIN_IN_P2P)
    for rank in (4, 5, 6, 8):
        (tmp_path / f"stacks-rank{rank}.txt").write_text(_MAIN_IN_P2P)
    assert stack_summary(tmp_path) == (
        "ranks 2,4-6,8: pipeline_parallel/p2p_communication.py:345 _batched_p2p_ops; "
        "rank 10: distributed/distributed_c10d.py:4879 barrier")
    assert stack_summary(tmp_path / "missing") is None
