"""The plots: interactive plotly HTML and static matplotlib PNG of the two fronts.

plotly and matplotlib are imported inside the functions: `autotune --help` and the search never
pay for them. The PNGs use matplotlib's object API (Figure + Agg canvas), not pyplot, so no
global backend is switched and no display is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.inputs.untrusted import for_html, for_matplotlib
from autotune.outputs import replacing
from autotune.report.pareto import ties_text, twin_groups

__all__ = ["pareto_figure", "pareto_html", "pareto_png", "scaling_html", "scaling_png"]

_FRONT = "#d62728"
_OTHER = "#9aa5b1"
_WINNER = "#ff9f1c"


def _hover(row: dict[str, Any], twins: Sequence[dict[str, Any]] = ()) -> str:
    mfu = "-" if row.get("mfu") is None else f"{row['mfu']:.1%}"
    same = (f"<br>same figures: {ties_text([t['trial'] for t in twins])}" if twins else "")
    return (f"#{row['trial']} {row['layout']}<br>{row['tokens_per_s']:,.0f} tokens/s, "
            f"MFU {mfu}<br>peak {row['peak_memory_gib']:.1f} GiB per GPU<br>"
            f"gbs {row['gbs']}, {row['status']}{same}")


@dataclass(frozen=True, slots=True)
class _Points:
    """The Pareto plot's content: one point per distinct figures (twins, such as sdpa and te
    layouts the models predict alike, share one), the front, the winner and the y range."""

    others: list[list[dict[str, Any]]]
    """Groups of rows off the front; each group's rows have the same figures."""
    front: list[list[dict[str, Any]]]
    winner: dict[str, Any] | None
    """The fastest layout (the least memory, then the lowest trial number, among equals)."""
    y_from_zero: bool
    y_low: float
    y_high: float

    @property
    def twins(self) -> list[list[dict[str, Any]]]:
        return [g for g in (*self.others, *self.front) if len(g) > 1]


def _points(rows: Sequence[dict[str, Any]], front: Sequence[int]) -> _Points:
    on_front = set(front)
    groups = twin_groups(range(len(rows)), lambda i: (rows[i]["peak_memory_gib"],
                                                      rows[i]["tokens_per_s"]))
    # Identical figures are all on the front or all off it (pareto.pareto_front).
    others = [[rows[i] for i in g] for g in groups if g[0] not in on_front]
    best = sorted((g for g in groups if g[0] in on_front),
                  key=lambda g: (rows[g[0]]["peak_memory_gib"], g[0]))
    winner = min(rows, key=lambda r: (-r["tokens_per_s"], r["peak_memory_gib"], r["trial"]),
                 default=None)
    ys = [r["tokens_per_s"] for r in rows] or [0.0]
    low, high = min(ys), max(ys)
    # From zero, unless distinct points would fill less than a quarter of the height: then
    # the axis starts near them and its label says so.
    from_zero = low <= 0 or low == high or high - low >= 0.25 * high
    pad = (high - (0.0 if from_zero else low)) or abs(high) or 1.0
    return _Points(others=others, front=[[rows[i] for i in g] for g in best], winner=winner,
                   y_from_zero=from_zero, y_low=0.0 if from_zero else max(0.0, low - 0.1 * pad),
                   # Headroom above the fastest point holds the winner's label.
                   y_high=high + 0.25 * pad)


_Y_TITLE = "tokens/s (whole job)"


def _y_title(points: _Points) -> str:
    return _Y_TITLE if points.y_from_zero else (f"{_Y_TITLE}; axis starts at "
                                                f"{points.y_low:,.0f}, not 0")


def _winner_text(winner: dict[str, Any], points: _Points) -> str:
    twins = next((g[1:] for g in points.twins if g[0] is winner), [])
    same = (f"\nsame figures: {ties_text([t['trial'] for t in twins])}" if twins else "")
    return (f"winner: #{winner['trial']} {winner['layout']}\n"
            f"{winner['tokens_per_s']:,.0f} tokens/s, {winner['peak_memory_gib']:.1f} GiB "
            f"per GPU{same}")


def _twins_note(points: _Points) -> str | None:
    twins = points.twins
    if not twins:
        return None
    layouts = sum(len(g) for g in twins)
    return (f"{len(twins)} point(s) stand for {layouts} layouts with identical figures "
            "(report.md: same figures)")


