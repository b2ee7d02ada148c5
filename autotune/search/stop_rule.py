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

Neither rule crosses a lever whose time the model leaves out (autotune.levers.unpriced: the NaN
checks, 2-27% of a step on 2 x H200, 2026-11-29-h200x2-nan-checks-s27.md): a layout priced
exactly as a measured one that differs there is no echo of it, nor its near variant.

A measured layout also vouches for its near variants (`nearby`): where an untried layout's time
terms differ from a measured one's by a small part of its step (one flag flipped, a recipe, a
few recomputed layers), its figure is the measured one moved by the model's difference, and
the model may misjudge that difference by CHANGE_ERROR times the terms it moves, plus what the
study's own pairs of near measured layouts show it leaves out (`unpriced`); the lowest such
bound over the measured layouts within reach counts, and nothing is ruled out so before the
study has measured one near pair. A variant that could then beat the best by no more than the
best's own noise is not launched: one global band would launch every variant predicted within
it, and a layout's error shared with its neighbour is not an error in the difference. On 4 x
H200 the variants of the leader were 19 of 23 launches in a replay; with this rule a replay of
that search launched 10, finalists included, against 20 (2026-11-28-h200-near-rule-s18.md, which
also shows its cost where the model errs at random from one layout to the next).

Nothing is ruled out before there is a best measurement (Alpa's seeds run first), in a plan
(the model is the measurement there), with --sampler grid (it measures every layout), nor with
--stop-rule none.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from autotune.layouts.layout import Layout
from autotune.levers import unpriced
from autotune.search.records import TrialRecord

__all__ = ["CHANGE_ERROR", "DEFAULT_ERROR_BAND", "ERROR_WINDOW", "LOCAL_REACH", "MIN_ERROR_BAND",
           "NOISE_MARGIN", "PRUNE_MARGIN", "ErrorBand", "ModelStop", "Neighbourhood",
           "error_band", "format_tokens", "prune_margin"]

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


LOCAL_REACH = 0.10
"""A measured layout vouches for an untried one whose time terms differ from its own by at most
this part of its predicted step (the L1 distance of CostEstimate.terms, the step left out): a
flag, a recipe, a few recomputed layers. Further apart the two share too little, and the global
band alone rules."""
CHANGE_ERROR = 2.0
"""How wrong the model may be about the difference between two near layouts, as a multiple of
the time terms that differ (their L1 distance), sign included, until the study's own pairs show
more beyond it (`Neighbourhood.unpriced`). Why twice: on gpt2-xl at mbs 8 on an H100 the model of
session 11 put tensorwise scaling 0.28 s behind delayed scaling and it measured 0.26 s ahead, an
error of at most 1.9 times what moved (results/benchmarks/2026-11-27-cpu-fp8-cost.md)."""


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


def _distance(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    """The L1 distance of two layouts' time terms, the step time (the last term) left out: the
    seconds the model moves between them, whatever their sum does."""
    return sum(abs(x - y) for x, y in zip(a[:-1], b[:-1], strict=True))


_UNPRICED = unpriced()


def _unpriced_values(s: Layout) -> tuple[object, ...]:
    """`s`'s values of the fields whose time the model leaves out: a measured layout stands
    for another (echo, near variant) only where these agree."""
    return tuple(getattr(s, name) for name in _UNPRICED)


@dataclass(frozen=True, slots=True)
class _Known:
    record: TrialRecord
    tokens: float
    """Its measured tokens/s."""
    terms: tuple[float, ...]
    measured_s: float
    """The measured step time, in the model's seconds: its predicted step x predicted /
    measured tokens/s (the tokens of a step are the study's)."""


class Neighbourhood:
    """What the measured trials say of the layouts near them (see the module), for one state of
    the search: built once per question, as the model and the records change between them."""

    def __init__(self, records: Iterable[TrialRecord], best: TrialRecord,
                 terms: Callable[[Layout], tuple[float, ...]],
                 predict: Callable[[Layout], float]) -> None:
        self.best = best
        self.terms = terms
        self.known: list[_Known] = []
        for r in records:
            tokens = r.tokens_per_s
            if not r.rankable or r.predicted or not tokens:
                continue
            t, p = terms(r.layout), predict(r.layout)
            if p > 0 and t[-1] > 0:
                self.known.append(_Known(r, tokens, t, t[-1] * p / tokens))
        self.unpriced = self._unpriced()

    def _unpriced(self) -> float | None:
        """What the model leaves out of a difference: the largest miss on the difference of two
        measured layouts within reach of each other (echoes included) beyond CHANGE_ERROR times
        the terms that moved, as a part of their step, each measurement's own noise taken off (a
        pair whose difference is noise tells nothing of the model). On 4 x H200 dp 4 and dp 2 +
        cp 2, priced alike, measured 3.7% apart: the ring's cost is not in the terms. None
        before the study has measured such a pair: the model's differences are trusted once the
        study has checked one, not on its word."""
        worst: float | None = None
        for a, b in itertools.combinations(self.known, 2):
            d = _distance(a.terms, b.terms)
            step = min(a.terms[-1], b.terms[-1])
            if d > LOCAL_REACH * step:
                continue
            miss = abs((a.measured_s - b.measured_s) - (a.terms[-1] - b.terms[-1]))
            miss -= a.record.noise * a.measured_s + b.record.noise * b.measured_s
            worst = max(worst or 0.0, (miss - CHANGE_ERROR * d) / step)
        return worst

    def fastest(self, s: Layout) -> tuple[float, _Known, float] | None:
        """The most `s` could measure by the near rule, with the measured layout that says so
        and the part of that one's step their terms differ by: the lowest bound over every
        measured layout within reach (each is one under the rule's error model; the one nearest
        in the model's terms is not always nearest in truth: a lever the model prices at almost
        nothing may cost 9%). None: no measured layout within reach, or no near pair measured."""
        if self.unpriced is None:
            return None
        t = self.terms(s)
        found: tuple[float, _Known, float] | None = None
        unpriced_s = _unpriced_values(s)
        for k in self.known:
            d = _distance(t, k.terms)
            if (k.record.layout == s or d > LOCAL_REACH * k.terms[-1]
                    or _unpriced_values(k.record.layout) != unpriced_s):
                continue
            fastest_s = (k.measured_s + (t[-1] - k.terms[-1]) - CHANGE_ERROR * d
                         - self.unpriced * k.measured_s)
            if fastest_s <= 0:
                continue
            bound = k.tokens * k.measured_s / fastest_s
            if found is None or bound < found[0]:
                found = (bound, k, d / k.terms[-1])
        return found

    def verdict(self, s: Layout) -> str | None:
        """Why `s` cannot beat the best by more than its noise (None: it could, or no measured
        layout is near enough to say)."""
        found = self.fastest(s)
        best = self.best.tokens_per_s
        if found is None or best is None:
            return None
        fastest, near, part = found
        if fastest > best * (1 + self.best.noise):
            return None
        return (f"a near variant of trial {near.record.number} ({near.record.label}): its time "
                f"terms differ by {part:.1%} of that step, so at most "
                f"{format_tokens(fastest)} tokens/s even if the model misjudged the difference "
                f"by {CHANGE_ERROR:g} times what moved and {self.unpriced:.1%} of the step (the "
                f"most its measured pairs show); the best measured is "
                f"{format_tokens(best)} (trial {self.best.number}), and a trial could tell "
                f"only measurement noise apart")


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

    def measured_terms(self) -> dict[tuple[object, ...], TrialRecord]:
        """The trials measured to their end, by the model's terms and their unpriced fields'
        values (the first of equals); none while the rule is off."""
        if self.terms is None or not self.active:
            return {}
        found: dict[tuple[object, ...], TrialRecord] = {}
        for r in self.records:
            if r.rankable and not r.predicted:
                found.setdefault((*self.terms(r.layout), *_unpriced_values(r.layout)), r)
        return found

    def echo(self, s: Layout, measured: dict[tuple[object, ...], TrialRecord] | None = None
             ) -> TrialRecord | None:
        """The measured trial that the model prices exactly as `s`, term by term, and that
        agrees with it in the fields whose time the model leaves out, if any (see the module);
        `measured`: measured_terms(), when the caller asks for many."""
        measured = self.measured_terms() if measured is None else measured
        if not measured or self.terms is None:
            return None
        found = measured.get((*self.terms(s), *_unpriced_values(s)))
        return found if found is not None and found.layout != s else None

    def nearby(self) -> Neighbourhood | None:
        """What the measured trials say of their near variants now (None while the rule is
        off, without the model's terms, or before a best)."""
        if not self.active or self.terms is None:
            return None
        best = self.best()
        return None if best is None else Neighbourhood(self.records, best, self.terms,
                                                       self.predict)

    def closest_untried(self) -> tuple[tuple[Layout, float] | None, bool]:
        """The model's fastest untried layout (with its prediction) that echoes no measured
        one and is no near variant that cannot win (`nearby`), None when there is none; and
        whether such layouts were passed over to find it. The stop rule waits for it, and the
        search queues it when proposals launch nothing."""
        measured = self.measured_terms()
        nearby = self.nearby()
        passed = False
        for s, predicted in self.ranked():
            if self.tried(s):
                continue
            if self.echo(s, measured) is None and (nearby is None
                                                  or nearby.verdict(s) is None):
                return (s, predicted), passed
            passed = True
        return None, passed

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
        nearby = self.nearby()
        near = nearby.verdict(s) if nearby is not None else None
        if near is not None:
            return near
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
        closest, passed = self.closest_untried()
        if closest is None:
            return ("every layout predicted to fit has been tried" if not passed else
                    "every layout predicted to fit has been tried, is priced exactly as a "
                    "measured one or is a near variant of one that cannot win")
        band = self.band()
        s, predicted = closest
        if band.optimistic(predicted) >= best.tokens_per_s:
            return None
        return (f"no untried layout is predicted within {band.band:.0%} of the best "
                f"({format_tokens(best.tokens_per_s)} tokens/s, trial {best.number}; the "
                f"closest, {s.describe()}, is predicted {format_tokens(predicted)}); "
                f"{band.describe()}")
