"""What one search process knows and plans: the records it noted, the layouts already seen,
its launch count and best figure so far (the stop rules read them), and the queue of layouts for
the coming trials."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from autotune.layouts.layout import Layout
from autotune.search.layout_map import FrozenParams, LayoutMap
from autotune.search.records import Observer, SearchResult, Source, TrialRecord
from autotune.trials.trial import TrialStatus

__all__ = ["LayoutQueue", "Learner", "Ledger"]

Learner = Callable[[TrialRecord, bool], None]
"""Called with each noted record, and whether this process just told it (not read it back)."""


class Ledger:
    """Every record this process has noted, in order, and what follows from them."""

    def __init__(self, result: SearchResult, layouts: LayoutMap, *, learn: Learner,
                 observer: Observer | None = None) -> None:
        self.result = result
        self.layouts = layouts
        self.learn = learn
        self.observer = observer
        self.seen: dict[FrozenParams, TrialRecord] = {}
        """The first record of each layout (LayoutMap.run_params) tried: a later proposal of it
        repeats that outcome instead of running again."""
        self.launched = 0
        """Launched (or simulated) trials of the study, by any process (--trials counts them)."""
        self.best_tokens = 0.0
        self.since_best = 0
        """Trials this process launched since the best tokens/s improved (--patience)."""

    def note(self, record: TrialRecord, *, told: bool = True) -> None:
        """Note a record: one this process told (`told`), or one read back from storage (a
        resume, or another searcher's result)."""
        self.result.records.append(record)
        if record.duplicate_of is None and record.status is not TrialStatus.PREDICTED_SLOW:
            # A layout skipped as predicted slow stays untried: the model and its error band
            # change with each measurement, and the next proposal of it is decided again.
            self.seen.setdefault(self.layouts.run_params(record.layout), record)
        # A trial pruned slow is measured below the best by construction: never the best.
        tokens = None if record.pruned_slow else record.tokens_per_s
        if record.launched and record.repeat_of is None:
            # A finalist's repeat (autotune.search.finalists) is not a new trial of the search.
            # --trials counts the study's launched trials, so a resumed study finishes the
            # budget it started with instead of launching it again; in a shared study it is a
            # budget for all searchers together.
            self.launched += 1
        if record.repeat_of is not None:
            pass  # it measures a layout again: the best and --patience follow new layouts
        elif record.launched and told:
            if tokens is not None and tokens > self.best_tokens:
                self.best_tokens, self.since_best = tokens, 0
            else:
                self.since_best += 1
        elif tokens is not None:
            self.best_tokens = max(self.best_tokens, tokens)
        self.learn(record, told)
        if self.observer is not None:
            self.observer(record, self.result)

    def tried(self, s: Layout) -> bool:
        return self.layouts.run_params(s) in self.seen


class LayoutQueue:
    """Layouts for the coming trials, each with who proposed it. The queue lives in the
    process, not in the study, so that a grid of thousands costs nothing until each trial is
    asked for."""

    def __init__(self) -> None:
        self._items: deque[tuple[Layout, Source]] = deque()

    def push(self, s: Layout, source: Source, *, first: bool = False) -> None:
        if first:
            self._items.appendleft((s, source))
        else:
            self._items.append((s, source))

    def pop(self) -> tuple[Layout, Source]:
        return self._items.popleft()

    def __len__(self) -> int:
        return len(self._items)

    def holds(self, *sources: Source) -> bool:
        """Whether a layout proposed by one of `sources` waits."""
        return any(source in sources for _, source in self._items)
