"""PyTorch's caching allocator with expandable segments (`PYTORCH_CUDA_ALLOC_CONF=
expandable_segments:True`), a setting of the run's environment, not a Megatron-LM flag.

With its default segments the allocator serves a request from one cached block or a new
cudaMalloc segment of its own size and never joins blocks of different segments
(c10/cuda/CUDACachingAllocator.cpp, its opening comment), so what it reserves above the
allocated peak follows the order and sizes of every allocation of a step: 0.1 to 3 fp32 logits
blocks over the one-GPU trials of tests/data/measured_trials.json, no term of the layout
(results/benchmarks/2026-11-27-cpu-memory-reserve.md), and near capacity the step's largest
block must find a free piece of its own (autotune.predict.memory.BLOCK_MARGIN). With expandable
segments it maps the pages of one growing segment per stream instead, and unmaps cached free
pages to make room before it reports an out-of-memory error (the same file, Note [Expandable
Segments]), so freed pieces are reused whatever their neighbours. Measured on one H200
(results/benchmarks/2026-11-29-h200-allocator-s24.md, five layouts whose reserve set the memory
bands, each run both ways): the reserve fell from 3.0-11.1 GiB to 0.08-1.7 GiB, the step time
stayed within 1%; near the capacity it held 2.2-3.0 GiB (gpt2-xl mbs 36 and 38, 1.7-2.3% of the
allocated peak, 2026-11-29-h200-allocator-mixed-s24.md), where mbs 38 ran in 138.5 of 140.4 GiB.

Megatron-LM's own functional tests and its DeepSeek-V3 proxy runs set it
(tests/functional_tests/test_cases/*/model_config.yaml, `ENV_VARS`). Megatron-LM refuses it only
beside Transformer Engine's CUDA graphs without NCCL_GRAPH_REGISTER=0 (arguments.py), which
autotune never turns on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.dimensions import dimension, flag_label
from autotune.levers.base import ActivationState, Lever, MemoryState, Seed, evolve

if TYPE_CHECKING:
    from autotune.layouts.layout import Layout
    from autotune.specs.model import ModelSpec

__all__ = ["ALLOC_CONF_ENV", "EXPANDABLE", "LEVER", "Fields", "environment", "expandable_in",
           "option", "read_environment"]

ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"
"""The variable PyTorch reads its allocator's options from (comma-separated `key:value`)."""


def option(expandable: bool) -> str:
    """The option as PyTorch spells it (c10/core/AllocatorConfig.cpp takes True or False; of
    several options, each `key:value` separated by commas, the last of a key holds)."""
    return f"expandable_segments:{expandable}"


EXPANDABLE = option(True)


@dataclass(frozen=True, kw_only=True)
class Fields:
    __slots__ = ()
    expandable_segments: bool = dimension(False, level=5, label=flag_label("xseg"), help=(
        "PyTorch's caching allocator with expandable segments (`PYTORCH_CUDA_ALLOC_CONF="
        "expandable_segments:True` in the run's environment): freed memory is reused whatever "
        "lies beside it, so little is reserved beyond the allocated peak."))


def expandable_in(conf: str) -> bool:
    """Whether an allocator configuration string turns expandable segments on: its last
    `expandable_segments` option, as PyTorch reads them in order."""
    on = False
    for option in conf.split(","):
        key, _, value = option.strip().partition(":")
        if key.strip() == "expandable_segments":
            on = value.strip() == "True"
    return on


def environment(s: Layout) -> dict[str, str]:
    """What the run's environment must hold for `s`: the option either way, so that a script
    runs what was measured whatever the environment it is started from holds."""
    return {ALLOC_CONF_ENV: option(s.expandable_segments)}


def read_environment(env: Mapping[str, str]) -> dict[str, Any]:
    """The field a run's environment gives (a script's exported variables)."""
    return {"expandable_segments": expandable_in(env.get(ALLOC_CONF_ENV, ""))}


def _memory(m: ModelSpec, s: Layout, state: MemoryState) -> MemoryState:
    # Which reserve the overhead prices: autotune.predict.memory.MemoryParams.fragmentation or
    # .expandable_fragmentation.
    return evolve(state, expandable_segments=True) if s.expandable_segments else state


def _activations(m: ModelSpec, s: Layout, state: ActivationState) -> ActivationState:
    # No largest block needs a free piece of its own: the allocator unmaps cached pages to map
    # it. Measured: gpt2-xl mbs 32 (its 6.14 GiB logits block) ran with 0.66 GiB of reserve.
    return evolve(state, block_margin=0.0) if s.expandable_segments else state


LEVER = Lever(
    name="allocator",
    fields=Fields,
    flag_rows=(),
    environment=environment,
    read_environment=read_environment,
    core_config=lambda m, s: {},
    memory=_memory,
    activations=_activations,
    cost=None,
    no_cost=("measured: the step time of five layouts stayed within 1% either way "
             "(results/benchmarks/2026-11-29-h200-allocator-s24.md); mapping a segment's pages "
             "happens in the first step, which no timed step includes"),
    seed=Seed.PRACTICE,
    # Megatron-LM's functional tests run with it; nothing is lost.
    practice=lambda s, impl: {"expandable_segments": True},
)
