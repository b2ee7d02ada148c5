"""The model's stop rule: what the cost model and its measured error rule out of a real search.

A layout's optimistic prediction is its predicted tokens/s (the cost model as refitted to the
study's measured trials, autotune.search.refit) times 1 + the error band (`error_band`). A layout
whose optimistic prediction is below the best measured tokens/s cannot be the best unless the
model is wrong by more than it has been: it is recorded PREDICTED_SLOW, not launched (`skip`).
The search stops once no untried layout that the memory gate lets through could beat the best
(`exhausted`). A launched trial stops timing once its first steps show it cannot reach the best
less PRUNE_MARGIN, or less twice the best's own noise where that is wider (`prune_below`,
TrialSpec.slow_below_tokens_per_s). Measurement noise is not model error: each trial's miss
counts in the error band less the trial's own spread (`_miss`).

A layout the model prices exactly as a measured one, term by term (CostEstimate.terms: dp 4
against dp 2 with cp 2 where the ring hides, a flag the model does not price), is expected to
measure what that one measured: a trial of it could only tell measurement noise apart, and
would crown the luckier of two runs. It is not launched either (`echo`), and the search does
not wait for it to stop. On 4 x H200 a replay of a llama3-8b search with its measured figures
launched 37 trials, most of them such echoes of its best, at about 50 s each
(2026-11-28-h200x4-issue30-s16.md).

Nothing is ruled out before there is a best measurement (Alpa's seeds run first), in a plan
(the model is the measurement there), with --sampler grid (it measures every layout), nor with
--stop-rule none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from autotune.layouts.layout import Layout
from autotune.search.records import TrialRecord

__all__ = ["DEFAULT_ERROR_BAND", "ERROR_WINDOW", "MIN_ERROR_BAND", "NOISE_MARGIN",
           "PRUNE_MARGIN", "ErrorBand", "ModelStop", "error_band", "format_tokens", "prune_margin"]

DEFAULT_ERROR_BAND = 0.30
"""The band while the model has not been refitted to this study: the committed constants'
tokens/s error is a few percent in the median on other machines, but single layouts have been
under-predicted by 35% (rc=full(block/2), before the partial-recompute fix) and over-predicted
by 40% (results/benchmarks/2026-11-23-h100-refactor-and-run-identity.md,
2026-11-21-h100-h200x2-model-accuracy.md); 30% keeps every layout within the model's common
misses, and the bias already seen on this machine is added on top (`error_band`)."""
MIN_ERROR_BAND = 0.05
"""The narrowest band: a refitted model can match a few trials almost exactly, but a
measurement itself varies by a few percent between runs of one layout."""
ERROR_WINDOW = 5
"""The refitted model's own predictions of this many latest trials count in its band: recent
enough to follow the refits, enough for one lucky match not to narrow it."""
PRUNE_MARGIN = 0.10
"""A trial stops timing, pruned slow, once it cannot reach the best measured tokens/s less
this margin: its first steps may run slower than its steady state (allocator growth, kernel
autotuning), and the margin keeps that noise from pruning a layout that would have been the
best."""


NOISE_MARGIN = 2.0
"""A measurement is trusted to within this many times its own relative noise (the timed steps'
spread): the prune margin is at least that wide."""


def format_tokens(value: float) -> str:
    """tokens/s as people read them in a reason: 43.7k, 1.25M."""
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    return f"{value / 1e3:.1f}k" if value >= 1e3 else f"{value:.0f}"


def _measured(records: Iterable[TrialRecord]
              ) -> list[tuple[Layout, float, float | None, float]]:
    """(layout, measured tokens/s, the prediction it was launched with, the measurement's own
    relative noise) of each measured trial, in order (a finalist's repeats left out)."""
    return [(r.layout, r.tokens_per_s, r.predicted_tokens_per_s, r.noise) for r in records
            if r.duplicate_of is None and r.repeat_of is None and not r.predicted
            and r.tokens_per_s]


def _miss(measured: float, predicted: float, noise: float) -> float:
    """The model's error on one trial: |measured / predicted - 1| less the measurement's own
    noise, at least 0. A trial whose steps jitter by 4% may be 4% off its layout's true speed
    without the model being wrong (issue 25: one layout moved 23% between two cold runs)."""
    return max(0.0, abs(measured / predicted - 1) - noise)


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorBand:
    """How far a measurement may be above the model's prediction, and what that rests on."""

    band: float
    """Optimistic prediction = predicted tokens/s x (1 + band)."""
    error: float | None
    """The model's largest |measured / predicted - 1| so far, each less its trial's own noise
    (None: nothing measured)."""
    trials: int
    """The measured trials `error` is over."""
    fitted: bool
    """Whether the band is the refitted model's own (else the default band applies)."""

    def optimistic(self, predicted_tokens_per_s: float) -> float:
        return predicted_tokens_per_s * (1 + self.band)

    def describe(self) -> str:
        """`model error so far 12% over 6 measured trials`, with the default band's note."""
        error = "-" if self.error is None else f"{self.error:.0%}"
        plural = "" if self.trials == 1 else "s"
        said = f"model error so far {error} over {self.trials} measured trial{plural}"
        if self.fitted:
            return said
        return (f"{said} (a {DEFAULT_ERROR_BAND:.0%} band until a refitted prediction is "
                "measured)")


def error_band(records: Iterable[TrialRecord], *, predict: Callable[[Layout], float] | None,
               fitted_after: int = 0) -> ErrorBand:
    """The band of the model from the study's measured trials (`records`, in order).

    Refitted (`predict`, the refitted model's tokens/s), once a refitted model has predicted a
    trial before it ran (one measured after the first `fitted_after`; a fit is not trusted on
    the trials it was fitted to alone): its largest miss (`_miss`: |measured / predicted - 1|
    less the trial's own noise) over every measured trial, and over the latest ERROR_WINDOW of
    its own predictions, at least MIN_ERROR_BAND. The unfitted model's errors do not count
    then: the refit took out its bias. Before: (1 + DEFAULT_ERROR_BAND) x the largest measured
    / predicted ratio so far, the measurement's noise taken off (at least 1) - 1, so that a
    model seen to under-predict this machine keeps the default band on top of that bias."""
    measured = _measured(records)
    checked = any(p for _, _, p, _ in measured[fitted_after:])
    if predict is not None and checked:
        errors = [_miss(m, q, n) for s, m, _, n in measured if (q := predict(s)) > 0]
        errors += [_miss(m, p, n) for _, m, p, n in measured[fitted_after:][-ERROR_WINDOW:]
                   if p]
        worst = max(errors)
        return ErrorBand(band=max(MIN_ERROR_BAND, worst), error=worst, trials=len(measured),
                         fitted=True)
    ratios = [m / p for _, m, p, _ in measured if p]
    discounted = [m * (1 - n) / p for _, m, p, n in measured if p]
    return ErrorBand(band=(1 + DEFAULT_ERROR_BAND) * max([1.0, *discounted]) - 1,
                     error=max((_miss(m, p, n) for _, m, p, n in measured if p), default=None),
                     trials=len(ratios), fitted=False)


def prune_margin(best: TrialRecord) -> float:
    """How far below the best a trial may measure before it is pruned slow: PRUNE_MARGIN, or
    NOISE_MARGIN times the best's own noise where that is wider (a best measured with 6% jitter
    may stand 6% too high, and the layout that would beat it must not be pruned for that)."""
    return max(PRUNE_MARGIN, NOISE_MARGIN * best.noise)


class ModelStop:
    """The rule of one search (see the module): `active` only for real runs that asked for it
    and do not measure every layout; it reads the search's knowledge through callables."""

    def __init__(self, *, active: bool, records: Sequence[TrialRecord],
                 fitted: Callable[[], bool], predict: Callable[[Layout], float],
                 ranked: Callable[[], list[tuple[Layout, float]]],
                 tried: Callable[[Layout], bool], refit_after: int = 0,
                 terms: Callable[[Layout], tuple[float, ...]] | None = None) -> None:
        """`records`: the search's records, growing as it goes; `fitted`: whether the model has
        been refitted (after `refit_after` measured trials); `predict`: its tokens/s of a
        layout; `ranked`: the valid layouts predicted to fit with their predicted tokens/s,
        fastest first; `tried`: whether a layout has an outcome already; `terms`: the model's
        time terms of a layout (CostEstimate.terms; None: no layout echoes another)."""
        self.active = active
        self.records = records
        self.fitted = fitted
        self.predict = predict
        self.ranked = ranked
        self.tried = tried
        self.refit_after = refit_after
        self.terms = terms

    def best(self) -> TrialRecord | None:
        """The best measured trial (never one pruned slow), None before there is one."""
        ok = [r for r in self.records if r.rankable]
        return max(ok, key=lambda r: r.tokens_per_s or 0.0, default=None)

    def band(self) -> ErrorBand:
        return error_band(self.records, predict=self.predict if self.fitted() else None,
                          fitted_after=self.refit_after)

    def measured_terms(self) -> dict[tuple[float, ...], TrialRecord]:
        """The trials measured to their end, by the model's terms (the first of equals); none
        while the rule is off."""
        if self.terms is None or not self.active:
            return {}
        found: dict[tuple[float, ...], TrialRecord] = {}
        for r in self.records:
            if r.rankable and not r.predicted:
                found.setdefault(self.terms(r.layout), r)
        return found

    def echo(self, s: Layout, measured: dict[tuple[float, ...], TrialRecord] | None = None
             ) -> TrialRecord | None:
        """The measured trial that the model prices exactly as `s`, term by term, if any
        (see the module); `measured`: measured_terms(), when the caller asks for many."""
        measured = self.measured_terms() if measured is None else measured
        if not measured or self.terms is None:
            return None
        found = measured.get(self.terms(s))
        return found if found is not None and found.layout != s else None

    def closest_untried(self) -> tuple[tuple[Layout, float] | None, bool]:
        """The model's fastest untried layout (with its prediction) that echoes no measured
        one, None when there is none; and whether echoes were passed over to find it. The
        stop rule waits for it, and the search queues it when proposals launch nothing."""
        measured = self.measured_terms()
        echoes = False
        for s, predicted in self.ranked():
            if self.tried(s):
                continue
            if self.echo(s, measured) is None:
                return (s, predicted), echoes
            echoes = True
        return None, echoes

    def skip(self, s: Layout, predicted_tokens_per_s: float) -> str | None:
        """Why `s` is not worth launching (its PREDICTED_SLOW reason), or None."""
        best = self.best() if self.active else None
        if best is None or best.tokens_per_s is None:
            return None
        echo = self.echo(s)
        if echo is not None and echo.tokens_per_s is not None:
            return (f"priced exactly as trial {echo.number} ({echo.label}), term by term: "
                    f"expected at its measured {format_tokens(echo.tokens_per_s)} tokens/s; a "
                    f"trial could tell only measurement noise apart")
        band = self.band()
        optimistic = band.optimistic(predicted_tokens_per_s)
        if optimistic >= best.tokens_per_s:
            return None
        return (f"predicted {format_tokens(predicted_tokens_per_s)} tokens/s, at most "
                f"{format_tokens(optimistic)} with the model's {band.band:.0%} error band, "
                f"below the best measured {format_tokens(best.tokens_per_s)} (trial "
                f"{best.number}); {band.describe()}")

    def prune_below(self) -> float | None:
        """TrialSpec.slow_below_tokens_per_s for the next launch: the best less the prune
        margin (`prune_margin`)."""
        best = self.best() if self.active else None
        if best is None or best.tokens_per_s is None:
            return None
        return best.tokens_per_s * (1 - prune_margin(best))

    def exhausted(self) -> str | None:
        """The stop reason once no untried layout the gate lets through could beat the best
        measured (none while one could, or while the rule is off or has no best)."""
        best = self.best() if self.active else None
        if best is None or best.tokens_per_s is None:
            return None
        closest, echoes = self.closest_untried()
        if closest is None:
            return ("every layout predicted to fit has been tried" if not echoes else
                    "every layout predicted to fit has been tried or is priced exactly as a "
                    "measured one")
        band = self.band()
        s, predicted = closest
        if band.optimistic(predicted) >= best.tokens_per_s:
            return None
        return (f"no untried layout is predicted within {band.band:.0%} of the best "
                f"({format_tokens(best.tokens_per_s)} tokens/s, trial {best.number}; the "
                f"closest, {s.describe()}, is predicted {format_tokens(predicted)}); "
                f"{band.describe()}")
