"""`autotune report`: Pareto fronts, tables and plots of a study, written into its folder."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError
from autotune.outputs import replacing, write_text

__all__ = ["TOP_K", "ReportFiles", "run_report"]

TOP_K = 10
_TERMINAL_PARETO = 20
"""Pareto rows shown in the terminal; report.md has them all."""


@dataclass(slots=True)
class ReportFiles:
    study: str
    folder: Path
    written: list[Path] = field(default_factory=list)


def _require_extras() -> None:
    missing = []
    for module in ("pandas", "matplotlib", "plotly"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ConfigError(f"autotune report needs {', '.join(missing)}: "
                          "pip install 'autotune[report]'")


def _write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import pandas as pd

    with replacing(path) as tmp:
        pd.DataFrame(list(rows)).to_csv(tmp, index=False)


def _top_rows(loaded: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The TOP_K rows of the top table, each with `similar`: the trials it stands for (the same
    run, or within noise in noise-level options only; autotune.report.similar)."""
    import functools

    from autotune.megatron.identity import run_key
    from autotune.report.pareto import ties_text
    from autotune.report.similar import similar_groups

    groups = similar_groups(
        rows, layout=lambda r: loaded.record(r["trial"]).layout,
        figures=lambda r: (r["tokens_per_s"], r["peak_memory_gib"]),
        run_key=None if loaded.model is None else functools.partial(run_key, loaded.model),
        limit=TOP_K)
    return [{**first, "similar": ties_text([r["trial"] for r in rest])}
            for first, *rest in groups]


def run_report(*, study: str | None, results_dir: str, storage: str | None,
               model: str | None = None) -> ReportFiles:
    """Write pareto.html/.png, trials.csv, report.md (and gpu_scaling.* when the same model
    was searched on several GPU counts) into the study's folder; print the tables."""
    from rich.console import Console
    from rich.table import Table

    from autotune.predict.memory import estimate_memory
    from autotune.report.importance import tokens_importances
    from autotune.report.load import load_study, peer_studies, resolve_study
    from autotune.report.markdown import (
        PARETO_COLUMNS,
        SCALING_COLUMNS,
        TOP_COLUMNS,
        Column,
        cells,
        render_report,
        with_fp8_mfu,
    )
    from autotune.report.pareto import fold_ties, pareto_front, scaling_points
    from autotune.report.plots import pareto_html, pareto_png, scaling_html, scaling_png
    from autotune.search.storage import storage_errors
    from autotune.search.timesplit import time_split

    _require_extras()
    root = Path(results_dir)
    ref = resolve_study(study, root, storage)
    if study is None:
        print(f"autotune: report on study {ref.name} (the newest under "
              f"{ref.redacted if storage else root}; --study NAME picks another)",
              file=sys.stderr)
    loaded = load_study(ref, model)
    folder = ref.folder
    folder.mkdir(parents=True, exist_ok=True)
    out = ReportFiles(study=ref.name, folder=folder)
    tag = " (predicted)" if loaded.predicted else ""
    what = loaded.model.name if loaded.model else ref.name
    gpus = f"{loaded.cluster.num_gpus} x {loaded.cluster.gpu.name}" if loaded.cluster else ""

    csv_path = folder / "trials.csv"
    _write_csv(loaded.rows, csv_path)
    out.written.append(csv_path)

    ranked = loaded.complete_rows()
    # The memory objective is what the study told Optuna: measured peak per GPU (or predicted).
    feasible = [r for r in ranked
                if r["peak_memory_gib"] is not None and r["duplicate_of"] is None]
    front_idx = pareto_front([r["tokens_per_s"] for r in feasible],
                             [r["peak_memory_gib"] for r in feasible])
    pareto = fold_ties([feasible[i] for i in front_idx])
    capacity = loaded.cluster.gpu.memory_bytes / 2**30 if loaded.cluster else None
    if feasible:
        title = f"{what} on {gpus}: tokens/s against peak memory{tag}"
        for writer, name in ((pareto_html, "pareto.html"), (pareto_png, "pareto.png")):
            writer(feasible, front_idx, folder / name, title=title, capacity_gib=capacity)
            out.written.append(folder / name)
    top = _top_rows(loaded, fold_ties([r for r in ranked if r["duplicate_of"] is None]))

    breakdown = None
    if top and loaded.model is not None and loaded.cluster is not None:
        winner = loaded.record(top[0]["trial"]).layout
        breakdown = estimate_memory(loaded.model, winner, loaded.cluster).breakdown_gib()

    scaling: list[dict[str, Any]] = []
    if storage is None and loaded.cluster is not None and top:
        peers = peer_studies(root, loaded)
        entries: list[tuple[int, str, dict[str, Any] | None]] = [
            (loaded.cluster.num_gpus, ref.name, top[0])]
        for p in peers:
            if p.cluster is not None:
                best = p.complete_rows()
                entries.append((p.cluster.num_gpus, p.ref.name, best[0] if best else None))
        scaling = scaling_points(entries)
        if len(scaling) < 2:
            scaling = []
    if scaling:
        title = f"{what}: tokens/s per GPU against GPU count"
        scaling_html(scaling, folder / "gpu_scaling.html", title=title)
        scaling_png(scaling, folder / "gpu_scaling.png", title=title)
        out.written += [folder / "gpu_scaling.html", folder / "gpu_scaling.png"]

    md_path = folder / "report.md"
    with storage_errors(ref.url, reading=True):  # the importances read the study again
        importances = tokens_importances(loaded.study)
    text = render_report(loaded, top=top, pareto=pareto, breakdown=breakdown,
                         importances=importances, scaling=scaling,
                         files=[p.name for p in [*out.written, md_path]])
    write_text(md_path, text)
    out.written.append(md_path)

    console = Console()
    if not console.is_terminal:
        console.width = 150  # piped or captured: no terminal to fit, keep rows on one line

    def show(title: str, rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> None:
        table = Table(title=title)
        for c in columns:
            table.add_column(c.title, justify="right" if c.right else "left")
        for r in rows:
            table.add_row(*cells(r, columns))
        console.print(table)

    for note in loaded.notes:
        console.print(f"note: {note}")
    if top:
        shown = pareto[-_TERMINAL_PARETO:]  # the fastest end of the front matters most
        more = f", fastest {len(shown)} of {len(pareto)}" if len(shown) < len(pareto) else ""
        show(f"Pareto front: tokens/s against peak memory{tag}{more}", shown,
             with_fp8_mfu(PARETO_COLUMNS, shown))
        show(f"{what} on {gpus}: top {len(top)} layouts{tag}", top,
             with_fp8_mfu(TOP_COLUMNS, top))
    else:
        console.print("no COMPLETE trial with a tokens/s figure yet")
    if scaling:
        show(f"{what}: best layout per GPU count", scaling, SCALING_COLUMNS)
    split = time_split(loaded.records[n] for n in sorted(loaded.records))
    if not loaded.predicted and split.describe():
        console.print(split.describe())
    console.print(f"study {ref.name} in {ref.redacted}")
    for path in out.written:
        console.print(f"wrote {path}", soft_wrap=True)
    return out
