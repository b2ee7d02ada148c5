"""Fit the analytical models' constants to measured trials, and keep them as JSON.

`fit_cost_params` minimizes the mean squared error of log step time (a relative error, so a 50 ms
and a 30 s trial weigh alike) over a few `CostParams` fields; `fit_memory_params` does the same for
peak device memory and the `MemoryParams` overheads. A small ridge term pulls each constant
towards its default, so a field that the samples say nothing about (TE constants fitted on local
runs only) stays put and the problem stays well posed with fewer samples than constants.
The optimizer is a deterministic Nelder-Mead (Nelder & Mead 1965, with the standard
reflection / expansion / contraction / shrink coefficients 1, 2, 1/2, 1/2) in log-parameter
space; scipy is not a dependency.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from autotune.cost import CostParams, estimate_cost
from autotune.errors import ConfigError
from autotune.hardware import ClusterSpec
from autotune.inputs.bounds import FLOAT_MAX
from autotune.inputs.documents import parse_json
from autotune.inputs.files import read_text
from autotune.layout import Layout
from autotune.memory import MemoryParams, estimate_memory
from autotune.model import ModelSpec
from autotune.outputs import write_text

__all__ = [
    "COST_FIT_FIELDS",
    "MEMORY_FIT_FIELDS",
    "Sample",
    "fit_cost_params",
    "fit_memory_params",
    "load_calibration",
    "nelder_mead",
    "save_calibration",
]

Sample = tuple[ModelSpec, Layout, ClusterSpec, float]
"""(model, layout, cluster, measured value): step time in seconds or peak bytes."""

COST_FIT_FIELDS: tuple[str, ...] = ("gemm_efficiency_max", "elementwise_bytes_local",
                                    "elementwise_bytes_te", "step_overhead_s")
MEMORY_FIT_FIELDS: tuple[str, ...] = ("cuda_context_bytes", "nccl_bytes_per_group",
                                      "fragmentation")
_UPPER: dict[str, float] = {"gemm_efficiency_max": 1.0, "flash_attention_efficiency": 1.0,
                            "hbm_efficiency": 1.0, "comm_efficiency": 1.0}
_RIDGE = 1e-6
_FLOOR = 1e-12  # fitted constants are positive; zero defaults start from this floor


def nelder_mead(f: Callable[[list[float]], float], x0: Sequence[float], *, step: float = 0.1,
                max_iter: int = 2000, tol: float = 1e-10) -> list[float]:
    """Minimize f from x0 with Nelder-Mead; deterministic (axis-aligned initial simplex)."""
    n = len(x0)
    simplex = [list(x0)] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)]
                            for i in range(n)]
    values = [f(p) for p in simplex]
    for _ in range(max_iter):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        spread = max(abs(a - b) for p in simplex[1:] for a, b in zip(p, simplex[0],
                                                                       strict=True))
        if values[-1] - values[0] <= tol and spread <= 1e-6:
            break
        centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]

        def toward(c: float, w: list[float] = worst, ce: list[float] = centroid) -> list[float]:
            return [cj + c * (cj - wj) for cj, wj in zip(ce, w, strict=True)]

        reflected = toward(1.0)
        fr = f(reflected)
        if fr < values[0]:
            expanded = toward(2.0)
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = toward(0.5) if fr < values[-1] else toward(-0.5)
            fc = f(contracted)
            if fc < min(fr, values[-1]):
                simplex[-1], values[-1] = contracted, fc
            else:  # shrink towards the best point
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, p, strict=True)]
                                    for p in simplex[1:]]
                values = [values[0]] + [f(p) for p in simplex[1:]]
    return simplex[min(range(n + 1), key=values.__getitem__)]


def _fit(default: Any, names: Sequence[str], samples: Sequence[Sample],
         predict: Callable[[Any, ModelSpec, Layout, ClusterSpec], float]) -> Any:
    if not samples:
        raise ConfigError("calibration needs at least one measured sample")
    for *_, measured in samples:
        if not measured > 0:
            raise ConfigError(f"measured values must be positive, got {measured!r}")
    known = {f.name for f in fields(default)}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"unknown {type(default).__name__} field(s): {', '.join(unknown)}")
    log0 = [math.log(max(float(getattr(default, n)), _FLOOR)) for n in names]
    log_measured = [math.log(m) for *_, m in samples]

    def make(x: list[float]) -> Any:
        values = {n: min(math.exp(v), _UPPER.get(n, math.inf)) for n, v in zip(names, x,
                                                                            strict=True)}
        return replace(default, **values)

    def loss(x: list[float]) -> float:
        params = make(x)
        err = 0.0
        for (model, layout, cluster, _), lm in zip(samples, log_measured, strict=True):
            err += (math.log(predict(params, model, layout, cluster)) - lm) ** 2
        ridge = sum((a - b) ** 2 for a, b in zip(x, log0, strict=True))
        return err / len(samples) + _RIDGE * ridge

    return make(nelder_mead(loss, log0))


def fit_cost_params(samples: Sequence[Sample], *, names: Sequence[str] = COST_FIT_FIELDS,
                    start: CostParams | None = None) -> CostParams:
    """CostParams whose predicted step times best match the measured ones (seconds)."""
    def predict(p: CostParams, m: ModelSpec, s: Layout, c: ClusterSpec) -> float:
        return estimate_cost(m, s, c, p).step_time_s

    result: CostParams = _fit(start or CostParams(), names, samples, predict)
    return result


def fit_memory_params(samples: Sequence[Sample], *, names: Sequence[str] = MEMORY_FIT_FIELDS,
                      start: MemoryParams | None = None) -> MemoryParams:
    """MemoryParams whose predicted peaks best match measured peak device bytes.

    Measured peaks should be what `MemoryEstimate.peak_bytes` predicts: device memory in use
    (NVML, context and NCCL included) on the busiest rank, not torch's max_allocated.
    """
    def predict(p: MemoryParams, m: ModelSpec, s: Layout, c: ClusterSpec) -> float:
        return estimate_memory(m, s, c, p).peak_bytes

    result: MemoryParams = _fit(start or MemoryParams(), names, samples, predict)
    return result


def save_calibration(path: Path | str, cost: CostParams, memory: MemoryParams, *,
                     samples: int, source: str) -> None:
    """Both models' constants in one file, as `autotune calibrate` writes it."""
    data = {"version": 1, "samples": samples, "source": source,
            "cost": {"type": "CostParams", "values": asdict(cost)},
            "memory": {"type": "MemoryParams", "values": asdict(memory)}}
    write_text(Path(path), json.dumps(data, indent=2, sort_keys=True) + "\n")


