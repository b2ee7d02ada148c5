"""The FP8 loss guard: an FP8 trial's loss must follow its bf16 twin's on the same data.

A trial records the mean loss of every step (TrialMetrics.losses). Its bf16 twin is the same
layout with FP8 off (`twin`): the same model, initialised from the same seed on the same ranks
(autotune.worker.run seeds torch and megatron-core's RNG tracker per trial), trained on the same
synthetic micro-batches (autotune.worker.train.make_batches, seeded), step by step. The two
differ only in the GEMMs' arithmetic, so the FP8 loss must end where the twin's ends, within
LOSS_TOLERANCE of the loss's scale; an FP8 recipe that diverges (a loss that grows away, or
stops being finite) is recorded as failed (TrialStatus.DIVERGED) with the numbers, never as
the fastest layout.

The twin's losses come from a trial of its own when the search has run it, else from a short
reference run that the search launches for the purpose (autotune.search.execution).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.layouts.layout import Layout, with_fields
from autotune.levers.fp8 import Fp8, Fp8Recipe

__all__ = ["GUARD_STEPS", "LAG_STEPS", "LOSS_TOLERANCE", "MIN_STEPS", "REFERENCE_STEPS",
           "SAME_ARITHMETIC", "WINDOW", "LossVerdict", "arithmetic", "compare_losses", "guarded",
           "judged_from", "lag_steps", "long_enough", "same_arithmetic", "twin"]

LOSS_TOLERANCE = 0.10
"""Largest gap between the FP8 trial's loss and its twin's over the last WINDOW steps, as a
fraction of the twin's first loss (the scale of the loss: training drives it towards zero, so a
gap relative to the current loss would grow without meaning). Measured on one H100 (2026-11-25,
results/benchmarks/2026-11-25-h100-fp8.md, 7 FP8 trials of gpt2-xl and Llama-3.2-3B against
their twins): healthy recipes end 0.0-0.5% (tensorwise, blockwise) and up to 6.3% (delayed
scaling, whose empty amax history makes the first steps lag, then catches up) of the first loss
away; a diverging run goes back towards its first loss or leaves the finite numbers. 10% lies
above every healthy gap measured and far below a divergence; a quality difference smaller
than that cannot be judged from ten steps of a fresh model."""

LAG_STEPS: dict[Fp8Recipe, int] = {Fp8Recipe.DELAYED: 2}
"""Steps an FP8 recipe's series may trail its twin's (0 where not listed). Delayed scaling
scales each tensor by the amax of earlier steps (TE's DelayedScaling, amax_history), so its
first step runs on default scales and its loss then trails bf16's by one to two steps, which
on the worker's quickly learnt synthetic batches is a large gap in absolute terms. On one
H200 (Llama-3.2-3B at seq 4096, 2026-11-28-h200-fp8-follow-s16.md) delayed scaling went
12.37, 10.70, 6.77, 4.67, 2.56, 1.18 against bf16's 12.37, 6.88, 3.45, 1.50, 0.55, 0.10: 17%
of the first loss apart over steps 4-6, 7.9% against the twin's steps 3-5. At gbs 8
(2026-11-29-h200-fp8-recompute-host-s26.md, mbs 1 and 2, with and without full recompute)
it went 12.37, 10.07, 6.38, 5.01, 3.68, 1.96 against 12.38, 7.15, 3.74, 1.99, 1.02, 0.46:
10.5-12.5% against the twin's steps one back, 4.1-6.0% two back, so four healthy trials were
failed with a lag of one. Current scaling (tensorwise) scales from the tensor itself and may
not trail. A diverging run trails by every lag: it is failed whatever the lag allowed."""

WINDOW = 3
"""Steps at the end of the common series whose mean losses are compared: early transients
(delayed scaling's first steps lag bf16 by up to 23% of the first loss) are not divergence."""

MIN_STEPS = 3
"""Fewer common steps than this say nothing about a trend: the guard does not judge then."""

REFERENCE_STEPS = 10
"""Steps of the short bf16 reference run the search launches when the twin has not run."""

GUARD_STEPS = 6
"""The fewest steps a guarded trial runs before its timing may call it stable
(TrialSpec.min_steps): the last WINDOW steps judged must lie past delayed scaling's first
steps, which lag bf16 by up to 34.5% of the first loss at step 2 (2026-11-25-h100-fp8.md). Six
is the fewest a stable trial ran before the timing's early window (one warm-up step and a
window of five), the series the tolerance was set against; the early window would end a
trial of long, steady steps after four, judging steps 2-4."""


@dataclass(frozen=True, slots=True)
class LossVerdict:
    """The comparison of an FP8 trial's losses with its twin's."""

    diverged: bool
    steps: int
    """Steps compared (the common prefix of the two series)."""
    worst_step: int
    """1-based last step of the compared window (or the first non-finite FP8 loss's step)."""
    fp8: float | None
    """The FP8 loss over the window (its mean; None where not finite)."""
    bf16: float
    distance: float
    """|fp8 - bf16| over the twin's first loss (inf where the FP8 loss was not finite)."""
    tolerance: float
    lag: int = 0
    """Steps the twin's window was moved back to (LAG_STEPS): the FP8 loss trails by this."""

    def describe(self) -> str:
        fp8 = "not finite" if self.fp8 is None else f"{self.fp8:.4f}"
        verdict = "left" if self.diverged else "followed"
        where = (f"step {self.worst_step} of {self.steps}" if self.fp8 is None else
                 f"steps {self.worst_step - WINDOW + 1}-{self.worst_step} of {self.steps}")
        if self.lag and self.fp8 is not None:
            first = self.worst_step - WINDOW + 1 - self.lag
            where += (f" against the twin's {first}-{self.worst_step - self.lag} (trailing by "
                      f"{self.lag})")
        return (f"FP8 loss {verdict} its bf16 twin's: {where}: {fp8} against {self.bf16:.4f} "
                f"({self._distance()} of the first loss "
                f"{'>' if self.diverged else '<='} {self.tolerance:.1%})")

    def _distance(self) -> str:
        return "inf" if math.isinf(self.distance) else f"{self.distance:.2%}"


def guarded(s: Layout) -> bool:
    """Whether the guard judges trials of `s`: FP8 on."""
    return s.fp8 != Fp8.OFF


def twin(s: Layout) -> Layout:
    """`s` in bf16: FP8 off, its recipe and parameter gather at their defaults (what the export
    and the worker give Megatron without FP8). with_fields, not dataclasses.replace: a plan's
    first FP8 follow-up asks it of every valid layout (55k for DeepSeek-V3 on 1,024 GPUs)."""
    return with_fields(s, fp8=Fp8.OFF, fp8_recipe=Fp8Recipe.DELAYED, fp8_param_gather=False)


SAME_ARITHMETIC: tuple[str, ...] = (
    "recompute", "recompute_method", "recompute_num_layers", "recompute_modules",
    "offload_layers", "overlap_grad_reduce", "overlap_param_gather", "nan_checks")
"""Layout fields that leave a step's losses as they are: recomputation runs the same forward
again with the RNG states it saved (megatron-core's tensor_parallel.checkpoint and
CheckpointWithoutOutput), activation offload moves tensors and back, overlap reorders when
gradients and parameters travel, not what they sum to, and the NaN checks only read them. Two
layouts that differ only here train alike up to the kernels' own rounding, far inside
LOSS_TOLERANCE: a measured bf16 trial of one is the other's twin, and a search that measured
the bf16 layout without recompute needs no reference run for its FP8 layout with it."""


def long_enough(twin_losses: Sequence[float | None], fp8_steps: int) -> bool:
    """Whether a bf16 series of `twin_losses` can judge an FP8 series of `fp8_steps` steps: it
    reaches as far as the FP8 trial's guarded steps (GUARD_STEPS, or all of a shorter FP8
    series). A shorter twin would move the compared window back onto delayed scaling's first
    steps, which lag by design: on 4 x H200 (2026-11-28-h200x4-issue30-s16.md) a bf16 trial
    timed for 4 steps judged a healthy delayed-scaling trial at steps 2-4 (27% of the first
    loss apart) that had caught up by its sixth."""
    return len(twin_losses) >= min(GUARD_STEPS, fp8_steps)


def same_arithmetic(a: Layout, b: Layout) -> bool:
    """Whether `a` and `b` differ in SAME_ARITHMETIC fields alone."""
    return arithmetic(a) == arithmetic(b)


_NEUTRAL = Layout()
_NEUTRAL_ARITHMETIC = {name: getattr(_NEUTRAL, name) for name in SAME_ARITHMETIC}


def arithmetic(s: Layout) -> Layout:
    """`s` with its SAME_ARITHMETIC fields at Layout's defaults: the layouts that train as `s`
    does share it (same_arithmetic)."""
    return with_fields(s, **_NEUTRAL_ARITHMETIC)


def judged_from(s: Layout) -> int:
    """The fewest steps over which `s`'s losses are judged against the twin's gap (a loss that
    stops being finite is judged at any length): GUARD_STEPS for a recipe that trails
    (LAG_STEPS), whose first steps lag by design, so that a trial the timing stopped early
    (pruned slow after a few steps) is not failed on them; 0 for the others. Session 20's
    search on one H200 failed a delayed-scaling trial at mbs 16 stopped slow after 4 steps, on
    steps 2-4 (2026-11-28-h200-conditional-asks-s20.md)."""
    return GUARD_STEPS if lag_steps(s) else 0


def lag_steps(s: Layout) -> int:
    """Steps `s`'s FP8 loss may trail its twin's (LAG_STEPS by its recipe)."""
    return LAG_STEPS.get(s.fp8_recipe, 0) if guarded(s) else 0


def compare_losses(fp8: Sequence[float | None], bf16: Sequence[float | None],
                   tolerance: float = LOSS_TOLERANCE, *, lag: int = 0,
                   min_steps: int = 0) -> LossVerdict | None:
    """The verdict on an FP8 series against its twin's over their common prefix: every FP8 step
    finite, and the last WINDOW steps' mean within `tolerance` of the twin's first loss, at the
    same steps or at the twin's steps up to `lag` earlier (the closest counts); None when there
    is nothing to judge (fewer than MIN_STEPS steps with a finite twin), or when every step is
    finite and there are fewer than `min_steps` (judged_from: a window that would lie on a
    recipe's first, lagging steps)."""
    if not tolerance > 0:  # NaN too
        raise ValueError(f"tolerance must be positive, got {tolerance}")
    pairs = list(zip(fp8, bf16, strict=False))
    # The twin's own non-finite steps say nothing about FP8: stop comparing there.
    first_bad = next((i for i, (_, b) in enumerate(pairs) if not _finite(b)), len(pairs))
    pairs = pairs[:first_bad]
    if len(pairs) < max(MIN_STEPS, WINDOW):
        return None
    scale = abs(pairs[0][1])  # type: ignore[arg-type]
    for i, (a, b) in enumerate(pairs):
        if not _finite(a):
            assert b is not None
            return LossVerdict(diverged=True, steps=len(pairs), worst_step=i + 1, fp8=None,
                               bf16=b, distance=math.inf, tolerance=tolerance)
    if len(pairs) < min_steps:
        return None
    a = sum(x for x, _ in pairs[-WINDOW:]) / WINDOW  # type: ignore[misc]
    best: tuple[float, float, int] | None = None
    for shift in range(min(lag, len(pairs) - WINDOW) + 1):
        window = pairs[len(pairs) - WINDOW - shift:len(pairs) - shift]
        b = sum(y for _, y in window) / WINDOW  # type: ignore[misc]
        distance = abs(a - b) / scale if scale > 0 else (0.0 if a == b else math.inf)
        if best is None or distance < best[0]:
            best = (distance, b, shift)
    assert best is not None
    distance, b, shift = best
    return LossVerdict(diverged=distance > tolerance, steps=len(pairs), worst_step=len(pairs),
                       fp8=a, bf16=b, distance=distance, tolerance=tolerance, lag=shift)


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
