"""What a search reports: one record per trial, the search's result, and their stored form.

A trial's record is stored in the study as one JSON-able user attribute (`record`), written by
`store_record` alone and read back by `read_record` alone: a resumed or shared search, report
and export all read it that way. The reader takes what every earlier version wrote: keys that
were added later (a layout field such as cross_entropy_fusion runs at its default), and the
DUPLICATE and INTERRUPTED records that versions before the typed record wrote without a layout.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.dimensions import plain
from autotune.errors import ConfigError
from autotune.inputs.bounds import FLOAT_MAX
from autotune.inputs.untrusted import shown
from autotune.layouts.layout import DIMENSIONS, Layout
from autotune.predict.cost import CostParams
from autotune.predict.trust import predicted_rank
from autotune.search.derive import DERIVE, DIVISORS
from autotune.specs.hardware import ClusterSpec
from autotune.trials.trial import StopReason, TrialMetrics, TrialStatus

__all__ = ["DERIVED_ATTR", "LAUNCHED", "RECORD_ATTR", "Figure", "Observer", "SearchResult",
           "Source", "TrialRecord", "rank_tokens", "read_record", "record_attrs", "store_record",
           "stored_derived", "stored_record"]


class Source(enum.StrEnum):
    """Who proposed a trial's layout."""

    ALPA = "alpa"
    """Alpa's heuristic seeds (autotune.search.heuristics)."""
    SAMPLER = "sampler"
    """Optuna's sampler (TPE)."""
    GRID = "grid"
    RANKED = "ranked"
    """The analytical model's best layouts, in order."""
    MODEL = "model"
    """The model's best untried layout, when the sampler keeps proposing nothing new or has just
    repeated a tried layout (Scheduler.after_repeat)."""
    OOM_BISECT = "oom-bisect"
    """A smaller micro-batch after a real OOM (Alpa's first step, by bisection)."""
    DERIVED = "derived"
    """The next rung of a derived lever's count (autotune.search.ladder): fewer recomputed
    layers after a fit with room left, more after an OOM."""
    PRECISION = "precision"
    """The leading bf16 layout's FP8 variant the model predicts fastest, measured next
    (TrialExecutor.follow_with_fp8): the leader is its loss guard twin."""
    UNPRICED = "unpriced"
    """The leader's variant in a lever the cost model does not price (the NaN checks), measured
    next (TrialExecutor.follow_unpriced): the model ranks the two alike."""
    USER = "user"
    """The user's own layout (SearchConfig.seeds, `--from-megatron`), tried first."""
    FINALIST = "finalist"
    """A finalist measured again before the search stops (autotune.search.finalists)."""

    @classmethod
    def read(cls, value: object) -> Source:
        """A stored source; one this version does not know reads as the sampler's."""
        try:
            return cls(str(value))
        except ValueError:
            return cls.SAMPLER

