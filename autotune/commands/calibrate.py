"""`autotune calibrate`: fit the analytical models' constants to trials measured here.

Reads every finished trial under the results folders (trials/<n>/trial.json with its
result.json or failure file), fits the throughput constants to measured step times and the
memory overheads to NVML device memory, and writes both to one JSON file that `--calibration`
of the search and of `estimate` accepts.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from autotune.errors import ConfigError
from autotune.inputs.files import output_file
from autotune.layouts.layout import Layout
from autotune.predict.calibration import (
    COST_FIT_FIELDS,
    fit_cost_params,
    fit_memory_params,
    lever_fit_fields,
    save_calibration,
)
from autotune.predict.cost import CostParams, estimate_cost
from autotune.predict.memory import MemoryParams, estimate_memory
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.model import ModelSpec
from autotune.trials.protocol import RESULT_NAME, SPEC_NAME
from autotune.trials.trial import TrialMetrics, TrialSpec, TrialStatus

__all__ = ["Measured", "collect", "run_calibrate"]

COST_FIELDS = (*COST_FIT_FIELDS, "layer_launch_s")
"""COST_FIT_FIELDS and the host time per layer (CostParams.layer_launch_s), a property of the
machine the trials ran on."""

Measured = tuple[ModelSpec, Layout, ClusterSpec, float, int]
"""(model, layout, cluster, median step time s, NVML device memory in use, bytes)."""


def collect(folders: list[Path], gpu: str | None) -> list[Measured]:
    """Every trial that ran to completion under `folders` (searched recursively)."""
    found: list[Measured] = []
    for folder in folders:
        if not folder.is_dir():
            what = "is not a folder" if folder.exists() else "does not exist"
            raise ConfigError(f"results folder {folder} {what}")
        for spec_path in sorted(folder.rglob(SPEC_NAME)):
            result = spec_path.parent / RESULT_NAME
            if not result.is_file():
                continue
            metrics = TrialMetrics.read(result)  # checked: a NaN would poison the fit
            if metrics.status is not TrialStatus.OK or not metrics.step_time_s or \
                    not metrics.device_used_bytes:
                continue
            spec = TrialSpec.read(spec_path)
            name = gpu or spec.gpu_name
            if name is None:
                raise ConfigError(f"{spec_path} does not say which GPU it ran on; pass --gpu")
            world = spec.layout.world_size
            cluster = ClusterSpec(num_gpus=world, gpus_per_node=min(world, 8),
                                  gpu=gpu_spec(name))
            found.append((spec.model, spec.layout, cluster, metrics.step_time_s,
                          metrics.device_used_bytes))
    return found


def _errors(samples: list[Measured], cost: CostParams,
            memory: MemoryParams) -> tuple[float, float]:
    """Median relative error of step time and of device memory."""
    step = [abs(estimate_cost(m, s, c, cost).step_time_s - t) / t for m, s, c, t, _ in samples]
    mem = [abs(estimate_memory(m, s, c, memory).peak_bytes - u) / u for m, s, c, _, u in samples]
    return statistics.median(step), statistics.median(mem)


def run_calibrate(folders: list[str], gpu: str | None, output: str) -> None:
    output_file(output)  # a folder or a missing one is refused before the fit, not after it
    samples = collect([Path(f) for f in folders], gpu)
    if len(samples) < 3:
        raise ConfigError(f"calibration needs at least 3 measured trials, found {len(samples)} "
                          f"under {', '.join(folders)}")
    before = _errors(samples, CostParams(), MemoryParams())
    fitted_cost = fit_cost_params([(m, s, c, t) for m, s, c, t, _ in samples],
                                  names=(*COST_FIELDS,
                                         *lever_fit_fields([s for _, s, *_ in samples])))
    fitted_memory = fit_memory_params([(m, s, c, float(u)) for m, s, c, _, u in samples])
    fitted = _errors(samples, fitted_cost, fitted_memory)
    # The fits minimise their own losses, not the median error reported here; a fit that is
    # worse than the defaults on the very trials it saw is not written (each model apart:
    # step time depends only on the cost constants, memory only on the memory ones).
    keep_cost, keep_memory = fitted[0] <= before[0], fitted[1] <= before[1]
    cost = fitted_cost if keep_cost else CostParams()
    memory = fitted_memory if keep_memory else MemoryParams()
    save_calibration(output, cost, memory, samples=len(samples), source=", ".join(folders))
    print(f"{len(samples)} measured trials (in-sample median errors):")
    for what, kept, old, new in (("step time", keep_cost, before[0], fitted[0]),
                                 ("device memory", keep_memory, before[1], fitted[1])):
        verdict = (f"fitted constants kept ({old:.1%} -> {new:.1%})" if kept else
                   f"default constants kept: the fit was worse ({old:.1%} -> {new:.1%})")
        print(f"  {what}: {verdict}")
    print(f"wrote {output}; use it with --calibration {output}")
