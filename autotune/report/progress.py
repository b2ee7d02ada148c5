"""Live progress of a search in the terminal (rich): a bar, the recent trials (how each stopped
timing, its overhead), the layouts the model skipped, the best so far."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from autotune.layouts.layout import Layout
from autotune.report.pareto import ties_text, twin_groups
from autotune.report.similar import similar_groups
from autotune.search.records import SearchResult, TrialRecord
from autotune.search.timesplit import overhead_s
from autotune.trials.trial import TrialStatus

__all__ = ["LiveProgress", "best_groups", "best_table", "format_record"]

_GIB = 2**30
_STYLE = {TrialStatus.OK: "green", TrialStatus.OOM: "red", TrialStatus.PREDICTED_OOM: "yellow",
          TrialStatus.INVALID: "dim", TrialStatus.TIMEOUT: "red", TrialStatus.CRASH: "red",
          TrialStatus.NCCL_ERROR: "red", TrialStatus.DIVERGED: "red", TrialStatus.DUPLICATE: "dim",
          TrialStatus.INTERRUPTED: "red", TrialStatus.PREDICTED_SLOW: "dim"}


_LIVE_COLUMNS = ("#", "layout", "status", "tokens/s", "±", "MFU", "peak GiB", "timed", "wall s",
                 "overhead s", "gpu", "source", "same figures")
"""The live table: each trial as it finishes, with how it stopped timing (`12 stable`, `3 slow`:
timed steps and TrialMetrics.stop_reason), its wall time (launch included) and its overhead
(wall time less the timed steps), its noise (`±`: the timed steps' relative spread) and the GPU
(`gpu`: THROTTLED when NVML saw a power, thermal or hardware slowdown during its timed steps,
else its median SM clock); trials with the same figures as an earlier one share its row,
as in the best table and the report. Layouts skipped as predicted slow are counted below it."""


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / _GIB:.1f}"


def format_record(r: TrialRecord) -> dict[str, str]:
    m = r.metrics
    peak = r.peak_bytes
    return {
        "#": str(r.number), "layout": r.label, "status": r.status.value,
        "tokens/s": "-" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}",
        "MFU": "-" if not m or m.mfu is None or r.tokens_per_s is None else f"{m.mfu:.1%}",
        "peak GiB": _gib(peak if peak is not None else r.predicted_peak_bytes),
        "source": r.source + (f" (=#{r.duplicate_of})" if r.duplicate_of is not None else ""),
        "wall s": "-" if not m or m.wall_time_s is None else f"{m.wall_time_s:.0f}",
        "timed": _timed(r),
        "overhead s": "-" if (o := overhead_s(r)) is None else f"{o:.1f}",
        "±": "-" if not m or m.step_time_cv is None or r.tokens_per_s is None
        else f"{m.step_time_cv:.1%}",
        "gpu": _gpu(r),
        "runs": "1",
    }


def _gpu(r: TrialRecord) -> str:
    """`THROTTLED (sw_power_cap)`, else `1980 MHz` (median SM clock), `-` without clocks."""
    clocks = r.metrics.clocks if r.metrics is not None else None
    if clocks is None:
        return "-"
    if clocks.throttled:
        return f"THROTTLED ({clocks.describe().split('throttled: ')[-1]})"
    return "-" if clocks.sm_mhz is None else f"{clocks.sm_mhz.median:.0f} MHz"


def _runs(result: SearchResult, r: TrialRecord) -> dict[str, str]:
    """A best-table row's figure over the trial's runs (autotune.search.finalists): the mean
    and its error once it was measured again."""
    figure = result.figure(r)
    if figure is None or len(figure.runs) < 2:
        return {}
    return {"tokens/s": f"{figure.tokens_per_s:,.0f}", "±": f"{figure.error:.1%}",
            "runs": str(len(figure.runs))}


def _timed(r: TrialRecord) -> str:
    """`12 stable`: the timed steps and why timing ended; `-` for predictions and failures."""
    m = r.metrics
    if m is None or m.predicted or m.stop_reason is None:
        return "-"
    steps = "" if m.timed_steps is None else f"{m.timed_steps} "
    return f"{steps}{m.stop_reason.value}"


def _figures(r: TrialRecord) -> tuple[float | None, float | None]:
    """What the tables show of a trial's outcome: tokens/s and the peak (measured, else
    predicted). Trials with the same figures are twins (sdpa and te under the same model)."""
    return r.tokens_per_s, r.peak_bytes if r.peak_bytes is not None else r.predicted_peak_bytes


def _fold(records: list[TrialRecord]) -> list[list[TrialRecord]]:
    """Records grouped by their figures; one without a tokens/s figure stands alone."""
    return twin_groups(records, lambda r: _figures(r) if r.tokens_per_s is not None
                       else ("alone", r.number))


_BEST_COLUMNS = ("#", "layout", "tokens/s", "±", "runs", "MFU", "peak GiB", "gpu", "source",
                 "same figures", "similar")
"""The best table: a finalist measured again shows the mean over its runs, `±` the mean's
relative standard error (one run: its timed steps' spread)."""


def best_groups(result: SearchResult, k: int = 10,
                run_key: Callable[[Layout], Hashable] | None = None
                ) -> list[tuple[list[TrialRecord], list[TrialRecord]]]:
    """The k best rows of the table: (the row's trial with its twins of exactly the same
    figures, the other trials it stands for: the same run, or within noise of it in noise-level
    options only; autotune.report.similar)."""
    twins = _fold(result.best(len(result.records)))
    groups = similar_groups(twins, layout=lambda g: g[0].layout,
                            figures=lambda g: _figures(g[0]), run_key=run_key, limit=k)
    return [(first, [r for g in rest for r in g]) for first, *rest in groups]


def best_table(result: SearchResult, k: int = 10, title: str | None = None,
               run_key: Callable[[Layout], Hashable] | None = None) -> Table:
    """The k best layouts, one row per distinct figures as in the report: a row's `same
    figures` names the trials that got exactly its tokens/s and peak, `similar` those it stands
    for (best_groups). The caption explains the labels' abbreviations (autotune.layouts.legend)."""
    from autotune.layouts.legend import legend_text

    predicted = any(r.metrics is not None and r.metrics.predicted for r in result.records)
    rows = best_groups(result, k, run_key)
    table = Table(title=title or ("best layouts (predicted)" if predicted else "best layouts"),
                  caption=legend_text(g[0].label for g, _ in rows) or None,
                  caption_justify="left")
    for column in _BEST_COLUMNS:
        table.add_column(column, justify="left" if column in ("layout", "same figures",
                                                              "similar") else "right")
    for (first, *twins), similar in rows:
        row = {**format_record(first), **_runs(result, first),
               "same figures": ties_text([r.number for r in twins]),
               "similar": ties_text([r.number for r in similar])}
        table.add_row(*(row[c] for c in _BEST_COLUMNS))
    return table


class LiveProgress:
    """An observer for run_search that redraws a bar and a table after each trial."""

    def __init__(self, total: int | None, console: Console | None = None,
                 recent: int = 12) -> None:
        self.console = console or Console(stderr=True)
        self.recent: list[TrialRecord] = []
        self.keep = recent
        self.skipped: set[str] = set()
        """Labels of the layouts skipped as predicted slow."""
        self.last_skip: TrialRecord | None = None
        self.start = time.monotonic()
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 TextColumn("{task.completed}/{task.total} launched"),
                                 TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=self.console)
        self.task = self.progress.add_task("searching", total=total)
        self.live = Live(self.render(None), console=self.console, refresh_per_second=4,
                         transient=False)

    def __enter__(self) -> LiveProgress:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.live.__exit__(*exc)
        if not self.console.is_terminal:
            # Live ends its last frame with a newline only on a terminal: without one, the
            # next line on stderr (an error, `autotune: interrupted`) would continue it.
            self.console.line()

    def render(self, result: SearchResult | None) -> Group:
        table = Table(expand=False)
        for column in _LIVE_COLUMNS:
            table.add_column(column)
        for first, *twins in _fold(self.recent):
            row = {**format_record(first), "same figures": ties_text([r.number for r in twins])}
            table.add_row(*(row[c] for c in _LIVE_COLUMNS), style=_STYLE.get(first.status, ""))
        best = result.best(1) if result else []
        line = (f"best so far: {best[0].label} at "
                f"{best[0].tokens_per_s:,.0f} tokens/s (#{best[0].number})" if best
                else "best so far: -")
        if best and best[0].throttled:
            line += " - measured while the GPU throttled; measured again before the search ends"
        if self.last_skip is not None:
            why = self.last_skip.reason.split(";")[0]
            line = (f"skipped as predicted slow: {len(self.skipped)} layouts (latest "
                    f"{self.last_skip.label}: {why})\n{line}")
        return Group(self.progress, table, line)

    def __call__(self, record: TrialRecord, result: SearchResult) -> None:
        if record.status is TrialStatus.PREDICTED_SLOW:
            # Skips cost nothing and may come by the dozen: counted, not listed.
            self.skipped.add(record.label)
            self.last_skip = record
            self.live.update(self.render(result))
            return
        self.recent = [*self.recent, record][-self.keep:]
        # The bar counts the search's own launches (--trials): finalists' repeats are extra.
        self.progress.update(self.task, completed=sum(
            1 for r in result.records if r.launched and r.repeat_of is None))
        self.live.update(self.render(result))