RECORD_ATTR = "record"
"""The trial's user attribute that holds its record."""
DERIVED_ATTR = "derived"
"""The user attribute of a queued trial that holds its derived values (the ladder's rung):
its parameters name the choice, this the count (autotune.search.layout_map)."""
LAUNCHED = (TrialStatus.OK, TrialStatus.OOM, TrialStatus.TIMEOUT, TrialStatus.CRASH,
            TrialStatus.NCCL_ERROR, TrialStatus.DIVERGED)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialRecord:
    """One trial of the study as the user sees it."""

    number: int
    layout: Layout
    status: TrialStatus
    source: Source
    reason: str = ""
    metrics: TrialMetrics | None = None
    predicted_peak_bytes: float | None = None
    predicted_tokens_per_s: float | None = None
    duplicate_of: int | None = None
    """The earlier trial of the same layout whose outcome this one repeats (or, DUPLICATE,
    that another searcher was running)."""
    predicted: bool = False
    """True when the figures come from the analytical models (a planning study)."""
    repeat_of: int | None = None
    """The trial whose layout this one measures again (a finalist's repeat,
    autotune.search.finalists): its figure joins that trial's, it is never ranked alone."""

    @property
    def launched(self) -> bool:
        return self.status in LAUNCHED and self.duplicate_of is None

    @property
    def tokens_per_s(self) -> float | None:
        ok = self.metrics is not None and self.metrics.status is TrialStatus.OK
        return self.metrics.tokens_per_s if ok and self.metrics else None

    @property
    def pruned_slow(self) -> bool:
        """Stopped timing once its first steps showed it could not come within the prune margin
        of the best (StopReason.SLOW): a real measurement, but of a layout below the best by
        construction and over fewer steps, so never the best nor on its Pareto front."""
        return self.metrics is not None and self.metrics.stop_reason is StopReason.SLOW

    @property
    def rankable(self) -> bool:
        """A figure that may be the best: measured (or simulated) to the end, not a duplicate."""
        return self.tokens_per_s is not None and self.duplicate_of is None \
            and self.repeat_of is None and not self.pruned_slow

    @property
    def noise(self) -> float:
        """The figure's own relative noise (TrialMetrics.noise; 0 without metrics)."""
        return self.metrics.noise if self.metrics is not None else 0.0

    @property
    def throttled(self) -> bool:
        """Measured while the GPU throttled (TrialMetrics.throttled)."""
        return self.metrics is not None and self.metrics.throttled

    @property
    def peak_bytes(self) -> int | None:
        """The measured (or simulated) peak memory per GPU; None without figures."""
        return self.metrics.peak_bytes if self.metrics is not None else None

    @property
    def label(self) -> str:
        return self.layout.describe()


@dataclass(frozen=True, slots=True, kw_only=True)
class Figure:
    """A layout's tokens/s over its runs (the trial and its repeats): the mean of the runs not
    measured while throttled (of all runs when every one was), and how sure that mean is."""

    tokens_per_s: float
    error: float
    """Relative standard error of the mean: the runs' spread / sqrt(runs) over two runs and
    more; with one run, its own timed steps' spread (TrialMetrics.noise)."""
    runs: tuple[float, ...]
    """Every run's tokens/s, the first trial's first."""
    throttled: bool
    """Every run counted was measured while the GPU throttled."""

    @classmethod
    def of(cls, records: list[TrialRecord]) -> Figure | None:
        measured = [r for r in records if r.tokens_per_s is not None]
        counted = [r for r in measured if not r.throttled] or measured
        if not counted:
            return None
        values = [r.tokens_per_s or 0.0 for r in counted]
        mean = sum(values) / len(values)
        if len(values) > 1:
            var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
            error = (var / len(values)) ** 0.5 / mean if mean > 0 else 0.0
        else:
            error = counted[0].noise
        return cls(tokens_per_s=mean, error=error,
                   runs=tuple(r.tokens_per_s or 0.0 for r in measured),
                   throttled=counted[0].throttled)


@dataclass(slots=True)
class SearchResult:
    study_name: str
    storage: str
    """Redacted storage URL."""
    records: list[TrialRecord] = field(default_factory=list)
    stop_reason: str = ""
    interrupted: bool = False
    valid_layouts: int = 0
    elapsed_s: float = 0.0
    cost_params: CostParams | None = None
    """The cost constants at the end: refitted to the measured trials once there are enough."""
    fitted_on: int = 0
    cluster: ClusterSpec | None = None
    """The GPUs searched: a predicted figure near their memory ranks lower (`rank_tokens`)."""

    def best(self, k: int = 5) -> list[TrialRecord]:
        """The k best rankable trials by their figure (their repeats' too, `figure`); a
        predicted one by `rank_tokens`; among equal figures the lighter layout, then the lower
        trial number, as the report and export rank (report.load.Study.complete_rows)."""
        ok = [r for r in self.records if r.rankable]
        # The repeats of all trials in one pass: a plan of thousands of trials asked each
        # record's own (a pass each) on every progress line.
        repeats: dict[int, list[TrialRecord]] = {}
        for r in self.records:
            if r.repeat_of is not None:
                repeats.setdefault(r.repeat_of, []).append(r)

        def tokens(record: TrialRecord) -> float:
            figure = Figure.of([record, *repeats.get(record.number, ())])
            return rank_tokens(record, figure.tokens_per_s if figure is not None else 0.0,
                               self.cluster)

        def peak(record: TrialRecord) -> float:
            peak = record.peak_bytes
            return float("inf") if peak is None else peak

        return sorted(ok, key=lambda r: (-tokens(r), peak(r), r.number))[:k]

    def repeats(self, record: TrialRecord) -> list[TrialRecord]:
        """The trials that measured `record`'s layout again, in order."""
        return [r for r in self.records if r.repeat_of == record.number]

    def figure(self, record: TrialRecord) -> Figure | None:
        """`record`'s tokens/s with its repeats' (Figure); None without a measured figure."""
        return Figure.of([record, *self.repeats(record)])

    def tokens(self, record: TrialRecord) -> float:
        """The tokens/s a ranking uses: the figure over the runs (0 without one)."""
        figure = self.figure(record)
        return figure.tokens_per_s if figure is not None else 0.0

    def count(self, status: TrialStatus) -> int:
        return sum(1 for r in self.records if r.status is status and r.duplicate_of is None)

    @property
    def launched(self) -> int:
        """Trials launched (or simulated) that this result holds."""
        return sum(1 for r in self.records if r.launched)


