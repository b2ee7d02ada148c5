"""Measured GEMM rates per GPU type: how fast the layers' matrix multiplies run, by shape.

Source: tools/gemm_sweep.py on one H100 80GB HBM3 and one H200 (torch 2.11.0+cu130, cuBLAS,
700 W power limit), sustained torch.matmul rates over 1.5 s per case: squares 1024-16384 and
every measured family's QKV / proj / fc1 / fc2 forward GEMM at 4096 and 16384 tokens
(results/benchmarks/2026-11-28-h100-gemm-sweep/ and 2026-11-28-h200-gemm-sweep/, gemm-sweep.jsonl;
the fit and its residuals: results/benchmarks/2026-11-28-cpu-gemm-rates.md). Both GPUs sit at the
700 W software power cap from 2048^3 up (SM clock ~1320-1500 MHz, not the 1980 MHz boost), so
the rate is the power roof's, not the datasheet's: bf16 0.58-0.71 of 989 TFLOP/s.

The curve: rate(x) = rate_max * x / (x + x_half), with x the harmonic mean of the GEMM's three
dimensions, 3 / (1/m + 1/n + 1/k). x / 3 is the GEMM's arithmetic intensity (2mnk FLOPs over
2(mn + nk + mk) bytes of bf16 operands, each read or written once), which bounds how well its
tiles reuse what they load; it is symmetric in m, n and k, so one GEMM's forward, input-gradient
and weight-gradient products (the same three dimensions permuted) share it. On the sweep, x
explains the rates better than the smallest dimension (log-rms residual 2.9% against 3.1% on the
H100's bf16 cases, 4.4% against 5.1% for fp8). What it leaves is tile and wave quantization:
gpt2-xl's h = 1600 GEMMs run ~7% under the curve.

GPUs never swept (A100, B200) have no entry: the cost model keeps its saturating efficiency
over the datasheet peak for them (autotune.specs.flops.gemm_efficiency), and FP8 its
first-principles speed-up (autotune.levers.fp8.gemm_speedup).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GEMM_RATES", "SWEEP_FILES", "RateCurve", "fit_curve", "gemm_x", "load_sweep",
           "mean_rate", "rate_curve"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RateCurve:
    """Sustained FLOP/s of one dtype's GEMMs on one GPU type, by the GEMM's size x (gemm_x)."""

    rate_max: float
    """FLOP/s the curve tends to for large GEMMs (under the power cap)."""
    x_half: float
    """The x at which the curve reaches half of rate_max."""

    def rate(self, x: float) -> float:
        return self.rate_max * x / (x + self.x_half)


_REPO = Path(__file__).resolve().parent.parent.parent
SWEEP_FILES: dict[str, Path] = {
    "h100-80gb": _REPO / "results/benchmarks/2026-11-28-h100-gemm-sweep/gemm-sweep.jsonl",
    "h200": _REPO / "results/benchmarks/2026-11-28-h200-gemm-sweep/gemm-sweep.jsonl",
}
"""Where each entry of GEMM_RATES was measured (tests/test_gemm_rates.py refits them)."""

FIT_MIN_SIZE = 1500.0
"""Cases below this x are left out of the fit: 1024^3 (x = 1024) is the one, and it is another
regime (the GPU under its power cap at 1860 MHz, each call ~5 us: launch- and latency-bound;
389 TFLOP/s on the H100, where the curve says 552). The smallest family case kept is gpt2-large's
proj at 4096 tokens, x = 1661; below ~1500 the curve is an extrapolation and optimistic."""

# Fitted by fit_curve to SWEEP_FILES (every case with x >= FIT_MIN_SIZE, TFLOP/s column
# "tflops": the median over the case's 1.5 s), rounded to 3 significant digits.
GEMM_RATES: dict[str, dict[str, RateCurve]] = {
    "h100-80gb": {"bf16": RateCurve(rate_max=711e12, x_half=295.0),
                  "fp8": RateCurve(rate_max=1423e12, x_half=692.0)},
    "h200": {"bf16": RateCurve(rate_max=697e12, x_half=209.0),
             "fp8": RateCurve(rate_max=1379e12, x_half=533.0)},
}


def rate_curve(gpu: str, dtype: str = "bf16") -> RateCurve | None:
    """The measured curve of `gpu` (a GpuSpec name) for `dtype`; None where never swept."""
    return GEMM_RATES.get(gpu, {}).get(dtype)


def gemm_x(m: float, n: float, k: float) -> float:
    """The curve's x of an m x n x k GEMM: the harmonic mean of its dimensions (3 x its
    arithmetic intensity in bf16; the module's docstring says why)."""
    return 3.0 / (1.0 / m + 1.0 / n + 1.0 / k)


@functools.lru_cache(maxsize=4096)
def mean_rate(gpu: str, dtype: str, m: float, gemms: tuple[tuple[int, int], ...]) -> float | None:
    """The rate at which a sequence of GEMMs of m rows each (the local tokens), one per
    (input features, output features) in `gemms`, runs as a whole: total FLOPs over total time,
    sum(f) / sum(f / rate), each GEMM's f = in * out (the 2m of 2m*in*out cancels). None for a
    GPU never swept. Cached: a plan asks for the same few shapes thousands of times."""
    curve = rate_curve(gpu, dtype)
    if curve is None:
        return None
    flops = sum(i * o for i, o in gemms)
    seconds = sum(i * o / curve.rate(gemm_x(m, i, o)) for i, o in gemms)
    return flops / seconds


# ---- provenance: refit the table from the sweep --------------------------------------------


def load_sweep(path: Path) -> list[dict[str, Any]]:
    """The OK cases of a tools/gemm_sweep.py JSONL."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("status") == "ok"]


def fit_curve(rows: Iterable[dict[str, Any]], dtype: str,
              min_size: float = FIT_MIN_SIZE) -> RateCurve:
    """Least squares on log rate (a relative error: the 577 and the 707 TFLOP/s cases weigh
    alike) of RateCurve to the sweep's `dtype` cases of x >= min_size."""
    import numpy as np  # scipy's dependency; imported where a fit runs
    from scipy.optimize import least_squares

    cases = [r for r in rows if r["dtype"] == dtype]
    xs = np.array([gemm_x(r["m"], r["n"], r["k"]) for r in cases], dtype=float)
    keep = xs >= min_size
    x = xs[keep]
    y = np.log(np.array([r["tflops"] * 1e12 for r in cases], dtype=float)[keep])

    def residuals(p: Sequence[float]) -> Any:
        return p[0] + np.log(x / (x + np.exp(p[1]))) - y

    start = [float(np.max(y)), float(np.log(300.0))]
    sol = least_squares(residuals, start, method="trf", xtol=1e-12, ftol=1e-12)
    return RateCurve(rate_max=float(np.exp(sol.x[0])), x_half=float(np.exp(sol.x[1])))
