"""Where a search's study lives: its trials are asked for, told, and read back here.

Two kinds behind one interface, `StudyStore`:
- `RealRunStore`: real trials, in Optuna's RDB storage (SQLite under results/<study>/ by
  default, or a shared server) as they happen. Running trials beat, so that the trial of a
  killed process is failed (by a resume, or by any other searcher before its next trial), and
  several searchers can share the study: before each launch a searcher re-reads it (`sync`), skips
  the layouts others finished or are running, and learns from their results.
- `PlanningStore`: predictions cost microseconds, and a storage round trip per trial would
  dominate. The study runs in memory, holding the stored study's finished trials, and its new
  trials are written in one pass when the search ends (`close`). No other process sees it.

An SQLite study is held by one process (autotune.search.lock): a second search of it is refused
before it touches the database. Ctrl-C never splits a write (autotune.search.interrupts): a trial
asked for is held or failed, a record is told with its state, a plan is written whole.
"""

from __future__ import annotations

import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, ClassVar

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.dimensions import plain
from autotune.layouts.layout import Layout
from autotune.search.bulk import add_finished_trials
from autotune.search.config import Sampler, SearchConfig
from autotune.search.interrupts import deferred_interrupts
from autotune.search.layout_map import FrozenParams, LayoutMap, search_sampler
from autotune.search.lock import StudyLock, lock_study
from autotune.search.records import (
    DERIVED_ATTR,
    Source,
    TrialRecord,
    store_record,
    stored_derived,
    stored_record,
)
from autotune.search.shared import PARAMS_WAIT_S, read_shared
from autotune.search.storage import (
    Heartbeat,
    default_study_name,
    describe_study,
    fail_orphans,
    fail_stale,
    heartbeat,
    open_planning_study,
    open_study,
    storage_url,
)
from autotune.search.study_space import keep_space
from autotune.trials.trial import TrialStatus

__all__ = ["PlanningStore", "RealRunStore", "StudyStore", "open_store"]

_GIB = 2**30
_FAILED = (TrialStatus.CRASH, TrialStatus.TIMEOUT, TrialStatus.NCCL_ERROR,
           TrialStatus.DUPLICATE, TrialStatus.INTERRUPTED, TrialStatus.DIVERGED)
"""Told FAIL: nothing learned about the layout's fit (TPE ignores them, dedupe too)."""


@contextmanager
def _locked(name: str, url: str) -> Iterator[StudyLock | None]:
    """The study's SQLite lock (lock_study), taken before the block opens the study and let go
    when the block fails (else the store holds it)."""
    lock = lock_study(name, url)
    try:
        yield lock
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _alone(lock: StudyLock | None) -> bool:
    """Whether this search alone holds its study: an SQLite study locked once in this process
    (a RUNNING trial there has no process left to finish it)."""
    return lock is not None and lock.holders == 1


