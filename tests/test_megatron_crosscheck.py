"""Cross-check autotune's rules against megatron-core itself (0.16.1, CPU torch).

The verdicts come from tools/rules_crosscheck.py (runnable alone for another megatron-core,
e.g. 0.19.x on a Python 3.12 machine): for each layout megatron-core judges it the way a real
launch would, as far as a CPU can. Whenever megatron-core rejects a layout, autotune must reject
it too.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import pytest

from autotune.layouts.layout import Layout, check
from autotune.megatron.core_config import core_config
from tests.conftest import cluster

if os.environ.get("CI"):  # CI installs megatron-core on purpose: a skip there would hide a gap.
    import megatron.core  # noqa: F401
    import torch  # noqa: F401
else:
    pytest.importorskip("megatron.core")
    pytest.importorskip("torch")

import torch.distributed as dist
from megatron.core import parallel_state

import tools.rules_crosscheck as crosscheck
from tools.rules_crosscheck import (
    TABLE,
    layout_for,
    megatron_verdict,
    model_by_name,
    random_layouts,
)


@pytest.fixture(scope="module", autouse=True)
def _quiet_warnings() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize(("name", "gpus", "fields", "accepted"), TABLE)
def test_table_agrees_with_megatron(name: str, gpus: int, fields: dict[str, Any],
                                    accepted: bool) -> None:
    model = model_by_name(name)
    s = layout_for(model, gpus, **fields)
    verdict = megatron_verdict(model, s, gpus)
    assert (verdict is None) == accepted, verdict
    if verdict is not None:
        assert check(s, model, cluster(gpus, gpus_per_node=8)), (
            f"megatron-core rejects {s.describe()} ({verdict}) but autotune accepts it")


@pytest.mark.parametrize("seed", range(4))
def test_random_layouts_never_accepted_when_megatron_rejects(seed: int) -> None:
    disagreements = []
    rejected = 0
    for name, gpus, s in random_layouts(150, seed):
        model = model_by_name(name)
        verdict = megatron_verdict(model, s, gpus)
        if verdict is None:
            continue
        rejected += 1
        per_node = gpus if gpus <= 8 else (8 if gpus % 8 == 0 else 4)
        if not check(s, model, cluster(gpus, gpus_per_node=per_node)):
            disagreements.append(f"{name} on {gpus}: {s.describe()} -> {verdict}")
    assert rejected > 30  # the sample must exercise megatron-core's checks
    assert not disagreements, "\n".join(disagreements)


# megatron-core 0.19.2's TransformerConfig.__post_init__ without Transformer Engine: its
# utils.get_te_version reads a missing TE as 0.0.0, so these fail where 0.16.1 raised a TypeError.
TE_VERSION_REJECTIONS = [
    "ValueError: Only transformer-engine>=1.7.0 supports MoE FP8 training, but your version is "
    "0.0.0.",
    "ValueError: moe_act and layernorm recompute for fp8 needs transformer-engine>=2.6.0dev0, "
    "but your version is 0.0.0.",
    "ValueError: rotary_interleaved does not work with apply_rope_fusion for TE < 2.3.0. "
    "Please install TE >= 2.3.0",
    "AssertionError: TE version >= 2.3.0 is required for "
    "overlap_dispatch_backward_with_experts_wgrad",
]


@pytest.mark.parametrize("message", TE_VERSION_REJECTIONS)
@pytest.mark.parametrize("installed", [False, True])
def test_a_missing_te_is_no_verdict_on_the_layout(message: str, installed: bool,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Without TE, a rejection for TE's version judges the machine, not the layout: no verdict,
    in 0.19 as in 0.16.1 (TypeError). With TE installed the rejection stands."""
    kind, _, text = message.partition(": ")
    error = {"ValueError": ValueError, "AssertionError": AssertionError}[kind]

    def rejects(*args: Any, **kwargs: Any) -> None:
        raise error(text)

    monkeypatch.setattr(crosscheck, "te_available", lambda: installed)
    monkeypatch.setattr(crosscheck, "TransformerConfig", rejects)
    model = model_by_name("tiny-moe")
    verdict = megatron_verdict(model, layout_for(model, 8, ep=4, impl="te", fp8="hybrid"), 8)
    assert verdict == (message if installed else None)


def test_a_missing_te_leaves_other_rejections_standing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crosscheck, "te_available", lambda: False)
    model = model_by_name("gpt2-xl")
    verdict = megatron_verdict(model, layout_for(model, 8, tp=2), 8)  # 25 heads over 2 ranks
    assert verdict is not None and not crosscheck._asks_missing_te(verdict)


OPTIMIZER_CASES = [
    dict(distributed_optimizer=do, precision_aware_optimizer=pao, optimizer_offload_percent=oo,
         impl=impl)
    for do in (False, True) for pao in (False, True) for oo in (0, 50) for impl in ("local", "te")]
"""The optimizer levers' fields in every combination (autotune/levers/)."""


def optimizer_verdict(model_name: str, s: Layout) -> str | None:
    """None when megatron-core's OptimizerConfig takes the worker's optimizer keywords for `s`
    (its __post_init__ asserts the precision-aware optimizer's needs), else its error."""
    from megatron.core.optimizer import OptimizerConfig

    from autotune.megatron.megatron_versions import config_kwargs, running
    from autotune.worker.build import _resolved

    kwargs = _resolved(core_config(model_by_name(model_name), s).optimizer)
    try:
        OptimizerConfig(**config_kwargs("OptimizerConfig", kwargs, running()))
    except (AssertionError, RuntimeError, TypeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@pytest.mark.parametrize("fields", OPTIMIZER_CASES,
                         ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()))
def test_optimizer_config_agrees_with_megatron(fields: dict[str, Any]) -> None:
    model = model_by_name("gpt2-xl")
    s = layout_for(model, 8, **fields)
    verdict = optimizer_verdict("gpt2-xl", s)
    te_missing = importlib.util.find_spec("transformer_engine") is None
    if verdict is not None and s.impl == "te" and te_missing and (
            "TransformerEngine" in verdict or verdict.startswith("TypeError")):
        # impl te is autotune's marker for an installed TE; without one, megatron-core 0.16.1
        # fails in is_te_min_version("2.1.0") (a TypeError on TE's version None) or on "requires
        # FusedAdam from TransformerEngine", which says nothing of the layout.
        pytest.skip("Transformer Engine is not installed here")
    if verdict is not None:
        assert check(s, model, cluster(8, gpus_per_node=8)), (
            f"megatron-core rejects {s.describe()} ({verdict}) but autotune accepts it")


def test_optimizer_config_rejects_what_the_rules_name() -> None:
    """The precision-aware optimizer without the distributed optimizer: megatron-core's assert
    and autotune's rule agree."""
    s = layout_for(model_by_name("gpt2-xl"), 8, precision_aware_optimizer=True, impl="te")
    assert "distributed optimizer" in (optimizer_verdict("gpt2-xl", s) or "")
    assert {v.rule for v in check(s, model_by_name("gpt2-xl"), cluster(8))} == {"pao_do"}


def teardown_module() -> None:
    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
