"""Finalists measured again before a search stops, and how sure the ranking then is.

One short measurement of a host-bound layout is a coin toss: issue 25 saw one micro-batch-8
layout move by 23% between two cold runs on one H100. So before a search stops (for any reason
but Ctrl-C or a spent --time-budget) its best FINALISTS layouts are measured again until each
has RUNS runs, in a fresh order each round (the last first, so that no layout is always measured
right after itself) and the leader's last repeat in a fresh process, the last run of all
(`fresh`: the pool's warmth is part of nothing a user runs; the process was started with the
search and waits with its imports made, autotune.trials.standby). The search then decides on
the repeated figures (SearchResult.figure: the mean of the runs not measured while the GPU
throttled), and `ranking_line` says how sure that is: "A beats B by 3.1% ± 0.4% over 3 runs
each".

The repeats stop early once the call is settled (`settled`): when, after each finalist's second
run, the leader is ahead by more than NOISE_MARGIN times the error of the gap, a third round
cannot reverse it and is not run; the leader's fresh run still is. GPU-bound finalists are
usually settled after one round (an H100 search of a 3B model at seq 8192 had its two 5.3%
apart, each repeating within 0.8%: results/benchmarks/2026-11-27-h100-session11.md), host-bound
ones, which move between runs, get their three.

A warm repeat is not skipped because its layout's runs already agree more closely than
RUN_SPREAD_FLOOR: the floor is there because two runs that agree say little about a third.
Nor because on its own it could not reverse the order: the leader's fresh run is still to come,
and the two together can. Session 11's xl-32k search (one H100) had its finalists 1.7% apart
after a round (9,620 against 9,459 tokens/s), under the 3.5% that settles; the runner-up's third
run two floors high (+3.4%) and the leader's fresh run two floors low put the runner-up ahead
(9,566 against 9,511), so its third run was rightly measured. What shortens the finalists of
long steps is the timing's early window (autotune.worker.timing), not fewer runs.

Each repeat is a trial of its own in the study (TrialRecord.repeat_of, Source.FINALIST), so
records keep every run and a resumed search runs only the repeats still missing (`plan`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.search.records import Figure, SearchResult, TrialRecord
from autotune.search.stop_rule import NOISE_MARGIN

__all__ = ["FINALISTS", "RUNS", "RUN_SPREAD_FLOOR", "Repeat", "plan", "ranking_line", "settled"]

FINALISTS = 2
"""Layouts measured again: the best and the one behind it, the close call that crowns a layout.
Three cost an H100 search of gpt2-xl 247 s against 96-151 s before (6 repeats and two pool
restarts; results/benchmarks/2026-11-25-h100-measurements.md)."""
RUNS = 3
"""Runs per finalist, the first measurement included: with three, one outlier shows."""
RUN_SPREAD_FLOOR = 0.017
"""The least relative spread between runs of one layout that a figure's error assumes: two runs
that happen to agree closely say little about a third. The widest spread seen between the three
runs of a GPU-bound finalist on one H100 (gpt2-xl mbs 16: 1.7%, the third after a pool restart,
results/benchmarks/2026-11-25-h100-measurements.md); the runs of this session's finalists
spread by 0.1-0.8% (2026-11-27-h100-session11.md), so the floor errs towards a third round."""


@dataclass(frozen=True, slots=True)
class Repeat:
    """One repeat to run: the finalist it measures again, and whether in a fresh process."""

    of: TrialRecord
    fresh: bool


def plan(result: SearchResult, *, finalists: int = FINALISTS, runs: int = RUNS) -> list[Repeat]:
    """The repeats still missing, in the order to run them (the module). A finalist's repeats
    already in the study (a resume) count, a fresh run of the leader too."""
    top = result.best(finalists)
    if not top or runs < 2:
        return []
    missing = {r.number: runs - 1 - len(_launched(result.repeats(r))) for r in top}
    leader = top[0]
    fresh_done = any(m is not None and m.warm is False
                     for m in (r.metrics for r in [leader, *result.repeats(leader)]))
    order: list[Repeat] = []
    backwards = list(reversed(top))
    for k in range(max(missing.values(), default=0)):
        # Round k starts k places further along: the last first in round 0, then rotated.
        shift = k % len(backwards)
        for r in backwards[shift:] + backwards[:shift]:
            if missing[r.number] > k:
                order.append(Repeat(r, False))
    # The leader's fresh process is its last repeat and the last of all: a fresh run stops the
    # warm pool, and any warm repeat after it, the leader's or another finalist's, would start
    # the pool again (28 s each time on an H100; 29 s on an H200 for gpt2-xl at seq 32k).
    last = next((i for i in range(len(order) - 1, -1, -1) if order[i].of is leader), None)
    if last is not None and not fresh_done:
        del order[last]
        order.append(Repeat(leader, True))
    return order


def _launched(records: list[TrialRecord]) -> list[TrialRecord]:
    """Repeats that ran (an interrupted repeat runs again on --resume)."""
    return [r for r in records if r.launched]


@dataclass(frozen=True, slots=True)
class _Gap:
    """The leader's lead over the runner-up on their repeated figures."""

    top: tuple[TrialRecord, TrialRecord]
    figures: tuple[Figure, Figure]
    gap: float
    error: float

    @property
    def decided(self) -> bool:
        """The gap is NOISE_MARGIN times its error: a measurement is trusted that far (the stop
        rule's margin too)."""
        return self.gap >= NOISE_MARGIN * self.error


def _floored(figure: Figure) -> float:
    return max(figure.error, RUN_SPREAD_FLOOR / math.sqrt(len(figure.runs)))


def _gap(result: SearchResult) -> _Gap | None:
    top = result.best(2)
    if len(top) < 2:
        return None
    a, b = (result.figure(r) for r in top)
    if a is None or b is None:
        return None
    gap = a.tokens_per_s / b.tokens_per_s - 1
    return _Gap((top[0], top[1]), (a, b), gap, math.hypot(_floored(a), _floored(b)) * (1 + gap))


def settled(result: SearchResult) -> bool:
    """The top two's order can no longer change by more repeats: each has two runs or more and
    the gap is NOISE_MARGIN times its error (each figure's error at least RUN_SPREAD_FLOOR over
    its runs); also when there is no second layout to beat."""
    g = _gap(result)
    if g is None:
        return len(result.best(2)) < 2
    return min(len(f.runs) for f in g.figures) >= 2 and g.decided


def ranking_line(result: SearchResult) -> str | None:
    """How sure the top of the ranking is: `A beats B by 3.1% ± 0.4% over 3 runs each`, with
    `within the noise` when the gap is under twice its error; None with fewer than two
    layouts, or when neither was measured more than once."""
    g = _gap(result)
    if g is None:
        return None
    a, b = g.figures
    if len(a.runs) < 2 and len(b.runs) < 2:
        return None
    top = g.top
    runs = (f"{len(a.runs)} runs each" if len(a.runs) == len(b.runs)
            else f"{len(a.runs)} and {len(b.runs)} runs")
    line = (f"{top[0].label} (#{top[0].number}) beats {top[1].label} (#{top[1].number}) by "
            f"{g.gap:.1%} ± {g.error:.1%} over {runs}")
    if not g.decided:
        line += ": within the noise, either may be the faster"
    throttled = [r for r, f in zip(top, g.figures, strict=True) if f.throttled]
    if throttled:
        line += "; measured while the GPU throttled: " + ", ".join(
            f"#{r.number}" for r in throttled)
    return line