def pareto_html(rows: Sequence[dict[str, Any]], front: Sequence[int], path: Path, *,
                title: str, capacity_gib: float | None) -> None:
    """tokens/s against peak memory per GPU; hover shows each layout and its twins."""
    import plotly.graph_objects as go

    points = _points(rows, front)

    def trace(groups: list[list[dict[str, Any]]], **style: Any) -> Any:
        return go.Scatter(x=[g[0]["peak_memory_gib"] for g in groups],
                          y=[g[0]["tokens_per_s"] for g in groups],
                          hovertext=[_hover(g[0], g[1:]) for g in groups], hoverinfo="text",
                          **style)

    fig = go.Figure()
    fig.add_trace(trace(points.others, mode="markers", name="other layouts",
                        marker={"color": _OTHER, "size": 7}))
    fig.add_trace(trace(points.front, mode="lines+markers", name="Pareto front",
                        line={"shape": "hv", "color": _FRONT},
                        marker={"color": _FRONT, "size": 11, "symbol": "diamond"}))
    note = _twins_note(points)
    if note:  # twins are folded into one point each: a legend line says so
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=note,
                                 marker={"color": "rgba(0,0,0,0)"}))
    if points.winner is not None:
        w = points.winner
        fig.add_trace(go.Scatter(x=[w["peak_memory_gib"]], y=[w["tokens_per_s"]],
                                 mode="markers", name=f"winner: #{w['trial']} {w['layout']}",
                                 marker={"color": _WINNER, "size": 16, "symbol": "star"},
                                 hovertext=[_hover(w)], hoverinfo="text"))
        fig.add_annotation(x=w["peak_memory_gib"], y=w["tokens_per_s"],
                           text=_winner_text(w, points).replace("\n", "<br>"),
                           showarrow=True,
                           xanchor="right", yanchor="bottom", align="right")
    if capacity_gib:
        fig.add_vline(x=capacity_gib, line_dash="dash", line_color="black",
                      annotation_text=f"GPU memory {capacity_gib:.0f} GiB")
    fig.update_layout(title=for_html(title), xaxis_title="peak memory per GPU (GiB)",
                      yaxis_title=_y_title(points), template="plotly_white",
                      hovermode="closest",
                      legend={"orientation": "h", "yanchor": "top", "y": -0.15})
    fig.update_yaxes(range=[points.y_low, points.y_high])
    # The whole plotly.js goes into the file: the report opens offline, e.g. copied off a
    # cluster without internet access.
    with replacing(path) as tmp:  # whole or not at all (autotune.outputs)
        fig.write_html(tmp, include_plotlyjs=True, full_html=True)


def _thousands(ax: Any) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))


def _figure(width: float = 8.0, height: float = 5.0) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=120, layout="constrained")


def pareto_figure(rows: Sequence[dict[str, Any]], front: Sequence[int], *, title: str,
                  capacity_gib: float | None) -> Any:
    """The static Pareto plot (a matplotlib Figure): one marker per distinct figures, twins
    ringed, the winner starred and named in a label inside the axes, the legend below the
    axes (never over a point), and a y-axis from zero unless its label says otherwise."""
    points = _points(rows, front)
    fig = _figure()
    ax = fig.add_subplot()

    def xy(groups: list[list[dict[str, Any]]]) -> tuple[list[float], list[float]]:
        return ([g[0]["peak_memory_gib"] for g in groups],
                [g[0]["tokens_per_s"] for g in groups])

    ax.scatter(*xy(points.others), s=12, color=_OTHER,
               label="other layouts" if points.others else None)
    ax.step(*xy(points.front), where="post", color=_FRONT, linewidth=1)
    ax.scatter(*xy(points.front), s=40, marker="D", color=_FRONT, label="Pareto front",
               zorder=3)
    if points.winner is not None:
        w = points.winner
        ax.scatter([w["peak_memory_gib"]], [w["tokens_per_s"]], s=160, marker="*",
                   color=_WINNER, edgecolors="black", linewidths=0.5, zorder=5,
                   label=f"winner: #{w['trial']}")
    if capacity_gib:
        ax.axvline(capacity_gib, color="black", linestyle="--", linewidth=1,
                   label=f"GPU memory {capacity_gib:.0f} GiB")
    note = _twins_note(points)
    if note:  # a legend line without a marker: twins are folded, not drawn over each other
        from matplotlib.lines import Line2D

        ax.add_artist(Line2D([], [], linestyle="none", label=note))
    if points.winner is not None:
        # The label sits in the headroom above every point, inside the axes, towards the
        # middle from the winner (the side with more room), with an arrow to it.
        w = points.winner
        low, high = ax.get_xlim()
        left_half = w["peak_memory_gib"] - low < 0.5 * (high - low)
        ax.annotate(_winner_text(w, points), (w["peak_memory_gib"], w["tokens_per_s"]),
                    xytext=(0.02 if left_half else 0.98, 0.97), textcoords="axes fraction",
                    ha="left" if left_half else "right", va="top", fontsize=7,
                    bbox={"boxstyle": "round", "fc": "white", "ec": _WINNER, "alpha": 0.9},
                    arrowprops={"arrowstyle": "->", "color": _WINNER, "linewidth": 0.8})
    ax.set_ylim(points.y_low, points.y_high)
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel(_y_title(points), fontsize=9 if points.y_from_zero else 8)
    _thousands(ax)
    ax.set_title(for_matplotlib(title), fontsize=10)
    ax.grid(alpha=0.3)
    fig.legend(fontsize=8, loc="outside lower center", ncols=3, frameon=False)
    return fig


def pareto_png(rows: Sequence[dict[str, Any]], front: Sequence[int], path: Path, *,
               title: str, capacity_gib: float | None) -> None:
    figure = pareto_figure(rows, front, title=title, capacity_gib=capacity_gib)
    with replacing(path) as tmp:
        figure.savefig(tmp, format="png")


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
    fig.update_layout(title=for_html(title), xaxis_title="GPUs", yaxis_title="tokens/s per GPU",
                      xaxis_type="log", template="plotly_white")
    fig.update_xaxes(tickvals=[p["gpus"] for p in points])
    with replacing(path) as tmp:  # whole or not at all (autotune.outputs)
        fig.write_html(tmp, include_plotlyjs=True, full_html=True)


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
    ax.set_title(for_matplotlib(title), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    with replacing(path) as tmp:
        fig.savefig(tmp, format="png")
