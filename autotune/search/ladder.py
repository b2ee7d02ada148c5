"""The derived lever's ladder: move a resolved count by what the trials measure.

A `derive` dimension (autotune.search.derive) is first resolved to the fewest recomputed (or
offloaded) layers the memory model expects to fit with the gate's error band as margin. The
model is right to within a few percent, and a few percent of an 80 GB GPU is several layers of
a long-sequence model: the fastest count is often below the first guess. So, per layout (all
its fields but the derived count), the search climbs a ladder as micro-batch bisection does:

- after a trial that fits, the fewest count whose peak, extrapolated from that trial's measured
  peak along the model's slope (measured + predicted(n) - predicted(measured n)), stays under
  the device memory less `LADDER_MARGIN` is tried next, if it is fewer;
- after an OOM at n, the middle count between n and the fewest that fit (or, with none known,
  the model's answer under the gate's learned capacity, above n) is tried next.
Each rung is a layout of its own (its count is part of its record and key), so a rung is
never run twice and `--resume` continues the ladder from the records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.layouts.layout import Layout, with_fields
from autotune.predict.memory import MemoryParams, estimate_memory
from autotune.search.derive import DERIVABLE, resolve, safe_limit_bytes, values_of
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.trials.trial import TrialStatus

__all__ = ["LADDER_MARGIN", "Ladder", "Rungs"]

LADDER_MARGIN = 0.01
"""Headroom below the device memory that an extrapolated rung must keep, as a fraction of it:
the allocator's peak moved by 0.01-0.1 GiB between warm and cold runs of one layout
(results/benchmarks/2026-11-23-h100-warm-pool-and-self-stopping-search.md) and the model's
per-layer slope is an estimate; 1% of an 80 GB GPU is 0.8 GB. A rung that runs out of memory
all the same costs one trial, and the ladder bisects above it."""


@dataclass(slots=True)
class Rungs:
    """What one layout's counts did: measured peaks of those that fit, and the OOMs."""

    fits: dict[int, float] = field(default_factory=dict)
    """count -> measured device memory (bytes) of a trial that ran."""
    ooms: set[int] = field(default_factory=set)


@dataclass(slots=True)
class Ladder:
    """Per layout and derived dimension, the rungs tried; `next_rung` says what to try."""

    model: ModelSpec
    cluster: ClusterSpec
    dims: tuple[str, ...]
    params: MemoryParams | None = None
    rungs: dict[tuple[Layout, str], Rungs] = field(default_factory=dict)

    def _applicable(self, s: Layout) -> list[str]:
        return [d for d in self.dims
                if DERIVABLE[d].monotone(s) and values_of(d, s, self.model)]

    @staticmethod
    def _template(s: Layout, dim: str) -> Layout:
        return with_fields(s, **{dim: DERIVABLE[dim].off})

    def learn(self, s: Layout, status: TrialStatus, measured_bytes: float | None) -> None:
        """Take in one trial of `s`: a fit with its measured peak, or an OOM."""
        for dim in self._applicable(s):
            rungs = self.rungs.setdefault((self._template(s, dim), dim), Rungs())
            value = getattr(s, dim)
            if status is TrialStatus.OOM:
                rungs.ooms.add(value)
            elif measured_bytes is not None and status is TrialStatus.OK:
                rungs.fits[value] = measured_bytes

    def _peak(self, s: Layout, dim: str, value: int) -> float:
        return estimate_memory(self.model, with_fields(s, **{dim: value}), self.cluster,
                               self.params).peak_bytes

    def extrapolated(self, s: Layout) -> float | None:
        """`s`'s peak extrapolated from the measured trial of the nearest count of its derived
        lever (measured + predicted(s) - predicted(that count)); None without one."""
        for dim in self._applicable(s):
            rungs = self.rungs.get((self._template(s, dim), dim))
            if rungs is None or not rungs.fits:
                continue
            value = getattr(s, dim)
            if value in rungs.fits:
                return rungs.fits[value]
            near = min(rungs.fits, key=lambda v: (abs(v - value), v))
            return rungs.fits[near] + self._peak(s, dim, value) - self._peak(s, dim, near)
        return None

    def next_rung(self, s: Layout, *, capacity_bytes: float | None = None) -> Layout | None:
        """The next count of `s`'s derived lever to try after a trial of `s`, or None: fewer
        after a fit with room left, more after an OOM (see the module). `capacity_bytes`:
        the gate's learned capacity, for an OOM with no fit known."""
        for dim in self._applicable(s):
            rungs = self.rungs.get((self._template(s, dim), dim))
            if rungs is None:
                continue
            values = values_of(dim, s, self.model)
            fit = min(rungs.fits, default=None)
            oom = max((v for v in rungs.ooms if fit is None or v < fit), default=None)
            untried = [v for v in values if v not in rungs.fits and v not in rungs.ooms
                       and (oom is None or v > oom) and (fit is None or v < fit)]
            if not untried:
                continue
            if fit is not None and oom is None:
                # Only fits: extrapolate the fewest's measured peak along the model's slope.
                limit = self.cluster.gpu.memory_bytes * (1 - LADDER_MARGIN)
                base = self._peak(s, dim, fit)
                below = [v for v in untried
                         if rungs.fits[fit] + self._peak(s, dim, v) - base <= limit]
                if below:
                    return with_fields(s, **{dim: below[0]})
                continue
            if fit is not None:
                # Between an OOM and a fit (the extrapolation was wrong once): bisect.
                return with_fields(s, **{dim: untried[len(untried) // 2]})
            if oom is not None:
                # No fit yet: the model's answer above the OOM, under what the gate learned.
                above = resolve(s, (dim,), self.model, self.cluster,
                                limit_bytes=safe_limit_bytes(
                                    self.cluster, capacity_bytes,
                                    expandable=s.expandable_segments),
                                params=self.params, floor={dim: oom + 1})
                value = getattr(above, dim)
                if value in untried:
                    return above
                return with_fields(s, **{dim: untried[len(untried) // 2]})
        return None
