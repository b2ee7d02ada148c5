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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import TrialState

from autotune.backends import Backend, te_available, trial_timeout_s
from autotune.calibration import fit_cost_params
from autotune.cost import CostParams, estimate_cost
from autotune.errors import ConfigError
from autotune.gate import MemoryGate, layout_key
from autotune.hardware import ClusterSpec
from autotune.heuristics import alpa_seeds, next_smaller_mbs
from autotune.memory import MemoryParams
from autotune.model import ModelSpec
from autotune.search.storage import (
    DIRECTIONS,
    default_study_name,
    fail_stale,
    heartbeat,
    open_study,
    redact_url,
    storage_url,
)
from autotune.space import SearchSpace, enumerate_space
from autotune.strategy import Strategy
from autotune.trial import TrialMetrics, TrialSpec, TrialStatus

__all__ = ["SearchConfig", "SearchResult", "TrialRecord", "run_search"]

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)

LAUNCHED = (TrialStatus.OK, TrialStatus.OOM, TrialStatus.TIMEOUT, TrialStatus.CRASH,
            TrialStatus.NCCL_ERROR)
_GIB = 2**30
GRID_LIMIT = 3000
RANKED_DEFAULT = 200
REFIT_FIELDS = ("gemm_efficiency_max", "step_overhead_s", "layer_launch_s")
"""Constants refitted during a search: few, so a handful of trials pins them down."""
"""Layouts the ranked sampler tries when --trials is not given."""
"""With predictions, spaces of at most this many valid layouts are searched exhaustively."""
SHARED_POLL_S = 0.5
"""A worker whose queued layouts are all running in other workers looks again this often."""
PARAMS_WAIT_S = 2.0
"""How long to wait for an older RUNNING trial's parameters to appear (see _Search.sync)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchConfig:
    model: ModelSpec
    cluster: ClusterSpec
    space: SearchSpace
    backend: Backend
    results_dir: Path = Path("results")
    study_name: str | None = None
    storage: str | None = None
    """An Optuna RDB URL (postgresql://...); default SQLite at results/<study>/study.db."""
    sampler: str = "auto"
    """tpe (after Alpa's seeds), grid (every valid layout), ranked (the model's best first), or
    auto: tpe for real trials; for predictions grid when the space is small, else ranked."""
    n_trials: int | None = None
    """Stop once the study holds this many launched (or simulated) trials; a resumed study
    counts the ones it already has."""
    time_budget_s: float | None = None
    patience: int | None = None
    """Stop after this many launched trials without a better tokens/s."""
    resume: bool = False
    seed: int = 0
    train_steps: int = 10
    warmup_steps: int = 3
    trial_timeout_s: float | None = None
    """Per-trial timeout; default derived from the predicted step time."""
    cost_params: CostParams | None = None
    memory_params: MemoryParams | None = None
    """Fitted constants (autotune calibrate --output FILE, then --calibration FILE)."""
    refit_after: int = 4
    """With this many measured trials, the cost constants are refitted to them, and the
    model that ranks and times the next trials is the fitted one (0: never)."""
    max_idle_asks: int = 40
    """Consecutive proposals that launch nothing before the model's best untried layout is
    enqueued instead."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialRecord:
    """One trial of the study as the user sees it."""

    number: int
    strategy: Strategy
    status: TrialStatus
    source: str
    reason: str = ""
    metrics: TrialMetrics | None = None
    predicted_peak_bytes: float | None = None
    predicted_tokens_per_s: float | None = None
    duplicate_of: int | None = None

    @property
    def launched(self) -> bool:
        return self.status in LAUNCHED and self.duplicate_of is None

    @property
    def tokens_per_s(self) -> float | None:
        ok = self.metrics is not None and self.metrics.status is TrialStatus.OK
        return self.metrics.tokens_per_s if ok and self.metrics else None


@dataclass(slots=True)
class SearchResult:
    study_name: str
    storage: str
    """Redacted storage URL."""
    records: list[TrialRecord] = field(default_factory=list)
    stop_reason: str = ""
    interrupted: bool = False
    valid_strategies: int = 0
    elapsed_s: float = 0.0
    cost_params: CostParams | None = None
    """The cost constants at the end: refitted to the measured trials once there are enough."""
    fitted_on: int = 0

    def best(self, k: int = 5) -> list[TrialRecord]:
        ok = [r for r in self.records if r.tokens_per_s is not None and r.duplicate_of is None]
        return sorted(ok, key=lambda r: -(r.tokens_per_s or 0.0))[:k]

    def count(self, status: TrialStatus) -> int:
        return sum(1 for r in self.records if r.status is status and r.duplicate_of is None)


Observer = Callable[[TrialRecord, SearchResult], None]


def _params(strategy: Strategy, free: dict[str, tuple[Any, ...]]) -> dict[str, Any]:
    return {dim: getattr(strategy, dim) for dim in free}


def _key(params: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted(params.items()))


def _sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        # Multivariate TPE models the interactions (tp x pp x mbs) that decide memory and speed.
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=8,
                                          constant_liar=True)
    if name in ("grid", "ranked"):
        return optuna.samplers.RandomSampler(seed=seed)  # unused: every trial is enqueued
    raise ConfigError(f"unknown sampler {name!r}; choose tpe, grid or ranked")


class _Search:
    def __init__(self, cfg: SearchConfig, observer: Observer | None) -> None:
        self.cfg = cfg
        self.observer = observer
        summary = enumerate_space(cfg.space, cfg.model, cfg.cluster)
        if not summary.valid:
            raise ConfigError(f"no valid layout of {cfg.model.name} on "
                              f"{cfg.cluster.num_gpus} GPUs in this search space")
        self.valid = summary.valid
        dims = {d: tuple(summary.valid_values(d)) for d in cfg.space.candidates}
        self.free = {d: v for d, v in dims.items() if len(v) > 1}
        self.fixed = {d: v[0] for d, v in dims.items() if len(v) == 1}
        self.distributions: dict[str, BaseDistribution] = {
            d: CategoricalDistribution(list(v)) for d, v in self.free.items()}
        self.by_key = {_key(_params(s, self.free)): s for s in self.valid}
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
        self.sampler = cfg.sampler
        if self.sampler == "auto":
            small = len(self.valid) <= GRID_LIMIT
            self.sampler = "tpe" if not cfg.backend.predicted else ("grid" if small
                                                                   else "ranked")
        name = cfg.study_name or default_study_name(cfg.model, cfg.cluster, cfg.space,
                                                    cfg.backend.name)
        url = storage_url(cfg.results_dir, name, cfg.storage)
        self.trial_root = cfg.results_dir / name / "trials"
        sampler = _sampler(self.sampler, cfg.seed)
        self.persistent: optuna.Study | None = None
        self.persisted = 0
        if cfg.backend.predicted:
            # Predictions cost microseconds; a storage round trip per trial would dominate. The
            # study runs in memory and its trials are written in one pass at the end.
            # Predictions are deterministic: running the same planning job again continues (and
            # so shows) the stored study instead of refusing; --resume stays strict.
            self.persistent = open_study(name, url, sampler, resume=cfg.resume or None,
                                         heartbeat=False)
            self.study = optuna.create_study(directions=list(DIRECTIONS), sampler=sampler)
            finished = [t for t in self.persistent.get_trials(deepcopy=False)
                        if t.state.is_finished()]
            self.study.add_trials(finished)
            self.persisted = len(finished)
        else:
            self.study = open_study(name, url, sampler, resume=cfg.resume, heartbeat=True)
        self.queue: deque[tuple[Strategy, str]] = deque()
        self.describe_study(self.persistent or self.study)
        self.last_told: int | None = None
        self.result = SearchResult(study_name=name, storage=redact_url(url),
                                   valid_strategies=len(self.valid))

    def describe_study(self, study: optuna.Study) -> None:
        """What the study is about, for report, export and optuna-dashboard."""
        cluster = self.cfg.cluster
        study.set_user_attr("model", asdict(self.cfg.model))
        study.set_user_attr("cluster", {"num_gpus": cluster.num_gpus,
                                        "gpus_per_node": cluster.gpus_per_node,
                                        "gpu": cluster.gpu.name})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # set_metric_names is experimental in Optuna 5
            study.set_metric_names(["tokens_per_s", "peak_memory_gib"])

    # -- strategies -----------------------------------------------------------------------
    def strategy(self, params: dict[str, Any]) -> Strategy | None:
        return self.by_key.get(_key({d: params[d] for d in self.free}))

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
            attrs = frozen.user_attrs.get("record")
            if frozen.state not in (TrialState.COMPLETE, TrialState.PRUNED) or not attrs:
                continue
            s = self.strategy(frozen.params)
            if s is None:
                continue
            self.note_stored(frozen.number, s, attrs)

    def note_stored(self, number: int, s: Strategy, attrs: dict[str, Any]) -> None:
        """Note a trial read back from storage (resume, or another worker's result)."""
        record = record_from_attrs(number, s, attrs)
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
        states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
        deadline = time.monotonic() + PARAMS_WAIT_S
        while True:
            trials = self.study.get_trials(deepcopy=False, states=states)
            running: dict[tuple[Any, ...], int] = {}
            pending = False
            for t in trials:
                if t.number == mine:
                    continue
                if t.state is TrialState.RUNNING:
                    # An enqueued layout is known from its creation (fixed_params).
                    params = t.params if len(t.params) == len(self.free) else \
                        t.system_attrs.get("fixed_params", {})
                    if not set(self.free) <= set(params):
                        if mine is not None and t.number < mine and \
                                t.number not in self.paramless:
                            pending = True
                            if time.monotonic() >= deadline:
                                self.paramless.add(t.number)
                        continue
                    key = _key({d: params[d] for d in self.free})
                    running[key] = min(running.get(key, t.number), t.number)
                elif t.number not in self.known and t.user_attrs.get("record"):
                    s = self.strategy(t.params)
                    if s is not None:
                        self.note_stored(t.number, s, t.user_attrs["record"])
            if not pending or time.monotonic() >= deadline:
                return running
            time.sleep(0.05)

    def note(self, record: TrialRecord, *, count_launch: bool = True) -> None:
        self.known.add(record.number)
        self.result.records.append(record)
        if record.duplicate_of is None:
            self.seen.setdefault(_key(_params(record.strategy, self.free)), record)
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
        measured = [(self.cfg.model, r.strategy, self.cfg.cluster, r.metrics.step_time_s)
                    for r in self.result.records
                    if r.duplicate_of is None and r.tokens_per_s is not None and r.metrics
                    and r.metrics.step_time_s]
        if not self.cfg.refit_after or len(measured) < self.cfg.refit_after or \
                len(measured) == self.fitted_on:
            return
        start = self.cost_params or CostParams()
        self.cost_params = fit_cost_params(measured, names=REFIT_FIELDS, start=start)
        self.fitted_on = len(measured)
        log.info("cost model refitted to %d measured trials", len(measured))

    def enqueue(self, s: Strategy, source: str, *, first: bool = False) -> None:
        """Queue a layout for a coming trial. The queue lives here, not in the study, so that
        a grid of thousands costs nothing until each trial is asked for."""
        if first:
            self.queue.appendleft((s, source))
        else:
            self.queue.append((s, source))

    # -- one trial ------------------------------------------------------------------------
    def tell(self, trial: optuna.Trial, record: TrialRecord) -> None:
        trial.set_user_attr("record", record_to_attrs(record, self.cfg.backend.predicted))
        capacity = self.cfg.cluster.gpu.memory_bytes
        m = record.metrics
        if record.tokens_per_s is not None and m is not None:
            peak = m.peak_reserved_bytes or m.peak_allocated_bytes or 0
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
            key = _key(_params(queued, self.free))
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
        s = self.strategy(trial.params)
        if s is None:
            params = {**trial.params, **self.fixed}
            record = TrialRecord(number=trial.number,
                                 strategy=Strategy(gbs=self.cfg.model.global_batch_size,
                                                   **{k: v for k, v in params.items()
                                                      if k in Strategy.__dataclass_fields__}),
                                 status=TrialStatus.INVALID, source=source,
                                 reason="breaks a Megatron rule (autotune MODEL --dry-run "
                                        "lists them)")
            self.tell(trial, record)
            return
        # Re-read the shared storage right before deciding: another worker may have finished
        # this layout, or be running it, since the queue was checked.
        running = self.sync(mine=trial.number)
        previous = self.seen.get(_key(trial.params))
        if previous is not None:
            self.tell(trial, replace(previous, number=trial.number, source=source,
                                     duplicate_of=previous.number))
            return
        other = running.get(_key(trial.params))
        if other is not None and other < trial.number:
            # The older trial runs it (the newer one yields, so exactly one of two racing
            # workers launches). No outcome to copy yet: told FAIL, which TPE ignores and
            # dedupe does not count, and queued again in case the other worker dies.
            trial.set_user_attr("record", {"status": "DUPLICATE", "source": source,
                                           "strategy": s.describe(), "duplicate_of": other,
                                           "reason": f"running in trial {other}"})
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
                                         reason=decision.reason, predicted_peak_bytes=peak))
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
        except KeyboardInterrupt:
            trial.set_user_attr("record", {"status": "INTERRUPTED", "source": source,
                                           "strategy": s.describe()})
            raise  # run_one tells FAIL
        record = TrialRecord(number=trial.number, strategy=s, status=metrics.status,
                             source=source, reason=metrics.error or "", metrics=metrics,
                             predicted_peak_bytes=peak, predicted_tokens_per_s=cost.tokens_per_s)
        self.tell(trial, record)
        if metrics.status is TrialStatus.OOM:
            self.bisect(s)
        elif record.tokens_per_s is not None and layout_key(s) in self.gate.oom_mbs:
            self.bisect(replace(s, mbs=self.gate.oom_mbs[layout_key(s)]))

    def bisect(self, failed: Strategy) -> None:
        """After a real OOM, try a smaller micro-batch of the same layout (Alpa step 1); after
        a success below a known OOM, the middle micro-batch between the two (bisection)."""
        candidates = self.cfg.space.candidates.get("mbs", (failed.mbs,))
        smaller = next_smaller_mbs(candidates, failed.mbs, self.good_mbs.get(layout_key(failed)))
        if smaller is None:
            return
        retry = replace(failed, mbs=smaller)
        if _key(_params(retry, self.free)) in self.by_key and \
                _key(_params(retry, self.free)) not in self.seen:
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
                               if _key(_params(s, self.free)) not in self.seen]
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
        self.persistent.add_trials(new)
        self.persisted += len(new)


