"""One trial, from the ask to the tell: gate, launch, and what its outcome teaches.

A proposal that breaks a Megatron rule is told INVALID; one already tried repeats that outcome
(a duplicate); one another searcher is running yields to it (DUPLICATE); one predicted not to fit
is told PREDICTED_OOM; one the model rules out (autotune.search.stop_rule) is told
PREDICTED_SLOW. Only the rest is launched, with a timeout from the predicted step time, the
adaptive timing of SearchConfig.stable_cv and the stop rule's prune threshold, and launched once
more when the launch never reached its rendezvous. A real OOM is pruned and teaches the gate
(autotune.predict.gate), and the micro-batch of its layout is bisected.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import optuna

from autotune.dimensions import Recompute, RecomputeMethod
from autotune.layouts.layout import DIMENSIONS, Layout, with_fields
from autotune.levers import unpriced
from autotune.predict.cost import CostEstimate, CostParams, estimate_cost
from autotune.predict.gate import MemoryGate, mbs_family
from autotune.predict.memory_memo import MemoryMemo
from autotune.search.backends import trial_timeout_s
from autotune.search.config import SearchConfig
from autotune.search.derive import DIVISORS, divisor_values
from autotune.search.heuristics import next_smaller_mbs
from autotune.search.ladder import Ladder
from autotune.search.layout_map import FrozenParams, LayoutMap
from autotune.search.ledger import LayoutQueue, Ledger
from autotune.search.loss_guard import (
    GUARD_STEPS,
    REFERENCE_STEPS,
    arithmetic,
    compare_losses,
    guarded,
    judged_from,
    lag_steps,
    long_enough,
    same_arithmetic,
    twin,
)
from autotune.search.records import SearchResult, Source, TrialRecord, stored_derived
from autotune.search.refit import refit_cost_params
from autotune.search.stop_rule import NOISE_MARGIN, PRUNE_MARGIN, ModelStop, format_tokens
from autotune.search.store import StudyStore
from autotune.trials.launchers import LOG_NAME
from autotune.trials.trial import TrialMetrics, TrialSpec, TrialStatus

__all__ = ["Knowledge", "SearchParts", "TrialExecutor"]

log = logging.getLogger(__name__)


class Knowledge:
    """What the trials taught: the memory gate (real OOMs), the largest micro-batch that ran
    per layout, and the cost constants refitted to measured step times."""

    def __init__(self, cfg: SearchConfig, result: SearchResult, *, refits: bool,
                 checked: Collection[Layout] = frozenset(),
                 costs: Mapping[Layout, CostEstimate] | None = None,
                 memory: MemoryMemo | None = None) -> None:
        """`checked`: layouts known to pass every rule (LayoutMap.checked), which the gate does
        not check again; `costs`: cost estimates at the default constants already made
        (LayoutMap.costs), taken where the search prices with those; `memory`: the memory
        estimates already made (LayoutMap.memory), of the search's model, cluster and memory
        constants, which the gate reads and adds to."""
        self.cfg = cfg
        self.checked = checked
        self.result = result
        self.refits = refits
        """Whether the figures are measurements to refit to (a plan's are the model's own)."""
        self.gate = MemoryGate(cfg.model, cfg.cluster, params=cfg.memory_params, memo=memory)
        self.cost_params: CostParams | None = cfg.cost_params
        self.fitted_on = 0
        self.good_mbs: dict[Layout, int] = {}
        """Per micro-batch family (gate.mbs_family), the largest micro-batch that ran."""
        self._estimates: dict[Layout, CostEstimate] = \
            dict(costs) if costs and cfg.cost_params is None else {}
        """The cost estimate per layout under the current cost constants (refit clears it)."""
        self.ladder = Ladder(cfg.model, cfg.cluster, cfg.space.derived, cfg.memory_params)
        """The derived levers' rungs (autotune.search.ladder)."""
        self._fits: dict[Layout, bool] = {}
        """The gate's verdict per layout until it learns an OOM: the stop rule ranks every
        valid layout before each trial, thousands on 8 GPUs."""

    def learn(self, record: TrialRecord, told: bool) -> None:
        """Ledger.note's learner: take in one record."""
        # Only measured peaks move a derived count: a plan's figures are the model's own.
        if record.duplicate_of is None and self.ladder.dims and not record.predicted:
            metrics = record.metrics
            measured = None if metrics is None else (metrics.device_used_bytes
                                                     or metrics.peak_bytes)
            self.ladder.learn(record.layout, record.status, measured)
        if record.status is TrialStatus.OOM and record.duplicate_of is None:
            noise = self.gate.record_oom(record.layout, record.predicted_peak_bytes)
            if noise:
                log.warning("trial %d: %s", record.number, noise)
            self._fits.clear()
        if record.tokens_per_s is not None:
            # Steps were measured, so it fit: an OOM predicted to need no more is noise.
            if self.gate.record_fit(record.predicted_peak_bytes, f"trial {record.number}"):
                self._fits.clear()
            measured = record.metrics.device_used_bytes if record.metrics is not None else None
            # NVML's device use against the prediction: the machine's bias (gate.py).
            if (not record.predicted and record.duplicate_of is None and measured
                    and record.predicted_peak_bytes
                    and self.gate.record_peak(record.predicted_peak_bytes, measured)):
                self._fits.clear()
            key = mbs_family(record.layout)
            self.good_mbs[key] = max(self.good_mbs.get(key, 0), record.layout.mbs)
            if told:
                self.refit()

    def refit(self) -> None:
        """Refit the cost constants to the study's measured step times once there are
        `refit_after` of them (and again with each new one), so that ranking and timeouts
        follow what this machine really does."""
        if not self.refits:
            return
        fitted = refit_cost_params(self.result, self.cfg.model, self.cfg.cluster,
                                   refit_after=self.cfg.refit_after, fitted_on=self.fitted_on,
                                   start=self.cost_params)
        if fitted is None:
            return
        self.cost_params, self.fitted_on = fitted
        self._estimates.clear()
        log.info("cost model refitted to %d measured trials", self.fitted_on)

    def predict(self, s: Layout) -> CostEstimate:
        return estimate_cost(self.cfg.model, s, self.cfg.cluster, self.cost_params)

    def estimate(self, s: Layout) -> CostEstimate:
        """predict(s), remembered until the next refit."""
        found = self._estimates.get(s)
        if found is None:
            found = self._estimates[s] = self.predict(s)
        return found

    def predicted_tokens(self, s: Layout) -> float:
        return self.estimate(s).tokens_per_s

    def predicted_terms(self, s: Layout) -> tuple[float, ...]:
        """The model's time terms of `s` (CostEstimate.terms), remembered until the refit."""
        return self.estimate(s).terms

    def fits(self, s: Layout) -> bool:
        found = self._fits.get(s)
        if found is None:
            found = self._fits[s] = self.gate.decide(s, checked=s in self.checked).launch
        return found

    def ranked_tokens(self, layouts: list[Layout]) -> list[tuple[Layout, float]]:
        """The layouts predicted to fit with their predicted tokens/s, fastest first."""
        fitting = [(s, self.predicted_tokens(s)) for s in layouts if self.fits(s)]
        return sorted(fitting, key=lambda pair: pair[1], reverse=True)

    def ranked(self, layouts: list[Layout]) -> list[Layout]:
        """The layouts predicted to fit, fastest predicted first."""
        return [s for s, _ in self.ranked_tokens(layouts)]

    def smaller_mbs(self, failed: Layout) -> Layout | None:
        """After a real OOM, the same layout with a smaller micro-batch (Alpa step 1); after a
        success below a known OOM, the middle micro-batch between the two (bisection)."""
        listed = self.cfg.space.candidates.get("mbs", (failed.mbs,))
        # `mbs: divisors`: every micro-batch that divides the layout's batch per rank.
        candidates = divisor_values("mbs", failed, self.cfg.model) if DIVISORS in listed \
            else listed
        smaller = next_smaller_mbs(candidates, failed.mbs, self.good_mbs.get(mbs_family(failed)))
        return None if smaller is None else replace(failed, mbs=smaller)


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchParts:
    """One search's parts that trial execution and scheduling share (autotune.search.loop
    builds them)."""

    cfg: SearchConfig
    layouts: LayoutMap
    store: StudyStore
    ledger: Ledger
    knowledge: Knowledge
    queue: LayoutQueue
    stop: ModelStop
    """What the model rules out (autotune.search.stop_rule)."""


