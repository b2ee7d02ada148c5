"""The FP8 loss guard: an FP8 trial's loss must follow its bf16 twin's on the same data.

A trial records the mean loss of every step (TrialMetrics.losses). Its bf16 twin is the same
layout with FP8 off (`twin`): the same model, initialised from the same seed on the same ranks
(autotune.worker.run seeds torch and megatron-core's RNG tracker per trial), trained on the same
synthetic micro-batches (autotune.worker.train.make_batches, seeded), step by step. The two
differ only in the GEMMs' arithmetic, so their losses must stay within a small relative distance
step for step; an FP8 recipe that diverges (a loss that grows away, or stops being finite) is
recorded as failed (TrialStatus.DIVERGED) with the numbers, never as the fastest layout.

The twin's losses come from a trial of its own when the search has run it, else from a short
reference run that the search launches for the purpose (autotune.search.execution).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from autotune.layout import Layout
from autotune.levers.fp8 import Fp8, Fp8Recipe

__all__ = ["LOSS_TOLERANCE", "MIN_STEPS", "REFERENCE_STEPS", "LossVerdict", "compare_losses",
           "guarded", "twin"]

LOSS_TOLERANCE = 0.01
"""Largest relative distance |fp8 - bf16| / bf16 of one step's loss. A first-principles bound,
to be set from measured twins: FP8's rounding (E4M3's 3 mantissa bits, 2^-4 relative per
element) averages out over the K products a GEMM accumulates in fp32, so on the first steps
of a fresh model (the loss near ln(vocabulary), 10.8 for GPT-2's) FP8 and bf16 agree to well
under 0.1%; bf16 against bf16 differs by less still (non-deterministic reductions). 1% is an
order of magnitude above both and far below what a diverging recipe does (a loss that grows
without bound, or NaN)."""

MIN_STEPS = 3
"""Fewer common steps than this say nothing about a trend: the guard does not judge then."""

REFERENCE_STEPS = 10
"""Steps of the short bf16 reference run the search launches when the twin has not run: the
first steps are where a recipe's scaling goes wrong (delayed scaling's amax history starts
empty)."""


@dataclass(frozen=True, slots=True)
class LossVerdict:
    """The comparison of an FP8 trial's losses with its twin's."""

    diverged: bool
    steps: int
    """Steps compared (the common prefix of the two series)."""
    worst_step: int
    """1-based step of the largest distance (or of the first non-finite FP8 loss)."""
    fp8: float | None
    bf16: float
    distance: float
    """Relative distance at worst_step (inf where the FP8 loss was not finite)."""
    tolerance: float

    def describe(self) -> str:
        fp8 = "not finite" if self.fp8 is None else f"{self.fp8:.4f}"
        verdict = "left" if self.diverged else "followed"
        return (f"FP8 loss {verdict} its bf16 twin's: step {self.worst_step} of {self.steps}: "
                f"{fp8} against {self.bf16:.4f} ({self._distance()} "
                f"{'>' if self.diverged else '<='} {self.tolerance:.1%})")

    def _distance(self) -> str:
        return "inf" if math.isinf(self.distance) else f"{self.distance:.2%}"


def guarded(s: Layout) -> bool:
    """Whether the guard judges trials of `s`: FP8 on."""
    return s.fp8 != Fp8.OFF


def twin(s: Layout) -> Layout:
    """`s` in bf16: FP8 off, its recipe and parameter gather at their defaults (what the export
    and the worker give Megatron without FP8)."""
    return replace(s, fp8=Fp8.OFF, fp8_recipe=Fp8Recipe.DELAYED, fp8_param_gather=False)


def compare_losses(fp8: Sequence[float | None], bf16: Sequence[float | None],
                   tolerance: float = LOSS_TOLERANCE) -> LossVerdict | None:
    """The verdict on an FP8 series against its twin's, step by step over their common prefix;
    None when there is nothing to judge (fewer than MIN_STEPS steps with a finite twin)."""
    if not tolerance > 0:  # NaN too
        raise ValueError(f"tolerance must be positive, got {tolerance}")
    pairs = list(zip(fp8, bf16, strict=False))
    # The twin's own non-finite steps say nothing about FP8: stop comparing there.
    first_bad = next((i for i, (_, b) in enumerate(pairs) if not _finite(b)), len(pairs))
    pairs = pairs[:first_bad]
    if len(pairs) < MIN_STEPS:
        return None
    worst, worst_distance = 0, -1.0
    for i, (a, b) in enumerate(pairs):
        assert b is not None
        distance = math.inf if not _finite(a) else abs(a - b) / abs(b)  # type: ignore[operator]
        if distance > worst_distance:
            worst, worst_distance = i, distance
        if math.isinf(distance):
            break
    a, b = pairs[worst]
    assert b is not None
    return LossVerdict(diverged=worst_distance > tolerance, steps=len(pairs),
                       worst_step=worst + 1, fp8=a if _finite(a) else None, bf16=b,
                       distance=worst_distance, tolerance=tolerance)


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