Observer = Callable[[TrialRecord, SearchResult], None]


def rank_tokens(record: TrialRecord, tokens: float, cluster: ClusterSpec | None) -> float:
    """What `record`'s figure `tokens` ranks by, in the search's ranking and the report's alike:
    measured, the figure; predicted, the figure less what the memory model's risk costs it
    within the cost model's resolution (autotune.predict.trust.predicted_rank)."""
    if not record.predicted or cluster is None:
        return tokens
    return predicted_rank(tokens, record.peak_bytes or record.predicted_peak_bytes, cluster,
                          record.layout.expandable_segments)


def record_attrs(record: TrialRecord) -> dict[str, Any]:
    """The record's stored form: one JSON-able dict. Its keys are a stored format that
    earlier studies share: "strategy" is the label (`describe()`), for people and tools
    reading the storage; "layout" holds the fields the reader rebuilds the layout from."""
    attrs: dict[str, Any] = {
        "status": record.status.value, "source": plain(record.source), "reason": record.reason,
        "strategy": record.label,
        "layout": {f: plain(getattr(record.layout, f)) for f in DIMENSIONS},
        "predicted_peak_bytes": record.predicted_peak_bytes,
        "predicted_tokens_per_s": record.predicted_tokens_per_s,
        "predicted": record.predicted,
    }
    if record.metrics is not None:
        attrs["metrics"] = record.metrics.to_dict()
    if record.duplicate_of is not None:
        attrs["duplicate_of"] = record.duplicate_of
    if record.repeat_of is not None:
        attrs["repeat_of"] = record.repeat_of
    return attrs


def store_record(trial: optuna.Trial, record: TrialRecord) -> None:
    """Write the record to its trial (one write per trial)."""
    trial.set_user_attr(RECORD_ATTR, record_attrs(record))


PLACEHOLDERS = (DERIVE, DIVISORS)
"""What a space offers in place of values; an INVALID record may hold one unresolved."""


def _tampered(number: int, what: str) -> ConfigError:
    return ConfigError(f"the study's record of trial {number} is not one autotune wrote: "
                       f"{what} (was study.db edited?)")


def _stored_layout(number: int, value: object, *, unresolved_ok: bool = False) -> Layout | None:
    """The stored layout. `unresolved_ok`: a space's placeholder (`derive`, `divisors`) may
    stand for a value, as autotune stores it for a layout that broke a rule before the value
    was resolved from the model (an INVALID record)."""
    if value is None:
        return None  # a DUPLICATE or INTERRUPTED record of a version before typed records
    if not isinstance(value, Mapping):
        raise _tampered(number, f"layout is {type(value).__name__}, not a mapping")
    # A field added after the record was written is absent: it ran at its default. A value
    # is held to what a space file may give (its type, its minimum), then to Megatron's rules
    # where the layout is used.
    for key in DIMENSIONS:
        if key in value:
            if unresolved_ok and value[key] in PLACEHOLDERS:
                continue
            problem = DIMENSIONS[key].check(value[key])
            if problem is not None:
                raise _tampered(number, f"layout.{key} must be {problem}, got "
                                        f"{shown(value[key])}")
    return Layout(**{f: value[f] for f in DIMENSIONS if f in value})


