"""Fit the analytical models' constants to measured trials, and keep them as JSON.

`fit_cost_params` minimizes the mean squared error of log step time (a relative error, so a 50 ms
and a 30 s trial weigh alike) over a few `CostParams` fields; `fit_memory_params` does the same for
peak device memory and the `MemoryParams` overheads. A small ridge term pulls each constant
towards its default, so a field that the samples say nothing about (TE constants fitted on local
runs only) stays put and the problem stays well posed with fewer samples than constants.
The optimizer is scipy.optimize.least_squares (trust-region reflective, bounded) over the
log-ratio residuals log(predicted / measured) in log-parameter space, deterministic.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError
from autotune.inputs.bounds import FLOAT_MAX
from autotune.inputs.documents import parse_json
from autotune.inputs.files import read_text
from autotune.layouts.layout import Layout
from autotune.levers import calibrated
from autotune.outputs import write_text
from autotune.predict.cost import CostParams, estimate_cost
from autotune.predict.memory import MemoryParams, estimate_memory
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec

__all__ = [
    "ATTENTION_FIT_FIELDS",
    "COST_FIT_FIELDS",
    "CV_LEFT_OUT",
    "MEMORY_FIT_FIELDS",
    "CrossValidation",
    "Sample",
    "fit_cost_params",
    "fit_fields",
    "fit_memory_params",
    "gemm_rate_fields",
    "held_out_step_errors",
    "lever_fit_fields",
    "load_calibration",
    "load_trials",
    "row_inputs",
    "save_calibration",
]

Sample = tuple[ModelSpec, Layout, ClusterSpec, float]
"""(model, layout, cluster, measured value): step time in seconds or peak bytes."""

COST_FIT_FIELDS: tuple[str, ...] = ("gemm_efficiency_max", *calibrated(), "step_overhead_s")
"""The constants a calibration fits besides those of the levers the trials turn: the GEMM
efficiency, the levers' always-fitted ones (the implementation's element-wise factors,
autotune.levers.transformer_impl.CALIBRATED) and the fixed cost per step; and gemm_rate_scale
where the measured GEMM rates are on (gemm_rate_fields)."""
ATTENTION_FIT_FIELDS: tuple[str, ...] = ("flash_attention_efficiency",
                                         "attention_dropout_ops_per_score")
"""What the fit to tests/data/measured_trials.json (cross_validate, tools/fit_constants.py) adds
to COST_FIT_FIELDS: fused attention's speed without dropout and the cost of dropout's random
numbers (autotune.levers.transformer_impl.Constants). The data set separates them: families
with and without attention dropout, and one shape measured both ways (s13-dropout). A machine's
own trials (`autotune calibrate`, a search's refit) seldom do. Not fitted by default yet: with
them the GPT families' held-out errors grow (results/benchmarks/2026-11-28-cpu-attention-
dropout.md); `tools/fit_constants.py --also` fits them."""
MEMORY_FIT_FIELDS: tuple[str, ...] = ("cuda_context_bytes", "nccl_bytes_per_group",
                                      "fragmentation")


def gemm_rate_fields(start: CostParams) -> tuple[str, ...]:
    """("gemm_rate_scale",) where `start` prices the GEMMs at the measured rates
    (CostParams.gemm_rate_scale > 0: the share of them training reaches is what a fit then
    moves); () where it is 0, the switch off, which a fit in log space must not turn on."""
    return ("gemm_rate_scale",) if start.gemm_rate_scale > 0 else ()


def fit_fields(base: Sequence[str], start: CostParams, layouts: Sequence[Layout],
               extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The cost constants one fit moves: `base` (COST_FIT_FIELDS, or a search's REFIT_FIELDS),
    gemm_rate_scale where `start` prices the GEMMs at the measured rates (gemm_rate_fields; never
    from `extra`, which cannot turn the switch on), `extra`, and the constants of the levers
    `layouts` turn on (lever_fit_fields)."""
    return (*base, *gemm_rate_fields(start), *(n for n in extra if n != "gemm_rate_scale"),
            *lever_fit_fields(layouts))


