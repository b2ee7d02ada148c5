"""Alpa's manual heuristics for Megatron GPT, as the study's first trials.

Zheng et al. 2022, "Alpa: Automating Inter- and Intra-Operator Parallelism for Distributed Deep
Learning", Section 8.1 describes how the authors tuned Megatron-LM by hand: (1) the largest
micro-batch that does not run out of memory; (2) the largest data-parallel degree at that
micro-batch; (3) tensor parallelism only inside a node; (4) then adjust DP and PP for the best
throughput. Here the memory model replaces their trial-and-error for (1); (3) is a validity
rule (strategy.RULES: tp_node); seeds are ordered by (2) and then walk (4).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from autotune.gate import layout_key
from autotune.strategy import Strategy

__all__ = ["alpa_seeds", "next_smaller_mbs"]


def _default_options(s: Strategy, impl: str) -> bool:
    """Megatron practice without tuning: no recompute, the distributed optimizer with dp > 1,
    overlapped gradient reduce and parameter gather, sequence parallel with tp > 1, no
    interleaving, context or expert parallelism."""
    return (s.recompute == "none" and s.vpp == 1 and s.cp == 1
            and s.distributed_optimizer == (s.dp > 1)
            and s.overlap_grad_reduce and s.overlap_param_gather == s.distributed_optimizer
            and s.sequence_parallel == (s.tp > 1) and s.impl == impl)


def alpa_seeds(valid: Sequence[Strategy], fits: Callable[[Strategy], bool], impl: str,
               limit: int = 6) -> list[Strategy]:
    """Up to `limit` strategies: per layout the largest micro-batch that fits, largest DP first.

    Layouts with default options are preferred; when none of them fits at any micro-batch
    (a model too large for its GPUs), recompute is allowed, selective before full, as a user
    would do next.
    """
    for recompute in ("none", "selective", "full"):
        best_mbs: dict[Strategy, Strategy] = {}
        for s in valid:
            candidate = s if recompute == "none" else replace(s, recompute="none")
            if s.recompute != recompute or not _default_options(candidate, impl):
                continue
            key = layout_key(s)
            if fits(s) and (key not in best_mbs or s.mbs > best_mbs[key].mbs):
                best_mbs[key] = s
        if best_mbs:
            # Largest DP first; among equal DP, less TP (cheaper communication), then less PP.
            ordered = sorted(best_mbs.values(), key=lambda s: (-s.dp, s.tp, s.pp, s.ep, -s.mbs))
            return ordered[:limit]
    return []


def next_smaller_mbs(candidates: Sequence[int], failed_mbs: int, known_good: int | None) -> \
        int | None:
    """Bisection step after an OOM at `failed_mbs`: the middle candidate between the largest
    micro-batch known to fit (or the smallest candidate) and the failed one."""
    lower = sorted(m for m in candidates if m < failed_mbs and
                   (known_good is None or m > known_good))
    if not lower:
        return None
    return lower[len(lower) // 2]
