"""A predicted pick inside the memory band says so in the report and the export header
(autotune.predict.trust.memory_risk; issue 24 item 4, issue 28 item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.cli import main
from autotune.predict.trust import memory_band, memory_risk
from autotune.specs.hardware import ClusterSpec

H100 = ClusterSpec.make(1, gpu="h100-80gb")
EDGE = 1 - memory_band(H100)
"""Where the H100's memory band starts, as a share of its memory."""


@pytest.mark.parametrize(("fraction", "warned"), [
    (None, False),  # no prediction on record
    (0.50, False),
    (EDGE - 0.01, False),  # under the H100's band
    (EDGE + 0.01, True),
    (0.999, True),
    (1.0, True),
    (1.01, False),  # over the capacity: the gate's verdict, not a risk
])
def test_memory_risk_is_the_band_below_the_capacity(fraction: float | None,
                                                    warned: bool) -> None:
    peak = None if fraction is None else fraction * H100.gpu.memory_bytes
    line = memory_risk(peak, H100)
    assert bool(line) is warned
    if warned:
        assert f"±{memory_band(H100):.1%} band" in line and "may not fit" in line


def test_a_simulated_winner_in_the_band_is_marked_in_report_and_export(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # gpt-3.6b at mbs 2 with the distributed optimizer is predicted at ~98% of an H100
    # (the only layout of this space): the simulated winner sits inside the band.
    space = tmp_path / "space.yaml"
    space.write_text("tp: [1]\nmbs: [2]\nrecompute: [none]\ndistributed_optimizer: [true]\n"
                     "impl: [sdpa]\nfp8: ['off']\n")
    results = str(tmp_path / "r")
    args = ["--results-dir", results, "--study", "s"]
    assert main(["gpt-3.6b", "--gpus", "1", "--gpu", "h100-80gb", "--gbs", "16", "--backend",
                 "simulate", "--space", str(space), *args]) == 0
    capsys.readouterr()
    assert main(["export", *args]) == 0
    header = capsys.readouterr().out
    assert "# Memory: predicted at" in header and "may not fit" in header, header[:800]
    assert main(["report", *args]) == 0
    capsys.readouterr()
    report = (Path(results) / "s" / "report.md").read_text()
    assert "> **Memory:** predicted at" in report
