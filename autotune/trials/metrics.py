"""A finished run -> TrialMetrics: read result.json, failure-rank*.json and the log, classify.

Pure apart from reading the trial's files; no process is started here. The files and lines it
reads are autotune.trials.protocol's.

Classification of a run that did not succeed, strongest evidence first:

| evidence (failure files, `AUTOTUNE_STATUS` lines, log text, exit code)    | status      |
|---------------------------------------------------------------------------|-------------|
| Ctrl-C stopped the run                                                    | CRASH       |
| a rank reports OOM, the log shows CUDA out of memory, or the exit code 3  | OOM         |
| torchrun's rendezvous store was unreachable and no rank reported anything | CRASH       |
| the runner's timeout stopped the run                                      | TIMEOUT     |
| a rank reports NCCL_ERROR, or the log shows an NCCL / watchdog error      | NCCL_ERROR  |
| anything else: non-zero exit, or exit 0 without a usable result.json      | CRASH       |

OOM wins over everything: when one rank runs out of memory its peers fail in, or hang on, the
collective it never joins, so their NCCL errors and the timeout are consequences, not causes.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import ConfigError
from autotune.trials.protocol import (
    FAILURE_GLOB,
    FAILURE_PREFIX,
    RANK_MARKERS,
    RESULT_NAME,
    STACKS_NAME,
    STATUS_MARKER,
    exit_status,
    parse_status_lines,
    percentile,
)
from autotune.trials.trial import RankResult, TrialMetrics, TrialSpec, TrialStatus

if TYPE_CHECKING:
    from autotune.trials.runner import RunOutput

__all__ = [
    "ERROR_EXCERPT_LINES",
    "RENDEZVOUS_FAILED",
    "classify_run",
    "error_excerpt",
    "innermost_frame",
    "metrics_from_megatron_log",
    "metrics_from_run",
    "parse_megatron_log",
    "stack_summary",
]

ERROR_EXCERPT_LINES = 40

_LOG_TAIL_BYTES = 8 * 1024 * 1024
"""Only the end of a huge log is searched: the error that ended the run is printed last."""

_OOM_PATTERNS = (
    "CUDA out of memory",  # torch.OutOfMemoryError's message
    "OutOfMemoryError",
    "CUDA error: out of memory",  # raised by a CUDA call outside the caching allocator
    "CUBLAS_STATUS_ALLOC_FAILED",  # cuBLAS could not allocate its workspace
)
_NCCL_PATTERNS = (
    "NCCL error",
    "Watchdog caught collective operation timeout",
    "NCCL communicator was aborted",
    "DistBackendError",
)
RENDEZVOUS_FAILED = "torchrun rendezvous failed (a launch problem, not the layout)"
"""Headline of TrialMetrics.error for a run that never got past torchrun's rendezvous."""
# torchrun's c10d rendezvous could not reach its store: the launch failed, not the layout.
_RENDEZVOUS_PATTERNS = (
    "TCP client failed to connect",
    "RendezvousConnectionError",
    "RendezvousTimeoutError",
)
# ...except at teardown: an agent whose store host already exited logs "has failed to shutdown
# the rendezvous ... RendezvousConnectionError" after a run that did start.
_RENDEZVOUS_TEARDOWN = "failed to shutdown the rendezvous"
# Lines that only a started rank prints: autotune's worker (its first line and its results)
# and Megatron-LM's pretrain_gpt.py (arguments.py prints the world size on rank 0 first).
_RANK_STARTED = (*RANK_MARKERS, "using world size")
# Every crashed rank logs "ProcessGroupNCCL.cpp:...] Warning: WARNING: destroy_process_group()
# was not called before program exit"; only ProcessGroupNCCL lines that speak of an error count.
_PG_NCCL_ERROR = re.compile(r"ProcessGroupNCCL.*(?:error|timed ?out|timeout|abort|exception)",
                            re.IGNORECASE)


def metrics_from_run(output: RunOutput) -> TrialMetrics:
    """The metrics of an autotune-worker run: result.json on success, a classified failure else."""
    if output.returncode == 0 and not (output.timed_out or output.interrupted):
        result = _read_result(output.trial_dir / RESULT_NAME)
        if isinstance(result, TrialMetrics) and result.status is TrialStatus.OK:
            return _with_wall_time(result, output.wall_time_s)
        why = (result if isinstance(result, str)
               else f"{RESULT_NAME} has status {result.status}")
        return _failure(output, TrialStatus.CRASH, f"worker exited 0 but {why}")
    return _failure(output, *classify_run(output))


