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

from autotune.layouts.layout import Layout
from autotune.predict.memory import MemoryEstimate, MemoryParams, estimate_memory, memory_key
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec

__all__ = ["MemoryMemo", "peak_function"]


class MemoryMemo:
    """estimate_memory of `model` on `cluster` with `params`, once per memory_key."""

    __slots__ = ("_estimates", "cluster", "model", "params")

    def __init__(self, model: ModelSpec, cluster: ClusterSpec,
                 params: MemoryParams | None = None) -> None:
        self.model = model
        self.cluster = cluster
        self.params = params
        """The memory constants (None: the defaults, DEFAULT_MEMORY_PARAMS; kept apart from
        an equal explicit set only in that serves() compares them as given)."""
        self._estimates: dict[tuple[object, ...], MemoryEstimate] = {}

    def serves(self, model: ModelSpec, cluster: ClusterSpec,
               params: MemoryParams | None) -> bool:
        """Whether the memo's estimates are those of `model` on `cluster` with `params`: the
        same objects (the fast answer), or equal ones."""
        if model is self.model and cluster is self.cluster and params is self.params:
            return True
        return model == self.model and cluster == self.cluster and params == self.params

    def estimate(self, layout: Layout) -> MemoryEstimate:
        """estimate_memory of `layout`, made at the first layout of its memory_key."""
        key = memory_key(layout)
        found = self._estimates.get(key)
        if found is None:
            found = self._estimates[key] = estimate_memory(self.model, layout, self.cluster,
                                                           self.params)
        return found

    def peak_bytes(self, layout: Layout) -> float:
        """The predicted peak of `layout` (estimate(layout).peak_bytes)."""
        return self.estimate(layout).peak_bytes

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
