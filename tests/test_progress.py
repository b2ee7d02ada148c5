from __future__ import annotations

import io
from pathlib import Path

from doubles.fake_backend import FakeBackend, small_cluster, small_model
from rich.console import Console

from autotune.report.progress import LiveProgress, best_table
from autotune.search import SearchConfig, run_search
from autotune.search.space import space_from_mapping


def test_live_progress_shows_each_trial_and_the_best(tmp_path: Path) -> None:
    cluster, model = small_cluster(), small_model()
    space = space_from_mapping({"tp": [1, 2], "pp": [1, 2], "mbs": [1, 2, 4]}, "small")
    cfg = SearchConfig(model=model, cluster=cluster, space=space,
                       backend=FakeBackend(cluster), results_dir=tmp_path, n_trials=4)
    out = io.StringIO()
    console = Console(file=out, width=160, force_terminal=False)
    with LiveProgress(4, console) as progress:
        result = run_search(cfg, progress)
    text = out.getvalue()
    assert "4/4 launched" in text
    for column in ("layout", "status", "tokens/s", "peak GiB", "wall s", "source"):
        assert column in text
    best = result.best(1)[0]
    assert f"best so far: {best.layout.describe()}" in text
    console.print(best_table(result))
    assert best.layout.describe() in out.getvalue().split("best layouts")[-1]
