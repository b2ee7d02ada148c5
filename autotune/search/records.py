"""What a search reports: one record per trial, the search's result, and their stored form.

A trial's record is stored in the study as one JSON-able user attribute (`record`), which
report, export and a resumed or shared search read back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autotune.cost import CostParams
from autotune.strategy import Strategy
from autotune.trial import TrialMetrics, TrialStatus

__all__ = ["LAUNCHED", "Observer", "SearchResult", "TrialRecord", "record_from_attrs",
           "record_to_attrs"]

LAUNCHED = (TrialStatus.OK, TrialStatus.OOM, TrialStatus.TIMEOUT, TrialStatus.CRASH,
            TrialStatus.NCCL_ERROR)


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
