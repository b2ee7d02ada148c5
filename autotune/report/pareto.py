"""Pareto fronts: the layouts no other layout beats on both objectives at once.

Pure Python over plain sequences, so the definition is testable on a hand-built table.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, TypeVar

__all__ = ["fold_ties", "pareto_front", "scaling_points", "ties_text", "twin_groups"]

T = TypeVar("T")


def pareto_front(maximize: Sequence[float], minimize: Sequence[float]) -> list[int]:
    """Indices of the non-dominated points, ordered by the minimized objective (then index).

    Point j dominates i when it is at least as good on both objectives and strictly better on
    one; points with identical values do not dominate each other, so both stay on the front
    (two layouts with the same figures are equally good answers).
    """
    if len(maximize) != len(minimize):
        raise ValueError(f"objectives differ in length: {len(maximize)} != {len(minimize)}")
    order = sorted(range(len(maximize)), key=lambda i: (minimize[i], -maximize[i], i))
    front: list[int] = []
    best = float("-inf")
    best_cost = float("nan")
    for i in order:
        gain, cost = maximize[i], minimize[i]
        if gain > best:
            front.append(i)
            best, best_cost = gain, cost
        elif gain == best and cost == best_cost:
            front.append(i)  # a twin of the last front point
    return sorted(front, key=lambda i: (minimize[i], i))


def scaling_points(studies: Sequence[tuple[int, str, dict[str, Any] | None]]
                   ) -> list[dict[str, Any]]:
    """One point per GPU count: its best trial's tokens/s and tokens/s per GPU.

    `studies` holds (num_gpus, study name, best row or None). With several studies of one GPU
    count the best of them stands for it. `pareto` marks the GPU counts that no other count
    beats on both whole-job tokens/s and tokens/s per GPU: more GPUs usually buy speed with
    efficiency, and a count that is slower *and* less efficient than another is never the
    right size.
    """
    best: dict[int, dict[str, Any]] = {}
    for gpus, name, row in studies:
        if row is None or not row.get("tokens_per_s"):
            continue
        point = {"gpus": gpus, "study": name, "trial": row["trial"], "layout": row["layout"],
                 "tokens_per_s": row["tokens_per_s"],
                 "tokens_per_s_per_gpu": row["tokens_per_s"] / gpus,
                 "mfu": row.get("mfu"), "peak_memory_gib": row.get("peak_memory_gib"),
                 "predicted": row.get("predicted", False)}
        if gpus not in best or point["tokens_per_s"] > best[gpus]["tokens_per_s"]:
            best[gpus] = point
    points = [best[g] for g in sorted(best)]
    front = set(pareto_front([p["tokens_per_s"] for p in points],
                             [-p["tokens_per_s_per_gpu"] for p in points]))
    for i, p in enumerate(points):
        p["pareto"] = i in front
    return points


def twin_groups(items: Iterable[T], key: Callable[[T], Hashable]) -> list[list[T]]:
    """`items` grouped by equal `key` (their figures), each group in the order given and the
    groups in the order of their first item."""
    groups: dict[Hashable, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return list(groups.values())


def ties_text(others: Sequence[int]) -> str:
    """`+2: #12 #14`: the other trials of a group with the same figures ("" for none)."""
    if not others:
        return ""
    shown = " ".join(f"#{n}" for n in others[:4])
    return f"+{len(others)}: {shown}{' ...' if len(others) > 4 else ''}"


def fold_ties(rows: Sequence[dict[str, Any]], keys: Sequence[str] = (
        "tokens_per_s", "peak_memory_gib")) -> list[dict[str, Any]]:
    """One row per distinct figures: the first row of each group, with `ties` naming the other
    trials that have exactly the same figures (the analytical models often predict the same
    numbers for layouts that differ only in, say, the attention kernel)."""
    return [{**group[0], "ties": ties_text([r["trial"] for r in group[1:]])}
            for group in twin_groups(rows, lambda row: tuple(row.get(k) for k in keys))]
