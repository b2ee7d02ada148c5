"""The worker <-> orchestrator contract: what the worker writes, the orchestrator reads back."""

from __future__ import annotations

import fnmatch
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.trials.metrics import classify_run, stack_summary
from autotune.trials.protocol import (
    EXIT_CODES,
    FAILURE_GLOB,
    SPEC_NAME,
    STACKS_NAME,
    exit_status,
    failure_name,
    parse_status_lines,
    percentile,
    result_line,
    started_line,
    started_ranks,
    status_line,
    worker_args,
)
from autotune.trials.runner import RunOutput
from autotune.trials.trial import TrialStatus
from autotune.worker.__main__ import parse_args

RENDEZVOUS = ("[c10d] TCP client failed to connect/validate to host 127.0.0.1:53267 - "
              "retrying (try=0, timeout=60000ms)")


def _output(trial_dir: Path, *, returncode: int = 1, log: str = "") -> RunOutput:
    (trial_dir / "log.txt").write_text(log)
    return RunOutput(argv=("worker",), pid=1, returncode=returncode, timed_out=False,
                     interrupted=False, wall_time_s=1.0, log_path=trial_dir / "log.txt",
                     trial_dir=trial_dir)


@pytest.mark.parametrize("status", list(TrialStatus))
@pytest.mark.parametrize("rank", [0, 3, 127])
def test_status_line_round_trips(rank: int, status: TrialStatus) -> None:
    log = f"some output\n[rank{rank}] {status_line(rank, status)}\nmore output\n"
    assert list(parse_status_lines(log)) == [(rank, status)]


@pytest.mark.parametrize(("status", "code"), list(EXIT_CODES.items()))
def test_exit_code_maps_back_to_its_status(tmp_path: Path, status: TrialStatus,
                                           code: int) -> None:
    sharing = [s for s, c in EXIT_CODES.items() if c == code]
    assert exit_status(code) is sharing[0]
    # The exit code alone: what the classifier makes of it is what the table says it means.
    alone, _, _ = classify_run(_output(tmp_path, returncode=code))
    assert alone is exit_status(code)
    # With the status line the worker prints before it exits: the exact status.
    announced, _, _ = classify_run(_output(tmp_path, returncode=code,
                                           log=status_line(0, status)))
    assert announced is status


@pytest.mark.parametrize("code", [0, 1, 2, -9, 137])
def test_other_exit_codes_mean_nothing(code: int) -> None:
    assert exit_status(code) is None


@pytest.mark.parametrize("rank", [0, 1, 10, 511])
@pytest.mark.parametrize("status", [TrialStatus.OOM, TrialStatus.NCCL_ERROR, TrialStatus.CRASH])
def test_failure_file_is_found_by_the_metrics_reader(tmp_path: Path, rank: int,
                                                     status: TrialStatus) -> None:
    name = failure_name(rank)
    assert fnmatch.fnmatch(name, FAILURE_GLOB)
    assert [p.name for p in tmp_path.glob(FAILURE_GLOB)] == []
    (tmp_path / name).write_text(json.dumps({"status": status.value, "error": "boom"}))
    classified, message, _ = classify_run(_output(tmp_path))
    assert classified is status
    assert f"rank {rank}: {status}: boom" in message  # the rank comes from the file name


@pytest.mark.parametrize("rank", [0, 5])
def test_started_line_round_trips(rank: int) -> None:
    log = f"{started_line(rank, pid=4242, host='node-a')}\n{started_line(rank + 1)}\n"
    assert started_ranks(log, "node-a") == {rank: 4242}  # no pid: never signalled
    assert started_ranks(log, "node-b") == {}


@pytest.mark.parametrize("line", [started_line(0), status_line(0, TrialStatus.OOM),
                                  result_line(0.5, {"init_s": 1.0})])
def test_every_worker_line_says_a_rank_started(tmp_path: Path, line: str) -> None:
    _, _, launch_failed = classify_run(_output(tmp_path, log=f"{RENDEZVOUS}\n{line}\n"))
    assert not launch_failed
    _, _, launch_failed = classify_run(_output(tmp_path, log=f"{RENDEZVOUS}\n"))
    assert launch_failed


def test_stacks_file_is_read_back(tmp_path: Path) -> None:
    dump = ('Current thread 0x01 (most recent call first):\n'
            '  File "/x/autotune/worker/train.py", line 7 in train\n')
    for rank in (0, 1, 3):
        (tmp_path / STACKS_NAME.format(rank=rank)).write_text(dump)
    assert stack_summary(tmp_path) == "ranks 0-1,3: worker/train.py:7 train"


def test_worker_args_are_what_the_worker_parses(tmp_path: Path) -> None:
    args = parse_args(worker_args(tmp_path))
    assert args.spec == tmp_path / SPEC_NAME
    assert args.out_dir == tmp_path


@pytest.mark.parametrize("values", [[1.0], [3.0, 1.0], [float(x) for x in range(11)],
                                    [0.41, 0.43, 0.40, 0.52, 0.44, 0.42, 0.47]])
def test_percentile_is_linear_interpolation(values: list[float]) -> None:
    if len(values) > 1:
        expected = statistics.quantiles(values, n=10, method="inclusive")[8]
    else:
        expected = values[0]
    assert percentile(values, 0.9) == pytest.approx(expected)
    assert percentile(values, 0.0) == min(values)
    assert percentile(values, 1.0) == max(values)


def test_protocol_imports_neither_torch_nor_optuna() -> None:
    code = ("import sys, autotune.trials.protocol; "
            "assert not {'torch', 'optuna'} & set(sys.modules), sorted(sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
