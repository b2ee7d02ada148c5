"""The search loop: ask -> gate -> run -> tell, on an Optuna study.

A search is assembled from one part per concern (docs/ARCHITECTURE.md, "A search, trial by
trial"):
- layouts.LayoutMap: the study's parameters <-> layouts (free and fixed dimensions, the one
  layout of each run (autotune.megatron.identity), keys);
- store.StudyStore: the study's storage, in memory for a plan (PlanningStore) or in RDB storage
  shared with other searchers for real runs (RealRunStore);
- execution: one trial (TrialExecutor: gate, launch, relaunch, bisection) and what trials teach
  (Knowledge: the memory gate, micro-batches that ran, refitted cost constants);
- ledger: what this process noted (Ledger) and the queue of coming layouts (LayoutQueue);
- stop_rule.ModelStop: what the refitted cost model and its measured error rule out (layouts
  not worth launching, the search's end, the prune threshold of a trial);
- scheduling.Scheduler: seeds, queue order, stop rules and the main loop.

Several processes may share one study (`--storage postgresql://...`, docs/SHARED_STUDIES.md).
Each keeps its own queue (grid, ranked, Alpa seeds); the storage is the one truth: before each
launch a searcher re-reads it, skips layouts another searcher finished or is running, and fails
the trials of searchers that died (heartbeats), whose layouts then become eligible again.
"""

from __future__ import annotations

import time

import optuna

from autotune.search.config import Sampler, SearchConfig, StopRule, sampler_name
from autotune.search.execution import Knowledge, SearchParts, TrialExecutor
from autotune.search.layout_map import LayoutMap
from autotune.search.ledger import LayoutQueue, Ledger
from autotune.search.records import Observer, SearchResult, TrialRecord
from autotune.search.scheduling import Clock, Scheduler
from autotune.search.stop_rule import ModelStop
from autotune.search.storage import Heartbeat, redact_url, storage_errors
from autotune.search.store import open_store

__all__ = ["Search", "SearchConfig", "SearchResult", "TrialRecord", "run_search"]

optuna.logging.set_verbosity(optuna.logging.WARNING)


class Search:
    """One search, its parts built and wired together. Tests reach the parts through it, and
    give it a clock or heartbeat timing of their own."""

    def __init__(self, cfg: SearchConfig, observer: Observer | None = None, *,
                 clock: Clock = time.monotonic, heartbeat: Heartbeat | None = None) -> None:
        self.cfg = cfg
        self.layouts = LayoutMap.of(cfg)
        sampler = sampler_name(cfg, len(self.layouts.valid))
        with storage_errors(cfg.storage or str(cfg.results_dir)):
            self.store = open_store(cfg, self.layouts, sampler, beat=heartbeat)
        self.result = SearchResult(study_name=self.store.name, storage=redact_url(self.store.url),
                                   valid_layouts=len(self.layouts.valid), cluster=cfg.cluster)
        self.knowledge = Knowledge(cfg, self.result, refits=self.store.measured,
                                   costs=self.layouts.costs, memory=self.layouts.memory,
                                   checked=self.layouts.checked)
        ledger = Ledger(self.result, self.layouts, learn=self.knowledge.learn, observer=observer)
        self.ledger = ledger
        knowledge, valid = self.knowledge, self.layouts.valid
        # A plan's figures are the model's own, and a grid is asked to measure every layout.
        self.stop = ModelStop(
            active=(cfg.stop_rule is StopRule.MODEL and self.store.measured
                    and sampler != Sampler.GRID),
            records=self.result.records, fitted=lambda: knowledge.fitted_on > 0,
            predict=knowledge.predicted_tokens, ranked=lambda: knowledge.ranked_tokens(valid),
            tried=ledger.tried, refit_after=cfg.refit_after,
            terms=knowledge.predicted_terms)
        parts = SearchParts(cfg=cfg, layouts=self.layouts, store=self.store, ledger=ledger,
                            knowledge=self.knowledge, queue=LayoutQueue(), stop=self.stop)
        self.executor = TrialExecutor(parts)
        self.scheduler = Scheduler(parts, self.executor, sampler=sampler, clock=clock)

    def run(self, observer: Observer | None = None) -> SearchResult:
        """Run the search (once); `observer`, if given, replaces the one it was built with, so
        that a display can start after the study opened (and was not refused)."""
        if observer is not None:
            self.ledger.observer = observer
        try:
            with storage_errors(self.store.url):  # a full disk: one line, the study kept
                return self.scheduler.run()
        finally:
            self.store.release()  # an SQLite study is free for the next process
            self.cfg.backend.close()  # a warm pool's ranks exit with the search


def run_search(cfg: SearchConfig, observer: Observer | None = None) -> SearchResult:
    """Run (or resume) a study and return what happened."""
    return Search(cfg, observer).run()
