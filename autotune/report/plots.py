"""The plots: interactive plotly HTML and static matplotlib PNG of the two fronts.

plotly and matplotlib are imported inside the functions: `autotune --help` and the search never
pay for them. The PNGs use matplotlib's object API (Figure + Agg canvas), not pyplot, so no
global backend is switched and no display is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["pareto_html", "pareto_png", "scaling_html", "scaling_png"]

_FRONT = "#d62728"
_OTHER = "#9aa5b1"


def _hover(row: dict[str, Any]) -> str:
    mfu = "-" if row.get("mfu") is None else f"{row['mfu']:.1%}"
    return (f"#{row['trial']} {row['layout']}<br>{row['tokens_per_s']:,.0f} tokens/s, "
            f"MFU {mfu}<br>peak {row['peak_memory_gib']:.1f} GiB per GPU<br>"
            f"gbs {row['gbs']}, {row['status']}")


def pareto_html(rows: Sequence[dict[str, Any]], front: Sequence[int], path: Path, *,
                title: str, capacity_gib: float | None) -> None:
    """tokens/s against peak memory per GPU; hover shows each layout."""
    import plotly.graph_objects as go

    on_front = set(front)
    others = [r for i, r in enumerate(rows) if i not in on_front]
    best = [rows[i] for i in front]
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[r["peak_memory_gib"] for r in others], y=[r["tokens_per_s"] for r in others],
        mode="markers", name="other layouts", marker={"color": _OTHER, "size": 7},
        hovertext=[_hover(r) for r in others], hoverinfo="text"))
    fig.add_trace(go.Scatter(
        x=[r["peak_memory_gib"] for r in best], y=[r["tokens_per_s"] for r in best],
        mode="lines+markers", name="Pareto front", line={"shape": "hv", "color": _FRONT},
        marker={"color": _FRONT, "size": 11, "symbol": "diamond"},
        hovertext=[_hover(r) for r in best], hoverinfo="text"))
    if capacity_gib:
        fig.add_vline(x=capacity_gib, line_dash="dash", line_color="black",
                      annotation_text=f"GPU memory {capacity_gib:.0f} GiB")
    fig.update_layout(title=title, xaxis_title="peak memory per GPU (GiB)",
                      yaxis_title="tokens/s (whole job)", template="plotly_white",
                      hovermode="closest")
    # The whole plotly.js goes into the file: the report opens offline, e.g. copied off a
    # cluster without internet access.
    fig.write_html(path, include_plotlyjs=True, full_html=True)


def _thousands(ax: Any) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))


def _figure(width: float = 8.0, height: float = 5.0) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=120, layout="constrained")


def pareto_png(rows: Sequence[dict[str, Any]], front: Sequence[int], path: Path, *,
               title: str, capacity_gib: float | None) -> None:
    fig = _figure()
    ax = fig.add_subplot()
    on_front = set(front)
    others = [r for i, r in enumerate(rows) if i not in on_front]
    best = [rows[i] for i in front]
    ax.scatter([r["peak_memory_gib"] for r in others], [r["tokens_per_s"] for r in others],
               s=12, color=_OTHER, label="other layouts")
    ax.step([r["peak_memory_gib"] for r in best], [r["tokens_per_s"] for r in best],
            where="post", color=_FRONT, linewidth=1)
    ax.scatter([r["peak_memory_gib"] for r in best], [r["tokens_per_s"] for r in best],
               s=40, marker="D", color=_FRONT, label="Pareto front", zorder=3)
    if best:  # the fastest point only: labels for the whole front would overlap
        top = min(best, key=lambda r: (-r["tokens_per_s"], r["peak_memory_gib"], r["trial"]))
        ax.annotate(f"#{top['trial']} {top['layout']}", (top["peak_memory_gib"],
                    top["tokens_per_s"]), fontsize=7, xytext=(6, 2), textcoords="offset points")
    if capacity_gib:
        ax.axvline(capacity_gib, color="black", linestyle="--", linewidth=1,
                   label=f"GPU memory {capacity_gib:.0f} GiB")
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("tokens/s (whole job)")
    _thousands(ax)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.savefig(path)


def _scaling_hover(p: dict[str, Any]) -> str:
    return (f"{p['gpus']} GPUs: {p['layout']} (study {p['study']}, #{p['trial']})<br>"
            f"{p['tokens_per_s']:,.0f} tokens/s, {p['tokens_per_s_per_gpu']:,.0f} per GPU")


def scaling_html(points: Sequence[dict[str, Any]], path: Path, *, title: str) -> None:
    """tokens/s per GPU against GPU count: the best layout of each study."""
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[p["gpus"] for p in points], y=[p["tokens_per_s_per_gpu"] for p in points],
        mode="lines+markers", name="best layout per GPU count",
        marker={"size": [13 if p["pareto"] else 8 for p in points],
                "color": [_FRONT if p["pareto"] else _OTHER for p in points]},
        line={"color": _OTHER}, hovertext=[_scaling_hover(p) for p in points],
        hoverinfo="text"))
    fig.update_layout(title=title, xaxis_title="GPUs", yaxis_title="tokens/s per GPU",
                      xaxis_type="log", template="plotly_white")
    fig.update_xaxes(tickvals=[p["gpus"] for p in points])
    fig.write_html(path, include_plotlyjs=True, full_html=True)


def scaling_png(points: Sequence[dict[str, Any]], path: Path, *, title: str) -> None:
    fig = _figure(7.0, 4.5)
    ax = fig.add_subplot()
    gpus = [p["gpus"] for p in points]
    ax.plot(gpus, [p["tokens_per_s_per_gpu"] for p in points], color=_OTHER, marker="o")
    front = [p for p in points if p["pareto"]]
    ax.scatter([p["gpus"] for p in front], [p["tokens_per_s_per_gpu"] for p in front],
               s=60, marker="D", color=_FRONT, zorder=3, label="Pareto front")
    ax.set_xscale("log", base=2)
    ax.set_xticks(gpus, [str(g) for g in gpus])
    ax.set_xlabel("GPUs")
    ax.set_ylabel("tokens/s per GPU")
    ax.set_ylim(0, 1.2 * max(p["tokens_per_s_per_gpu"] for p in points))
    ax.set_xlim(min(gpus) / 1.5, max(gpus) * 1.5)
    _thousands(ax)
    for p in points:
        ax.annotate(f"{p['tokens_per_s']:,.0f} tokens/s",
                    (p["gpus"], p["tokens_per_s_per_gpu"]), fontsize=7, ha="center",
                    xytext=(0, 8), textcoords="offset points")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.savefig(path)
