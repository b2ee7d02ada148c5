"""autotune.worker.holders: the chain of references that keeps a released trial's memory alive,
walked on CPU tensors with the same code the pool runs on CUDA ones."""

from __future__ import annotations

import sys
import types

import pytest

torch = pytest.importorskip("torch")

from autotune.worker.holders import describe_holders, find_holders  # noqa: E402

BIG = 3 * 2**20  # larger than any tensor the rest of the test process keeps on the CPU


@pytest.fixture
def registry():
    """A module-level registry, as a library's global cache would be."""
    module = types.ModuleType("fake_registry")
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


class _Optimizer:
    def __init__(self, state: torch.Tensor) -> None:
        self.state = {"exp_avg": state}


def test_a_global_registry_is_named_down_to_the_tensor(registry):
    registry.OPTIMIZERS = [_Optimizer(torch.zeros(BIG // 4))]
    holders = find_holders("cpu", top=1, min_bytes=BIG)
    assert len(holders) == 1
    h = holders[0]
    assert h.nbytes == BIG and h.tensors == 1
    assert h.chain[0] == "module fake_registry.OPTIMIZERS"
    assert "list[0]" in h.chain and "dict['exp_avg']" in h.chain
    assert any(hop.endswith("_Optimizer") for hop in h.chain)
    assert h.chain[-1].endswith("Tensor")


def test_a_closure_is_followed_through_its_cell(registry):
    def make_hook(buffer: torch.Tensor):
        def hook() -> torch.Tensor:
            return buffer
        return hook

    registry.HOOKS = {"pre": make_hook(torch.zeros(BIG // 4))}
    chain = find_holders("cpu", top=1, min_bytes=BIG)[0].chain
    assert chain[0] == "module fake_registry.HOOKS"
    assert "closure cell" in chain
    assert any(hop.startswith("function ") and "hook" in hop for hop in chain)


def test_views_of_one_storage_count_once_and_largest_comes_first(registry):
    base = torch.zeros(2 * BIG // 4)
    registry.KEPT = [base[: BIG // 4], base[BIG // 4:], torch.zeros(BIG // 4 + 1)]
    del base
    holders = find_holders("cpu", top=2, min_bytes=BIG)
    assert [h.nbytes for h in holders] == [2 * BIG, BIG + 4]
    assert holders[0].tensors == 3  # the two views and the base tensor they keep
    assert holders[0].chain[0] == "module fake_registry.KEPT"


def test_nothing_left_means_no_holders():
    assert find_holders("cpu", min_bytes=64 * BIG) == []


@pytest.mark.parametrize(("chain", "line"), [
    (("module m.X", "list[0]", "torch.Tensor"),
     "0.50 GiB in 2 tensor(s), held by: module m.X -> list[0] -> torch.Tensor"),
    ((), "0.50 GiB in 2 tensor(s), held by: no Python object (held inside C++)"),
])
def test_describe(chain, line):
    from autotune.worker.holders import Holder

    assert describe_holders([Holder(nbytes=2**29, tensors=2, chain=chain)]) == [line]
