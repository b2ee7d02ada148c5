"""What a study's trials were, every one counted once: the search's summary line and its JSON.

"2802 trials simulated, 2889 in the study" left the other 87 unexplained. Each record falls in
exactly one bucket: ranked (a figure that may be the best), launched but left unranked (why:
OOM, TIMEOUT, pruned slow, ...), never launched (predicted out of memory, predicted slow,
invalid, interrupted, ...), a repeat of an earlier trial's run, or a finalist measured again
(autotune.search.finalists: its run joins the finalist's figure); the buckets add up to the
study.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from autotune.search.records import TrialRecord
from autotune.trials.trial import TrialStatus

__all__ = ["StudyCounts", "count_trials"]

_NOT_RUN_WORDS = {TrialStatus.PREDICTED_OOM: "predicted out of memory",
                  TrialStatus.PREDICTED_SLOW: "predicted slow",
                  TrialStatus.INVALID: "invalid",
                  TrialStatus.INTERRUPTED: "interrupted",
                  TrialStatus.DUPLICATE: "running in another searcher"}
"""How the summary names the statuses of trials that were never launched (or simulated)."""
PRUNED_SLOW = "pruned slow"


def _key(words: str) -> str:
    return words.replace(" ", "_").lower()


@dataclass(frozen=True, slots=True)
class StudyCounts:
    """The study's trials by what became of them (see the module)."""

    in_study: int
    ran: int
    """Launched (or simulated) by this run."""
    read: int
    """Launched (or simulated) before, read back from the stored study."""
    ranked: int
    unranked: dict[str, int] = field(default_factory=dict)
    """Launched without a figure that may be the best, by why (OOM, TIMEOUT, pruned slow)."""
    not_run: dict[str, int] = field(default_factory=dict)
    """Never launched, by why (predicted out of memory, predicted slow, invalid, ...)."""
    repeats: int = 0
    """The same run as an earlier trial, its outcome repeated."""
    remeasured: int = 0
    """Finalists' runs measured again (TrialRecord.repeat_of): launched, ranked with the
    finalist's figure, never alone."""

    def breakdown(self, verb: str) -> str:
        """`2802 ranked, 87 predicted out of memory (not simulated)`: every trial once."""
        parts = [f"{self.ranked} ranked"]
        if self.unranked:
            parts.append(_joined(self.unranked) + " left unranked")
        if self.not_run:
            parts.append(_joined(self.not_run) + f" (not {verb})")
        if self.repeats:
            parts.append(f"{self.repeats} repeating an earlier trial's run")
        if self.remeasured:
            parts.append(f"{self.remeasured} measuring a finalist again")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"in_study": self.in_study, "ran": self.ran, "read": self.read,
                "ranked": self.ranked,
                "unranked": {_key(k): n for k, n in self.unranked.items()},
                "not_run": {_key(k): n for k, n in self.not_run.items()},
                "repeats": self.repeats, "remeasured": self.remeasured}


def _joined(counts: dict[str, int]) -> str:
    items = [f"{n} {what}" for what, n in counts.items()]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _why_unranked(r: TrialRecord) -> str:
    return PRUNED_SLOW if r.pruned_slow else r.status.value


def count_trials(records: Iterable[TrialRecord], stored: Collection[int]) -> StudyCounts:
    """The buckets of `records`; `stored`: the numbers of trials finished before this run."""
    every = list(records)
    repeats = [r for r in every if r.duplicate_of is not None]
    launched = [r for r in every if r.launched]
    remeasured = [r for r in launched if r.repeat_of is not None]
    unranked = Counter(_why_unranked(r) for r in launched
                       if not r.rankable and r.repeat_of is None)
    not_run = Counter(_NOT_RUN_WORDS.get(r.status, r.status.value.lower()) for r in every
                      if r.duplicate_of is None and not r.launched)
    read = sum(1 for r in launched if r.number in stored)
    return StudyCounts(in_study=len(every), ran=len(launched) - read, read=read,
                       ranked=sum(1 for r in launched if r.rankable),
                       unranked=dict(unranked.most_common()),
                       not_run=dict(not_run.most_common()), repeats=len(repeats),
                       remeasured=len(remeasured))
