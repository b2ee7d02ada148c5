"""The measured trials (tests/data/measured_trials.json) as the model's inputs: one reader for
the tests that hold the models to them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.layouts.layout import Layout
from autotune.predict.calibration import row_inputs
from autotune.specs.hardware import ClusterSpec

DATA_PATH = Path(__file__).parent / "data" / "measured_trials.json"


def trial_inputs(trial: dict[str, Any]) -> tuple[Any, Layout, ClusterSpec]:
    """(model, layout, cluster) of one recorded trial, as the run had them."""
    return row_inputs(trial, DATA_PATH)
