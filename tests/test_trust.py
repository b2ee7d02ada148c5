"""Bands and the measured range that simulated figures carry (autotune.predict.trust)."""

from __future__ import annotations

import json

import pytest

from autotune.predict.trust import MEASURED_RANGE, MeasuredRange, outside_range, trust_line
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.params import count_parameters
from autotune.specs.presets import load_model
from tests.measured import DATA_PATH, trial_inputs

DATA = json.loads(DATA_PATH.read_text())


def test_the_measured_range_is_what_the_data_spans() -> None:
    trials = DATA["trials"]
    models = [trial_inputs(t)[0] for t in trials]
    assert MeasuredRange(
        max_params=max(count_parameters(m) for m in models),
        max_gpus=max(t["gpus"] for t in trials),
        max_nodes=1,  # every trial ran on one node (gpus_per_node = gpus)
        gpus=tuple(sorted({t["gpu"] for t in trials})),
        moe=any(m.is_moe for m in models)) == MEASURED_RANGE


@pytest.mark.parametrize(("model", "gpus", "per_node", "gpu", "expected"), [
    ("gpt2-xl", 4, 4, "h200", []),
    ("gpt-3.6b", 1, 1, "h100-80gb", []),
    ("llama3-70b", 4, 4, "h100-80gb", ["parameters"]),
    ("gpt2-xl", 16, 8, "h100-80gb", ["16 GPUs", "2 nodes"]),
    ("mixtral-8x7b", 8, 8, "h100-80gb", ["parameters", "8 GPUs", "MoE"]),
    ("gpt2-xl", 1, 1, "b200", ["b200 never measured (datasheet only)"]),
])
def test_outside_range_names_each_reason(model: str, gpus: int, per_node: int, gpu: str,
                                         expected: list[str]) -> None:
    cluster = ClusterSpec(num_gpus=gpus, gpus_per_node=per_node, gpu=gpu_spec(gpu))
    notes = outside_range(load_model(model), cluster)
    assert len(notes) == len(expected)
    for note, word in zip(notes, expected, strict=True):
        assert word in note
    line = trust_line(load_model(model), cluster)
    assert "step time ±" in line and "memory ±" in line
    assert ("OUTSIDE the measured range" in line) == bool(expected)
