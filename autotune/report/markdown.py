"""report.md: the winner, its memory, the top layouts, the fronts and how good the models were.

The table columns are shared with the terminal tables (commands/report.py) so both say the same.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.inputs.untrusted import for_markdown
from autotune.predict.trust import memory_risk
from autotune.report.load import LoadedStudy, StudyRef
from autotune.search.storage import DEFAULT_RESULTS_DIR

__all__ = ["FP8_MFU", "MFU_NOTE", "PARETO_COLUMNS", "SCALING_COLUMNS", "TOP_COLUMNS", "Column",
           "cells", "markdown_table", "render_report", "with_fp8_mfu"]


def _num(fmt: str) -> Callable[[Any], str]:
    return lambda v: "-" if v is None else format(v, fmt)


@dataclass(frozen=True, slots=True)
class Column:
    title: str
    key: str
    fmt: Callable[[Any], str] = str
    right: bool = True


TOP_COLUMNS: tuple[Column, ...] = (
    Column("#", "trial"), Column("layout", "layout", right=False),
    Column("tokens/s", "tokens_per_s", _num(",.0f")),
    Column("tokens/s/GPU", "tokens_per_s_per_gpu", _num(",.0f")),
    Column("MFU", "mfu", _num(".1%")), Column("step s", "step_time_s", _num(".3f")),
    Column("peak GiB", "peak_memory_gib", _num(".1f")),
    Column("source", "source", right=False),
    Column("same figures", "ties", lambda v: v or "", right=False),
    Column("similar", "similar", lambda v: v or "", right=False))
PARETO_COLUMNS = TOP_COLUMNS[:-1]
"""The front's rows are each a trade-off of their own: none stands for another."""
SCALING_COLUMNS: tuple[Column, ...] = (
    Column("GPUs", "gpus"), Column("best layout", "layout", right=False),
    Column("tokens/s", "tokens_per_s", _num(",.0f")),
    Column("tokens/s/GPU", "tokens_per_s_per_gpu", _num(",.0f")),
    Column("MFU", "mfu", _num(".1%")), Column("peak GiB", "peak_memory_gib", _num(".1f")),
    Column("Pareto", "pareto", lambda v: "yes" if v else ""),
    Column("figures", "predicted", lambda v: "predicted" if v else "measured", right=False),
    Column("study", "study", right=False))
_ERROR_COLUMNS: tuple[Column, ...] = (
    Column("#", "trial"), Column("layout", "layout", right=False),
    Column("status", "status", right=False),
    Column("tokens/s predicted", "predicted_tokens_per_s", _num(",.0f")),
    Column("tokens/s measured", "tokens_per_s", _num(",.0f")),
    Column("error", "tokens_error_pct", _num("+.1f")),
    Column("peak GiB predicted", "predicted_peak_memory_gib", _num(".1f")),
    Column("peak GiB measured", "peak_memory_gib", _num(".1f")),
    Column("error %", "memory_error_pct", _num("+.1f")))


FP8_MFU = Column("MFU FP8 peak", "mfu_fp8", _num(".1%"))
"""An FP8 trial's model FLOP/s against the GPU's dense FP8 peak (report.load); MFU stays
against the dense bf16 peak for every trial, FP8's included, so that the two precisions
compare on one scale."""
MFU_NOTE = ("MFU is model FLOP/s against the GPU's dense bf16 peak for every trial, FP8 trials "
            "included; `MFU FP8 peak` is an FP8 trial's against the dense FP8 peak (twice the "
            "bf16 one on H100, H200 and B200).")


def with_fp8_mfu(columns: Sequence[Column], rows: Sequence[dict[str, Any]]) -> list[Column]:
    """`columns` with FP8_MFU after MFU where a row has an FP8 figure; unchanged otherwise."""
    if not any(r.get("mfu_fp8") is not None for r in rows):
        return list(columns)
    out: list[Column] = []
    for c in columns:
        out.append(c)
        if c.key == "mfu":
            out.append(FP8_MFU)
    return out


