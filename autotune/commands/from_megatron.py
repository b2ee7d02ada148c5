"""`autotune --from-megatron FILE`: the user's own layout estimated, searched around (it is the
first trial), and compared with the best found, with the flags that change."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from autotune.cost import estimate_cost
from autotune.errors import ConfigError, InvalidLayoutError
from autotune.hardware import ClusterSpec
from autotune.layout import SEARCHED, Impl, Layout, validate
from autotune.megatron_args import exported_layout, measured_as_exported
from autotune.megatron_command import (
    MegatronCommand,
    changed_args,
    megatron_layout,
    read_megatron_command,
)
from autotune.memory import estimate_memory
from autotune.model import ModelSpec
from autotune.space import SearchSpace

if TYPE_CHECKING:
    from autotune.search.records import SearchResult, TrialRecord

__all__ = ["UserJob", "comparison_lines", "read_user_job", "runnable_seed", "widen_space"]

_GIB = 2**30


@dataclass(frozen=True, slots=True)
class UserJob:
    """A user's Megatron-LM command as autotune searches it: its model, machine and layout."""

    command: MegatronCommand
    model: ModelSpec
    cluster: ClusterSpec
    layout: Layout


def read_user_job(path: str, *, gpus: int | None, gpus_per_node: int | None,
                  gpu: str | None) -> UserJob:
    """The command in `path` with its GPUs (the launcher's, or --gpus where it cannot tell),
    its layout checked against Megatron's rules there."""
    command = read_megatron_command(path)
    world = command.gpus
    if world is None and gpus is None:
        raise ConfigError(f"{path}: cannot tell how many GPUs the command runs on "
                          f"({command.gpus_unknown}); give --gpus N")
    if gpus is not None and world is not None and gpus != world:
        raise ConfigError(f"{path} runs on {world} GPUs (torchrun --nproc-per-node "
                          f"{command.gpus_per_node} x --nnodes {command.nodes}); --gpus says "
                          f"{gpus}")
    num = gpus if gpus is not None else world
    assert num is not None
    if gpus_per_node is None and command.nodes is not None and command.nodes > 1:
        gpus_per_node = command.gpus_per_node
    cluster = ClusterSpec.make(num, gpus_per_node, gpu)
    layout = megatron_layout(command, num)
    try:
        validate(layout, command.model, cluster)
    except InvalidLayoutError as exc:
        raise InvalidLayoutError(f"{path}: the command's layout {layout.describe()} on {num} "
                                 f"GPUs: {exc}") from None
    return UserJob(command, command.model, cluster, layout)


def widen_space(space: SearchSpace, layout: Layout) -> SearchSpace:
    """The space with the user's layout in it: each listed dimension also offers the user's
    value, and a dimension the space leaves out stays at the user's value (the search moves
    around their layout, not around Layout's defaults)."""
    candidates = dict(space.candidates)
    for name in SEARCHED:
        value = getattr(layout, name)
        listed = candidates.get(name)
        if listed is None:
            if value != SEARCHED[name].default:
                candidates[name] = (value,)
        elif value not in listed:
            candidates[name] = (*listed, value)
    return replace(space, candidates=candidates, source=f"{space.source} + your layout")


def runnable_seed(layout: Layout, space: SearchSpace) -> Layout:
    """The user's layout with an implementation this machine runs: Transformer Engine (the
    Megatron-LM default) may be missing here, then the nearest, sdpa (PyTorch's fused
    attention) or local, measures it, and a line says so."""
    impls = space.candidates.get("impl", (layout.impl,))
    if layout.impl in impls:
        return layout
    nearest = next((i for i in (Impl.SDPA, Impl.LOCAL) if i in impls), impls[0])
    print(f"autotune: your layout's impl {layout.impl} cannot run here; it is measured with "
          f"impl {nearest} instead", file=sys.stderr)
    return replace(layout, impl=nearest)


def estimate_line(job: UserJob) -> str:
    """The user's layout, predicted: one line."""
    memory = estimate_memory(job.model, job.layout, job.cluster)
    cost = estimate_cost(job.model, job.layout, job.cluster)
    fits = "fits" if memory.fits else "does NOT fit"
    return (f"yours ({job.command.source}, line {job.command.line}): {job.layout.describe()} "
            f"on {job.cluster.num_gpus} x {job.cluster.gpu.name}, gbs {job.layout.gbs}: "
            f"predicted {cost.tokens_per_s:,.0f} tokens/s, peak "
            f"{memory.peak_bytes / _GIB:.1f} GiB of {memory.capacity_bytes / _GIB:.1f} ({fits})")


def _figure(record: TrialRecord | None) -> tuple[float | None, str]:
    if record is None:
        return None, "not tried"
    kind = "predicted" if record.predicted else "measured"
    if record.tokens_per_s is None:
        why = f": {record.reason}" if record.reason else ""
        return None, f"{record.status}{why} ({kind})"
    return record.tokens_per_s, f"{record.tokens_per_s:,.0f} tokens/s ({kind})"


def comparison_lines(job: UserJob, result: SearchResult, *, study: str) -> list[str]:
    """`yours: X tokens/s, best found: Y (+Z%)`, the flags that change, and the export that
    writes the user's command with them."""
    from autotune.search.records import Source

    mine = next((r for r in result.records if r.source == Source.USER), None)
    yours, shown = _figure(mine)
    best = result.best(1)
    if not best:
        return [f"yours: {shown}; no layout completed"]
    top = best[0]
    _, best_shown = _figure(top)
    gain = "" if not yours else f" ({(top.tokens_per_s or 0.0) / yours - 1:+.1%})"
    lines = [f"yours: {mine.label if mine else job.layout.describe()}: {shown}",
             f"best found: {top.label}: {best_shown}{gain}"]
    _, changes = changed_args(job.command, job.layout, top.layout)
    if not measured_as_exported(top.layout):
        # sdpa stood in for the te the command runs: its figure is not the command's.
        te = estimate_cost(job.model, exported_layout(top.layout), job.cluster).tokens_per_s
        lines.append(f"the best's figure is sdpa's, standing in for te (Transformer Engine is "
                     f"not installed here); with te it is predicted {te:,.0f} tokens/s, not "
                     "measured")
    if not changes or (mine is not None and top.number == mine.number):
        lines.append("your layout is the best found: no flag changes"
                     if measured_as_exported(top.layout) and (mine is None
                                                              or mine.layout == job.layout)
                     else "no flag changes found: your layout was measured with sdpa standing "
                     "in for te, so this is not a measurement of your command")
        return lines
    lines.append("flags that change: " + "; ".join(c.describe() for c in changes))
    lines.append(f"autotune export --from-megatron {job.command.source} --study {study} "
                 "-o tuned.sh   writes your command with these flags changed")
    return lines