def _constants(cls: type[Any], data: Any, part: str, source: str) -> Any:
    """`cls` (CostParams or MemoryParams) from the file's `part`: each value a finite number
    (autotune.inputs.schema), at most 1 where it is an efficiency (_UPPER), positive where its
    default is (a zero GEMM efficiency divides by zero; a negative fragmentation made a
    model that does not fit "fit"), never negative."""
    from autotune.inputs.schema import check

    section = data.get(part) if isinstance(data, dict) else None
    values = section.get("values") if isinstance(section, dict) else None
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: not a calibration file from `autotune calibrate` (no "
                          f"{part}.values)")
    checked = check(cls, values, source, what=part, prefix=f"{part}.")
    defaults = cls()
    for name, value in checked.items():
        if value is None:
            continue
        if isinstance(value, bool):
            raise ConfigError(f"{source}: {part}.{name} must be a number, got {value!r}")
        low = 0.0 if not getattr(defaults, name) else math.ulp(0.0)
        high = _UPPER.get(name, FLOAT_MAX)
        if not low <= value <= high:
            rule = "positive" if low else "at least 0"
            raise ConfigError(f"{source}: {part}.{name} must be {rule} and at most {high:g}, "
                              f"got {value!r}")
    return cls(**checked)


def load_calibration(path: Path | str) -> tuple[CostParams, MemoryParams]:
    """The (cost, memory) constants of a file written by save_calibration, every value checked
    (one line naming the file and the constant otherwise)."""
    source = f"calibration file {path}"
    data = parse_json(read_text(Path(path), "calibration file"), source)
    return (_constants(CostParams, data, "cost", source),
            _constants(MemoryParams, data, "memory", source))
