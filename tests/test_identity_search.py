"""The search and `--dry-run` use the run key (autotune.megatron.identity): the same run never runs
twice.

Issue 18's case: gpt2-xl at seq 16384 on one GPU, recompute none or full of 2, 8 or 48 layers.
Megatron ignores recompute_num_layers without full recompute, so the six layouts are four runs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from doubles.fake_backend import FakeBackend
from typer.testing import CliRunner

from autotune.cli import app
from autotune.dimensions import Recompute
from autotune.search import SearchConfig, run_search
from autotune.search.space import load_space
from autotune.specs.hardware import ClusterSpec
from autotune.specs.presets import load_model
from autotune.trials.trial import TrialStatus

REPO = Path(__file__).resolve().parents[1]
SPACE = REPO / "tools" / "spaces" / "xl-16k-recompute.yaml"


def test_dry_run_counts_four_distinct_runs() -> None:
    result = CliRunner().invoke(app, ["gpt2-xl", "--gpus", "1", "--seq-len", "16384",
                                      "--gpu", "h100-80gb", "--space", str(SPACE), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "valid layouts: 6" in result.output
    assert "distinct runs: 4" in result.output


def test_grid_launches_each_run_once(tmp_path: Path) -> None:
    model = replace(load_model("gpt2-xl"), seq_length=16384, global_batch_size=2)
    cluster = ClusterSpec.make(1, gpu="h100-80gb")
    backend = FakeBackend(cluster)
    result = run_search(SearchConfig(model=model, cluster=cluster, space=load_space(str(SPACE)),
                                     backend=backend, results_dir=tmp_path, study_name="grid",
                                     sampler="grid", finalists=0))  # each run once: no repeats
    assert len(backend.calls) == 4
    assert sum(s.recompute == Recompute.NONE for s in backend.calls) == 1
    assert sorted(s.recompute_num_layers for s in backend.calls
                  if s.recompute == Recompute.FULL) == [2, 8, 48]
    assert result.count(TrialStatus.OK) == 4
    assert result.stop_reason == "every layout of the grid was tried"
