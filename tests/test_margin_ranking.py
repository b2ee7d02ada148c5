"""Within the cost model's resolution a predicted layout with memory to spare ranks above one at
the edge of the GPU's memory (autotune.predict.trust.predicted_rank); measured figures rank as
measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.layouts.layout import Layout
from autotune.predict.trust import STEP_TIME_BAND, memory_band, memory_band_depth, predicted_rank
from autotune.search.records import SearchResult, Source, TrialRecord
from autotune.specs.hardware import ClusterSpec
from autotune.trials.trial import TrialMetrics, TrialStatus

H100 = ClusterSpec.make(1, gpu="h100-80gb")
CAPACITY = H100.gpu.memory_bytes
UNDER_BAND = 1 - memory_band(H100) - 0.01
"""A share of the GPU's memory just outside (below) the memory band."""


def _record(number: int, tokens: float, memory: float, *, predicted: bool) -> TrialRecord:
    peak = int(memory * CAPACITY)
    metrics = TrialMetrics(status=TrialStatus.OK, tokens_per_s=tokens, peak_reserved_bytes=peak,
                           predicted=predicted)
    return TrialRecord(number=number, layout=Layout(mbs=number + 1, gbs=64),
                       status=TrialStatus.OK, source=Source.SAMPLER, metrics=metrics,
                       predicted_peak_bytes=peak, predicted=predicted)


# (first: tokens/s, share of the GPU's memory), (second: ...), predicted, the winner
CASES = [
    # the sweep's case: 99.99% of the memory against 0.003% slower with 4% to spare
    ((100_000.0, 0.9999), (99_997.0, 0.96), True, 1),
    # slower by less than the step-time band, outside the memory band
    ((100_000.0, 0.9999), (100_000.0 / (1 + STEP_TIME_BAND / 2), 0.90), True, 1),
    # faster by more than the band: the model can tell, the faster keeps its place
    ((100_000.0, 0.9999), (100_000.0 / (1 + 1.5 * STEP_TIME_BAND), 0.90), True, 0),
    # both outside the memory band: the faster
    ((100_000.0, UNDER_BAND), (99_997.0, 0.50), True, 0),
    # measured: the figures rank as measured, memory is what ran
    ((100_000.0, 0.9999), (99_997.0, 0.96), False, 0),
    ((100_000.0, 0.9999), (95_000.0, 0.50), False, 0),
]


@pytest.mark.parametrize(("first", "second", "predicted", "winner"), CASES)
def test_the_margin_wins_within_the_models_resolution(
        first: tuple[float, float], second: tuple[float, float], predicted: bool,
        winner: int) -> None:
    records = [_record(0, *first, predicted=predicted), _record(1, *second, predicted=predicted)]
    for ordered in (records, records[::-1]):  # whatever order the trials ran in
        result = SearchResult(study_name="s", storage="mem", records=list(ordered),
                              cluster=H100)
        assert result.best(1)[0].number == winner


@pytest.mark.parametrize(("memory", "depth"), [
    (0.50, 0.0), (UNDER_BAND, 0.0), (1.0, 1.0), (1.01, 0.0)])  # over the capacity: the gate's
def test_the_depth_into_the_memory_band(memory: float, depth: float) -> None:
    assert memory_band_depth(memory * CAPACITY, H100) == pytest.approx(depth)
    assert predicted_rank(1.0, memory * CAPACITY, H100) == \
        pytest.approx(1 / (1 + STEP_TIME_BAND * depth))


@pytest.mark.parametrize("command", ["search", "export"])
def test_search_and_export_pick_the_layout_with_room(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     command: str) -> None:
    # llama3-8b on 8 H100: vpp 2 is predicted 0.04% faster than vpp 4 at 95% of the memory
    # (inside the memory band), vpp 4 at 91% (less deep in it).
    space = tmp_path / "space.yaml"
    space.write_text("tp: [1]\npp: [2]\nvpp: [2, 4]\nmbs: [1]\nrecompute: [none]\n"
                     "distributed_optimizer: [true]\noverlap_grad_reduce: [true]\n"
                     "overlap_param_gather: [true]\nimpl: [te]\nfp8: [hybrid]\n"
                     "fp8_param_gather: [true]\n")
    args = ["--results-dir", str(tmp_path / "r"), "--study", "s"]
    assert main(["llama3-8b", "--gpus", "8", "--backend", "simulate", "--space", str(space),
                 "--json", *args]) == 0
    out = json.loads(capsys.readouterr().out)
    fast = max(out["best"], key=lambda row: row["tokens_per_s"])
    # vpp 2 lies deeper in the memory band than vpp 4 (which may lie in it too, by the band).
    assert fast["vpp"] == 2 and fast["trial"] in out["within_memory_band"]
    if command == "search":
        assert out["best"][0]["vpp"] == 4
        return
    assert main(["export", *args]) == 0
    assert "--num-virtual-stages-per-pipeline-rank 4" in capsys.readouterr().out


# Equal figures (a plan of thousands of GPUs predicts sp and no-sp alike at tp 8): (tokens/s,
# share of the GPU's memory) of trials 0 and 1, predicted, the winner. The report and the export
# take the lighter, then the lower number (report.load.Study.complete_rows); the search's best
# must be the same trial, or its JSON and the export name different layouts.
TIES = [
    ((100_000.0, 0.16), (100_000.0, 0.12), True, 1),
    ((100_000.0, 0.12), (100_000.0, 0.16), True, 0),
    ((100_000.0, 0.16), (100_000.0, 0.12), False, 1),
    ((100_000.0, 0.16), (100_000.0, 0.16), True, 0),
]


@pytest.mark.parametrize(("first", "second", "predicted", "winner"), TIES)
def test_equal_figures_rank_the_lighter_first_as_the_export_does(
        first: tuple[float, float], second: tuple[float, float], predicted: bool,
        winner: int) -> None:
    records = [_record(0, *first, predicted=predicted), _record(1, *second, predicted=predicted)]
    for ordered in (records, records[::-1]):
        result = SearchResult(study_name="s", storage="mem", records=list(ordered),
                              cluster=H100)
        assert result.best(1)[0].number == winner