_UNPRICED_DEFAULTS = {name: DIMENSIONS[name].default for name in unpriced()}
"""The unpriced levers' fields at their defaults: what a layout and its unpriced variants
share (TrialExecutor.unpriced_variants)."""


class TrialExecutor:
    """Gate, run and tell one asked trial (see the module)."""

    def __init__(self, parts: SearchParts) -> None:
        self.parts = parts
        self.trial_root = parts.cfg.results_dir / parts.store.name / "trials"
        self._references: dict[Layout, tuple[tuple[float | None, ...], str]] = {}
        """The FP8 loss guard's bf16 references run so far: losses and where they came from,
        per twin layout."""
        self._fp8_variants: dict[Layout, list[Layout]] | None = None
        self._unpriced_variants: dict[Layout, list[Layout]] | None = None

    def look(self, mine: int | None = None) -> dict[FrozenParams, int]:
        """Note the trials other searchers finished since the last look (so that their layouts
        count as tried and their OOMs teach the gate); return the layouts they are running,
        each with its smallest trial number (StudyStore.sync)."""
        finished, running = self.parts.store.sync(mine)
        for record in finished:
            self.parts.ledger.note(record, told=False)
        return running

    def tell(self, trial: optuna.Trial, record: TrialRecord) -> None:
        self.parts.store.tell(trial, record)
        self.parts.ledger.note(record)

    def finish(self, trial: optuna.Trial) -> None:
        """Gate, run and tell one asked trial."""
        p = self.parts
        source = Source.read(trial.user_attrs.get("source", Source.SAMPLER))
        predicted = p.cfg.backend.predicted
        s = p.layouts.layout(trial.params, stored_derived(trial))
        if s is None:
            self.tell(trial, TrialRecord(
                number=trial.number, layout=p.layouts.proposal(trial.params),
                status=TrialStatus.INVALID, source=source, predicted=predicted,
                reason="breaks a Megatron rule (autotune MODEL --dry-run lists them)"))
            return
        # Re-read the shared storage right before deciding: another searcher may have finished
        # this layout, or be running it, since the queue was checked.
        running = self.look(mine=trial.number)
        run = p.layouts.run_params(s)
        previous = p.ledger.seen.get(run)
        if previous is not None:
            self.tell(trial, replace(previous, number=trial.number, source=source,
                                     duplicate_of=previous.number))
            return
        other = running.get(run)
        if other is not None and other < trial.number:
            # The older trial runs it (the newer one yields, so exactly one of two racing
            # searchers launches). No outcome to copy yet: told FAIL, which TPE ignores and
            # dedupe does not count, and queued again in case the other searcher dies.
            p.store.tell(trial, TrialRecord(
                number=trial.number, layout=s, status=TrialStatus.DUPLICATE, source=source,
                duplicate_of=other, reason=f"running in trial {other}", predicted=predicted))
            p.queue.push(s, source)
            return
        # A rung of a derived lever is judged by its measured neighbour where it has one.
        evidence = p.knowledge.ladder.extrapolated(s) if source is Source.DERIVED else None
        decision = p.knowledge.gate.decide(s, evidence)
        peak = decision.memory.peak_bytes if decision.memory else None
        planned = TrialRecord(number=trial.number, layout=s, status=TrialStatus.OK,
                              source=source, predicted_peak_bytes=peak, predicted=predicted)
        if not decision.launch:
            assert decision.status is not None
            self.tell(trial, replace(planned, status=decision.status, reason=decision.reason))
            return
        cost = p.knowledge.predict(s)
        planned = replace(planned, predicted_tokens_per_s=cost.tokens_per_s)
        slow = p.stop.skip(s, cost.tokens_per_s)
        if slow is not None:
            self.tell(trial, replace(planned, status=TrialStatus.PREDICTED_SLOW, reason=slow))
            return
        self.launch(trial, planned, cost.step_time_s)

    def launch(self, trial: optuna.Trial, planned: TrialRecord, step_time_s: float) -> None:
        """Run a layout the gate and the stop rule let through (`step_time_s` predicted), tell
        its outcome, and bisect after an OOM."""
        s, cfg = planned.layout, self.parts.cfg
        spec = self.spec(s, slow_below=self.parts.stop.prune_below())
        timeout = cfg.trial_timeout_s or trial_timeout_s(step_time_s, spec)
        trial_dir = self.trial_root / str(trial.number)
        try:
            metrics = cfg.backend.run(spec, trial_dir, timeout)
            if metrics.launch_failed:
                metrics = self.relaunch(spec, trial_dir, timeout, metrics)
        except KeyboardInterrupt:
            self.parts.store.tell(trial, replace(planned, status=TrialStatus.INTERRUPTED))
            raise
        record = replace(planned, status=metrics.status, reason=metrics.error or "",
                         metrics=metrics)
        noise = self.parts.knowledge.gate.contradicted(planned.predicted_peak_bytes)
        if metrics.status is TrialStatus.OOM and noise:
            # Kept as an OOM, but the record says why it does not rule out other layouts.
            record = replace(record, reason=f"{record.reason}; {noise}" if record.reason
                             else noise)
        if record.pruned_slow:
            record = replace(record, reason=_pruned_reason(metrics, spec))
        if record.tokens_per_s is not None and guarded(s) and not cfg.backend.predicted:
            record = self.guard(record, trial_dir)
        self.tell(trial, record)
        oom_mbs = self.parts.knowledge.gate.oom_mbs
        if metrics.status is TrialStatus.OOM:
            self.bisect(s)
        elif record.tokens_per_s is not None and mbs_family(s) in oom_mbs:
            self.bisect(replace(s, mbs=oom_mbs[mbs_family(s)]))
        if metrics.status in (TrialStatus.OK, TrialStatus.OOM) and not record.pruned_slow:
            self.climb(s)
        self.follow_with_fp8(record)
        self.follow_unpriced(record)

    def guard(self, record: TrialRecord, trial_dir: Path) -> TrialRecord:
        """The FP8 loss guard (autotune.search.loss_guard) on a measured FP8 trial: failed as
        DIVERGED, with the numbers, when its losses leave its bf16 twin's; its verdict, or why
        there is none, joins the record's reason either way."""
        metrics = record.metrics
        assert metrics is not None
        if not metrics.losses:  # a backend or worker that records none: nothing to compare
            return replace(record, reason=_joined(record.reason,
                                                  "loss unchecked: the trial recorded no losses"))
        losses, source = self.reference(twin(record.layout), len(metrics.losses), trial_dir)
        needed = judged_from(record.layout)
        verdict = (compare_losses(metrics.losses, losses, lag=lag_steps(record.layout),
                                  min_steps=needed) if losses else None)
        if verdict is None:
            steps = min(len(metrics.losses), len(losses))
            why = (source if not losses else
                   f"too few steps to judge {record.layout.fp8_recipe} scaling past its "
                   f"first, lagging steps ({steps} of the {needed} needed)"
                   if steps < needed else "too few steps with a finite loss on both sides")
            return replace(record, reason=_joined(record.reason, f"loss unchecked: {why}"))
        said = f"{verdict.describe()}, {source}"
        if verdict.diverged:
            log.warning("trial %d: %s", record.number, said)
            return replace(record, status=TrialStatus.DIVERGED, reason=said,
                           metrics=replace(metrics, status=TrialStatus.DIVERGED))
        return replace(record, reason=_joined(record.reason, said))

    def reference(self, bf16: Layout, steps: int,
                  trial_dir: Path) -> tuple[tuple[float | None, ...], str]:
        """The bf16 twin's losses and where they come from: a trial of the search that ran
        it, else a short reference run launched for the purpose (kept for the next FP8 trial
        of the same twin); no losses, with why, when neither has them."""
        # Keyed by what trains alike: the reference of one derived rung serves the next
        # (session 26 on 4 x H200 ran a second reference for a recompute count one rung down).
        key = arithmetic(bf16)
        known = self._references.get(key)
        if known is not None:
            return known
        # The twin itself first, else a bf16 trial that trains alike (loss_guard.SAME_ARITHMETIC).
        records = self.parts.ledger.result.records
        for r in sorted(records, key=lambda r: r.layout != bf16):
            if (same_arithmetic(r.layout, bf16) and r.metrics is not None
                    and r.metrics.losses and long_enough(r.metrics.losses, steps)):
                return r.metrics.losses, f"twin: trial {r.number}"
        found = self._references[key] = self.reference_run(bf16, steps, trial_dir)
        return found

    def reference_run(self, bf16: Layout, steps: int,
                      trial_dir: Path) -> tuple[tuple[float | None, ...], str]:
        """The losses of a short bf16 run for the twin `bf16` (on reference_layout's layout),
        and where they come from; none, with why, where it cannot run or ran without them."""
        run = self.reference_layout(bf16)
        if run is None:
            return (), ("its bf16 twin is predicted not to fit, recomputed in full or not: no "
                        "reference run")
        cfg = self.parts.cfg
        spec = replace(self.spec(run, slow_below=None), warmup_steps=0, stable_cv=0.0,
                       train_steps=max(1, min(REFERENCE_STEPS, steps)))
        where = trial_dir / "bf16-twin"
        timeout = cfg.trial_timeout_s or trial_timeout_s(
            self.parts.knowledge.predict(run).step_time_s, spec)
        metrics = cfg.backend.run(spec, where, timeout)
        if metrics.status is not TrialStatus.OK or not metrics.losses:
            return (), f"its bf16 twin's reference run ended {metrics.status} ({where})"
        relieved = "" if run == bf16 else f", as {run.describe()}"
        return metrics.losses, f"twin: a {len(metrics.losses)}-step reference run{relieved}"

    def reference_layout(self, bf16: Layout) -> Layout | None:
        """The layout a reference run trains for the twin `bf16`: the twin itself where the
        memory gate launches it outside its error band, else the same arithmetic with every
        layer recomputed in full (loss_guard.SAME_ARITHMETIC: the losses are the twin's), when
        that is predicted smaller; None where the gate launches neither (a reference run that
        runs out of memory costs a launch and teaches nothing). The twin of an FP8 layout with
        FP8 parameters holds its weights in bf16, 1 B per parameter more: session 26's
        llama3-8b FP8 layout at 140.4 of 140.4 GiB on 4 x H200 had a twin that ran out of
        memory, leaving its loss unchecked."""
        gate = self.parts.knowledge.gate
        decision = gate.decide(bf16)
        if decision.launch and not decision.risky:
            return bf16
        relieved = replace(bf16, recompute=Recompute.FULL,
                           recompute_method=RecomputeMethod.UNIFORM, recompute_num_layers=1)
        other = gate.decide(relieved) if relieved != bf16 else decision
        if not other.launch:
            return bf16 if decision.launch else None
        if decision.launch and (other.memory is None or decision.memory is None
                                or other.memory.peak_bytes >= decision.memory.peak_bytes):
            return bf16
        return relieved

    def spec(self, s: Layout, *, slow_below: float | None) -> TrialSpec:
        cfg = self.parts.cfg
        return TrialSpec(model=cfg.model, layout=s, train_steps=cfg.train_steps,
                         warmup_steps=cfg.warmup_steps, seed=cfg.seed,
                         gpu_peak_bf16_flops=cfg.cluster.gpu.peak_bf16_flops,
                         gpu_name=cfg.cluster.gpu.name, stable_cv=cfg.stable_cv,
                         slow_below_tokens_per_s=slow_below,
                         # The loss guard judges the end of a guarded trial's loss series,
                         # against a bf16 twin that must reach as far (long_enough).
                         min_steps=GUARD_STEPS if guarded(s) or self.fp8_variants(s) else 0)

    def remeasure(self, trial: optuna.Trial, original: TrialRecord, *, fresh: bool) -> None:
        """Measure `original`'s layout again as trial `trial` (a finalist's repeat,
        autotune.search.finalists): timed to its end (never pruned slow), in a fresh process
        when `fresh` and the backend keeps processes between trials (`run_fresh`), and told
        as a repeat of `original`."""
        cfg = self.parts.cfg
        s = original.layout
        spec = self.spec(s, slow_below=None)
        timeout = cfg.trial_timeout_s or trial_timeout_s(
            self.parts.knowledge.predict(s).step_time_s, spec)
        trial_dir = self.trial_root / str(trial.number)
        planned = TrialRecord(number=trial.number, layout=s, status=TrialStatus.OK,
                              source=Source.FINALIST, repeat_of=original.number,
                              predicted_peak_bytes=original.predicted_peak_bytes,
                              predicted_tokens_per_s=original.predicted_tokens_per_s)
        run_fresh = getattr(cfg.backend, "run_fresh", None) if fresh else None
        try:
            metrics = (run_fresh or cfg.backend.run)(spec, trial_dir, timeout)
            if metrics.launch_failed:
                metrics = self.relaunch(spec, trial_dir, timeout, metrics)
        except KeyboardInterrupt:
            self.parts.store.tell(trial, replace(planned, status=TrialStatus.INTERRUPTED))
            raise
        self.tell(trial, replace(planned, status=metrics.status, reason=metrics.error or "",
                                 metrics=metrics))

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
        metrics = self.parts.cfg.backend.run(spec, trial_dir, timeout)
        if failed.wall_time_s is not None and metrics.wall_time_s is not None:
            metrics = replace(metrics, wall_time_s=metrics.wall_time_s + failed.wall_time_s)
        return metrics

    def bisect(self, failed: Layout) -> None:
        """Queue the next micro-batch of `failed`'s layout to try (Knowledge.smaller_mbs) first,
        when it is a valid layout not tried yet."""
        p = self.parts
        retry = p.knowledge.smaller_mbs(failed)
        if retry is not None and p.layouts.is_valid(retry) and not p.ledger.tried(retry):
            p.queue.push(retry, Source.OOM_BISECT, first=True)


    def climb(self, s: Layout) -> None:
        """Queue the next rung of `s`'s derived lever (autotune.search.ladder) first, when
        there is one not tried yet."""
        p = self.parts
        knowledge = p.knowledge
        rung = knowledge.ladder.next_rung(s, capacity_bytes=knowledge.gate.capacity_bytes())
        if rung is not None and rung != s and not p.ledger.tried(rung):
            log.info("derived %s: next rung %s", s.describe(), rung.describe())
            p.queue.push(rung, Source.DERIVED, first=True)

    def leads(self, record: TrialRecord) -> bool:
        """Whether a real trial measured to its end at the best figure, within its own noise:
        the leader whose variants the model cannot rank (FP8's, the unpriced levers') are
        measured next."""
        tokens = record.tokens_per_s
        if (tokens is None or record.pruned_slow or record.status is not TrialStatus.OK
                or self.parts.cfg.backend.predicted):
            return False
        return tokens >= self.parts.ledger.best_tokens * (1 - NOISE_MARGIN * record.noise)

    def fp8_variants(self, s: Layout) -> list[Layout]:
        """The valid layouts of the space that are `s` with FP8 on (each recipe and parameter
        gather the space offers): those whose loss guard twin trains as `s` does
        (loss_guard.twin, loss_guard.arithmetic). Not only `s`'s own fields: a derived count
        may differ with FP8 on (FP8's weight copies need more layers recomputed:
        autotune.search.space raises it), and `s` judges those variants' losses all the same."""
        if self._fp8_variants is None:
            variants: dict[Layout, list[Layout]] = {}
            for v in self.parts.layouts.valid:
                if guarded(v):
                    variants.setdefault(arithmetic(twin(v)), []).append(v)
            self._fp8_variants = variants
        return self._fp8_variants.get(arithmetic(s), [])

    def follow_with_fp8(self, record: TrialRecord) -> None:
        """After a bf16 trial measured at the best figure (within its noise), queue first the
        FP8 variant of the same layout the refitted model predicts fastest, where it predicts
        it faster and to fit.

        Megatron's practice, and so Alpa's seeds, is bf16 (autotune.levers.fp8), and a sampler
        left to find FP8 on its own may not reach the fastest FP8 layout in a search of few,
        long trials: on 4 x H200 a llama3-8b search measured six FP8 layouts in 720 s, none
        of them the leader's own FP8 variant (2026-11-28-h200x4-issue30-s16.md). Measured
        right after the leader, the variant is judged against the leader's own losses (its
        loss guard twin: no reference run)."""
        s = record.layout
        if guarded(s) or not self.leads(record):
            return
        knowledge, ledger = self.parts.knowledge, self.parts.ledger
        untried = [v for v in self.fp8_variants(s) if not ledger.tried(v) and knowledge.fits(v)]
        if not untried:
            return
        fastest = max(untried, key=knowledge.predicted_tokens)
        if knowledge.predicted_tokens(fastest) > knowledge.predicted_tokens(s):
            log.info("%s leads in bf16: its FP8 variant %s next", s.describe(),
                     fastest.describe())
            self.parts.queue.push(fastest, Source.PRECISION, first=True)

    def unpriced_variants(self, s: Layout) -> list[Layout]:
        """The valid layouts of the space that differ from `s` only in fields of the levers the
        cost model does not price (autotune.levers.unpriced), `s` itself excluded."""
        if self._unpriced_variants is None:
            variants: dict[Layout, list[Layout]] = {}
            for v in self.parts.layouts.valid:
                variants.setdefault(with_fields(v, **_UNPRICED_DEFAULTS), []).append(v)
            self._unpriced_variants = variants
        key = with_fields(s, **_UNPRICED_DEFAULTS)
        return [v for v in self._unpriced_variants.get(key, []) if v != s]

    def follow_unpriced(self, record: TrialRecord) -> None:
        """After a trial measured at the best figure (within its noise), queue first its
        untried variants in the levers the cost model does not price, where the space lists
        them and they fit: the model predicts them as fast as the leader, so a search led by
        it may never measure them. On 2 x H200 a gpt2-xl search whose space listed the NaN
        checks both ways ended on a checked layout whose unchecked variant it never ran, 2%
        faster measured apart (2026-11-29-h200x2-nan-checks-s27.md)."""
        if not self.leads(record):
            return
        s, knowledge, ledger = record.layout, self.parts.knowledge, self.parts.ledger
        for v in self.unpriced_variants(s):
            if not ledger.tried(v) and knowledge.fits(v):
                log.info("%s leads: its unpriced variant %s next", s.describe(), v.describe())
                self.parts.queue.push(v, Source.UNPRICED, first=True)


def _joined(reason: str, more: str) -> str:
    return f"{reason}; {more}" if reason else more


def _pruned_reason(metrics: TrialMetrics, spec: TrialSpec) -> str:
    """The reason of a trial pruned slow: after how many steps, at what figure, below what."""
    steps = "?" if metrics.timed_steps is None else str(metrics.timed_steps)
    tokens = "" if metrics.tokens_per_s is None else \
        f" at {format_tokens(metrics.tokens_per_s)} tokens/s"
    below = "" if spec.slow_below_tokens_per_s is None else \
        f", below {format_tokens(spec.slow_below_tokens_per_s)} " \
        f"(the best measured less the prune margin, at least {PRUNE_MARGIN:.0%})"
    return f"pruned slow after {steps} steps{tokens}{below}"