def lever_fit_fields(layouts: Sequence[Layout]) -> tuple[str, ...]:
    """The cost constants of every lever (autotune.levers: Lever.constants) that one of
    `layouts` turns on: what measured trials of it can fit (FP8's GEMM efficiency and casts, the
    offloaded optimizer's host bandwidth). A lever no sample turns keeps its first-principles
    values; one whose constants every calibration fits (Lever.calibrated: the implementation)
    is in COST_FIT_FIELDS instead."""
    from autotune.layouts.layout import DIMENSIONS
    from autotune.levers import LEVERS

    names: list[str] = []
    for lever in LEVERS:
        if lever.constants is None or lever.calibrated:
            continue
        if any(getattr(s, n) != DIMENSIONS[n].default for s in layouts
               for n in lever.field_names):
            names += [f.name for f in fields(lever.constants)]
    return tuple(names)
_UPPER: dict[str, float] = {"gemm_efficiency_max": 1.0, "flash_attention_efficiency": 1.0,
                            "hbm_efficiency": 1.0, "comm_efficiency": 1.0}
_RIDGE = 1e-6
_FLOOR = 1e-12  # fitted constants are positive; zero defaults start from this floor


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
    import numpy as np  # scipy's dependency; imported where the fit runs
    from scipy.optimize import least_squares

    log0 = np.array([math.log(max(float(getattr(default, n)), _FLOOR)) for n in names])
    log_measured = np.array([math.log(m) for *_, m in samples])
    upper = np.array([math.log(_UPPER[n]) if n in _UPPER else np.inf for n in names])
    log0 = np.minimum(log0, upper - 1e-9)
    ridge = math.sqrt(_RIDGE * len(samples))

    def make(x: Any) -> Any:
        return replace(default, **{n: float(math.exp(v)) for n, v in zip(names, x,
                                                                           strict=True)})

    def residuals(x: Any) -> Any:
        params = make(x)
        predicted = np.array([math.log(predict(params, model, layout, cluster))
                              for model, layout, cluster, _ in samples])
        # log-ratio residuals, plus a small ridge pull towards the defaults (see above)
        return np.concatenate([predicted - log_measured, ridge * (x - log0)])

    result = least_squares(residuals, log0, bounds=(np.full(len(names), -np.inf), upper),
                           method="trf", x_scale=1.0, diff_step=1e-4, xtol=1e-10,
                           ftol=1e-12)
    return make(result.x)


def fit_cost_params(samples: Sequence[Sample], *, names: Sequence[str] | None = None,
                    start: CostParams | None = None) -> CostParams:
    """CostParams whose predicted step times best match the measured ones (seconds). `names`:
    the constants fitted; by default COST_FIT_FIELDS and the constants of the levers the
    samples turn on (lever_fit_fields)."""
    if names is None:
        names = fit_fields(COST_FIT_FIELDS, start or CostParams(),
                           [s for _, s, _, _ in samples])
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


# --- Leave-one-family-out cross-validation over measured trials (issue 28) ---

Trial = tuple[str, ModelSpec, Layout, ClusterSpec, float, float]
"""(family, model, layout, cluster, step time s, NVML device memory bytes) of one OK trial."""


def family_of(model_name: str, gpu_name: str) -> str:
    """A model on a GPU type: the unit the cross-validation holds out (tools/fit_constants.py)."""
    return f"{model_name}/{gpu_name}"


def trial_model_ref(model: str, data_path: Path | str) -> str:
    """A measured trial's model as load_model takes it: a preset name as is, a path (a model
    YAML or a Hugging Face config.json, relative to the repository root that holds
    tests/data/measured_trials.json) made absolute."""
    if "/" not in model and not model.endswith((".yaml", ".yml", ".json")):
        return model
    path = Path(model)
    if path.is_absolute():
        return model
    return str(Path(data_path).resolve().parent.parent.parent / path)