def cells(row: dict[str, Any], columns: Sequence[Column]) -> list[str]:
    return [c.fmt(row.get(c.key)) for c in columns]


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    def clean(text: str) -> str:
        return for_markdown(text)  # cells hold layouts and study names: `|`, `<` escaped

    lines = ["| " + " | ".join(c.title for c in columns) + " |",
             "|" + "|".join("---:" if c.right else ":---" for c in columns) + "|"]
    lines += ["| " + " | ".join(clean(x) for x in cells(r, columns)) + " |" for r in rows]
    return "\n".join(lines)


def launch_command(ref: StudyRef) -> str:
    """`autotune export` of the study as one shell command, every argument shell-quoted: with
    --results-dir (absolute) when the study is not under ./results, and --storage (its
    password redacted) when the study is not in its folder's study.db."""
    args = ["autotune", "export"]
    root = ref.folder.parent.resolve()
    if root != Path(DEFAULT_RESULTS_DIR).resolve():
        args += ["--results-dir", str(root)]
    if ref.url != f"sqlite:///{(ref.folder / 'study.db').resolve()}":
        args += ["--storage", ref.redacted]
    return shlex.join([*args, "--study", ref.name, "--format", "megatron-lm"])


def _code(text: str) -> str:
    """`text` as a Markdown code span, whatever backticks it holds (CommonMark: a fence longer
    than any run of backticks inside, padded when the text starts or ends with one)."""
    run = max((len(r) for r in re.findall(r"`+", text)), default=0)
    fence = "`" * (run + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _winner(loaded: LoadedStudy, best: dict[str, Any],
            breakdown: dict[str, float] | None) -> list[str]:
    out = [f"## Winner: trial {best['trial']}", "",
           f"`{best['layout']}` with gbs {best['gbs']}: **{best['tokens_per_s']:,.0f} tokens/s**"
           f" ({best['tokens_per_s_per_gpu']:,.0f} per GPU), MFU "
           f"{TOP_COLUMNS[4].fmt(best['mfu'])}, step {TOP_COLUMNS[5].fmt(best['step_time_s'])}"
           f" s, peak {TOP_COLUMNS[6].fmt(best['peak_memory_gib'])} GiB per GPU"
           + (" (predicted)." if best["predicted"] else " (measured)."), "",
           *([f"Layouts with exactly the same figures: {best['ties']}.", ""]
             if best.get("ties") else []),
           *_memory_risk(loaded, best),
           f"Launch it: {_code(launch_command(loaded.ref))} "
           "(or `--format slurm`, `torchrun`, `json`).", ""]
    if breakdown is not None:
        out += ["Memory of the busiest GPU, predicted by autotune.predict.memory (GiB):", "",
                markdown_table([{k: f"{v:.2f}" for k, v in breakdown.items()}],
                               [Column(k, k) for k in breakdown]), ""]
    return out


def _memory_risk(loaded: LoadedStudy, best: dict[str, Any]) -> list[str]:
    """A predicted winner inside the memory band says so (autotune.predict.trust.memory_risk)."""
    gib = best.get("predicted_peak_memory_gib")
    if not best["predicted"] or loaded.cluster is None or gib is None:
        return []
    risk = memory_risk(gib * 2**30, loaded.cluster, bool(best.get("expandable_segments")))
    return [f"> **Memory:** {risk}.", ""] if risk else []


def _importances(importances: dict[str, float] | str, loaded: LoadedStudy) -> list[str]:
    from autotune.report.importance import importance_caption

    out = ["## Parameter importances (tokens/s, COMPLETE trials)", ""]
    if isinstance(importances, str):
        return [*out, importances, ""]
    # What the trials are a sample of decides what the numbers mean (report.importance).
    sources = [r["source"] for r in loaded.rows if r.get("tokens_per_s") is not None]
    out += [importance_caption(sources, loaded.predicted), ""]
    rows = [{"parameter": k, "importance": f"{v:.3f}"} for k, v in importances.items()]
    return [*out, markdown_table(rows, [Column("parameter", "parameter", right=False),
                                        Column("importance", "importance")]), ""]


def _time(loaded: LoadedStudy) -> list[str]:
    """Where a real search's time went (autotune.search.timesplit), when it launched trials."""
    from autotune.search.timesplit import time_split

    split = time_split(loaded.records[n] for n in sorted(loaded.records))
    if loaded.predicted or not split.describe():
        return []
    return ["## Time", "", f"{split.describe()}.", ""]


def render_report(loaded: LoadedStudy, *, top: Sequence[dict[str, Any]],
                  pareto: Sequence[dict[str, Any]], breakdown: dict[str, float] | None,
                  importances: dict[str, float] | str,
                  scaling: Sequence[dict[str, Any]], files: Sequence[str]) -> str:
    """The whole report.md as text."""
    rows = loaded.rows
    model, cluster = loaded.model, loaded.cluster
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    # The model's name and the notes are the user's (or a study's) text: escaped for Markdown.
    what = for_markdown(model.name) if model else "unknown model"
    where = f"{cluster.num_gpus} x {for_markdown(cluster.gpu.name)}" if cluster \
        else "unknown GPUs"
    out = [f"# autotune report: {loaded.ref.name}", "",
           f"- model: {what}"
           + (f" (seq {model.seq_length}, global batch {model.global_batch_size}; from "
              f"{for_markdown(loaded.model_source)})" if model else ""),
           f"- GPUs: {where}" + (f", {cluster.gpus_per_node} per node" if cluster else ""),
           f"- backend: {loaded.backend or 'unknown'}",
           f"- storage: `{loaded.ref.redacted}`",
           f"- trials: {len(rows)} ("
           + ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda x: -x[1]))
           + ")", ""]
    if loaded.predicted:
        out += ["> **Predictions.** Every figure in this report comes from autotune's analytical "
                "memory and throughput models (simulate backend); nothing was measured. Check "
                "the winner on real GPUs before relying on it.", ""]
    out += [f"> note: {for_markdown(n)}" for n in loaded.notes]
    if loaded.notes:
        out.append("")
    if not top:
        out += ["No COMPLETE trial with a tokens/s figure: nothing to rank yet.", ""]
    else:
        out += _winner(loaded, top[0], breakdown)
        out += [f"## Top {len(top)} layouts", "",
                "Layouts with exactly the same figures share a row (same figures), and so do "
                "the same run and layouts that differ only in recompute, offload, optimizer, "
                "overlap or implementation options with figures within noise (similar).", "",
                markdown_table(top, with_fp8_mfu(TOP_COLUMNS, top)), ""]
        if any(r.get("mfu_fp8") is not None for r in rows):
            out += [MFU_NOTE, ""]
        out += ["## Pareto front: tokens/s against peak memory per GPU", "",
                "No other layout is both faster and lighter than these "
                "(pareto.html, pareto.png).", "",
                markdown_table(pareto, with_fp8_mfu(PARETO_COLUMNS, pareto)), ""]
    measured = [r for r in rows if r["tokens_error_pct"] is not None
                or r["memory_error_pct"] is not None]
    if measured:
        def mean_abs(key: str) -> str:
            values = [abs(r[key]) for r in measured if r[key] is not None]
            return f"{sum(values) / len(values):.1f} %" if values else "-"

        out += ["## Predicted against measured", "",
                f"Mean absolute error over {len(measured)} launched trials: tokens/s "
                f"{mean_abs('tokens_error_pct')}, peak memory {mean_abs('memory_error_pct')}.",
                "", markdown_table(measured, _ERROR_COLUMNS), ""]
    elif not loaded.predicted:
        out += ["## Predicted against measured", "", "No launched trial has both figures.", ""]
    out += _time(loaded)
    out += _importances(importances, loaded)
    if scaling:
        out += ["## Scaling: tokens/s per GPU against GPU count", "",
                "The best layout of each study of this model under the same results folder "
                "(gpu_scaling.html, gpu_scaling.png). Pareto: no other GPU count gives both "
                "more tokens/s and more tokens/s per GPU.", "",
                markdown_table(scaling, SCALING_COLUMNS), ""]
    out += ["## Files", "", *[f"- {f}" for f in files], ""]
    return "\n".join(out)
