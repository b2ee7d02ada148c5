"""One memory estimate per distinct memory key, shared by whoever asks for one model and cluster.

A plan estimates the memory of a layout in several places: the enumeration's derived counts
(autotune.search.derive, a bisection of estimates each), its pipeline-split choice at the
complete layout (autotune.search.space), then the gate for every valid layout it ranks
(autotune.predict.gate). Each used to remember its own: the enumeration its peaks, the gate
its latest 256 estimates. The gate then estimated again most layouts the enumeration had
estimated already: of the 172,336 estimates of a gpt-1t plan on 3,072 GPUs, 123,219 were of
distinct layouts (memory_key); of DeepSeek-V3's 124,144 on 1,024 H100, 84,671
(results/benchmarks/2026-11-29-cpu-planning-speed-s26.md).

A MemoryMemo is the estimates of one model on one cluster with one set of memory constants, by
memory_key: the layout's every field but the MEMORY_BLIND ones, so two layouts share an
estimate exactly where estimate_memory cannot tell them apart (tests/test_gate.py holds the key
to the fields, tests/test_memory_memo.py the memo to estimate_memory). The enumeration makes
one (SpaceSummary.memory) and hands it to the search's gate (LayoutMap.memory ->
Knowledge -> MemoryGate), which checks that it is of its own model, cluster and constants.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from autotune.layouts.layout import Layout
from autotune.predict.memory import (
    MemoryEstimate,
    MemoryParams,
    StageMemory,
    estimate_memory,
    memory_key,
)
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec

__all__ = ["MemoryMemo", "peak_function"]


_ESTIMATE_FIELDS = tuple(f.name for f in fields(MemoryEstimate) if f.name != "stages")
_STAGE_FIELDS = tuple(f.name for f in fields(StageMemory))
_Packed = tuple[float, tuple[Any, ...], tuple[tuple[Any, ...], ...]]
"""An estimate as the memo keeps it: its peak, its other fields, its stages' fields (numbers
and the GPU's name alone)."""
LATEST_KEPT = 256
"""Estimates the memo also keeps whole, the latest: layouts that differ only in fields no
estimate reads (the overlap flags) lie a few apart in the order a plan's gate asks them."""


def _pack(estimate: MemoryEstimate) -> _Packed:
    return (estimate.peak_bytes, tuple(getattr(estimate, n) for n in _ESTIMATE_FIELDS),
            tuple(tuple(getattr(st, n) for n in _STAGE_FIELDS) for st in estimate.stages))


def _unpack(packed: _Packed) -> MemoryEstimate:
    _, values, stages = packed
    return MemoryEstimate(
        stages=tuple(StageMemory(**dict(zip(_STAGE_FIELDS, st, strict=True))) for st in stages),
        **dict(zip(_ESTIMATE_FIELDS, values, strict=True)))


class MemoryMemo:
    """estimate_memory of `model` on `cluster` with `params`, once per memory_key.

    Kept as tuples of numbers, not as the MemoryEstimate objects: Python's cycle collector
    walks every object a process holds at each full collection, and tuples of numbers alone
    it stops walking. The objects of a gpt-1t plan's 123k estimates (3,072 GPUs) took its
    collections from 2.5 to 4.4 s, more than the estimates they spared. An estimate asked
    again is rebuilt from its numbers (equal to the one made, field by field), or read whole
    among the LATEST_KEPT."""

    __slots__ = ("_estimates", "_latest", "cluster", "model", "params")

    def __init__(self, model: ModelSpec, cluster: ClusterSpec,
                 params: MemoryParams | None = None) -> None:
        self.model = model
        self.cluster = cluster
        self.params = params
        """The memory constants (None: the defaults, DEFAULT_MEMORY_PARAMS; kept apart from
        an equal explicit set only in that serves() compares them as given)."""
        self._estimates: dict[tuple[object, ...], _Packed] = {}
        self._latest: dict[tuple[object, ...], MemoryEstimate] = {}

    def serves(self, model: ModelSpec, cluster: ClusterSpec,
               params: MemoryParams | None) -> bool:
        """Whether the memo's estimates are those of `model` on `cluster` with `params`: the
        same objects (the fast answer), or equal ones."""
        if model is self.model and cluster is self.cluster and params is self.params:
            return True
        return model == self.model and cluster == self.cluster and params == self.params

    def estimate(self, layout: Layout, *, keep: bool = True) -> MemoryEstimate:
        """estimate_memory of `layout`, made at the first layout of its memory_key. `keep`:
        keep an estimate made here for good (False: among the LATEST_KEPT alone, for a caller
        that asks each layout once, the gate ranking a plan's layouts after the enumeration:
        gpt-1t's plan on 3,072 GPUs kept 54k such estimates, 200 MiB with the enumeration's,
        and ran 6% slower than without the memo)."""
        key = memory_key(layout)
        found = self._latest.get(key)
        if found is not None:
            return found
        packed = self._estimates.get(key)
        if packed is None:
            found = estimate_memory(self.model, layout, self.cluster, self.params)
            if keep:
                self._estimates[key] = _pack(found)
        else:
            found = _unpack(packed)
        if len(self._latest) >= LATEST_KEPT:
            del self._latest[next(iter(self._latest))]
        self._latest[key] = found
        return found

    def peak_bytes(self, layout: Layout) -> float:
        """The predicted peak of `layout` (estimate(layout).peak_bytes)."""
        key = memory_key(layout)
        packed = self._estimates.get(key)
        if packed is None:
            estimate = estimate_memory(self.model, layout, self.cluster, self.params)
            packed = self._estimates[key] = _pack(estimate)
        return packed[0]

    def __len__(self) -> int:
        """The distinct memory keys estimated."""
        return len(self._estimates)


def peak_function(model: ModelSpec, cluster: ClusterSpec, params: MemoryParams | None,
                  memo: MemoryMemo | None) -> Callable[[Layout], float]:
    """A layout's predicted peak for `model` on `cluster` with `params`: from `memo` where
    given, which must be of those three (another's estimates would be a silent wrong answer),
    else estimate_memory's, unremembered."""
    if memo is None:
        def peak(layout: Layout) -> float:
            return estimate_memory(model, layout, cluster, params).peak_bytes
        return peak
    if not memo.serves(model, cluster, params):
        raise ValueError(f"a memory memo of {memo.model.name} on {memo.cluster.num_gpus} "
                         f"GPUs asked for {model.name} on {cluster.num_gpus}, or with other "
                         "constants")
    return memo.peak_bytes