def row_inputs(t: dict[str, Any], path: Path | str) -> tuple[ModelSpec, Layout, ClusterSpec]:
    """(model, layout, cluster) of one row `t` of the measured_trials.json at `path`, as the run
    had them: the model at the row's batch and sequence with the row's RoPE fusion, one node of
    its GPUs. Every reader of a measured row (load_trials, tests/measured.py, tools/step_terms.py,
    tools/recompute_slopes.py) builds it here."""
    from autotune.specs.hardware import gpu_spec
    from autotune.specs.presets import load_model

    layout = Layout(**t["strategy"])
    # The worker ran RoPE unfused whatever the implementation until 2026-11-28 (session 17):
    # a row without the field was measured so (autotune.specs.elementwise.rope_fused).
    model = load_model(trial_model_ref(t["model"], path)).with_overrides(
        global_batch_size=layout.gbs, seq_length=t.get("seq_length"))
    model = replace(model, rope_fusion=bool(t.get("rope_fusion", False)))
    cluster = ClusterSpec(num_gpus=t["gpus"], gpus_per_node=t["gpus"], gpu=gpu_spec(t["gpu"]))
    return model, layout, cluster


CV_LEFT_OUT: dict[str, str] = {
    "s26-xl4-search/": "gpt2-xl on 4 x H200, gbs 64 (session 26's default search): every layout "
                       "predicted 12-46% fast, bf16 too; not understood yet",
    "s25-pao-step/": "Llama-3.2-3B at seq 1024, gbs 8, mbs 1 on one H200: 38-43% fast, the four "
                     "optimizer variants alike; not understood (not profiled)",
    "s25-l8b-offload/2": "Llama-3.1-8B, FP8 delayed under full recompute at mbs 1, 1% of the "
                         "optimizer offloaded: host-bound, 15% fast with delayed scaling's "
                         "recompute host time (its 10% twin is within 0.2% now)",
}
"""Trials of tests/data/measured_trials.json a fit of the constants leaves out (by source
prefix, with why): step times the cost model misses for a reason it does not model, which a fit
of the shared constants bends toward. With them in, the held-out step medians of families
without a trial among them move: gpt2-large on H200 5.6% -> 15.2% (over issue 28's 10%),
gpt2-large on H100 3.8% -> 6.7%, llama2-13b 3.5% -> 6.0%, gpt2-xl on H200 6.0% -> 9.1%
(results/benchmarks/2026-11-29-cpu-measured-trials-s26.md). tools/fit_constants.py and the
tests' cross-validation (tests/test_calibration.py) pass it to load_trials. The rows stay in the
file (test_model_accuracy, test_fp8 read them) so that a fix shows, and
test_left_out_trials_are_still_missed fails once the model meets them."""


def load_trials(path: Path | str, *, leave_out: Iterable[str] = ()) -> list[Trial]:
    """The OK trials of a measured_trials.json (tests/data), as fit samples with families,
    without those whose source starts with one of `leave_out` (CV_LEFT_OUT's keys for a fit).

    A trial's family is its `family` field (one model shape given by two files is one family)
    or else its model, on its GPU type."""
    data = json.loads(read_text(Path(path), "measured trials"))
    prefixes = tuple(leave_out)
    trials: list[Trial] = []
    for t in data["trials"]:
        if t["status"] != "OK" or (prefixes and t["source"].startswith(prefixes)):
            continue
        model, layout, cluster = row_inputs(t, path)
        trials.append((family_of(t.get("family", t["model"]), t["gpu"]), model, layout,
                       cluster, float(t["step_time_s"]), float(t["device_used_bytes"])))
    return trials