def metrics_from_megatron_log(output: RunOutput, spec: TrialSpec) -> TrialMetrics:
    """The metrics of a Megatron-LM run, from its log: median step time after the warm-up
    iterations, throughput, and the largest memory report of each rank."""
    if output.returncode != 0 or output.timed_out or output.interrupted:
        return _failure(output, *classify_run(output))
    parsed = parse_megatron_log(_read_log(output.log_path))
    timed = [it for it in parsed["iterations"] if it["iteration"] > spec.warmup_steps]
    times_s = [it["elapsed_ms"] / 1000.0 for it in timed if it["elapsed_ms"] is not None]
    if not times_s:
        return _failure(output, TrialStatus.CRASH,
                        f"Megatron-LM exited 0 but logged no iteration after the "
                        f"{spec.warmup_steps} warm-up iterations")
    step_s = statistics.median(times_s)
    tflops = [it["tflops_per_gpu"] for it in timed if it["tflops_per_gpu"] is not None]
    tflops_per_gpu = statistics.median(tflops) if tflops else None
    losses = [it["lm_loss"] for it in parsed["iterations"] if it["lm_loss"] is not None]
    nan_iterations = sum(it["nan_iterations"] or 0 for it in parsed["iterations"])
    ranks = tuple(
        RankResult(rank=rank, peak_allocated_bytes=_mib(mem["max_allocated_mb"]),
                   peak_reserved_bytes=_mib(mem["max_reserved_mb"]),
                   device_used_bytes=(None if mem.get("device_used_mb") is None
                                      else _mib(mem["device_used_mb"])))
        for rank, mem in sorted(parsed["memory"].items()))
    return TrialMetrics(
        status=TrialStatus.OK,
        step_time_s=step_s,
        step_time_p90_s=percentile(times_s, 0.9),
        tokens_per_s=spec.layout.gbs * spec.model.seq_length / step_s,
        tflops_per_gpu=tflops_per_gpu,
        # Megatron's TFLOP/s count (num_floating_point_operations in training.py) over the peak.
        mfu=(tflops_per_gpu * 1e12 / spec.gpu_peak_bf16_flops
             if tflops_per_gpu is not None else None),
        peak_allocated_bytes=max((r.peak_allocated_bytes for r in ranks), default=None),
        peak_reserved_bytes=max((r.peak_reserved_bytes for r in ranks), default=None),
        device_used_bytes=max((r.device_used_bytes for r in ranks
                               if r.device_used_bytes is not None), default=None),
        loss_finite=(all(math.isfinite(x) for x in losses) and nan_iterations == 0
                     if losses else None),
        ranks=ranks,
        wall_time_s=output.wall_time_s,
    )


def classify_run(output: RunOutput) -> tuple[TrialStatus, str, bool]:
    """The status of a run that did not succeed (the table above), an error excerpt for
    TrialMetrics.error, and whether no rank ever started (a launch failure)."""
    log_text = _read_log(output.log_path)
    reports = _failure_reports(output.trial_dir)
    evidence: dict[TrialStatus, list[str]] = {}
    for rank, status, message in reports:
        evidence.setdefault(status, []).append(f"rank {rank}: {status}: {message}")
    for rank, status in parse_status_lines(log_text):
        evidence.setdefault(status, []).append(f"rank {rank}: {status} ({STATUS_MARKER})")
    oom_line = _first_line(log_text, lambda line: any(p in line for p in _OOM_PATTERNS))
    if oom_line is not None:
        evidence.setdefault(TrialStatus.OOM, []).append(oom_line.strip())
    if exit_status(output.returncode) is TrialStatus.OOM:
        evidence.setdefault(TrialStatus.OOM, []).append(f"exit code {output.returncode}")
    nccl_line = _first_line(log_text, _is_nccl_error)
    if nccl_line is not None:
        evidence.setdefault(TrialStatus.NCCL_ERROR, []).append(nccl_line.strip())

    rendezvous_line = _first_line(log_text, _is_rendezvous_failure)
    if rendezvous_line is not None and any(m in log_text for m in _RANK_STARTED):
        rendezvous_line = None  # a rank ran: whatever failed, it was not the launch

    launch_failed = False
    if output.interrupted:
        status, headline = TrialStatus.CRASH, "interrupted (Ctrl-C)"
    elif TrialStatus.OOM in evidence:
        status, headline = TrialStatus.OOM, evidence[TrialStatus.OOM][0]
    elif rendezvous_line is not None and not reports:
        # No rank ever started (no failure report), so no layout figure: a CRASH with the
        # reason, not a TIMEOUT that would read as "this layout is too slow".
        status, headline = TrialStatus.CRASH, (
            f"{RENDEZVOUS_FAILED}: {rendezvous_line.strip()}")
        launch_failed = True
    elif output.timed_out:
        status, headline = TrialStatus.TIMEOUT, (
            f"timed out; stopped after {output.wall_time_s:.0f} s")
        where = stack_summary(output.trial_dir)
        if where:
            headline += f"; where the ranks were: {where}"
    elif TrialStatus.NCCL_ERROR in evidence:
        status, headline = TrialStatus.NCCL_ERROR, evidence[TrialStatus.NCCL_ERROR][0]
    else:
        crash = evidence.get(TrialStatus.CRASH)
        status = TrialStatus.CRASH
        headline = crash[0] if crash else f"exit code {output.returncode}"
    return status, f"{headline}\n{error_excerpt(log_text)}".rstrip(), launch_failed