class StudyStore(ABC):
    """A search's study: ask, tell, and the trials already there. Tell writes the trial's
    record (autotune.search.records) and what Optuna learns from it."""

    measured: ClassVar[bool]
    """Whether the figures told here are measurements, which the cost model refits to."""

    def __init__(self, study: optuna.Study, layouts: LayoutMap, *, name: str, url: str,
                 capacity_bytes: float) -> None:
        self.study = study
        self.layouts = layouts
        self.name = name
        self.url = url
        self.capacity_bytes = capacity_bytes
        self.known: set[int] = set()
        """Trial numbers already handed out as records (told here, replayed, or synced)."""
        self.last_told: int | None = None
        self.lock: StudyLock | None = None
        """This process's hold on an SQLite study (open); released when the search ends."""
        self.conditional = True
        """Whether a trial is asked its parameters one by one (LayoutMap.ask): the proposing
        sampler's (TPE) trials; open sets it from the sampler."""

    @staticmethod
    def study_name(cfg: SearchConfig, variant: dict[str, Any] | None) -> str:
        return cfg.study_name or default_study_name(cfg.model, cfg.cluster, cfg.space,
                                                    cfg.backend.name, variant)

    def _read(self, trial: FrozenTrial) -> TrialRecord | None:
        self.known.add(trial.number)
        # The layout comes from the parameters, as the search maps them now, with the derived
        # values the trial ran with (its record's layout).
        s = self.layouts.layout(trial.params, stored_derived(trial))
        return stored_record(trial, s) if s is not None else None

    def stored_records(self) -> Iterator[TrialRecord]:
        """The records of the finished trials already in the study (a resume)."""
        states = (TrialState.COMPLETE, TrialState.PRUNED)
        for trial in self.study.get_trials(deepcopy=False, states=states):
            record = self._read(trial)
            if record is not None:
                yield record

    @abstractmethod
    def sync(self, mine: int | None = None) -> tuple[list[TrialRecord], dict[FrozenParams, int]]:
        """What other searchers did since the last look: the records they finished, and the
        layouts (by LayoutMap.run_params) they are running, each with its smallest trial number."""

    @abstractmethod
    def before_ask(self) -> None:
        """Housekeeping before a trial is asked for."""

    def enqueue(self, s: Layout, source: Source) -> None:
        """Make `s` the next trial asked for."""
        attrs: dict[str, Any] = {"source": plain(source)}
        if self.layouts.derived:
            attrs[DERIVED_ATTR] = self.layouts.derived_values(s)
        self.study.enqueue_trial(self.layouts.params(s), user_attrs=attrs)

    def ask(self) -> optuna.Trial:
        """The next trial, its parameters asked: each where the earlier ones leave it a choice
        (LayoutMap.ask) when the sampler proposes (TPE), every one at once where every trial is
        enqueued (grid, ranked: their trials hold every parameter, as before)."""
        with warnings.catch_warnings():
            # Optuna warns that heartbeats belong to Study.optimize; storage.heartbeat beats
            # for our ask/tell trials instead.
            warnings.filterwarnings("ignore", message="Heartbeat of storage")
            if not self.conditional:
                return self.study.ask(self.layouts.distributions)
            trial = self.study.ask()
            self.layouts.ask(trial)
            return trial

    @contextmanager
    def next_trial(self, queued: tuple[Layout, Source] | None = None
                   ) -> Iterator[optuna.Trial]:
        """Ask for the next trial (`queued` enqueued first, to be the one asked for) and hold it
        while the block runs: it beats (storage.heartbeat), and a Ctrl-C at any step from the
        ask on ends it FAIL, never RUNNING (nor the enqueued layout WAITING)."""
        trial: optuna.Trial | None = None
        try:
            with deferred_interrupts():  # enqueue and ask: both or neither
                if queued is not None:
                    self.enqueue(*queued)
                trial = self.ask()
            with heartbeat(trial):
                yield trial
        except KeyboardInterrupt:
            if trial is not None:
                with deferred_interrupts():
                    # Told already when the Ctrl-C came after its tell: then nothing to do.
                    self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
            raise

    def tell(self, trial: optuna.Trial, record: TrialRecord) -> None:
        """Write the trial's record and finish it: COMPLETE with (tokens/s, peak GiB) when it
        ran (pruned slow too), FAIL when it says nothing about the layout's fit, else PRUNED
        (infeasible: TPE learns from pruned trials, and proposes elsewhere) with a positive
        memory constraint. A Ctrl-C waits until
        both are written."""
        with deferred_interrupts():
            self._tell(trial, record)

    def _tell(self, trial: optuna.Trial, record: TrialRecord) -> None:
        store_record(trial, record)
        capacity = self.capacity_bytes
        if record.tokens_per_s is not None:
            peak = record.peak_bytes or 0
            trial.set_constraint("memory_gib", (peak - capacity) / _GIB)
            self.study.tell(trial, [record.tokens_per_s, peak / _GIB])
        elif record.status in _FAILED:
            self.study.tell(trial, state=TrialState.FAIL)
        else:  # INVALID, PREDICTED_OOM, PREDICTED_SLOW, OOM
            predicted = record.predicted_peak_bytes or capacity
            trial.set_constraint("memory_gib", max((predicted - capacity) / _GIB, 0.1))
            self.study.tell(trial, state=TrialState.PRUNED)
        self.last_told = trial.number
        self.known.add(trial.number)

    @abstractmethod
    def close(self) -> None:
        """Write to storage what is not there yet (the search ends)."""

    def release(self) -> None:
        """Let go of the study (its SQLite lock): the search is over."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None


class RealRunStore(StudyStore):
    """Real trials, each written to the RDB storage as it happens (see the module)."""

    measured = True

    def __init__(self, study: optuna.Study, layouts: LayoutMap, *, name: str, url: str,
                 capacity_bytes: float) -> None:
        super().__init__(study, layouts, name=name, url=url, capacity_bytes=capacity_bytes)
        self.paramless: set[int] = set()
        """RUNNING trials waited on once without parameters appearing (their searcher died)."""

    @classmethod
    def open(cls, cfg: SearchConfig, layouts: LayoutMap, sampler: Sampler,
             beat: Heartbeat) -> RealRunStore:
        name = cls.study_name(cfg, None)
        url = storage_url(cfg.results_dir, name, cfg.storage)
        with _locked(name, url) as lock:
            study = open_study(name, url, search_sampler(sampler, cfg.seed, layouts),
                               resume=cfg.resume, heartbeat=beat)
            describe_study(study, cfg.model, cfg.cluster, cfg.backend.name)
            keep_space(study, layouts.candidates, cfg.space.source)
            fail_orphans(study, everything=_alone(lock), grace_s=beat.grace_s)
        store = cls(study, layouts, name=name, url=url,
                    capacity_bytes=cfg.cluster.gpu.memory_bytes)
        store.lock = lock
        store.conditional = sampler == Sampler.TPE
        return store

    def before_ask(self) -> None:
        # A dead searcher's trial stops beating: failing it here (every searcher, before each
        # ask) frees its layout for a retry by whoever is still alive.
        fail_stale(self.study)

    def sync(self, mine: int | None = None) -> tuple[list[TrialRecord], dict[FrozenParams, int]]:
        """See StudyStore.sync; `mine` is the trial this searcher is about to run.

        A trial's number is fixed when it is created, its parameters a moment later (after
        the sampler ran); an older RUNNING trial still without them is waited for (briefly,
        and once), else two searchers that asked for one layout at once could both launch it.
        """
        deadline = time.monotonic() + PARAMS_WAIT_S
        records: list[TrialRecord] = []
        while True:
            running, finished, waiting = read_shared(
                self.study, self.layouts.free, mine, self.known, self.paramless,
                run_params_of=self.layouts.run_params_of)
            if time.monotonic() >= deadline:
                self.paramless.update(waiting)
            records += [r for r in map(self._read, finished) if r is not None]
            if not waiting or time.monotonic() >= deadline:
                return records, running
            time.sleep(0.05)

    def close(self) -> None:
        """Nothing: every trial was written as it was told."""


class PlanningStore(StudyStore):
    """Predicted trials, in memory until the search ends (see the module)."""

    measured = False

    def __init__(self, study: optuna.Study, layouts: LayoutMap, *, name: str, url: str,
                 capacity_bytes: float, persistent: optuna.Study, persisted: int,
                 storage: optuna.storages.RDBStorage) -> None:
        super().__init__(study, layouts, name=name, url=url, capacity_bytes=capacity_bytes)
        self.persistent = persistent
        self.persisted = persisted
        """How many trials of the in-memory study the stored one has."""
        self.storage = storage
        """The stored study's storage: the plan is written there in one pass (close)."""

    @classmethod
    def open(cls, cfg: SearchConfig, layouts: LayoutMap, sampler: Sampler) -> PlanningStore:
        # A plan's figures depend on the sampler and the constants too: other ones, other study.
        variant = {"sampler": sampler,
                   "cost_params": asdict(cfg.cost_params) if cfg.cost_params else None,
                   "memory_params": asdict(cfg.memory_params) if cfg.memory_params else None}
        name = cls.study_name(cfg, variant)
        url = storage_url(cfg.results_dir, name, cfg.storage)
        with _locked(name, url) as lock:  # held until the plan is written (close)
            opened = open_planning_study(name, url, search_sampler(sampler, cfg.seed, layouts),
                                         resume=cfg.resume)
            persistent = opened.stored
            describe_study(persistent, cfg.model, cfg.cluster, cfg.backend.name)
            keep_space(persistent, layouts.candidates, cfg.space.source)
            fail_orphans(persistent, everything=_alone(lock), grace_s=Heartbeat().grace_s)
        store = cls(opened.memory, layouts, name=name, url=url,
                    capacity_bytes=cfg.cluster.gpu.memory_bytes, persistent=persistent,
                    persisted=opened.persisted, storage=opened.storage)
        store.lock = lock
        store.conditional = sampler == Sampler.TPE
        return store

    def sync(self, mine: int | None = None) -> tuple[list[TrialRecord], dict[FrozenParams, int]]:
        return [], {}  # an in-memory study: no other process can see it

    def before_ask(self) -> None:
        """Nothing: no other process runs trials of an in-memory study."""

    def close(self) -> None:
        new = [t for t in self.study.get_trials(deepcopy=False)[self.persisted:]
               if t.state.is_finished()]
        # One transaction, never split by Ctrl-C.
        add_finished_trials(self.persistent, new, storage=self.storage)
        self.persisted += len(new)


def open_store(cfg: SearchConfig, layouts: LayoutMap, sampler: Sampler, *,
               beat: Heartbeat | None = None) -> StudyStore:
    """The study of this search: planned in memory when the backend predicts, else real runs
    in storage (with `beat`'s heartbeats, default Heartbeat())."""
    if cfg.backend.predicted:
        return PlanningStore.open(cfg, layouts, sampler)
    return RealRunStore.open(cfg, layouts, sampler, beat or Heartbeat())