def _metrics(number: int, value: object) -> TrialMetrics | None:
    if value is None or value == {}:
        return None
    try:
        return TrialMetrics.from_dict(dict(value) if isinstance(value, Mapping) else value,
                                      source="metrics")
    except ConfigError as exc:
        raise _tampered(number, str(exc)) from None


def _number(number: int, key: str, value: object) -> float | None:
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) \
            or not math.isfinite(value) or not 0 <= value <= FLOAT_MAX:
        raise _tampered(number, f"{key} must be a finite number of at least 0, got "
                                f"{shown(value)}")
    return float(value)


def read_record(number: int, attrs: object,
                layout: Layout | None = None) -> TrialRecord | None:
    """The record of trial `number` from its stored form `attrs`. Its layout is `layout` when
    given (a search derives it from the trial's parameters), else the stored one. None when
    there is nothing to read: no record, a status this version does not know, or no layout
    (a DUPLICATE or INTERRUPTED record of an earlier version, and no `layout` given).
    ConfigError in one line when the record holds what autotune never writes (a tampered
    study: a string, NaN or a negative where a figure goes), rather than a wrong figure."""
    if not isinstance(attrs, Mapping):
        return None
    try:
        status = TrialStatus(str(attrs.get("status")))
    except ValueError:
        return None
    stored = _stored_layout(number, attrs.get("layout"),
                            unresolved_ok=status is TrialStatus.INVALID)
    layout = layout or stored
    if layout is None:
        return None
    raw_metrics = attrs.get("metrics")
    predicted = attrs.get("predicted", False)
    if isinstance(raw_metrics, Mapping):  # the metrics say it themselves where they exist
        predicted = raw_metrics.get("predicted", predicted)
    duplicate_of = attrs.get("duplicate_of")
    if duplicate_of is not None and (not isinstance(duplicate_of, int)
                                     or isinstance(duplicate_of, bool)
                                     or duplicate_of < 0):
        raise _tampered(number, f"duplicate_of must be a trial's number, got "
                                f"{shown(duplicate_of)}")
    repeat_of = attrs.get("repeat_of")
    if repeat_of is not None and (not isinstance(repeat_of, int)
                                  or isinstance(repeat_of, bool) or repeat_of < 0):
        raise _tampered(number, f"repeat_of must be a trial's number, got {shown(repeat_of)}")
    if not isinstance(predicted, bool):
        raise _tampered(number, f"predicted must be true or false, got {shown(predicted)}")
    return TrialRecord(number=number, layout=layout, status=status,
                       source=Source.read(attrs.get("source")),
                       reason=str(attrs.get("reason") or ""),
                       metrics=_metrics(number, raw_metrics),
                       predicted_peak_bytes=_number(number, "predicted_peak_bytes",
                                                    attrs.get("predicted_peak_bytes")),
                       predicted_tokens_per_s=_number(number, "predicted_tokens_per_s",
                                                      attrs.get("predicted_tokens_per_s")),
                       duplicate_of=duplicate_of, predicted=predicted, repeat_of=repeat_of)


def stored_derived(trial: FrozenTrial | optuna.Trial) -> dict[str, Any] | None:
    """The derived values a trial ran with: its record's layout once told, else what it was
    queued with (None: neither)."""
    attrs = trial.user_attrs
    record = attrs.get(RECORD_ATTR)
    if isinstance(record, Mapping) and isinstance(record.get("layout"), Mapping):
        return dict(record["layout"])
    queued = attrs.get(DERIVED_ATTR)
    return dict(queued) if isinstance(queued, Mapping) else None


def stored_record(trial: FrozenTrial, layout: Layout | None = None) -> TrialRecord | None:
    """`read_record` of a stored trial."""
    return read_record(trial.number, trial.user_attrs.get(RECORD_ATTR), layout)