_STACKS_FILE = re.compile(re.escape(STACKS_NAME).replace(r"\{rank\}", r"(\d+)"))
_FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def innermost_frame(dump: str) -> str | None:
    """`dir/file.py:line func` of the main thread's innermost Python frame in a faulthandler
    dump. faulthandler lists threads newest first, so the main thread is the last block, and
    each block innermost frame first."""
    blocks = [b for b in re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump.strip())
              if b.strip()]
    for block in reversed(blocks):
        for line in block.splitlines():
            if m := _FRAME.match(line):
                path = Path(m["path"])
                where = f"{path.parent.name}/{path.name}" if path.parent.name else path.name
                return f"{where}:{m['line']} {m['func']}"
    return None


def stack_summary(trial_dir: Path) -> str | None:
    """`ranks 0-3,5: frame; rank 4: frame` over the ranks that wrote their stacks
    (autotune.trials.protocol.STACKS_NAME): ranks stopped at the same frame are named together."""
    found = []
    for path in trial_dir.glob(STACKS_NAME.format(rank="*")):
        if not (named := _STACKS_FILE.fullmatch(path.name)):
            continue
        try:
            frame = innermost_frame(path.read_text(errors="replace"))
        except OSError:
            continue
        if frame is not None:
            found.append((int(named[1]), frame))
    by_frame: dict[str, list[int]] = {}
    for rank, frame in sorted(found):
        by_frame.setdefault(frame, []).append(rank)
    return "; ".join(f"{_rank_list(ranks)}: {frame}" for frame, ranks in by_frame.items()) or None


def _rank_list(ranks: list[int]) -> str:
    """[0, 1, 2, 3, 5] -> `ranks 0-3,5`; [4] -> `rank 4`."""
    spans: list[list[int]] = []
    for r in ranks:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank {text}" if len(ranks) == 1 else f"ranks {text}"


def _is_rendezvous_failure(line: str) -> bool:
    return (any(p in line for p in _RENDEZVOUS_PATTERNS)
            and _RENDEZVOUS_TEARDOWN not in line)


def error_excerpt(log_text: str, lines: int = ERROR_EXCERPT_LINES) -> str:
    """The last `lines` lines of a log."""
    return "\n".join(log_text.splitlines()[-lines:]) if lines > 0 else ""