@dataclass(frozen=True, slots=True, kw_only=True)
class FamilyError:
    """Relative errors on one family's trials: held out of the fit, and in sample."""

    family: str
    trials: int
    step_median: float
    step_worst: float
    memory_median: float
    memory_worst: float
    step_in_sample: float
    memory_in_sample: float
    step_shipped: float
    """Median error with the shipped defaults (CostParams(), MemoryParams())."""
    memory_shipped: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CrossValidation:
    families: tuple[FamilyError, ...]
    cost: CostParams
    """Fitted to every trial: the shipped defaults."""
    memory: MemoryParams


def _rel_errors(trials: Sequence[Trial], cost: CostParams,
                memory: MemoryParams) -> tuple[list[float], list[float]]:
    step = [abs(estimate_cost(m, s, c, cost).step_time_s / t - 1) for _, m, s, c, t, _ in trials]
    mem = [abs(estimate_memory(m, s, c, memory).peak_bytes / u - 1)
           for _, m, s, c, _, u in trials]
    return step, mem


def cross_validate(trials: Sequence[Trial], *, start_cost: CostParams | None = None,
                   start_memory: MemoryParams | None = None,
                   extra_cost: Sequence[str] = ()) -> CrossValidation:
    """Fit on all families but one, measure the one held out; then fit on all of them. Each
    fit's cost constants: COST_FIT_FIELDS, `extra_cost` and those of the levers its trials turn
    (lever_fit_fields)."""
    import statistics

    def fit(ts: Sequence[Trial]) -> tuple[CostParams, MemoryParams]:
        names = fit_fields(COST_FIT_FIELDS, start_cost or CostParams(),
                           [s for _, _, s, *_ in ts], extra_cost)
        cost = fit_cost_params([(m, s, c, t) for _, m, s, c, t, _ in ts], names=names,
                               start=start_cost or CostParams())
        memory = fit_memory_params([(m, s, c, u) for _, m, s, c, _, u in ts],
                                   start=start_memory or MemoryParams())
        return cost, memory

    all_cost, all_memory = fit(trials)
    rows = []
    for family in sorted({t[0] for t in trials}):
        held = [t for t in trials if t[0] == family]
        cost, memory = fit([t for t in trials if t[0] != family])
        step, mem = _rel_errors(held, cost, memory)
        step_in, mem_in = _rel_errors(held, all_cost, all_memory)
        step_sh, mem_sh = _rel_errors(held, CostParams(), MemoryParams())
        rows.append(FamilyError(family=family, trials=len(held),
                                step_median=statistics.median(step), step_worst=max(step),
                                memory_median=statistics.median(mem), memory_worst=max(mem),
                                step_in_sample=statistics.median(step_in),
                                memory_in_sample=statistics.median(mem_in),
                                step_shipped=statistics.median(step_sh),
                                memory_shipped=statistics.median(mem_sh)))
    return CrossValidation(families=tuple(rows), cost=all_cost, memory=all_memory)


def held_out_step_errors(trials: Sequence[Trial], names: Sequence[str], *,
                         start: CostParams | None = None) -> list[float]:
    """Leave-one-family-out for a few cost constants: each trial's step-time error (predicted /
    measured - 1, in the order of `trials`) with `names` fitted to the trials of the other
    families and every other constant held at `start` (the shipped defaults), so that a
    lever's constants are judged on models they were not fitted to, with nothing else moving
    (the FP8 trials: tests/test_fp8.py). Needs two families at least."""
    start = start or CostParams()
    errors: dict[int, float] = {}
    for family in sorted({t[0] for t in trials}):
        rest = [(m, s, c, step) for f, m, s, c, step, _ in trials if f != family]
        fitted = fit_cost_params(rest, names=names, start=start)
        for i, (f, m, s, c, step, _) in enumerate(trials):
            if f == family:
                errors[i] = estimate_cost(m, s, c, fitted).step_time_s / step - 1
    return [errors[i] for i in range(len(trials))]
