"""Cross-check autotune's rules against megatron-core itself (0.16.1, CPU torch).

The verdicts come from tools/rules_crosscheck.py (runnable alone for another megatron-core,
e.g. 0.19.x on a Python 3.12 machine): for each layout megatron-core judges it the way a real
launch would, as far as a CPU can. Whenever megatron-core rejects a layout, autotune must reject
it too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from autotune.layout import check
from tests.conftest import cluster

if os.environ.get("CI"):  # CI installs megatron-core on purpose: a skip there would hide a gap.
    import megatron.core  # noqa: F401
    import torch  # noqa: F401
else:
    pytest.importorskip("megatron.core")
    pytest.importorskip("torch")

import torch.distributed as dist
from megatron.core import parallel_state

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


def teardown_module() -> None:
    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
