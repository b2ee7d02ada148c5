#!/usr/bin/env python3
"""GEMM rate by size on one GPU, with its SM clock, power, temperature and clock-event reasons
sampled while it runs (issue 28: the GEMM rate and a power roof as measured constants).

Why: the cost model prices every layer GEMM at one fitted curve (autotune/specs/flops.py
`gemm_efficiency`, CostParams.gemm_efficiency_max / gemm_half_size); the Llama shapes' GEMMs
run slower than the GPT shapes' (suspected: the board's power cap lowers the SM clock on large
GEMMs), so the shared constant refits down and the GPT families' error grows
(results/benchmarks/2026-11-28-cpu-attention-dropout.md). This sweep measures the rate of
(a) square GEMMs 1024-16384 and (b) the layer GEMMs of every model family in
tests/data/measured_trials.json, each run back to back for a fixed wall time so that the
sustained clock and power show, not a cold burst.

Standalone on a GPU machine: the standard library, torch, and pynvml (nvidia-ml-py) when it
imports; without it `nvidia-smi --query-gpu=...` is polled instead. From autotune (pure Python,
on the path from the repository root) it takes only what it must agree on: the clock event
reasons' names (autotune.trials.clock_reasons) and the datasheet peaks (autotune.specs.hardware);
tests/test_gemm_sweep.py checks the shape table below against autotune's own models
(autotune.levers.fp8.gemm_dims).

    python3 tools/gemm_sweep.py --out DIR [--seconds 2] [--budget-s 150] [--fp8]
        [--passes fwd,dgrad,wgrad] [--tokens 4096,16384] [--only REGEX] [--dry-run]

Writes DIR/gemm-sweep.jsonl (one record per case, written as each case ends) and
DIR/gemm-sweep.md (the table, rewritten after each case), so a killed run keeps what it did.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from autotune.specs.hardware import GPUS
from autotune.trials.clock_reasons import reason_names

# ---- what is swept ------------------------------------------------------------------------------

SQUARE_SIZES: tuple[int, ...] = (1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
"""m = n = k: the rate by size with nothing model-specific (issue 28's request)."""

DEFAULT_TOKENS: tuple[int, ...] = (4096, 16384)
"""m of the layer GEMMs: tokens of one micro-batch on a rank (mbs x seq / cp). The measured
trials run 1024-65536 (tests/data/measured_trials.json); 4096 and 16384 bracket most of them."""


@dataclass(frozen=True, slots=True)
class Family:
    """One model family's layer shape: what its four GEMMs are made of."""

    name: str
    """The family as tests/data/measured_trials.json (autotune.predict.calibration) names it."""
    source: str
    """What autotune.specs.presets.load_model reads for it (tests check the numbers below)."""
    hidden: int
    heads: int
    query_groups: int
    """GQA key/value heads (= heads for multi-head attention)."""
    ffn: int
    gated: bool
    """SwiGLU: fc1 computes gate and up projections together, 2 x ffn outputs."""
    kv_channels: int = 0
    """Each head's width where it is not hidden / heads (Qwen3: 128 x 32 heads over a hidden
    of 2,560); 0: hidden / heads."""


FAMILIES: tuple[Family, ...] = (
    Family("gpt2-large", "gpt2-large", 1280, 20, 20, 5120, False),
    Family("gpt2-xl", "gpt2-xl", 1600, 25, 25, 6400, False),
    Family("gpt-3.6b", "gpt-3.6b", 3072, 32, 32, 12288, False),
    Family("llama-1b", "tools/shapes/llama-1b.yaml", 2048, 32, 8, 8192, True),
    Family("llama-3b", "tests/data/hf/llama-3.2-3b.json", 3072, 24, 8, 8192, True),
    Family("llama3-8b", "llama3-8b", 4096, 32, 8, 14336, True),
    Family("llama2-13b", "llama2-13b", 5120, 40, 40, 13824, True),
    Family("wide-8k", "tools/shapes/wide-8k.yaml", 8192, 64, 8, 28672, True),
    Family("qwen3-4b", "tests/data/hf/qwen3-4b.json", 2560, 32, 8, 9728, True, kv_channels=128),
)
"""Every family of tests/data/measured_trials.json (llama-3b's two files, the HF config and
tools/shapes/llama-3b.yaml, are one shape), in the order the sweep runs them: GPT shapes first."""

GEMM_NAMES: tuple[str, ...] = ("qkv", "proj", "fc1", "fc2")
PASSES: tuple[str, ...] = ("fwd", "dgrad", "wgrad")
"""The three GEMMs of one linear layer in training. With Y[m,n] = X[m,k] W[n,k]^T (nn.Linear's
weight layout) the backward is dX = dY W (dgrad, [m,n] x [n,k]) and dW = dY^T X (wgrad,
[n,m] x [m,k]): the same 2 m n k FLOPs each, the reduction over n and m instead of k. The cost
model prices backward as two forwards at one rate (autotune/predict/cost.py); dgrad and wgrad
test that."""
DTYPES: tuple[str, ...] = ("bf16", "fp8")


@dataclass(frozen=True, slots=True)
class Gemm:
    """One layer GEMM in forward layout: Y[m, n] = X[m, k] W[n, k]^T."""

    name: str
    m: int
    n: int
    k: int


def layer_gemms(f: Family, tokens: int, tp: int = 1) -> list[Gemm]:
    """The four GEMMs of one transformer layer on one tensor-parallel rank, as megatron-core
    shards them (column-parallel QKV and fc1, row-parallel proj and fc2): the same (k, n) as
    autotune.levers.fp8.gemm_dims gives (features, rows), which the tests hold it to.

    QKV's outputs are the rank's query heads plus a key and a value head per local KV group
    (GQA: at least one group per rank); fc1's are 2 x ffn / tp with SwiGLU."""
    head_dim = f.kv_channels or f.hidden // f.heads
    heads = f.heads * head_dim // tp
    qkv = heads + 2 * head_dim * max(1, f.query_groups // tp)
    ffn = f.ffn // tp
    gates = 2 if f.gated else 1
    return [
        Gemm("qkv", tokens, qkv, f.hidden),
        Gemm("proj", tokens, f.hidden, heads),
        Gemm("fc1", tokens, gates * ffn, f.hidden),
        Gemm("fc2", tokens, f.hidden, ffn),
    ]


def gemm_flops(m: int, n: int, k: int) -> int:
    """FLOPs of one [m, k] x [k, n] matrix multiply: m n k multiply-adds, 2 FLOPs each (the
    count autotune/specs/flops.py uses, Narayanan et al. 2021, Section 5.1)."""
    return 2 * m * n * k


def pass_dims(pass_: str, m: int, n: int, k: int) -> tuple[int, int, int]:
    """(M, N, K) of the matmul a pass runs for the forward GEMM (m, n, k): see PASSES."""
    if pass_ == "fwd":
        return m, n, k
    if pass_ == "dgrad":
        return m, k, n
    if pass_ == "wgrad":
        return n, k, m
    raise ValueError(f"unknown pass {pass_!r}; one of {', '.join(PASSES)}")


@dataclass(slots=True)
class Case:
    """One timed GEMM. Layer GEMMs of the same size as another case (gpt-3.6b's and llama-3b's
    proj, a square) are timed once; `labels` names every shape it stands for."""

    labels: list[str]
    kind: str
    """square or layer (the first label's)."""
    pass_: str
    dtype: str
    m: int
    n: int
    k: int
    """The matmul's own (M, N, K): [M, K] x [K, N]."""
    model_x: int
    """The cost model's x (autotune.specs.flops.gemm_size: min(tokens, hidden / tp)) of the
    first label; the size for a square."""

    @property
    def name(self) -> str:
        return self.labels[0]

    @property
    def flops(self) -> int:
        return gemm_flops(self.m, self.n, self.k)


def build_cases(
    *,
    sizes: Sequence[int] = SQUARE_SIZES,
    tokens: Sequence[int] = DEFAULT_TOKENS,
    families: Sequence[Family] = FAMILIES,
    passes: Sequence[str] = ("fwd",),
    dtypes: Sequence[str] = ("bf16",),
    tp: int = 1,
) -> list[Case]:
    """The sweep in the order it runs (what the budget cuts comes last): per dtype, the squares,
    then the layer GEMMs pass by pass (forward first), token count by token count, family by
    family. A shape already in the list adds its label to that case instead of a new one."""
    cases: list[Case] = []
    seen: dict[tuple[str, str, int, int, int], Case] = {}

    def add(
        label: str, kind: str, pass_: str, dtype: str, dims: tuple[int, int, int], x: int
    ) -> None:
        key = (pass_, dtype, *dims)
        if key in seen:
            seen[key].labels.append(label)
            return
        case = Case([label], kind, pass_, dtype, *dims, model_x=x)
        seen[key] = case
        cases.append(case)

    for dtype in dtypes:
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPES)}")
        for s in sizes:
            add(f"square {s}", "square", "fwd", dtype, (s, s, s), s)
        for pass_ in passes:
            # TE runs FP8 backward GEMMs on transposed FP8 copies in the forward layout;
            # torch._scaled_mm only takes that layout, so FP8 is timed forward only.
            if dtype == "fp8" and pass_ != "fwd":
                continue
            for t in tokens:
                for f in families:
                    for g in layer_gemms(f, t, tp):
                        label = f"{f.name} {g.name} m{t}" + (f" tp{tp}" if tp > 1 else "")
                        add(
                            label,
                            "layer",
                            pass_,
                            dtype,
                            pass_dims(pass_, g.m, g.n, g.k),
                            min(t, f.hidden // tp),
                        )
    return cases


# ---- statistics ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stats:
    median: float
    min: float
    max: float
    n: int


def summarize(values: Iterable[float | None]) -> Stats | None:
    """Median, min and max of the values that were read (None: a reading that failed)."""
    got = [v for v in values if v is not None and not math.isnan(v)]
    if not got:
        return None
    return Stats(statistics.median(got), min(got), max(got), len(got))


def reason_shares(masks: Iterable[int | None]) -> dict[str, float]:
    """Each reason's share of the samples that read one, e.g. {"sw_power_cap": 0.8} (the names
    of autotune.trials.clock_reasons, as a trial's record keeps them)."""
    got = [m for m in masks if m is not None]
    counts: dict[str, int] = {}
    for mask in got:
        for name in reason_names(mask):
            counts[name] = counts.get(name, 0) + 1
    return {name: round(c / len(got), 3) for name, c in counts.items()}


# ---- clocks and power ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    t: float
    """time.monotonic() when read."""
    sm_mhz: float | None = None
    power_w: float | None = None
    """NVML's power usage: on Ampere and newer (H100, H200) an average over 1 s (nvml.h,
    nvmlDeviceGetPowerUsage), so the first second of a window still shows the one before."""
    power_instant_w: float | None = None
    temp_c: float | None = None
    reasons: int | None = None


class Reader(Protocol):
    source: str

    def read(self) -> Sample: ...

    def static(self) -> dict[str, Any]: ...


def _num(text: str) -> float | None:
    text = text.strip()
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def _hex(text: str) -> int | None:
    try:
        return int(text.strip(), 16)
    except ValueError:
        return None


class NvmlReader:
    """Reads through pynvml (nvidia-ml-py): about 1 ms a sample."""

    source = "pynvml"

    def __init__(self, uuid: str | None, index: int) -> None:
        import pynvml

        self._nv = pynvml
        pynvml.nvmlInit()
        try:  # the UUID names the device torch runs on, whatever CUDA_VISIBLE_DEVICES says
            self._h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        except Exception:  # no UUID, or torch's spelling of it not NVML's
            self._h = pynvml.nvmlDeviceGetHandleByIndex(index)
        # nvmlDeviceGetCurrentClocksThrottleReasons was renamed ...ClocksEventReasons (NVML 12.x);
        # nvidia-ml-py keeps both names in its newer releases, older ones only the first.
        self._reasons = (
            getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        self._instant = getattr(pynvml, "NVML_FI_DEV_POWER_INSTANT", None)

    def _try(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception:  # a counter this GPU or driver does not have
            return None

    def _instant_w(self) -> float | None:
        if self._instant is None:
            return None
        value = self._nv.nvmlDeviceGetFieldValues(self._h, [self._instant])[0]
        if value.nvmlReturn != 0:
            self._instant = None  # not on this driver: stop asking
            return None
        return float(value.value.uiVal) / 1000

    def read(self) -> Sample:
        nv, h = self._nv, self._h
        sm = self._try(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        power = self._try(lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000)
        instant = self._try(self._instant_w)
        temp = self._try(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        reasons = self._try(lambda: self._reasons(h))
        return Sample(
            time.monotonic(),
            None if sm is None else float(sm),
            None if power is None else float(power),
            None if instant is None else float(instant),
            None if temp is None else float(temp),
            None if reasons is None else int(reasons),
        )

    def static(self) -> dict[str, Any]:
        nv, h = self._nv, self._h
        driver = self._try(nv.nvmlSystemGetDriverVersion)
        limit = self._try(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000)
        max_sm = self._try(lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM))
        return {
            "driver": driver if isinstance(driver, str) else str(driver),
            "power_limit_w": limit,
            "max_sm_mhz": max_sm,
        }


SMI_FIELDS = "clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"


def parse_smi_line(line: str, t: float, instant: bool = False) -> Sample:
    """One line of `nvidia-smi --query-gpu=SMI_FIELDS[,power.draw.instant] --format=csv,
    noheader,nounits`: "1980, 612.34, 51, 0x0000000000000004"."""
    parts = [p.strip() for p in line.split(",")]
    parts += [""] * (5 - len(parts))
    return Sample(
        t,
        _num(parts[0]),
        _num(parts[1]),
        _num(parts[4]) if instant else None,
        _num(parts[2]),
        _hex(parts[3]),
    )


class SmiReader:
    """Runs nvidia-smi once a sample (about 50-100 ms each): when pynvml does not import."""

    source = "nvidia-smi"

    def __init__(self, uuid: str | None, index: int) -> None:
        self._id = uuid or str(index)
        if uuid and self._query("clocks.sm") is None:  # a UUID nvidia-smi does not know
            self._id = str(index)
        # power.draw.instant (driver 535 and newer) besides power.draw, whose meaning moved to
        # the 1 s average on those drivers; an older one rejects the field, so ask once.
        self._instant = self._query(SMI_FIELDS + ",power.draw.instant") is not None

    def _query(self, fields: str) -> str | None:
        try:
            done = subprocess.run(
                [
                    "nvidia-smi",
                    "-i",
                    self._id,
                    f"--query-gpu={fields}",
                    "--format=csv,noheader,nounits",
                ],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return (
            done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout else None
        )

    def read(self) -> Sample:
        fields = SMI_FIELDS + (",power.draw.instant" if self._instant else "")
        line = self._query(fields)
        t = time.monotonic()
        return parse_smi_line(line, t, self._instant) if line else Sample(t)

    def static(self) -> dict[str, Any]:
        line = self._query("driver_version,power.limit,clocks.max.sm") or ""
        parts = [p.strip() for p in line.split(",")] + ["", "", ""]
        return {
            "driver": parts[0] or None,
            "power_limit_w": _num(parts[1]),
            "max_sm_mhz": _num(parts[2]),
        }


def make_reader(uuid: str | None, index: int) -> Reader | None:
    """pynvml when it imports and starts, else nvidia-smi when it is on PATH, else None."""
    try:
        return NvmlReader(uuid, index)
    except Exception as e:  # ImportError, or NVML failing to start
        print(f"pynvml unusable ({type(e).__name__}: {e}); polling nvidia-smi", flush=True)
    if shutil.which("nvidia-smi"):
        return SmiReader(uuid, index)
    print("no pynvml and no nvidia-smi: clocks and power are not recorded", flush=True)
    return None


class Sampler:
    """Reads every `interval_s` on a background thread between start() and stop(): the GEMMs
    run from the main thread, which waits on CUDA events with the GIL released."""

    def __init__(self, reader: Reader | None, interval_s: float) -> None:
        self._reader, self._interval = reader, interval_s
        self._samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        assert self._reader is not None
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # one failed read must not end the sampling
                self._samples.append(self._reader.read())
            self._stop.wait(self._interval)

    def start(self) -> None:
        self._samples, self._stop = [], threading.Event()
        if self._reader is not None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()

    def stop(self) -> list[Sample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._thread = None
        return list(self._samples)


def summarize_samples(samples: Sequence[Sample], t_start: float, t_end: float) -> dict[str, Any]:
    """Stats of each reading over the timed window, and of SM clock and power over its second
    half (`_late`): power is a 1 s average, and a power cap pulls the clock down after the
    first burst, so the late half is the sustained state."""
    inside = [s for s in samples if t_start <= s.t <= t_end]
    late = [s for s in inside if s.t >= (t_start + t_end) / 2]

    def stat(values: Iterable[float | None]) -> dict[str, float] | None:
        st = summarize(values)
        return None if st is None else {"median": st.median, "min": st.min, "max": st.max}

    return {
        "samples": len(inside),
        "sm_mhz": stat(s.sm_mhz for s in inside),
        "sm_mhz_late": stat(s.sm_mhz for s in late),
        "power_w": stat(s.power_w for s in inside),
        "power_w_late": stat(s.power_w for s in late),
        "power_instant_w": stat(s.power_instant_w for s in inside),
        "temp_c": stat(s.temp_c for s in inside),
        "clock_events": reason_shares(s.reasons for s in inside),
    }


# ---- peaks --------------------------------------------------------------------------------------

FLOPS_PER_CLOCK_PER_SM: dict[tuple[int, int], dict[str, int]] = {
    (9, 0): {"bf16": 4096, "fp8": 8192},
    (8, 0): {"bf16": 2048},
}
"""Dense tensor-core FLOPs per clock per SM, from the datasheet peaks and the clock they are
quoted at: H100 SXM 989.4 TFLOP/s bf16 = 132 SMs x 4096 x 1.83 GHz (NVIDIA H100 Tensor Core GPU
Architecture whitepaper), FP8 twice that; A100 312 TFLOP/s = 108 x 2048 x 1.41 GHz. Times the
SM clock measured, it is the peak at the clock the GEMM ran at: the rate over it is the kernel's
efficiency with the clock (power) taken out."""

def datasheet_peak(device: str, dtype: str) -> float | None:
    """The dense datasheet peak of `dtype` for an NVML device name: autotune.specs.hardware's
    GPUS, the peak of autotune/predict/cost.py, so that `of_datasheet` is directly the cost
    model's efficiency. None for a GPU autotune does not know or without that dtype."""
    gpu = next((g for g in GPUS.values() if any(p in device for p in g.nvml_patterns)), None)
    if gpu is None:
        return None
    return gpu.peak_fp8_flops if dtype == "fp8" else gpu.peak_bf16_flops


# ---- the sweep ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Timing:
    """What one case's timed window measured."""

    batch_tflops: list[float]
    """TFLOP/s of each batch of back-to-back calls (CUDA events around each batch)."""
    batch_t: list[float]
    """When each batch was enqueued (time.monotonic()), to split the window's late half."""
    calls: int
    t_start: float
    t_end: float
    samples: list[Sample] = field(default_factory=list)
    graphed: bool = False
    """The batch ran as one CUDA graph (small GEMMs: see make_batch)."""


RunCase = Callable[[Case], Timing]


def case_record(case: Case, timing: Timing, device: dict[str, Any]) -> dict[str, Any]:
    """The JSONL record of a case that ran."""
    mid = (timing.t_start + timing.t_end) / 2
    tf = summarize(timing.batch_tflops)
    late = summarize(
        v for v, t in zip(timing.batch_tflops, timing.batch_t, strict=True) if t >= mid
    )
    rec: dict[str, Any] = {
        "status": "ok",
        "calls": timing.calls,
        "graphed": timing.graphed,
        "batches": len(timing.batch_tflops),
        "seconds": round(timing.t_end - timing.t_start, 3),
        "tflops": tf.median if tf else None,
        "tflops_min": tf.min if tf else None,
        "tflops_max": tf.max if tf else None,
        "tflops_late": late.median if late else None,
    }
    rec.update(summarize_samples(timing.samples, timing.t_start, timing.t_end))
    peak = datasheet_peak(str(device.get("device", "")), case.dtype)
    rec["of_datasheet"] = tf.median * 1e12 / peak if tf and peak else None
    per_clock = FLOPS_PER_CLOCK_PER_SM.get(tuple(device.get("capability") or ()), {})
    sm_mhz = rec["sm_mhz"]["median"] if rec.get("sm_mhz") else None
    if tf and sm_mhz and case.dtype in per_clock and device.get("sms"):
        rec["of_clock_peak"] = (
            tf.median * 1e12 / (device["sms"] * per_clock[case.dtype] * sm_mhz * 1e6)
        )
    else:
        rec["of_clock_peak"] = None
    return rec


def base_record(case: Case, device: dict[str, Any]) -> dict[str, Any]:
    return {
        **device,
        "case": case.name,
        "also": case.labels[1:],
        "kind": case.kind,
        "pass": case.pass_,
        "dtype": case.dtype,
        "m": case.m,
        "n": case.n,
        "k": case.k,
        "flops": case.flops,
        "model_x": case.model_x,
    }


def run_sweep(
    cases: Sequence[Case],
    run_case: RunCase,
    *,
    device: dict[str, Any],
    budget_s: float,
    case_s: float,
    clock: Callable[[], float] = time.monotonic,
    on_record: Callable[[dict[str, Any]], None] = lambda r: None,
) -> list[dict[str, Any]]:
    """Every case in order, each one's failure recorded (status "error") and the sweep going
    on. A case starts only if the sweep's elapsed time plus its expected wall stays within
    `budget_s`; the rest are recorded as status "skipped" and printed, so the total wall stays
    bounded. Expected wall: the longest case that ran so far (set-up, warm-up and timed window
    as this GPU takes them), `case_s` before the first."""
    start = clock()
    records: list[dict[str, Any]] = []
    skipped: list[str] = []
    walls: list[float] = []
    for i, case in enumerate(cases):
        rec = base_record(case, device)
        elapsed = clock() - start
        if elapsed + (max(walls) if walls else case_s) > budget_s:
            rec.update(status="skipped", error=f"budget: {elapsed:.0f} s of {budget_s:.0f} s")
            skipped.append(case.name)
        else:
            t0 = clock()
            try:
                rec.update(case_record(case, run_case(case), device))
            except Exception as e:  # OOM, a dtype cuBLAS refuses, ...: recorded, sweep goes on
                rec.update(status="error", error=f"{type(e).__name__}: {e}"[:500])
            rec["wall_s"] = round(clock() - t0, 3)
            if rec["status"] == "ok":  # a failure ends early: no measure of a case's wall
                walls.append(clock() - t0)
            print(f"[{i + 1}/{len(cases)}] {progress_line(rec)}", flush=True)
        records.append(rec)
        on_record(rec)
    if skipped:
        print(
            f"budget {budget_s:.0f} s reached: skipped {len(skipped)} case(s): "
            + "; ".join(skipped),
            flush=True,
        )
    return records


def progress_line(rec: dict[str, Any]) -> str:
    head = f"{rec['case']} {rec['dtype']} {rec['pass']} {rec['m']}x{rec['n']}x{rec['k']}"
    if rec["status"] != "ok":
        return f"{head}: {rec['status']} {rec.get('error', '')}"
    sm = rec.get("sm_mhz_late") or {}
    pw = rec.get("power_w_late") or {}
    return (
        f"{head}: {_fmt(rec['tflops'], 1)} TFLOP/s, SM {_fmt(sm.get('median'), 0)} MHz, "
        f"{_fmt(pw.get('median'), 0)} W, {','.join(rec.get('clock_events') or {}) or '-'}"
    )


# ---- markdown -----------------------------------------------------------------------------------


def _fmt(value: Any, digits: int) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}"


def _range(st: dict[str, float] | None, digits: int = 0) -> str:
    if not st:
        return "-"
    return f"{_fmt(st['median'], digits)} ({_fmt(st['min'], digits)}-{_fmt(st['max'], digits)})"


def render_markdown(records: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    """One table row per case (cases never run are listed after it)."""
    lines = [
        f"# GEMM sweep: {meta.get('device', '?')}",
        "",
        f"torch {meta.get('torch', '?')}, CUDA {meta.get('cuda', '?')}, driver "
        f"{meta.get('driver', '?')}, {meta.get('sms', '?')} SMs, power limit "
        f"{_fmt(meta.get('power_limit_w'), 0)} W, max SM clock "
        f"{_fmt(meta.get('max_sm_mhz'), 0)} MHz; clocks read by "
        f"{meta.get('sampler', 'nothing')}; {meta.get('seconds', '?')} s per case.",
        "",
        "TFLOP/s: median over batches of back-to-back calls (late: the window's second "
        "half); of peak: over the datasheet dense peak (the cost model's efficiency) and "
        "over SMs x FLOPs/clock x the median SM clock measured (the kernel, clock taken "
        "out). SM MHz and W: median (min-max) over the window's second half; power is "
        "NVML's 1 s average. Clock events: share of samples.",
        "",
        "| case | pass | dtype | M x N x K | TFLOP/s | late | of datasheet | of clock peak "
        "| SM MHz | W | max °C | clock events |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    not_run: list[str] = []
    for r in records:
        name = r["case"] + (f" (= {', '.join(r['also'])})" if r.get("also") else "")
        dims = f"{r['m']} x {r['n']} x {r['k']}"
        if r["status"] == "skipped":
            not_run.append(f"{name} {r['dtype']} {r['pass']}")
            continue
        if r["status"] != "ok":
            lines.append(
                f"| {name} | {r['pass']} | {r['dtype']} | {dims} | "
                f"{r['status']}: {r.get('error', '')} | | | | | | | |"
            )
            continue
        events = ", ".join(f"{k} {v:.0%}" for k, v in (r.get("clock_events") or {}).items())
        temp = (r.get("temp_c") or {}).get("max")
        lines.append(
            f"| {name} | {r['pass']} | {r['dtype']} | {dims} | {_fmt(r['tflops'], 1)} "
            f"| {_fmt(r.get('tflops_late'), 1)} | {_fmt(r.get('of_datasheet'), 3)} "
            f"| {_fmt(r.get('of_clock_peak'), 3)} | {_range(r.get('sm_mhz_late'))} "
            f"| {_range(r.get('power_w_late'))} | {_fmt(temp, 0)} | {events or '-'} |"
        )
    if not_run:
        lines += ["", f"Not run (budget): {len(not_run)} case(s): " + "; ".join(not_run) + "."]
    return "\n".join(lines) + "\n"


# ---- the GPU part -------------------------------------------------------------------------------


def device_info(torch: Any, index: int) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    return {
        "device": props.name,
        "capability": [props.major, props.minor],
        "sms": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        # NVML and nvidia-smi spell it GPU-xxxxxxxx-...; torch's str() may leave the prefix out.
        "uuid": None if uuid is None else "GPU-" + str(uuid).removeprefix("GPU-"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def bf16_operands(torch: Any, case: Case, gen: Any) -> tuple[Any, Any]:
    """A [M, K] and B [K, N] of a case in the memory layout megatron-core's linear layer runs
    its pass in (see PASSES; the case's (M, N, K) already are the pass's own): forward X W^T
    with W [out, in] row-major, so B is a transposed view; dgrad dY W, both row-major; wgrad
    dY^T X, A a transposed view of dY [tokens, out]."""
    m, n, k = case.m, case.n, case.k
    kw = {"device": "cuda", "dtype": torch.bfloat16, "generator": gen}
    if case.pass_ == "fwd":
        return torch.randn(m, k, **kw), torch.randn(n, k, **kw).t()
    if case.pass_ == "dgrad":
        return torch.randn(m, k, **kw), torch.randn(k, n, **kw)
    return torch.randn(k, m, **kw).t(), torch.randn(k, n, **kw)


GRAPH_BELOW_S = 100e-6
"""Calls shorter than this run their batch as one CUDA graph: eager torch.matmul costs the host
some 5-10 us a launch, longer than a 1024^3 GEMM on an H100 (2.1 GFLOP, ~3 us), which would
time the host, not the GEMM."""
GRAPH_MAX_CALLS = 2000


def make_batch(
    torch: Any, fn: Callable[[], Any], reps: int, per_call: float
) -> tuple[Callable[[], Any], bool]:
    """`reps` back-to-back calls of fn: one CUDA graph's replay for short calls, else eager
    (also when capture fails). Returns (batch, graphed)."""

    def eager() -> None:
        for _ in range(reps):
            fn()

    if per_call >= GRAPH_BELOW_S:
        return eager, False
    try:
        # Warm on a side stream before capture, as torch.cuda.graphs' documentation asks.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        return graph.replay, True
    except Exception as e:
        print(f"  CUDA graph capture failed ({type(e).__name__}: {e}); eager", flush=True)
        torch.cuda.synchronize()
        return eager, False


def gpu_timer(
    torch: Any, sampler: Sampler, *, seconds: float, warmup_s: float, batch_s: float = 0.05
) -> RunCase:
    """Times a case on the current CUDA device: warm-up batches for `warmup_s`, then batches of
    back-to-back calls for `seconds` of wall time, each batch between two CUDA events, at most
    two batches enqueued ahead of the host (so the GPU never idles and the host's clock tracks
    the GPU's), the sampler running over the timed window."""

    def run(case: Case) -> Timing:
        dev = torch.device("cuda")
        gen = torch.Generator(device=dev).manual_seed(0)
        # Random normal operands: a GEMM's power depends on its data's bit toggling, and
        # training's normalised activations and initialised weights look like this, not zeros.
        m, n, k = case.m, case.n, case.k
        fn: Callable[[], Any]
        try:
            if case.dtype == "fp8":
                a = torch.randn(m, k, device=dev, generator=gen).to(torch.float8_e4m3fn)
                w = torch.randn(n, k, device=dev, generator=gen).to(torch.float8_e4m3fn)
                one = torch.ones((), device=dev, dtype=torch.float32)
                # _scaled_mm wants [M, K] row-major x [K, N] column-major: W^T of a row-major
                # W[N, K], the forward layout. Fast accumulation, as TE's forward GEMM uses.
                b = w.t()

                def fn() -> Any:
                    return torch._scaled_mm(
                        a, b, one, one, out_dtype=torch.bfloat16, use_fast_accum=True
                    )
            else:
                a_, b_ = bf16_operands(torch, case, gen)
                out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)

                def fn() -> Any:
                    return torch.matmul(a_, b_, out=out)

            fn()
            torch.cuda.synchronize()
            # Batch size for ~batch_s a batch, from three timed calls.
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(3):
                fn()
            e1.record()
            e1.synchronize()
            per_call = max(e0.elapsed_time(e1) / 3 / 1000, 1e-6)
            reps = max(1, min(GRAPH_MAX_CALLS, math.ceil(batch_s / per_call)))
            batch, graphed = make_batch(torch, fn, reps, per_call)
            t_warm = time.monotonic()
            while time.monotonic() - t_warm < warmup_s:
                batch()
                torch.cuda.synchronize()

            events: list[tuple[Any, Any, float]] = []
            sampler.start()
            t_start = time.monotonic()
            while time.monotonic() - t_start < seconds:
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                t = time.monotonic()
                start.record()
                batch()
                end.record()
                events.append((start, end, t))
                if len(events) >= 2:
                    events[-2][1].synchronize()
            torch.cuda.synchronize()
            t_end = time.monotonic()
            samples = sampler.stop()
        finally:
            sampler.stop()
        per_batch = case.flops * reps / 1e12
        return Timing(
            [per_batch / (s.elapsed_time(e) / 1000) for s, e, _ in events],
            [t for _, _, t in events],
            reps * len(events),
            t_start,
            t_end,
            samples,
            graphed,
        )

    def guarded(case: Case) -> Timing:
        try:
            return run(case)
        finally:
            # Free this case's operands before the next, also after an OOM.
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    return guarded


# ---- command line -------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--out",
        default=os.environ.get("OUT", "gemm-sweep"),
        help="folder for gemm-sweep.jsonl and gemm-sweep.md (default $OUT)",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=2.0,
        help="timed wall per case, back to back (default 2.0)",
    )
    p.add_argument("--warmup-s", type=float, default=0.3, help="warm-up per case (0.3)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=150.0,
        help="start no case that would end past this many seconds (150)",
    )
    p.add_argument(
        "--sizes",
        default=",".join(map(str, SQUARE_SIZES)),
        help="square sizes, comma-separated ('' for none)",
    )
    p.add_argument(
        "--tokens",
        default=",".join(map(str, DEFAULT_TOKENS)),
        help="m of the layer GEMMs, comma-separated ('' for none)",
    )
    p.add_argument(
        "--families",
        default=",".join(f.name for f in FAMILIES),
        help="model families, comma-separated (default all)",
    )
    p.add_argument("--passes", default="fwd", help="of fwd,dgrad,wgrad (default fwd)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel shard of the layer GEMMs")
    p.add_argument(
        "--fp8",
        action="store_true",
        help="also time FP8 (e4m3, torch._scaled_mm), forward only, after bf16",
    )
    p.add_argument("--only", default=None, help="regex: keep cases whose label matches")
    p.add_argument("--sample-ms", type=float, default=100.0, help="sampling interval (100)")
    p.add_argument("--device-index", type=int, default=0)
    p.add_argument("--dry-run", action="store_true", help="list the cases, run nothing")
    return p.parse_args(argv)


def select_cases(args: argparse.Namespace) -> list[Case]:
    known = {f.name: f for f in FAMILIES}
    unknown = [n for n in _names(args.families) if n not in known]
    if unknown:
        raise SystemExit(f"unknown families {unknown}; known: {', '.join(known)}")
    passes = _names(args.passes)
    for p in passes:
        if p not in PASSES:
            raise SystemExit(f"unknown pass {p!r}; one of {', '.join(PASSES)}")
    cases = build_cases(
        sizes=_ints(args.sizes),
        tokens=_ints(args.tokens),
        families=[known[n] for n in _names(args.families)],
        passes=passes,
        dtypes=("bf16", "fp8") if args.fp8 else ("bf16",),
        tp=args.tp,
    )
    if args.only:
        rx = re.compile(args.only)
        cases = [c for c in cases if any(rx.search(label) for label in c.labels)]
    return cases


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cases = select_cases(args)
    case_s = args.warmup_s + args.seconds + 0.5  # + operand set-up, first call, sync
    print(
        f"{len(cases)} cases, about {len(cases) * case_s:.0f} s; budget {args.budget_s:.0f} s",
        flush=True,
    )
    if args.dry_run:
        for c in cases:
            print(
                f"  {c.name}{' = ' + ', '.join(c.labels[1:]) if c.labels[1:] else ''}: "
                f"{c.dtype} {c.pass_} {c.m} x {c.n} x {c.k}"
            )
        return 0

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    torch.cuda.set_device(args.device_index)
    # matmul in bf16 as Megatron runs it: no reduced-precision tweaks beyond the defaults.
    device = device_info(torch, args.device_index)
    reader = make_reader(device["uuid"], args.device_index)
    meta = {
        **device,
        **(reader.static() if reader else {}),
        "sampler": reader.source if reader else None,
        "seconds": args.seconds,
    }
    device = {
        k: meta[k]
        for k in (
            "device",
            "capability",
            "sms",
            "uuid",
            "torch",
            "cuda",
            "driver",
            "power_limit_w",
            "max_sm_mhz",
        )
        if k in meta
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jsonl, md = out / "gemm-sweep.jsonl", out / "gemm-sweep.md"
    jsonl.write_text("")
    done: list[dict[str, Any]] = []

    def write(rec: dict[str, Any]) -> None:
        with jsonl.open("a") as fh:
            fh.write(json.dumps(rec) + "\n")
        done.append(rec)
        md.write_text(render_markdown(done, meta))

    sampler = Sampler(reader, args.sample_ms / 1000)
    timer = gpu_timer(torch, sampler, seconds=args.seconds, warmup_s=args.warmup_s)
    records = run_sweep(
        cases, timer, device=device, budget_s=args.budget_s, case_s=case_s, on_record=write
    )
    md.write_text(render_markdown(records, meta))
    print(f"wrote {jsonl} and {md}", flush=True)
    return 0 if any(r["status"] == "ok" for r in records) or not records else 1


if __name__ == "__main__":
    sys.exit(main())
