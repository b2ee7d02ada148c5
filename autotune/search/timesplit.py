"""Where a real search's time went: launch and build, warm-up, timed steps, failed trials, and
the share of trials pruned slow; and how many layouts the model skipped without a launch.

The search's end-of-run summary, `autotune search --json` and `autotune report` read the same
split from the trials' records (TrialMetrics wall_time_s, warmup_s, timed_s, stop_reason).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from autotune.search.records import TrialRecord
from autotune.trials.trial import TrialStatus

__all__ = ["TimeSplit", "overhead_s", "time_split"]


def overhead_s(record: TrialRecord) -> float | None:
    """A measured trial's wall time beyond its timed steps (launch, build, warm-up); None
    without both figures."""
    m = record.metrics
    if m is None or m.predicted or m.wall_time_s is None or m.timed_s is None:
        return None
    return max(m.wall_time_s - m.timed_s, 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeSplit:
    """Seconds of the launched trials' wall time by phase (they add up to `wall_s`)."""

    trials: int = 0
    """Launched trials with a wall time."""
    wall_s: float = 0.0
    launch_s: float = 0.0
    """Launch and build: wall time less warm-up and timed steps, of trials that ran."""
    warmup_s: float = 0.0
    timed_s: float = 0.0
    failed_s: float = 0.0
    """Wall time of trials that ended without a measurement (OOM, timeout, crash)."""
    unsplit_s: float = 0.0
    """Wall time of measured trials without phase figures (earlier versions, Megatron-LM)."""
    pruned_trials: int = 0
    pruned_s: float = 0.0
    """Wall time of the trials pruned slow (part of the phases above)."""
    skipped: int = 0
    """Layouts recorded PREDICTED_SLOW and never launched."""

    def describe(self) -> str:
        """One line: `trials' wall time 312 s over 8 launched: launch+build 180 s (58%), ...`;
        empty when nothing was launched nor skipped (a plan)."""
        parts: list[str] = []
        if self.trials:
            def share(label: str, seconds: float) -> str:
                return f"{label} {seconds:,.0f} s ({seconds / self.wall_s:.0%})" \
                    if self.wall_s else f"{label} {seconds:,.0f} s"

            phases = [share("launch+build", self.launch_s), share("warm-up", self.warmup_s),
                      share("timed", self.timed_s)]
            phases += [share("failed trials", self.failed_s)] if self.failed_s else []
            phases += [share("not split", self.unsplit_s)] if self.unsplit_s else []
            parts.append(f"trials' wall time {self.wall_s:,.0f} s over {self.trials} launched: "
                         + ", ".join(phases))
            if self.pruned_trials:
                parts.append(f"{self.pruned_trials} pruned slow ({self.pruned_s:,.0f} s)")
        if self.skipped:
            parts.append(f"{self.skipped} layouts skipped as predicted slow")
        return "; ".join(parts)


def time_split(records: Iterable[TrialRecord]) -> TimeSplit:
    """The split of the measured trials in `records` (duplicates and predictions left out)."""
    seconds: dict[str, float] = dict.fromkeys(
        ("wall", "launch", "warmup", "timed", "failed", "unsplit", "pruned"), 0.0)
    trials = pruned = 0
    skipped: set[str] = set()
    ran: set[str] = set()
    for r in records:
        if r.duplicate_of is not None or r.predicted:
            continue
        if r.status is TrialStatus.PREDICTED_SLOW:
            skipped.add(r.label)
            continue
        m = r.metrics
        if not r.launched or m is None or m.wall_time_s is None:
            continue
        ran.add(r.label)
        trials += 1
        wall = m.wall_time_s
        seconds["wall"] += wall
        if r.tokens_per_s is None:
            seconds["failed"] += wall
        elif m.timed_s is None:
            seconds["unsplit"] += wall
        else:
            warmup = m.warmup_s or 0.0
            seconds["warmup"] += warmup
            seconds["timed"] += m.timed_s
            seconds["launch"] += max(wall - warmup - m.timed_s, 0.0)
        if r.pruned_slow:
            pruned += 1
            seconds["pruned"] += wall
    return TimeSplit(trials=trials, wall_s=seconds["wall"], launch_s=seconds["launch"],
                     warmup_s=seconds["warmup"], timed_s=seconds["timed"],
                     failed_s=seconds["failed"], unsplit_s=seconds["unsplit"],
                     pruned_trials=pruned, pruned_s=seconds["pruned"],
                     skipped=len(skipped - ran))
