"""The precision-aware optimizer lever (autotune/levers/precision_optimizer.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.errors import ConfigError
from autotune.layouts.layout import Layout, check
from autotune.megatron.core_config import core_config
from autotune.megatron.identity import representatives, run_key
from autotune.megatron.megatron_args import megatron_lm_args, read_fields
from autotune.predict.cost import estimate_cost
from autotune.predict.memory import estimate_memory
from autotune.search.heuristics import MEMORY_OPTIONS
from autotune.search.space import enumerate_space, load_space
from autotune.specs.hardware import ClusterSpec
from autotune.specs.presets import load_model
from tests.conftest import given_of

MODEL = load_model("gpt2-xl")
EIGHT = ClusterSpec.make(8, gpu="h100-80gb")
ONE = ClusterSpec.make(1, gpu="h100-80gb")
BASE = Layout(dp=8, gbs=64, mbs=1, impl="te", distributed_optimizer=True)
PAO = replace(BASE, precision_aware_optimizer=True)


def test_optimizer_state_halves() -> None:
    before = estimate_memory(MODEL, BASE, EIGHT).peak
    after = estimate_memory(MODEL, PAO, EIGHT).peak
    assert after.optimizer_bytes == pytest.approx(before.optimizer_bytes / 2)
    assert after.weights_bytes == before.weights_bytes
    assert after.gradients_bytes == before.gradients_bytes


def test_step_moves_fewer_bytes() -> None:
    before = estimate_cost(MODEL, BASE, EIGHT).optimizer_s
    after = estimate_cost(MODEL, PAO, EIGHT).optimizer_s
    assert after == pytest.approx(before * 22 / 32)


@pytest.mark.parametrize(("change", "rule"), [
    ({"distributed_optimizer": False}, "pao_do"),
    ({"impl": "local"}, "pao_te"),
    ({"impl": "sdpa"}, "pao_te"),
])
def test_megatron_refuses(change: dict[str, object], rule: str) -> None:
    broken = replace(PAO, **change)  # type: ignore[arg-type]
    assert rule in {v.rule for v in check(broken, MODEL, EIGHT)}


def test_valid_with_te_and_the_distributed_optimizer() -> None:
    assert check(PAO, MODEL, EIGHT) == []


def test_flags_round_trip() -> None:
    args = megatron_lm_args(MODEL, PAO)
    assert args[args.index("--exp-avg-dtype") + 1] == "bf16"
    assert "--use-precision-aware-optimizer" in args
    assert read_fields(given_of(args))["precision_aware_optimizer"] is True
    assert read_fields(given_of(megatron_lm_args(MODEL, BASE)))["precision_aware_optimizer"] \
        is False


def test_other_dtypes_are_refused() -> None:
    args = [*megatron_lm_args(MODEL, BASE), "--use-precision-aware-optimizer"]
    with pytest.raises(ConfigError, match="bf16 moments"):
        read_fields(given_of(args))


def test_worker_keys() -> None:
    on, off = core_config(MODEL, PAO).optimizer, core_config(MODEL, BASE).optimizer
    assert (on["use_precision_aware_optimizer"], on["exp_avg_dtype"]) == (True, "bfloat16")
    assert (off["use_precision_aware_optimizer"], off["exp_avg_sq_dtype"]) == (False, "float32")


def test_one_gpu_keeps_the_distributed_optimizer_it_needs() -> None:
    """One data-parallel rank makes the distributed optimizer the same run as none, except
    where the precision-aware optimizer asserts it (autotune.megatron.identity's same-run rule)."""
    single = Layout(dp=1, gbs=8, impl="te", distributed_optimizer=True,
                    precision_aware_optimizer=True)
    plain = replace(single, precision_aware_optimizer=False)
    chosen = representatives(MODEL, [single, plain, replace(plain, distributed_optimizer=False)])
    assert chosen[single] == single and check(chosen[single], MODEL, ONE) == []
    assert chosen[plain].distributed_optimizer is False
    assert run_key(MODEL, single) != run_key(MODEL, plain)


def test_a_saving_the_seeds_may_spend() -> None:
    assert "precision_aware_optimizer" in MEMORY_OPTIONS


def test_space_offers_it_on_one_gpu() -> None:
    space = load_space("tools/spaces/optimizer-levers-1gpu.yaml")
    valid = enumerate_space(space, load_model("llama3-8b"), ONE).valid
    saving = [s for s in valid if s.precision_aware_optimizer]
    assert saving and all(s.distributed_optimizer for s in saving)
