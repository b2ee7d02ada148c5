"""Issue 14, item 9: the Pareto plot names the winner inside the axes, keeps its legend off the
points, says when its y-axis does not start at zero and folds twins; parameter importances say
what sample they come from, or are left out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotune.report.importance import Sample, importance_caption, sample_of, tokens_importances
from autotune.report.pareto import pareto_front
from autotune.search import SearchConfig, run_search
from autotune.search.backends import SimulateBackend
from autotune.search.space import space_from_mapping
from autotune.search.storage import storage_url
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.presets import load_model

pytest.importorskip("matplotlib")
pytest.importorskip("plotly")

LONG = "tp8 pp64 dp6 vpp2 mbs1 sp rc=full(block/2) do ogr opg cef sdpa"


def row(trial: int, gib: float, tokens: float, layout: str = "tp1 pp1 dp1 mbs1 sdpa"
        ) -> dict[str, Any]:
    return {"trial": trial, "layout": layout, "peak_memory_gib": gib, "tokens_per_s": tokens,
            "mfu": 0.4, "gbs": 64, "status": "OK"}


def figure(rows: list[dict[str, Any]], capacity: float | None = 80.0) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from autotune.report.plots import pareto_figure

    front = pareto_front([r["tokens_per_s"] for r in rows], [r["peak_memory_gib"] for r in rows])
    fig = pareto_figure(rows, front, title="t", capacity_gib=capacity)
    FigureCanvasAgg(fig).draw()
    return fig


def spread(winner_gib: float, layout: str = LONG) -> list[dict[str, Any]]:
    """Points from 10k to 80k tokens/s, the winner (fastest) at `winner_gib`, twins among
    them."""
    rows = [row(i, 10 + 2.5 * i, 10_000 + 2_000 * i) for i in range(30)]
    rows.append(row(40, winner_gib, 85_000, layout))
    rows.append(row(41, 30.0, 20_000))
    rows.append(row(42, 30.0, 20_000))  # twin of 41
    return rows


def winner_label(fig: Any) -> Any:
    ax = fig.axes[0]
    return next(t for t in ax.texts if t.get_text().startswith("winner:"))


@pytest.mark.parametrize("winner_gib", [10.0, 45.0, 79.0, 200.0])
@pytest.mark.parametrize("layout", ["tp1 pp1 dp2 mbs16 sdpa", LONG])
def test_winner_is_named_inside_the_axes_over_no_point(winner_gib: float, layout: str) -> None:
    fig = figure(spread(winner_gib, layout))
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    label = winner_label(fig)
    assert label.get_text().startswith(f"winner: #40 {layout}\n85,000 tokens/s")
    box = label.get_bbox_patch().get_window_extent(renderer)
    axes = ax.get_window_extent(renderer)
    assert axes.x0 <= box.x0 and box.x1 <= axes.x1 and axes.y0 <= box.y0 and box.y1 <= axes.y1
    for collection in ax.collections:
        for x, y in ax.transData.transform(collection.get_offsets()):
            assert not box.contains(x, y), "the winner's label covers a point"


def test_winner_twins_are_named_in_its_label() -> None:
    rows = spread(45.0)
    rows.append(row(43, 45.0, 85_000, LONG.replace("sdpa", "te")))
    assert "same figures: +1: #43" in winner_label(figure(rows)).get_text()


@pytest.mark.parametrize("winner_gib", [10.0, 79.0])
def test_legend_is_off_the_axes(winner_gib: float) -> None:
    fig = figure(spread(winner_gib))
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    axes = fig.axes[0].get_window_extent(renderer)
    assert not legend.overlaps(axes)
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "winner: #40" in texts and "Pareto front" in texts


@pytest.mark.parametrize(("low", "high", "from_zero"), [
    (10_000, 85_000, True),
    (30_000, 50_000, True),
    (40_000, 50_000, False),     # a fifth of the height from zero
    (160_000, 170_000, False),   # within 6 %: from zero every point would sit on one line
    (1_000_000, 1_001_000, False),
])
def test_y_axis_starts_at_zero_or_says_it_does_not(low: float, high: float,
                                                   from_zero: bool) -> None:
    rows = [row(i, 10 + i, low + (high - low) * i / 9) for i in range(10)]
    ax = figure(rows).axes[0]
    bottom, top = ax.get_ylim()
    assert top > high
    if from_zero:
        assert bottom == 0 and "not 0" not in ax.get_ylabel()
    else:
        assert 0 < bottom < low
        assert f"axis starts at {bottom:,.0f}, not 0" in ax.get_ylabel()


def test_twins_are_one_point_with_a_note() -> None:
    rows = spread(45.0)
    fig = figure(rows)
    ax = fig.axes[0]
    drawn = [tuple(xy) for c in ax.collections for xy in c.get_offsets()]
    distinct = {(r["peak_memory_gib"], r["tokens_per_s"]) for r in rows}
    winner = (45.0, 85_000)
    assert len(drawn) == len(distinct) + 1  # the winner's star over its own point
    assert drawn.count(winner) == 2
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    notes = [t for t in texts if "identical figures" in t]
    assert notes == ["1 point(s) stand for 2 layouts with identical figures "
                     "(report.md: same figures)"]


def test_html_names_the_winner_and_folds_twins(tmp_path: Path) -> None:
    from autotune.report.plots import pareto_html

    rows = spread(45.0)
    front = pareto_front([r["tokens_per_s"] for r in rows], [r["peak_memory_gib"] for r in rows])
    path = tmp_path / "p.html"
    pareto_html(rows, front, path, title="t", capacity_gib=80.0)
    text = path.read_text()
    assert "winner: #40" in text and "same figures: +1: #42" in text
    assert "identical figures" in text


def test_one_point_plots() -> None:
    fig = figure([row(1, 20.0, 5_000)], capacity=None)
    assert winner_label(fig).get_text().startswith("winner: #1")
    assert fig.axes[0].get_ylim()[0] == 0


# -- importances: what sample, or left out --------------------------------------------------


@pytest.mark.parametrize(("sources", "sample"), [
    (["alpa", "sampler", "sampler"], Sample.ADAPTIVE),
    (["alpa", "oom-bisect", "sampler"], Sample.ADAPTIVE),
    (["grid", "grid"], Sample.GRID),
    (["ranked", "ranked"], Sample.RANKED),
    (["alpa", "alpa", "model"], Sample.SEEDS),
    (["alpa", "oom-bisect"], Sample.SEEDS),
    (["something-newer"], Sample.ADAPTIVE),  # an unknown source reads as the sampler's
])
def test_sample_of(sources: list[str], sample: Sample) -> None:
    assert sample_of(sources) is sample


@pytest.mark.parametrize(("predicted", "sources", "words"), [
    (True, ["grid"], ["grid's trials", "not a sample", "predicted tokens/s"]),
    (False, ["alpa", "sampler"], ["adaptive sample", "not across the whole space",
                                  "measured tokens/s"]),
])
def test_importance_caption(predicted: bool, sources: list[str], words: list[str]) -> None:
    caption = importance_caption(sources, predicted)
    for word in words:
        assert word in caption


def _study(tmp_path: Path, sampler: str) -> Any:
    import optuna

    cluster = ClusterSpec(num_gpus=2, gpus_per_node=2, gpu=gpu_spec("h100-80gb"))
    space = space_from_mapping({"pp": [1, 2], "mbs": [1, 2, 4], "recompute": ["none", "full"],
                                "impl": ["local", "sdpa"]}, "t")
    cfg = SearchConfig(model=load_model("gpt2"), cluster=cluster, space=space,
                       backend=SimulateBackend(cluster), results_dir=tmp_path, sampler=sampler,
                       n_trials=16)
    name = run_search(cfg).study_name
    return optuna.load_study(study_name=name, storage=storage_url(tmp_path, name, None))


def test_importances_of_a_ranking_are_left_out(tmp_path: Path) -> None:
    result = tokens_importances(_study(tmp_path, "ranked"))
    assert isinstance(result, str) and result.startswith("Left out: the 16 COMPLETE trials are "
                                                         "the analytical model's best layouts")


def test_importances_of_a_grid_are_computed_and_labelled(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    from autotune.cli import main

    study = _study(tmp_path, "grid")
    assert isinstance(tokens_importances(study), dict)
    assert main(["report", "--results-dir", str(tmp_path), "--study", study.study_name]) == 0
    capsys.readouterr()
    text = (tmp_path / study.study_name / "report.md").read_text()
    section = text.split("## Parameter importances")[1].split("##")[0]
    assert "Computed over the grid's trials" in section and "| parameter |" in section
