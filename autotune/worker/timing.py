"""When a trial's steps have answered: the end of warm-up, stable timing, an early slow stop.

Pure (no torch): the worker feeds it each step's time (the max over ranks, so every rank sees
the same times and takes the same decision) and runs steps until it says stop.

With `TrialSpec.stable_cv` 0 and no slow threshold the counts are fixed, as Megatron-LM's
benchmarks take them: `warmup_steps` untimed, then `train_steps` timed. Otherwise:
- the first step is always warm-up (torch.compile, the allocator's first growth, NCCL
  communicators made on their first collective);
- timing ends as soon as the mean of the last STABLE_WINDOW steps is known to within
  `stable_cv`: their relative standard error (coefficient of variation / sqrt(STABLE_WINDOW)) is
  at most that, and they do not drift (`drifting`: a least-squares line through the window
  changes by more than `stable_cv` over it, and its slope is more than TREND_T standard errors
  from flat, so noise alone does not count as a trend). A steady layout stops after the window;
  a noisy one (steps that jitter by several percent, seen on H100s at small micro-batches) runs
  to the most steps, where the median of more steps is what makes its figure good. Every step
  before the window is warm-up, so warm-up ends when the step time stops falling, and a window
  still falling (or rising: clocks coming down under sustained load) is not steady;
- a trial is stopped SLOW once SLOW_AFTER steps after the first show that even its fastest step
  is slower than `slow_below_tokens_per_s` allows;
- at most `warmup_steps + train_steps` steps run; then the last `train_steps` are timed.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from autotune.trials.trial import StopReason, TrialSpec

__all__ = ["SLOW_AFTER", "STABLE_WINDOW", "TREND_T", "StepJudge", "Timing", "drifting"]

STABLE_WINDOW = 5
"""Timed steps that must agree (coefficient of variation <= stable_cv) before timing ends: few
enough to stop early, enough for a median that one outlier does not move."""
SLOW_AFTER = 3
"""Steps after the first before a trial may be stopped slow: one more step may still be warming
up (a pipeline's first full 1F1B, a communicator made late), and the slow test reads the
fastest of them, so it errs toward running on."""

TREND_T = 2.0
"""A window's slope counts as a trend when it is this many standard errors from zero. With 3
degrees of freedom (a window of 5) noise alone passes it in about 14% of steady windows; such a
window then times one step more, which costs less than stopping on a drift."""


@dataclass(frozen=True, slots=True)
class Timing:
    """A finished trial's steps, split."""

    warmup_s: tuple[float, ...]
    timed_s: tuple[float, ...]
    reason: StopReason


@dataclass(slots=True)
class StepJudge:
    """Decides, step by step, whether a trial has answered (the module's rules)."""

    warmup_steps: int
    train_steps: int
    stable_cv: float = 0.0
    slow_step_s: float | None = None
    """A step slower than this (at best) proves the trial slow; None: never stopped slow."""
    times: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.train_steps < 1 or self.warmup_steps < 0:
            raise ValueError(f"need train_steps >= 1 and warmup_steps >= 0, got "
                             f"{self.train_steps} and {self.warmup_steps}")

    @classmethod
    def for_spec(cls, spec: TrialSpec) -> StepJudge:
        slow = spec.slow_below_tokens_per_s
        tokens = spec.layout.gbs * spec.model.seq_length
        return cls(warmup_steps=spec.warmup_steps, train_steps=spec.train_steps,
                   stable_cv=spec.stable_cv,
                   slow_step_s=tokens / slow if slow is not None and slow > 0 else None)

    @property
    def adaptive(self) -> bool:
        return self.stable_cv > 0 or self.slow_step_s is not None

    @property
    def most_steps(self) -> int:
        return self.warmup_steps + self.train_steps

    def phase(self) -> str:
        """What the next step is, as far as is known: warmup or timed."""
        if self.adaptive:
            return "warmup" if not self.times else "timed"
        return "warmup" if len(self.times) < self.warmup_steps else "timed"

    def add(self, step_s: float) -> Timing | None:
        """Take one step's time; the split once the trial has answered, else None."""
        self.times.append(step_s)
        n = len(self.times)
        if not self.adaptive:
            if n < self.most_steps:
                return None
            return self._split(self.train_steps, StopReason.FIXED)
        after_first = self.times[1:]
        if self.slow_step_s is not None and len(after_first) >= SLOW_AFTER \
                and min(after_first) > self.slow_step_s:
            return self._split(len(after_first), StopReason.SLOW)
        window = min(STABLE_WINDOW, self.train_steps)
        last = self.times[-window:]
        if self.stable_cv > 0 and len(after_first) >= window \
                and _cv(last) / math.sqrt(window) <= self.stable_cv \
                and not drifting(last, self.stable_cv):
            return self._split(window, StopReason.STABLE)
        if n >= max(self.most_steps, 2):
            return self._split(min(self.train_steps, n - 1), StopReason.MAX_STEPS)
        return None

    def _split(self, timed: int, reason: StopReason) -> Timing:
        cut = len(self.times) - timed
        return Timing(warmup_s=tuple(self.times[:cut]), timed_s=tuple(self.times[cut:]),
                      reason=reason)


def drifting(values: list[float], tolerance: float) -> bool:
    """Whether step times still trend: the least-squares line through them changes by more than
    `tolerance` (a fraction of their mean) from the first to the last, and its slope is more
    than TREND_T standard errors from zero (a trend, not noise)."""
    n = len(values)
    if n < 3:
        return False
    mean = statistics.fmean(values)
    xs = range(n)
    x_mean = (n - 1) / 2
    sxx = sum((x - x_mean) ** 2 for x in xs)
    slope = sum((x - x_mean) * (y - mean) for x, y in zip(xs, values, strict=True)) / sxx
    if mean <= 0 or abs(slope) * (n - 1) / mean <= tolerance:
        return False
    residual = sum((y - mean - slope * (x - x_mean)) ** 2
                   for x, y in zip(xs, values, strict=True))
    se = math.sqrt(residual / (n - 2) / sxx)
    return se == 0 or abs(slope) / se > TREND_T


def _cv(values: list[float]) -> float:
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean > 0 else float("inf")
