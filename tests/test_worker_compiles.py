"""How the worker makes torch.compile treat shapes (autotune.worker.run.configure_compiles),
counted in compiles on the CPU: a dense model compiles each shape once, in cold and warm trials
alike; an MoE model, whose experts meet a new token count every step, keeps dynamo's dynamic
shapes and compiles a handful of times however many counts it meets."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from autotune.specs.model import ModelSpec

torch = pytest.importorskip("torch")
dynamo = pytest.importorskip("torch._dynamo")

from torch._dynamo.utils import counters  # noqa: E402

from autotune.worker import run  # noqa: E402

DENSE = ModelSpec(name="tiny", num_layers=2, hidden_size=256, num_attention_heads=4,
                  vocab_size=1000, seq_length=256, global_batch_size=8)
MOE = ModelSpec(name="tiny-moe", num_layers=2, hidden_size=256, num_attention_heads=4,
                vocab_size=1000, seq_length=256, global_batch_size=8, num_experts=4, moe_topk=2)

# Every step brings each expert a new token count (1024 routed tokens over 4 experts).
EXPERT_COUNTS = [250, 262, 241, 271, 255, 249, 266, 260, 244, 258, 253, 263]


@pytest.fixture(autouse=True)
def _fresh_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test as a fresh worker process: dynamo's settings as started, empty caches."""
    names = ("automatic_dynamic_shapes", "recompile_limit", "cache_size_limit")
    saved = {n: getattr(dynamo.config, n) for n in names if hasattr(dynamo.config, n)}
    monkeypatch.setattr(run, "_dynamo_as_started", {})
    monkeypatch.setattr(run, "_dynamic_code_held", False)
    dynamo.reset()
    yield
    for name, value in saved.items():
        setattr(dynamo.config, name, value)
    dynamo.reset()


def _activation(x: Any) -> Any:
    # megatron-core's weighted swiglu shape: [tokens, 2 * ffn] in, [tokens, ffn] out.
    a, b = torch.chunk(x, 2, -1)
    return torch.nn.functional.silu(a) * b


# jit_fuser's torch.compile, on the eager backend: dynamo decides the compiles, not Inductor.
_compiled = torch.compile(_activation, backend="eager")


def _trial(model: ModelSpec, counts: list[int]) -> tuple[str, int]:
    """One trial: its compile mode, and the compiles its calls made."""
    mode = run.configure_compiles(model)
    before = counters["stats"]["unique_graphs"]
    for n in counts:
        _compiled(torch.randn(n, 8))
    return mode, counters["stats"]["unique_graphs"] - before


@pytest.mark.parametrize(("model", "counts", "mode", "compiles"), [
    (DENSE, [512, 512, 512], "static", 1),
    (DENSE, [256, 512, 1024, 512, 256], "static", 3),  # each shape once, then reused
    (DENSE, EXPERT_COUNTS, "static", len(set(EXPERT_COUNTS))),  # what MoE trials did
    (MOE, [512, 512, 512], "dynamic", 1),
    (MOE, EXPERT_COUNTS, "dynamic", 2),  # the first count statically, then one dynamic graph
])
def test_one_trial_compiles(model: ModelSpec, counts: list[int], mode: str,
                            compiles: int) -> None:
    assert _trial(model, counts) == (mode, compiles)


@pytest.mark.parametrize(("trials", "compiles"), [
    # a warm pool's dense trials reuse the code of shapes met before
    ([(DENSE, [256, 512]), (DENSE, [512, 1024])], [2, 1]),
    # every MoE trial compiles as a cold launch does, whatever ran before it
    ([(MOE, EXPERT_COUNTS), (MOE, EXPERT_COUNTS)], [2, 2]),
    ([(DENSE, [256]), (MOE, [256, 300])], [1, 2]),
    # a dense trial after an MoE one: static again, from empty caches
    ([(MOE, EXPERT_COUNTS), (DENSE, [256, 512])], [2, 2]),
])
def test_warm_pool_trials_compile_as_cold_ones(trials: list[tuple[ModelSpec, list[int]]],
                                               compiles: list[int]) -> None:
    assert [_trial(model, counts)[1] for model, counts in trials] == compiles


def test_moe_trial_restores_the_settings_the_process_started_with() -> None:
    started = dynamo.config.automatic_dynamic_shapes, dynamo.config.recompile_limit
    run.configure_compiles(DENSE)
    assert (dynamo.config.automatic_dynamic_shapes, dynamo.config.recompile_limit) == \
        (False, run.COMPILED_SHAPES_LIMIT)
    run.configure_compiles(MOE)
    assert (dynamo.config.automatic_dynamic_shapes, dynamo.config.recompile_limit) == started
