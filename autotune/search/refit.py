"""Refitting the cost model's constants to the step times a search has measured."""

from __future__ import annotations

from autotune.predict.calibration import fit_cost_params, fit_fields
from autotune.predict.cost import CostParams
from autotune.search.records import SearchResult
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec

__all__ = ["REFIT_FIELDS", "refit_cost_params"]

REFIT_FIELDS = ("gemm_efficiency_max", "step_overhead_s", "layer_launch_s")
"""Constants refitted during a search: few, so a handful of trials pins them down (and
gemm_rate_scale where the start prices GEMMs at the measured rates: calibration.fit_fields)."""


def refit_cost_params(result: SearchResult, model: ModelSpec, cluster: ClusterSpec, *,
                      refit_after: int, fitted_on: int,
                      start: CostParams | None) -> tuple[CostParams, int] | None:
    """The cost constants refitted to the measured step times in `result`, and how many there
    are; None unless there are `refit_after` of them (0: never) and more than `fitted_on`."""
    measured = [(model, r.layout, cluster, r.metrics.step_time_s)
                for r in result.records
                if r.duplicate_of is None and r.tokens_per_s is not None and r.metrics
                and r.metrics.step_time_s]
    if not refit_after or len(measured) < refit_after or len(measured) == fitted_on:
        return None
    # With the constants of the levers the measured trials turn (FP8's GEMM rate and casts):
    # the ridge keeps them near their first-principles values until trials speak for them.
    start = start or CostParams()
    names = fit_fields(REFIT_FIELDS, start, [s for _, s, _, _ in measured])
    return fit_cost_params(measured, names=names, start=start), len(measured)
