"""RoPE fused as Megatron-LM runs it: one rule (autotune.specs.elementwise.rope_fused) for the
worker's config, the cost model's traffic, the export's flag and a command's reading."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.layouts.layout import Layout
from autotune.levers.flags import Given
from autotune.megatron.core_config import core_config
from autotune.megatron.megatron_args import exported_layout, megatron_lm_args, read_fields
from autotune.predict.calibration import load_trials, row_inputs
from autotune.predict.cost import estimate_cost
from autotune.predict.memory import estimate_memory
from autotune.specs.elementwise import (
    ROPE_BYTES,
    ROPE_FUSED_BYTES,
    layer_elementwise_bytes,
    rope_fused,
)
from autotune.specs.presets import load_model
from tests.measured import DATA_PATH, sourced_trials, trial_inputs

LLAMA = load_model("llama3-8b")
GPT = load_model("gpt2-xl")


@pytest.mark.parametrize(("model", "rope_fusion", "impl", "fused"), [
    (LLAMA, True, "te", True),
    (LLAMA, True, "local", False),
    (LLAMA, True, "sdpa", False),
    (LLAMA, False, "te", False),
    (GPT, True, "te", False),
])
def test_fused_only_for_rope_with_te_and_the_default(model, rope_fusion, impl, fused) -> None:
    m = replace(model, rope_fusion=rope_fusion)
    assert rope_fused(m, impl) is fused
    layout = Layout(dp=1, mbs=1, gbs=8, impl=impl)
    transformer = dict(core_config(m, layout).transformer)
    if model.position_embedding == "rope":
        assert transformer["apply_rope_fusion"] is fused
    else:
        assert "apply_rope_fusion" not in transformer


@pytest.mark.parametrize(("rope_fusion", "impl", "flag"), [
    (True, "te", False),
    # sdpa runs as TE in Megatron-LM: fused there, as Megatron-LM's default.
    (True, "sdpa", False),
    # The local spec was measured unfused, and megatron-core asserts TE's kernel otherwise.
    (True, "local", True),
    (False, "te", True),
])
def test_export_says_no_rope_fusion_where_the_worker_ran_it_unfused(rope_fusion, impl,
                                                                    flag) -> None:
    m = replace(LLAMA, rope_fusion=rope_fusion)
    layout = Layout(dp=1, mbs=1, gbs=8, impl=impl)
    # sdpa is exported as TE (exported_layout), as the export writes it.
    assert ("--no-rope-fusion" in megatron_lm_args(m, exported_layout(layout))) is flag


def test_gpt_export_never_names_rope_fusion() -> None:
    assert "--no-rope-fusion" not in megatron_lm_args(GPT, Layout(dp=1, mbs=1, gbs=8,
                                                                  impl="local"))


@pytest.mark.parametrize(("values", "expected"), [
    ({}, True),
    ({"--no-rope-fusion": None}, False),
])
def test_a_command_s_rope_fusion_is_read(values, expected) -> None:
    base = {"--num-layers": "2", "--hidden-size": "64", "--num-attention-heads": "4",
            "--seq-length": "128", "--max-position-embeddings": "128",
            "--position-embedding-type": "rope", "--micro-batch-size": "1",
            "--global-batch-size": "8", "--tokenizer-type": "NullTokenizer",
            "--vocab-size": "1000"}
    assert read_fields(Given({**base, **values}, "test"))["rope_fusion"] is expected


def test_fused_rope_moves_fewer_bytes_by_the_counted_difference() -> None:
    fused = layer_elementwise_bytes(LLAMA, 1, "te").split
    unfused = layer_elementwise_bytes(replace(LLAMA, rope_fusion=False), 1, "te").split
    d = LLAMA.head_dim
    elements = LLAMA.num_attention_heads * d + LLAMA.query_groups * d
    assert unfused - fused == pytest.approx((ROPE_BYTES - ROPE_FUSED_BYTES) * elements)


@pytest.mark.parametrize(("model", "impl", "priced_apart"), [
    ("llama3-8b", "te", True),    # TE's fused kernel against the torch one
    ("llama3-8b", "sdpa", False),  # the torch RoPE either way (rope_fused)
    ("gpt2-xl", "te", False),     # learned positions: no RoPE to fuse
])
def test_a_measured_row_s_rope_fusion_is_read_by_every_reader(
        tmp_path: Path, model: str, impl: str, priced_apart: bool) -> None:
    """A row without the field ran unfused (before session 17), as one with false; one with true
    ran fused. load_trials, row_inputs and the tests' trial_inputs read it alike; the step time
    moves where the fused kernel runs, memory never (the kernels keep no tensor)."""
    trial = {"source": "t", "model": model, "gpu": "h200", "gpus": 1, "status": "OK",
             "step_time_s": 1.0, "device_used_bytes": 1.0,
             "strategy": {"dp": 1, "mbs": 1, "gbs": 8, "impl": impl}}
    rows = [trial, {**trial, "rope_fusion": False}, {**trial, "rope_fusion": True}]
    path = tmp_path / "tests" / "data" / "trials.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"trials": rows}))
    inputs = [row_inputs(t, path) for t in rows]
    assert [m.rope_fusion for m, _, _ in inputs] == [False, False, True]
    assert [sample[1:4] for sample in load_trials(path)] == inputs
    assert [trial_inputs(t) for t in rows] == inputs
    absent, off, on = (estimate_cost(*i).step_time_s for i in inputs)
    assert absent == off
    assert (on < off) is priced_apart and (on == off) is not priced_apart
    assert len({estimate_memory(*i).peak_bytes for i in inputs}) == 1


def test_the_tests_read_each_measured_trial_as_load_trials_does() -> None:
    """Every OK row of tests/data/measured_trials.json: the accuracy tests' inputs
    (tests/measured.trial_inputs) are the fit's (load_trials), RoPE fusion included."""
    rows = [t for t in json.loads(DATA_PATH.read_text())["trials"] if t["status"] == "OK"]
    samples = [t for _, t in sourced_trials()]
    assert [trial_inputs(t) for t in rows] == [sample[1:4] for sample in samples]
    fused = [t["source"] for t in rows if t.get("rope_fusion")]
    assert fused and fused == [t["source"] for t, (_, m, *_) in zip(rows, samples, strict=True)
                               if m.rope_fusion]
