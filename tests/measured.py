"""The measured trials (tests/data/measured_trials.json) as the model's inputs: one reader for
the tests that hold the models to them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.layouts.layout import Layout
from autotune.predict.calibration import trial_model_ref
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.presets import load_model

DATA_PATH = Path(__file__).parent / "data" / "measured_trials.json"


def trial_inputs(trial: dict[str, Any]) -> tuple[Any, Layout, ClusterSpec]:
    """(model, layout, cluster) of one recorded trial, as the run had them."""
    s = Layout(**trial["strategy"])
    model = load_model(trial_model_ref(trial["model"], DATA_PATH)).with_overrides(
        global_batch_size=s.gbs, seq_length=trial.get("seq_length"))
    cluster = ClusterSpec(num_gpus=trial["gpus"], gpus_per_node=trial["gpus"],
                          gpu=gpu_spec(trial["gpu"]))
    return model, s, cluster
