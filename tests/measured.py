"""The measured trials (tests/data/measured_trials.json) as the model's inputs: one reader for
the tests that hold the models to them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autotune.layouts.layout import Layout
from autotune.predict.calibration import Trial, load_trials, row_inputs
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec

DATA_PATH = Path(__file__).parent / "data" / "measured_trials.json"


def trial_inputs(trial: dict[str, Any]) -> tuple[ModelSpec, Layout, ClusterSpec]:
    """(model, layout, cluster) of one recorded trial, as the run had them (its RoPE fusion
    included: autotune.predict.calibration.row_inputs)."""
    return row_inputs(trial, DATA_PATH)


def sourced_trials() -> list[tuple[str, Trial]]:
    """(source, load_trials sample) of every OK trial, in the file's order."""
    sources = [t["source"] for t in json.loads(DATA_PATH.read_text())["trials"]
               if t["status"] == "OK"]
    samples = load_trials(DATA_PATH)
    assert len(sources) == len(samples)
    return list(zip(sources, samples, strict=True))
