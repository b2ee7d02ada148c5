"""Alpa's manual heuristics for Megatron GPT, as the study's first trials.

Zheng et al. 2022, "Alpa: Automating Inter- and Intra-Operator Parallelism for Distributed Deep
Learning", Section 8.1 describes how the authors tuned Megatron-LM by hand: (1) the largest
micro-batch that does not run out of memory; (2) the largest data-parallel degree at that
micro-batch; (3) tensor parallelism only inside a node; (4) then adjust DP and PP for the best
throughput. Here the memory model replaces their trial-and-error for (1); (3) is a validity
rule (autotune.layout.RULES: tp_node); seeds are ordered by (2) and then walk (4).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from autotune.layout import Layout

__all__ = ["alpa_seeds", "next_smaller_mbs"]


def _mismatches(s: Layout, impl: str) -> int:
    """How far a layout's options are from Megatron practice without tuning: no recompute
    beyond what is asked, the distributed optimizer and overlapped parameter gather with dp > 1,
    overlapped gradient reduce, sequence parallel with tp > 1, no interleaving or context
    parallelism, and the fastest implementation available."""
    ideal = {"vpp": 1, "cp": 1, "distributed_optimizer": s.dp > 1,
             "overlap_grad_reduce": True, "overlap_param_gather": s.dp > 1,
             "sequence_parallel": s.tp > 1, "impl": impl,
             # Megatron-LM's default is off; the search, not the seed, decides whether the
             # fused cross entropy's speed is worth its memory.
             "cross_entropy_fusion": False}
    return sum(getattr(s, name) != value for name, value in ideal.items())


def alpa_seeds(valid: Sequence[Layout], fits: Callable[[Layout], bool], impl: str,
               limit: int = 6) -> list[Layout]:
    """Up to `limit` layouts: per (tp, pp, dp, ep) the largest micro-batch that fits, largest
    DP first.

    Within each (tp, pp, dp, ep) the options closest to Megatron practice that the space offers are
    used (`_mismatches`); when nothing fits at any micro-batch without recompute (a model too
    large for its GPUs), recompute is allowed, selective before full, as a user would do next.
    """
    for recompute in ("none", "selective", "full"):
        groups: dict[tuple[int, ...], list[Layout]] = {}
        for s in valid:
            if s.recompute == recompute and fits(s):
                groups.setdefault((s.tp, s.pp, s.dp, s.ep), []).append(s)
        best: list[Layout] = []
        for members in groups.values():
            closest = min(_mismatches(s, impl) for s in members)
            options = [s for s in members if _mismatches(s, impl) == closest]
            # The largest micro-batch; among equals, the first in the space's order.
            best.append(max(options, key=lambda s: s.mbs))
        if best:
            # Largest DP first; among equal DP, less TP (cheaper communication), then less PP.
            ordered = sorted(best, key=lambda s: (-s.dp, s.tp, s.pp, s.ep, -s.mbs))
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
