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
- before a full window has run, a shorter one may end timing when it is long in time and its
  evidence is strong (`early_window`): the fewest last steps, at least MIN_WINDOW, that span
  EARLY_WINDOW_S, whose relative standard error is at most `stable_cv` even at the upper
  CONFIDENCE bound of their spread (a chi-square bound; at stable_cv 1%, three steps must
  agree within 0.32%, four within 0.59%, where the full window's estimate alone lets five stop
  at 2.2%), and that do not drift. Steps of seconds, which each average the host's jitter
  over thousands of kernels, stop after three; short or jittery steps never pass it and keep
  the full window;
- timing is never called stable before `min_steps` steps (TrialSpec.min_steps: the FP8 loss
  guard reads a series that must reach past delayed scaling's first steps);
- a trial is stopped SLOW once SLOW_AFTER steps after the first show that even its fastest step
  is slower than `slow_below_tokens_per_s` allows;
- at most `warmup_steps + train_steps` steps run; then the last `train_steps` are timed.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, field

from autotune.trials.trial import StopReason, TrialSpec

__all__ = ["CONFIDENCE", "EARLY_WINDOW_S", "MIN_WINDOW", "SLOW_AFTER", "STABLE_WINDOW", "TREND_T",
           "StepJudge", "Timing", "chi2_quantile", "drifting", "early_window"]

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

MIN_WINDOW = 3
"""The fewest timed steps an early window holds: with two, no trend can be judged (a line fits
two points exactly), and the median of two is moved by either."""
EARLY_WINDOW_S = 5.0
"""The least time an early window's steps span. Short steps repeat the host's own rhythms
(Python, the launch queue, clocks settling after warm-up) that several consecutive steps can
share: on 4 x H200 a 0.55 s step held three steps within 0.2% before falling 8% for good
(results/benchmarks/2026-11-27-h200x4-lanes, xl4-default trial 109), which three steps alone
would have taken as the figure; five seconds is three times that plateau, so under it a window
keeps its STABLE_WINDOW steps. A step of seconds averages such rhythms within itself (the same
lanes' 2.8-3.8 s steps spread by 0.05-0.26% over five steps); from 1.7 s three steps span it,
from 1.25 s four."""
CONFIDENCE = 0.95
"""How sure an early window must be that its relative standard error is within stable_cv: its
spread's one-sided upper confidence bound (chi-square, the steps taken as independent and
normal) is what is compared. A layout whose true standard error is stable_cv then stops early
in 5% of the tests, a noisier one in fewer (steps jittering by 3%: 1.7% at three steps), where
the full window's point estimate stops a layout at its own threshold in 71% (chi-square, 4
degrees of freedom, below 5)."""


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
    min_steps: int = 0
    """The fewest steps, warm-up included, before the step time may be called stable
    (TrialSpec.min_steps); a slow trial still stops at its own count."""
    times: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.train_steps < 1 or self.warmup_steps < 0 or self.min_steps < 0:
            raise ValueError(f"need train_steps >= 1, warmup_steps >= 0 and min_steps >= 0, "
                             f"got {self.train_steps}, {self.warmup_steps} and {self.min_steps}")

    @classmethod
    def for_spec(cls, spec: TrialSpec) -> StepJudge:
        slow = spec.slow_below_tokens_per_s
        tokens = spec.layout.gbs * spec.model.seq_length
        return cls(warmup_steps=spec.warmup_steps, train_steps=spec.train_steps,
                   stable_cv=spec.stable_cv, min_steps=spec.min_steps,
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
        if self.stable_cv > 0 and n >= self.min_steps:
            if len(after_first) >= window:
                if _cv(last) / math.sqrt(window) <= self.stable_cv \
                        and not drifting(last, self.stable_cv):
                    return self._split(window, StopReason.STABLE)
            else:
                # Fewer steps than a window so far: a shorter one may answer (tested at most
                # window - MIN_WINDOW times a trial), never once a full window could: a start
                # that did not settle at once is judged by the full window's rule alone.
                early = early_window(after_first, self.stable_cv)
                if early:
                    return self._split(early, StopReason.STABLE)
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


def early_window(times: list[float], stable_cv: float) -> int:
    """How many of the last `times` end timing early (0: none): the fewest last steps, at least
    MIN_WINDOW, that span EARLY_WINDOW_S, when their relative standard error is within
    `stable_cv` at the upper CONFIDENCE bound of their spread and they do not drift."""
    if stable_cv <= 0:
        return 0
    for k in range(MIN_WINDOW, len(times) + 1):
        last = times[-k:]
        if sum(last) < EARLY_WINDOW_S:
            continue
        # (k-1) s^2 / sigma^2 is chi-square with k-1 degrees of freedom: sigma's upper bound is
        # s sqrt((k-1) / q), q the lower (1 - CONFIDENCE) quantile; with the population
        # deviation (k-1) s^2 = k pstdev^2, so the bound on the standard error sigma / sqrt(k)
        # is pstdev / sqrt(q).
        upper = _cv(last) / math.sqrt(chi2_quantile(1 - CONFIDENCE, k - 1))
        return k if upper <= stable_cv and not drifting(last, stable_cv) else 0
    return 0


@functools.cache  # asked between steps, with the same few arguments every time
def chi2_quantile(p: float, dof: int) -> float:
    """The x with P(X <= x) = p for X chi-square with `dof` degrees of freedom (bisection on the
    regularized lower incomplete gamma function, by its power series: Abramowitz & Stegun
    6.5.29)."""
    if not 0 < p < 1 or dof < 1:
        raise ValueError(f"need 0 < p < 1 and dof >= 1, got {p} and {dof}")
    low, high = 0.0, float(dof)
    while _chi2_cdf(high, dof) < p:
        high *= 2
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if _chi2_cdf(mid, dof) < p else (low, mid)
    return (low + high) / 2


def _chi2_cdf(x: float, dof: int) -> float:
    a, z = dof / 2, x / 2
    if z <= 0:
        return 0.0
    term = total = 1 / a
    n = 0
    while term > total * 1e-16:
        n += 1
        term *= z / (a + n)
        total += term
    return min(1.0, total * math.exp(a * math.log(z) - z - math.lgamma(a)))


def _cv(values: list[float]) -> float:
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean > 0 else float("inf")