def run_search(cfg: SearchConfig, observer: Observer | None = None) -> SearchResult:
    """Run (or resume) a study and return what happened."""
    return _Search(cfg, observer).run()


def record_to_attrs(record: TrialRecord, predicted: bool) -> dict[str, Any]:
    """The trial's record as one JSON-able user attribute (one write per trial)."""
    attrs: dict[str, Any] = {
        "status": record.status.value, "source": record.source, "reason": record.reason,
        "strategy": record.strategy.describe(),
        "layout": {f: getattr(record.strategy, f) for f in Strategy.__dataclass_fields__},
        "predicted_peak_bytes": record.predicted_peak_bytes,
        "predicted_tokens_per_s": record.predicted_tokens_per_s,
        "predicted": predicted,
    }
    if record.metrics is not None:
        attrs["metrics"] = record.metrics.to_dict()
    if record.duplicate_of is not None:
        attrs["duplicate_of"] = record.duplicate_of
    return attrs


def record_from_attrs(number: int, strategy: Strategy, attrs: dict[str, Any]) -> TrialRecord:
    metrics = TrialMetrics.from_dict(attrs["metrics"]) if attrs.get("metrics") else None
    return TrialRecord(number=number, strategy=strategy, status=TrialStatus(attrs["status"]),
                       source=attrs.get("source", "sampler"), reason=attrs.get("reason", ""),
                       metrics=metrics, predicted_peak_bytes=attrs.get("predicted_peak_bytes"),
                       predicted_tokens_per_s=attrs.get("predicted_tokens_per_s"),
                       duplicate_of=attrs.get("duplicate_of"))
