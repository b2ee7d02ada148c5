"""What `autotune models` and `--dry-run` print: listings, no search."""

from __future__ import annotations

import json
from typing import Any

from autotune.megatron.identity import representatives
from autotune.search.space import describe_limits
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.params import count_parameters
from autotune.specs.presets import list_presets, load_model

__all__ = ["print_dry_run", "print_models"]


def _human(count: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if count >= size:
            return f"{count / size:.1f}{unit}"
    return f"{count:,.0f}"


def print_models() -> None:
    """`autotune models`: the presets with their sizes, smallest first."""

    print(f"{'name':<14} {'params':>8} {'layers':>6} {'hidden':>6} {'heads':>5} {'groups':>6} "
          f"{'seq':>5} {'gbs':>5}  notes")
    # Smallest first: gpt-3.6b before gpt-18b, which sorting by name would swap.
    for m in sorted((load_model(name) for name in list_presets()),
                    key=lambda m: (count_parameters(m), m.name)):
        notes = []
        if m.is_moe:
            notes.append(f"MoE {m.num_experts}x top-{m.moe_topk}")
        if m.gated_linear_unit:
            notes.append("SwiGLU")
        notes.append("RoPE" if m.position_embedding == "rope" else "learned positions")
        print(f"{m.name:<14} {_human(count_parameters(m)):>8} {m.num_layers:>6} "
              f"{m.hidden_size:>6} {m.num_attention_heads:>5} {m.query_groups:>6} "
              f"{m.seq_length:>5} {m.global_batch_size:>5}  {', '.join(notes)}")


def print_dry_run(model: ModelSpec, cluster: ClusterSpec, space: Any, summary: Any,
                   as_json: bool) -> None:
    """`--dry-run`: the space's size, its valid layouts and distinct runs, the rejections by
    Megatron's rule, and the candidates that survive, as text or JSON."""
    groups = sorted(summary.rejected.items(), key=lambda item: -item[1].count)
    limits = describe_limits(summary, space, model, cluster)
    distinct = len(set(representatives(model, summary.valid).values()))
    if as_json:
        print(json.dumps({
            "model": model.name, "gpus": cluster.num_gpus,
            "gpus_per_node": cluster.gpus_per_node, "seq_length": model.seq_length,
            "global_batch_size": model.global_batch_size, "space": space.source,
            "dimensions": len(space.candidates),
            "combinations": summary.total, "valid": len(summary.valid),
            "distinct_runs": distinct,
            "rejected": {rule: {"count": g.count, "examples": g.examples}
                         for rule, g in groups},
            "valid_values": {dim: summary.valid_values(dim) for dim in space.candidates},
            "limits": limits,
        }, indent=2))
        return
    print(f"{model.name} on {cluster.num_gpus} GPUs ({cluster.gpus_per_node} per node), "
          f"seq {model.seq_length}, global batch {model.global_batch_size}")
    print(f"search space {space.source}: {len(space.candidates)} dimensions, "
          f"{summary.total:,} combinations")
    print(f"valid layouts: {len(summary.valid):,}")
    if distinct < len(summary.valid):
        print(f"  distinct runs: {distinct:,} (layouts that give Megatron the same "
              "configuration are one run, which a search launches once)")
    print("rejected, by Megatron's rule (first broken rule counts):")
    width = max(len(rule) for rule, _ in groups) if groups else 0
    for rule, group in groups:
        print(f"  {rule:<{width}}  {group.count:>10,}  e.g. {group.examples[0]}")
    print("valid candidates per dimension:")
    for dim in space.candidates:
        values = ", ".join(str(v).lower() if isinstance(v, bool) else str(v)
                           for v in summary.valid_values(dim))
        print(f"  {dim:<22} {values}")
    for sentence in limits:
        print(f"note: {sentence}")
