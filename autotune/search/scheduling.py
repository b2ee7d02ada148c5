"""Which layout each trial tries, and when the search stops.

The queue is seeded by the sampler: every layout (grid), the analytical model's best first
(ranked), or Alpa's heuristic seeds before TPE proposes. Seeds already tried (a resume, another
searcher) are skipped when their turn comes; a layout another searcher is running is deferred.
When a TPE proposal repeats a layout already tried, the model's best untried layout is queued to
be the next trial (`Scheduler.after_repeat`). The search stops at --trials, --time-budget or
--patience, when no untried layout could beat the best measured (the model's stop rule,
autotune.search.stop_rule), when the queue of a grid or ranking is empty, or when proposals keep
launching nothing and every layout predicted to fit was tried. Before it stops (but on Ctrl-C or
a spent --time-budget) its finalists are measured again (autotune.search.finalists).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from autotune.layouts.layout import Layout
from autotune.search.config import RANKED_DEFAULT, Sampler
from autotune.search.execution import SearchParts, TrialExecutor
from autotune.search.finalists import plan, settled
from autotune.search.heuristics import alpa_seeds, predicted_speed
from autotune.search.impls import practice_impl
from autotune.search.records import SearchResult, Source
from autotune.search.shared import SHARED_POLL_S
from autotune.trials.protocol import te_available
from autotune.trials.trial import TrialStatus

__all__ = ["Clock", "Scheduler"]

Clock = Callable[[], float]
"""Seconds from an arbitrary start (time.monotonic): the time budget and the elapsed time."""


class Scheduler:
    """The search's main loop over the parts it is given (autotune.search.loop builds them)."""

    def __init__(self, parts: SearchParts, executor: TrialExecutor, *, sampler: Sampler,
                 clock: Clock = time.monotonic) -> None:
        self.parts = parts
        self.executor = executor
        self.sampler = sampler
        self.clock = clock

    def seed(self) -> None:
        p = self.parts
        self._seed_sampler()
        # The user's own layouts run first, whatever the sampler (a grid holds them too: the
        # later copy is skipped as tried).
        for s in reversed(p.cfg.seeds):
            p.queue.push(s, Source.USER, first=True)

    def _seed_sampler(self) -> None:
        p = self.parts
        if self.sampler == Sampler.GRID:
            for s in p.layouts.valid:
                p.queue.push(s, Source.GRID)
            return
        if self.sampler == Sampler.RANKED:
            limit = p.cfg.n_trials or RANKED_DEFAULT
            for s in p.knowledge.ranked(p.layouts.valid)[:limit]:
                p.queue.push(s, Source.RANKED)
            return
        # On resume the seeds already tried are skipped when asked (run_one), the rest still run.
        impl = practice_impl(p.cfg.backend.name, te_installed=te_available())
        for s in alpa_seeds(p.layouts.valid, p.knowledge.fits, impl,
                            speed=predicted_speed(p.cfg.model, p.cfg.cluster,
                                                  p.knowledge.cost_params),
                            risky=lambda s: p.knowledge.gate.decide(s).risky):
            p.queue.push(s, Source.ALPA)

    def stop_reason(self, start: float) -> str | None:
        cfg, ledger = self.parts.cfg, self.parts.ledger
        if cfg.n_trials is not None and ledger.launched >= cfg.n_trials:
            return f"reached --trials {cfg.n_trials}"
        if cfg.time_budget_s is not None and self.clock() - start >= cfg.time_budget_s:
            return f"reached --time-budget {cfg.time_budget_s:g} s"
        if cfg.patience is not None and ledger.since_best >= cfg.patience:
            return f"{cfg.patience} trials without improvement (--patience)"
        if self.parts.queue.holds(Source.DERIVED, Source.OOM_BISECT, Source.PRECISION,
                                  Source.UNPRICED):
            # What a measurement just asked for (a derived lever's next rung, a smaller
            # micro-batch, the leader's FP8 variant or its unpriced variants) runs before the
            # model's verdict on the layouts it knows: the rung is not among them, and its
            # figure is what the model would be judged against.
            return None
        return self.parts.stop.exhausted()

    def next_queued(self) -> tuple[tuple[Layout, Source] | None, bool]:
        """The first queued layout not tried nor running elsewhere, to be the next trial (None:
        none), and whether layouts running elsewhere were deferred."""
        p = self.parts
        p.store.before_ask()
        running = self.executor.look()
        deferred: list[tuple[Layout, Source]] = []
        took: tuple[Layout, Source] | None = None
        while p.queue and took is None:
            queued, source = p.queue.pop()
            if p.ledger.tried(queued):
                continue
            if p.layouts.run_params(queued) in running:
                # Another searcher runs it now; keep it in case that searcher dies (FAIL).
                deferred.append((queued, source))
                continue
            took = (queued, source)
        for queued, source in deferred:
            p.queue.push(queued, source)
        return took, bool(deferred)

    def run_one(self) -> bool:
        """Ask for one trial and finish it. False when the space is exhausted."""
        took, deferred = self.next_queued()
        if took is None and self.sampler != Sampler.TPE:
            if not deferred:
                return False
            time.sleep(SHARED_POLL_S)  # only layouts running elsewhere are left: wait for them
            return True
        with self.parts.store.next_trial(took) as trial:
            self.executor.finish(trial)
        if took is None:
            self.after_repeat(trial.number)
        return True

    def after_repeat(self, number: int) -> None:
        """When the sampler's trial `number` repeated a layout already tried, queue the model's
        best untried layout (ModelStop.closest_untried) to be the next trial, unless something
        is queued already.

        On small spaces TPE keeps proposing layouts it has tried: a quarter to a half of its
        asks on 4576 to 140 layouts (results/benchmarks/2026-11-29-cpu-sampler-repeats-s22.md).
        A repeat launches nothing but costs an ask, and steering TPE itself away from tried
        layouts measured no better (2026-11-29-cpu-sampler-partial-s21.md); the model's pick
        goes somewhere new that is predicted fast, and TPE learns from its outcome like any
        other trial's. With the stop rule on it is the layout the rule waits for, so the
        search reaches its verdict in fewer asks."""
        p = self.parts
        records = p.ledger.result.records
        last = records[-1] if records else None
        # DUPLICATE: another searcher is running the layout, which is queued again already.
        if (last is None or last.number != number or last.duplicate_of is None
                or last.status is TrialStatus.DUPLICATE or p.queue):
            return
        untried, _ = p.stop.closest_untried()
        if untried is not None:
            p.queue.push(untried[0], Source.MODEL)

    def fallback(self) -> str | None:
        """Proposals keep launching nothing: queue the model's best untried layout, or say
        why there is none."""
        p = self.parts
        # Not an echo of a measured layout (ModelStop.echo): that one is skipped when its turn
        # comes, and queued again and again it would launch nothing, for ever.
        untried, _ = p.stop.closest_untried()
        if untried is None:
            return "every layout predicted to fit has been tried"
        p.queue.push(untried[0], Source.MODEL)
        return None

    def budget_spent(self, start: float) -> bool:
        budget = self.parts.cfg.time_budget_s
        return budget is not None and self.clock() - start >= budget

    def remeasures(self) -> bool:
        """Whether the search ends by measuring its finalists again: real runs only (a plan's
        figures are the model's own), and not for a grid, whose point is every layout measured
        once, as the stop rule stays off."""
        cfg = self.parts.cfg
        return (not cfg.backend.predicted and cfg.finalists > 0 and cfg.finalist_runs >= 2
                and self.sampler != Sampler.GRID)

    def stand_by(self) -> None:
        """Have the backend start now the fresh process the finalists' last repeat will run in
        (WorkerBackend.stand_by): it makes its imports while the pool starts, when nothing is
        timed, and waits without touching a GPU; unused (a resumed study whose fresh run is on
        record, a spent --time-budget, Ctrl-C) it is stopped with the backend."""
        stand_by = getattr(self.parts.cfg.backend, "stand_by", None)
        if stand_by is not None and self.remeasures():
            stand_by(self.executor.trial_root, self.parts.cfg.cluster.num_gpus)

    def remeasure_finalists(self) -> None:
        """Measure the best layouts again (autotune.search.finalists) before the search
        stops."""
        p = self.parts
        if not self.remeasures():
            return
        # In the planned order; once the call is settled, the warm repeats left are dropped and
        # the leader's fresh run (the last of the plan) is not (finalists.settled).
        for repeat in plan(p.ledger.result, finalists=p.cfg.finalists,
                           runs=p.cfg.finalist_runs):
            if not repeat.fresh and settled(p.ledger.result):
                continue
            with p.store.next_trial((repeat.of.layout, Source.FINALIST)) as trial:
                self.executor.remeasure(trial, repeat.of, fresh=repeat.fresh)

    @staticmethod
    def interrupted(result: SearchResult) -> None:
        result.interrupted = True
        result.stop_reason = "interrupted (Ctrl-C); --resume continues the study"

    def run(self) -> SearchResult:
        """The search, to a stop rule or Ctrl-C (result.interrupted); the store is closed
        (a plan written) either way."""
        p = self.parts
        start = self.clock()
        result = p.ledger.result
        try:
            self.stand_by()
            for record in p.store.stored_records():
                p.ledger.note(record, told=False)
            p.knowledge.refit()
            self.seed()
            idle = 0
            while (reason := self.stop_reason(start)) is None:
                before = p.ledger.launched
                if not self.run_one():
                    reason = ("every layout of the grid was tried" if self.sampler == Sampler.GRID
                              else "every ranked layout was tried")
                    break
                idle = 0 if p.ledger.launched > before else idle + 1
                if idle >= p.cfg.max_idle_asks and not p.queue:
                    if (reason := self.fallback()) is not None:
                        break
                    idle = 0
            result.stop_reason = reason
            if not self.budget_spent(start):
                self.remeasure_finalists()
        except KeyboardInterrupt:
            self.interrupted(result)
        finally:
            try:
                p.store.close()
            except KeyboardInterrupt:  # held while a plan was written: it was written whole
                self.interrupted(result)
        result.elapsed_s = self.clock() - start
        result.cost_params, result.fitted_on = p.knowledge.cost_params, p.knowledge.fitted_on
        return result