def parse_megatron_log(text: str) -> dict[str, Any]:
    """Megatron-LM's iteration lines and memory reports, as printed by megatron/training/
    training.py (training_log) and utils.py (report_memory).

    Returns {"iterations": [{"iteration", "train_iters", "elapsed_ms", "tflops_per_gpu",
    "lm_loss", "nan_iterations", "skipped_iterations"}, ...] in log order, and
    "memory": {rank: {"after_iterations", "allocated_mb", "max_allocated_mb", "reserved_mb",
    "max_reserved_mb", "device_used_mb"}}} where each rank keeps its largest report (max
    allocated is a running peak, so that is also the latest).
    """
    iterations: list[dict[str, Any]] = []
    memory: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        if (m := _ITERATION.search(line)) is not None:
            fields = _fields(m.group(3))
            iterations.append({
                "iteration": int(m.group(1)),
                "train_iters": int(m.group(2)),
                "elapsed_ms": _float(fields.get("elapsed time per iteration (ms)")),
                "tflops_per_gpu": _float(fields.get("throughput per GPU (TFLOP/s/GPU)")),
                "lm_loss": _float(fields.get("lm loss")),
                "nan_iterations": _int(fields.get("number of nan iterations")),
                "skipped_iterations": _int(fields.get("number of skipped iterations")),
            })
        elif (m := _MEMORY.search(line)) is not None:
            fields = _fields(m.group(3))
            report = {
                "after_iterations": int(m.group(2)),
                "allocated_mb": _float(fields.get("allocated")),
                "max_allocated_mb": _float(fields.get("max allocated")),
                "reserved_mb": _float(fields.get("reserved")),
                "max_reserved_mb": _float(fields.get("max reserved")),
                "device_used_mb": _float(fields.get("total device memory used")),
            }
            if report["max_allocated_mb"] is None or report["max_reserved_mb"] is None:
                continue
            rank = int(m.group(1))
            previous = memory.get(rank)
            if previous is None or report["max_allocated_mb"] >= previous["max_allocated_mb"]:
                memory[rank] = report
    return {"iterations": iterations, "memory": memory}


# training_log: " [2025-01-01 12:00:00.000000] iteration        5/      10 | consumed samples: ...
# | elapsed time per iteration (ms): 812.3 | throughput per GPU (TFLOP/s/GPU): 301.2 | ..."
_ITERATION = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|(.*)$")
# report_memory: "[Rank 0] (after 5 iterations) memory (MB) | allocated: 1.00 | max allocated:
# 2.00 | reserved: 3.00 | max reserved: 4.00" (+ " | total device memory used: 5.00")
_MEMORY = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\)(.*)$")


def _fields(tail: str) -> dict[str, str]:
    """`| name: value |` pairs; names may hold colons inside parentheses only, so split on ': '."""
    out: dict[str, str] = {}
    for part in tail.split("|"):
        name, sep, value = part.strip().rpartition(": ")
        if sep:
            out[name.strip()] = value.strip()
    return out


def _float(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _int(value: str | None) -> int | None:
    number = _float(value)
    return None if number is None else int(number)


def _mib(value: float) -> int:
    # report_memory divides bytes by 1024 * 1024 and labels it MB.
    return round(value * 1024 * 1024)


def _is_nccl_error(line: str) -> bool:
    return any(p in line for p in _NCCL_PATTERNS) or _PG_NCCL_ERROR.search(line) is not None


def _first_line(text: str, predicate: Callable[[str], bool]) -> str | None:
    return next((line for line in text.splitlines() if predicate(line)), None)


def _failure_reports(trial_dir: Path) -> list[tuple[int, TrialStatus, str]]:
    """(rank, status, message) from every readable failure file (protocol.failure_name),
    by rank."""
    reports = []
    for path in sorted(trial_dir.glob(FAILURE_GLOB)):
        try:
            data = json.loads(path.read_text())
            status = TrialStatus(data["status"])
            rank = int(data.get("rank", path.stem.removeprefix(FAILURE_PREFIX)))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a rank killed while writing: the log still tells
        reports.append((rank, status, str(data.get("error", "")).strip()))
    return sorted(reports)


def _read_result(path: Path) -> TrialMetrics | str:
    if not path.exists() and not path.is_symlink():
        return f"wrote no {RESULT_NAME}"
    try:
        return TrialMetrics.read(path)
    except ConfigError as exc:  # a rank killed mid-write, or a file that is not the worker's
        return f"{RESULT_NAME} is unreadable ({exc})"


def _read_log(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - _LOG_TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _failure(output: RunOutput, status: TrialStatus, message: str,
             launch_failed: bool = False) -> TrialMetrics:
    return TrialMetrics(status=status, error=message, wall_time_s=output.wall_time_s,
                        launch_failed=launch_failed)


def _with_wall_time(metrics: TrialMetrics, wall_time_s: float) -> TrialMetrics:
    return replace(metrics, wall_time_s=wall_time_s)
