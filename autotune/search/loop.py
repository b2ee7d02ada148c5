"""The search loop: ask -> gate -> run -> tell, on an Optuna study.

Every valid layout is a point of the study's categorical dimensions (candidate lists fixed per
study). Alpa's heuristic seeds come first; then the sampler proposes. A proposal that breaks a
Megatron rule or is predicted not to fit is told PRUNED with its constraint and never launched;
a real OOM is pruned and teaches the gate (autotune.gate). A proposal already measured is told
again with the same outcome, so nothing runs twice.

Several processes may share one study (`--storage postgresql://...`, docs/SHARED_STUDIES.md).
Each keeps its own queue (grid, ranked, Alpa seeds); the storage is the one truth: before each
launch a worker re-reads it, skips layouts another worker finished or is running, and fails
the trials of workers that died (heartbeats), whose layouts then become eligible again.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections import deque
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import TrialState

from autotune.backends import trial_timeout_s
from autotune.cost import estimate_cost
from autotune.errors import ConfigError
from autotune.gate import MemoryGate, layout_key
from autotune.heuristics import alpa_seeds, next_smaller_mbs
from autotune.launchers import LOG_NAME
from autotune.protocol import te_available
from autotune.search.bulk import add_finished_trials
from autotune.search.config import RANKED_DEFAULT, SearchConfig, make_sampler, sampler_name
from autotune.search.records import (
    Observer,
    SearchResult,
    TrialRecord,
    store_record,
    stored_record,
)
from autotune.search.refit import refit_cost_params
from autotune.search.shared import PARAMS_WAIT_S, SHARED_POLL_S, read_shared
from autotune.search.shared import layout_params as _params
from autotune.search.shared import params_key as _key
from autotune.search.storage import (
    default_study_name,
    describe_study,
    fail_stale,
    heartbeat,
    open_planning_study,
    open_study,
    redact_url,
    storage_url,
)
from autotune.space import enumerate_space
from autotune.strategy import STRATEGY_DEFAULTS, Strategy, canonical
from autotune.trial import TrialMetrics, TrialSpec, TrialStatus

__all__ = ["SearchConfig", "SearchResult", "TrialRecord", "run_search"]

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)

_GIB = 2**30


class _Search:
    def __init__(self, cfg: SearchConfig, observer: Observer | None) -> None:
        self.cfg = cfg
        self.observer = observer
        summary = enumerate_space(cfg.space, cfg.model, cfg.cluster)
        if not summary.valid:
            raise ConfigError(f"no valid layout of {cfg.model.name} on "
                              f"{cfg.cluster.num_gpus} GPUs in this search space")
        dims = {d: tuple(summary.valid_values(d)) for d in cfg.space.candidates}
        self.free = {d: v for d, v in dims.items() if len(v) > 1}
        self.fixed = {d: v[0] for d, v in dims.items() if len(v) == 1}
        self.distributions: dict[str, BaseDistribution] = {
            d: CategoricalDistribution(list(v)) for d, v in self.free.items()}
        # Every parameter combination maps to its canonical layout (autotune.strategy.canonical)
        # and the search knows one of each set of layouts that are the same run.
        self.by_key = {_key(_params(s, self.free)): canonical(s) for s in summary.valid}
        self.valid = list(dict.fromkeys(self.by_key.values()))
        self.gate = MemoryGate(cfg.model, cfg.cluster, params=cfg.memory_params)
        self.cost_params = cfg.cost_params
        self.fitted_on = 0
        self.seen: dict[tuple[Any, ...], TrialRecord] = {}
        self.known: set[int] = set()
        """Trial numbers already noted (told here, replayed, or read back by sync)."""
        self.paramless: set[int] = set()
        """RUNNING trials waited on once without parameters appearing (their worker died)."""
        self.good_mbs: dict[Strategy, int] = {}
        self.best_tokens = 0.0
        self.since_best = 0
        self.launched = 0
        self.impl = "te" if te_available() else "sdpa"
        self.sampler = sampler_name(cfg, len(self.valid))
        # A plan's figures depend on the sampler and the constants too: other ones, other study.
        variant = ({"sampler": self.sampler,
                    "cost_params": asdict(cfg.cost_params) if cfg.cost_params else None,
                    "memory_params": asdict(cfg.memory_params) if cfg.memory_params else None}
                   if cfg.backend.predicted else None)
        name = cfg.study_name or default_study_name(cfg.model, cfg.cluster, cfg.space,
                                                    cfg.backend.name, variant)
        url = storage_url(cfg.results_dir, name, cfg.storage)
        self.trial_root = cfg.results_dir / name / "trials"
        sampler = make_sampler(self.sampler, cfg.seed)
        self.persistent: optuna.Study | None = None
        self.persisted = 0
        if cfg.backend.predicted:  # in memory, written to storage at the end (persist)
            self.study, self.persistent, self.persisted = open_planning_study(
                name, url, sampler, resume=cfg.resume)
        else:
            self.study = open_study(name, url, sampler, resume=cfg.resume, heartbeat=True)
        self.queue: deque[tuple[Strategy, str]] = deque()
        describe_study(self.persistent or self.study, cfg.model, cfg.cluster, cfg.backend.name)
        self.last_told: int | None = None
        self.result = SearchResult(study_name=name, storage=redact_url(url),
                                   valid_strategies=len(self.valid))

    # -- strategies -----------------------------------------------------------------------
    def strategy(self, params: dict[str, Any]) -> Strategy | None:
        """The layout a trial's parameters stand for, in canonical form (what runs)."""
        # A trial stored before the space freed a dimension (e.g. cross_entropy_fusion added
        # to the YAML for --resume) has no parameter for it: it ran with Strategy's default.
        return self.by_key.get(_key({d: params.get(d, STRATEGY_DEFAULTS[d]) for d in self.free}))

    def key(self, s: Strategy) -> tuple[Any, ...]:
        """Equal for two valid layouts that are the same run (autotune.strategy.canonical).

        Only a valid layout is mapped to its canonical form: an INVALID record's strategy is
        built from the proposal's parameters with dp left at 1, and canonicalising it could
        give the key of a real layout, which would then never run."""
        raw = _key(_params(s, self.free))
        valid = self.by_key.get(raw)
        return raw if valid is None else _key(_params(valid, self.free))

    def params_key(self, params: dict[str, Any]) -> tuple[Any, ...]:
        s = self.strategy(params)
        return _key(params) if s is None else self.key(s)

    def predicted_tokens(self, s: Strategy) -> float:
        return estimate_cost(self.cfg.model, s, self.cfg.cluster,
                             self.cost_params).tokens_per_s

    def ranked_launchable(self) -> list[Strategy]:
        fitting = [s for s in self.valid if self.gate.decide(s).launch]
        return sorted(fitting, key=self.predicted_tokens, reverse=True)

    # -- study bookkeeping ----------------------------------------------------------------
    def replay(self) -> None:
        """Rebuild state from a resumed study: seen layouts, OOM knowledge, best so far."""
        for frozen in self.study.get_trials(deepcopy=False):
            if frozen.state not in (TrialState.COMPLETE, TrialState.PRUNED):
                continue
            s = self.strategy(frozen.params)
            record = stored_record(frozen, s) if s is not None else None
            if record is not None:
                self.note_stored(record)

    def note_stored(self, record: TrialRecord) -> None:
        """Note a trial read back from storage (resume, or another worker's result)."""
        self.note(record, count_launch=False)
        if record.launched:
            # --trials counts the study's launched trials, so a resumed study finishes the
            # budget it started with instead of launching it again; in a shared study it is a
            # budget for all workers together.
            self.launched += 1

    def sync(self, mine: int | None = None) -> dict[tuple[Any, ...], int]:
        """Shared storage: note the trials other workers finished since the last look (so
        their layouts join `seen` and their OOMs teach the gate), and return the layouts of
        RUNNING trials other than `mine`, each with the smallest trial number running it.

        A trial's number is fixed when it is created, its parameters a moment later (after
        the sampler ran); an older RUNNING trial still without them is waited for (briefly,
        and once), else two workers that asked for one layout at once could both launch it.
        """
        if self.cfg.backend.predicted:
            return {}  # an in-memory study: no other process can see it
        deadline = time.monotonic() + PARAMS_WAIT_S
        while True:
            running, finished, waiting = read_shared(self.study, self.free, mine, self.known,
                                                     self.paramless, key_of=self.params_key)
            if time.monotonic() >= deadline:
                self.paramless.update(waiting)
            for t in finished:
                s = self.strategy(t.params)
                record = stored_record(t, s) if s is not None else None
                if record is not None:
                    self.note_stored(record)
            if not waiting or time.monotonic() >= deadline:
                return running
            time.sleep(0.05)

    def note(self, record: TrialRecord, *, count_launch: bool = True) -> None:
        self.known.add(record.number)
        self.result.records.append(record)
        if record.duplicate_of is None:
            self.seen.setdefault(self.key(record.strategy), record)
        if record.status is TrialStatus.OOM and record.duplicate_of is None:
            self.gate.record_oom(record.strategy, record.predicted_peak_bytes)
        tokens = record.tokens_per_s
        if tokens is not None:
            key = layout_key(record.strategy)
            self.good_mbs[key] = max(self.good_mbs.get(key, 0), record.strategy.mbs)
        if record.launched and count_launch:
            self.launched += 1
            if tokens is not None and tokens > self.best_tokens:
                self.best_tokens, self.since_best = tokens, 0
            else:
                self.since_best += 1
        elif tokens is not None:
            self.best_tokens = max(self.best_tokens, tokens)
        if tokens is not None and count_launch and not self.cfg.backend.predicted:
            self.refit()
        if self.observer is not None:
            self.observer(record, self.result)

    def refit(self) -> None:
        """Refit the cost constants to the study's measured step times once there are
        `refit_after` of them (and again with each new one), so that ranking and timeouts
        follow what this machine really does."""
        fitted = refit_cost_params(self.result, self.cfg.model, self.cfg.cluster,
                                   refit_after=self.cfg.refit_after, fitted_on=self.fitted_on,
                                   start=self.cost_params)
        if fitted is None:
            return
        self.cost_params, self.fitted_on = fitted
        log.info("cost model refitted to %d measured trials", self.fitted_on)

    def enqueue(self, s: Strategy, source: str, *, first: bool = False) -> None:
        """Queue a layout for a coming trial. The queue lives here, not in the study, so that
        a grid of thousands costs nothing until each trial is asked for."""
        if first:
            self.queue.appendleft((s, source))
        else:
            self.queue.append((s, source))

    # -- one trial ------------------------------------------------------------------------
    def tell(self, trial: optuna.Trial, record: TrialRecord) -> None:
        store_record(trial, record)
        capacity = self.cfg.cluster.gpu.memory_bytes
        if record.tokens_per_s is not None:
            peak = record.peak_bytes or 0
            trial.set_constraint("memory_gib", (peak - capacity) / _GIB)
            self.study.tell(trial, [record.tokens_per_s, peak / _GIB])
        elif record.status in (TrialStatus.CRASH, TrialStatus.TIMEOUT, TrialStatus.NCCL_ERROR):
            self.study.tell(trial, state=TrialState.FAIL)
        else:  # INVALID, PREDICTED_OOM, OOM: infeasible, and TPE learns from pruned trials
            predicted = record.predicted_peak_bytes or capacity
            trial.set_constraint("memory_gib", max((predicted - capacity) / _GIB, 0.1))
            self.study.tell(trial, state=TrialState.PRUNED)
        self.last_told = trial.number
        self.note(record)

    def run_one(self) -> bool:
        """Ask for one trial and finish it. False when the space is exhausted."""
        if not self.cfg.backend.predicted:
            # A dead worker's trial stops beating: failing it here (every worker, before each
            # ask) frees its layout for a retry by whoever is still alive.
            fail_stale(self.study)
        running = self.sync()
        took = False
        deferred: list[tuple[Strategy, str]] = []
        while self.queue and not took:
            queued, source = self.queue.popleft()
            key = self.key(queued)
            if key in self.seen:
                continue
            if key in running:
                # Another worker runs it now; keep it in case that worker dies (FAIL).
                deferred.append((queued, source))
                continue
            self.study.enqueue_trial(_params(queued, self.free), user_attrs={"source": source})
            took = True
        self.queue.extend(deferred)
        if not took and deferred and self.sampler != "tpe":
            time.sleep(SHARED_POLL_S)  # only layouts running elsewhere are left: wait for them
            return True
        if not took and self.sampler != "tpe":
            return False
        with warnings.catch_warnings():
            # Optuna warns that heartbeats belong to Study.optimize; storage.heartbeat beats
            # for our ask/tell trials instead.
            warnings.filterwarnings("ignore", message="Heartbeat of storage")
            trial = self.study.ask(self.distributions)
        with heartbeat(trial):
            try:
                self.finish(trial)
            except KeyboardInterrupt:
                # Whatever step was running, the trial ends FAIL, never RUNNING.
                if self.last_told != trial.number:
                    self.study.tell(trial, state=TrialState.FAIL)
                raise
        return True

    def finish(self, trial: optuna.Trial) -> None:
        """Gate, run and tell one asked trial."""
        source = trial.user_attrs.get("source", "sampler")
        predicted = self.cfg.backend.predicted
        s = self.strategy(trial.params)
        if s is None:
            params = {**trial.params, **self.fixed}
            record = TrialRecord(number=trial.number,
                                 strategy=Strategy(gbs=self.cfg.model.global_batch_size,
                                                   **{k: v for k, v in params.items()
                                                      if k in Strategy.__dataclass_fields__}),
                                 status=TrialStatus.INVALID, source=source,
                                 predicted=predicted,
                                 reason="breaks a Megatron rule (autotune MODEL --dry-run "
                                        "lists them)")
            self.tell(trial, record)
            return
        # Re-read the shared storage right before deciding: another worker may have finished
        # this layout, or be running it, since the queue was checked.
        running = self.sync(mine=trial.number)
        previous = self.seen.get(self.params_key(trial.params))
        if previous is not None:
            self.tell(trial, replace(previous, number=trial.number, source=source,
                                     duplicate_of=previous.number))
            return
        other = running.get(self.params_key(trial.params))
        if other is not None and other < trial.number:
            # The older trial runs it (the newer one yields, so exactly one of two racing
            # workers launches). No outcome to copy yet: told FAIL, which TPE ignores and
            # dedupe does not count, and queued again in case the other worker dies.
            store_record(trial, TrialRecord(
                number=trial.number, strategy=s, status=TrialStatus.DUPLICATE, source=source,
                duplicate_of=other, reason=f"running in trial {other}", predicted=predicted))
            self.study.tell(trial, state=TrialState.FAIL)
            self.last_told = trial.number
            self.enqueue(s, source)
            return
        decision = self.gate.decide(s)
        peak = decision.memory.peak_bytes if decision.memory else None
        if not decision.launch:
            assert decision.status is not None
            self.tell(trial, TrialRecord(number=trial.number, strategy=s,
                                         status=decision.status, source=source,
                                         reason=decision.reason, predicted_peak_bytes=peak,
                                         predicted=predicted))
            return
        cost = estimate_cost(self.cfg.model, s, self.cfg.cluster, self.cost_params)
        spec = TrialSpec(model=self.cfg.model, strategy=s, train_steps=self.cfg.train_steps,
                         warmup_steps=self.cfg.warmup_steps, seed=self.cfg.seed,
                         gpu_peak_bf16_flops=self.cfg.cluster.gpu.peak_bf16_flops,
                         gpu_name=self.cfg.cluster.gpu.name)
        timeout = self.cfg.trial_timeout_s or trial_timeout_s(cost.step_time_s, spec)
        trial_dir = self.trial_root / str(trial.number)
        try:
            metrics = self.cfg.backend.run(spec, trial_dir, timeout)
            if metrics.launch_failed:
                metrics = self.relaunch(spec, trial_dir, timeout, metrics)
        except KeyboardInterrupt:
            store_record(trial, TrialRecord(
                number=trial.number, strategy=s, status=TrialStatus.INTERRUPTED, source=source,
                predicted_peak_bytes=peak, predicted_tokens_per_s=cost.tokens_per_s,
                predicted=predicted))
            raise  # run_one tells FAIL
        record = TrialRecord(number=trial.number, strategy=s, status=metrics.status,
                             source=source, reason=metrics.error or "", metrics=metrics,
                             predicted_peak_bytes=peak, predicted_tokens_per_s=cost.tokens_per_s,
                             predicted=predicted)
        self.tell(trial, record)
        if metrics.status is TrialStatus.OOM:
            self.bisect(s)
        elif record.tokens_per_s is not None and layout_key(s) in self.gate.oom_mbs:
            self.bisect(replace(s, mbs=self.gate.oom_mbs[layout_key(s)]))

    def relaunch(self, spec: TrialSpec, trial_dir: Path, timeout: float,
                 failed: TrialMetrics) -> TrialMetrics:
        """Launch once more when the first launch never reached its rendezvous: that says
        nothing about the layout (a port taken under torchrun, seen on 4 x H200). The first
        attempt's log is kept beside the second's, and its wall time is counted."""
        log.warning("trial %s: %s; launching it once more", trial_dir.name,
                    (failed.error or "").splitlines()[0])
        first_log = trial_dir / LOG_NAME
        if first_log.exists():
            first_log.replace(trial_dir / "log-launch-failed.txt")
        metrics = self.cfg.backend.run(spec, trial_dir, timeout)
        if failed.wall_time_s is not None and metrics.wall_time_s is not None:
            metrics = replace(metrics, wall_time_s=metrics.wall_time_s + failed.wall_time_s)
        return metrics

    def bisect(self, failed: Strategy) -> None:
        """After a real OOM, try a smaller micro-batch of the same layout (Alpa step 1); after
        a success below a known OOM, the middle micro-batch between the two (bisection)."""
        candidates = self.cfg.space.candidates.get("mbs", (failed.mbs,))
        smaller = next_smaller_mbs(candidates, failed.mbs, self.good_mbs.get(layout_key(failed)))
        if smaller is None:
            return
        retry = replace(failed, mbs=smaller)
        if _key(_params(retry, self.free)) in self.by_key and self.key(retry) not in self.seen:
            self.enqueue(retry, "oom-bisect", first=True)

    # -- the loop -------------------------------------------------------------------------
    def stop_reason(self, start: float) -> str | None:
        cfg = self.cfg
        if cfg.n_trials is not None and self.launched >= cfg.n_trials:
            return f"reached --trials {cfg.n_trials}"
        if cfg.time_budget_s is not None and time.monotonic() - start >= cfg.time_budget_s:
            return f"reached --time-budget {cfg.time_budget_s:g} s"
        if cfg.patience is not None and self.since_best >= cfg.patience:
            return f"{cfg.patience} trials without improvement (--patience)"
        return None

    def seed(self) -> None:
        if self.sampler == "grid":
            for s in self.valid:
                self.enqueue(s, "grid")
            return
        if self.sampler == "ranked":
            limit = self.cfg.n_trials or RANKED_DEFAULT
            for s in self.ranked_launchable()[:limit]:
                self.enqueue(s, "ranked")
            return
        # On resume the seeds already tried are skipped when asked (run_one), the rest still run.
        for s in alpa_seeds(self.valid, lambda s: self.gate.decide(s).launch, self.impl):
            self.enqueue(s, "alpa")

    def waiting(self) -> int:
        return len(self.queue)

    def run(self) -> SearchResult:
        start = time.monotonic()
        self.replay()
        if not self.cfg.backend.predicted:
            self.refit()
        self.seed()
        idle = 0
        try:
            while (reason := self.stop_reason(start)) is None:
                before = self.launched
                if not self.run_one():
                    reason = ("every layout of the grid was tried" if self.sampler == "grid"
                              else "every ranked layout was tried")
                    break
                idle = 0 if self.launched > before else idle + 1
                if idle >= self.cfg.max_idle_asks and self.waiting() == 0:
                    untried = [s for s in self.ranked_launchable()
                               if self.key(s) not in self.seen]
                    if not untried:
                        reason = "every layout predicted to fit has been tried"
                        break
                    self.enqueue(untried[0], "model")
                    idle = 0
            self.result.stop_reason = reason
        except KeyboardInterrupt:
            self.result.interrupted = True
            self.result.stop_reason = "interrupted (Ctrl-C); --resume continues the study"
        finally:
            self.persist()
        self.result.elapsed_s = time.monotonic() - start
        self.result.cost_params, self.result.fitted_on = self.cost_params, self.fitted_on
        return self.result

    def persist(self) -> None:
        """Write the in-memory trials of a predicted study to its storage."""
        if self.persistent is None:
            return
        new = [t for t in self.study.get_trials(deepcopy=False)[self.persisted:]
               if t.state.is_finished()]
        add_finished_trials(self.persistent, new)
        self.persisted += len(new)


def run_search(cfg: SearchConfig, observer: Observer | None = None) -> SearchResult:
    """Run (or resume) a study and return what happened."""
    return _Search(cfg, observer).run()
