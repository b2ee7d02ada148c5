"""`autotune --from-megatron FILE`: the user's own layout estimated, searched around (it is the
first trial), and compared with the best found, with the flags that change."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from autotune.errors import ConfigError, InvalidLayoutError
from autotune.layouts.layout import SEARCHED, Impl, Layout, validate
from autotune.megatron.megatron_args import exported_layout, measured_as_exported
from autotune.megatron.megatron_command import (
    MegatronCommand,
    RowChange,
    arithmetic_warning,
    conditional_warning,
    ignored_warning,
    job_script_warning,
    layout_changes,
    megatron_layout,
    read_megatron_command,
    script_arguments_warning,
    unmodeled_warning,
)
from autotune.predict.cost import estimate_cost
from autotune.predict.memory import estimate_memory
from autotune.search.derive import DIVISORS
from autotune.search.space import SearchSpace
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec

if TYPE_CHECKING:
    from autotune.search.records import SearchResult, TrialRecord

__all__ = ["Comparison", "UserJob", "compare", "read_user_job", "runnable_seed",
           "widen_space"]

_GIB = 2**30


@dataclass(frozen=True, slots=True)
class UserJob:
    """A user's Megatron-LM command as autotune searches it: its model, machine and layout."""

    command: MegatronCommand
    model: ModelSpec
    cluster: ClusterSpec
    layout: Layout
    line_option: int | None = None
    """The user's --line N, which the export needs again."""
    warnings: tuple[str, ...] = ()
    """Lines about the command that the caller prints once it has taken the command (a
    refusal after reading, such as the export's "another model", is its one line alone)."""


def read_user_job(path: str, *, gpus: int | None, gpus_per_node: int | None,
                  gpu: str | None, line: int | None = None) -> UserJob:
    """The command in `path` (the launch on `line`, when given) with its GPUs (the
    launcher's, or --gpus where it cannot tell), its layout checked against Megatron's rules
    there."""
    command = read_megatron_command(path, line)
    world = command.gpus
    if world is None and gpus is None:
        raise ConfigError(f"{path}: cannot tell how many GPUs the command runs on "
                          f"({command.gpus_unknown}); give --gpus N")
    notes: list[str] = []
    if command.slurm_source is not None and gpus is not None and world is not None \
            and gpus != world:
        # sbatch's own options, given when the job is submitted, override its #SBATCH lines.
        notes.append(f"{path}: srun's task count is {world} by its {command.slurm_source} "
                     f"options; taking --gpus {gpus}")
        world = None
    elif command.slurm_source is not None and gpus is None and world is not None:
        notes.append(f"{path}: {world} GPUs, one per task of srun ({command.slurm_source} "
                     f"options: {command.gpus_per_node} per node x {command.nodes} nodes)")
    elif command.launcher_env and gpus is None and world is not None:
        # torchrun's count reads the environment the job runs in: say which value is taken.
        names = ", ".join("$" + n for n in command.launcher_env)
        if command.sbatch_nodes is not None:
            notes.append(f"{path}: {world} GPUs: torchrun's --nnodes is {names}, which Slurm "
                         f"sets from {command.sbatch_nodes_from} --nodes {command.sbatch_nodes} "
                         f"({command.gpus_per_node} per node); --gpus overrides it")
        else:
            notes.append(f"{path}: {world} GPUs by the script's default for {names}, which "
                         "the environment sets when the script runs; give --gpus N for the "
                         "job's count")
    if gpus is not None and world is not None and gpus != world:
        if not command.launcher_env:
            raise ConfigError(f"{path} runs on {world} GPUs (torchrun --nproc-per-node "
                              f"{command.gpus_per_node} x --nnodes {command.nodes}); --gpus "
                              f"says {gpus}")
        # A count the environment gives when the script runs (Slurm's SLURM_NNODES) is read
        # here from the script's default for it; --gpus says what the job will have.
        notes.append(f"{path}: torchrun's GPU count comes from "
                     f"{', '.join('$' + n for n in command.launcher_env)}, set when the script "
                     f"runs ({world} GPUs by the script's default); taking --gpus {gpus}")
        world = None
    num = gpus if gpus is not None else world
    assert num is not None
    # torchrun's GPUs per node where the job spans nodes (several of the launcher's, or --gpus
    # filling whole nodes of them).
    per_node = command.gpus_per_node
    if gpus_per_node is None and per_node is not None and num > per_node \
            and num % per_node == 0:
        gpus_per_node = per_node
    cluster = ClusterSpec.make(num, gpus_per_node, gpu)
    layout = megatron_layout(command, num)
    try:
        validate(layout, command.model, cluster)
    except InvalidLayoutError as exc:
        raise InvalidLayoutError(f"{path}: the command's layout {layout.describe()} on {num} "
                                 f"GPUs: {exc}") from None
    # Said by the caller once the command is known to be usable: a refusal above, or the
    # caller's own, is its one line alone.
    warnings = tuple(f"autotune: warning: {w}" for w in (
        *notes, arithmetic_warning(command), conditional_warning(command),
        script_arguments_warning(command), job_script_warning(command),
        ignored_warning(command, layout),
        unmodeled_warning(command)) if w is not None)
    return UserJob(command, command.model, cluster, layout, line, warnings)


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
        elif value not in listed and DIVISORS not in listed:
            # `divisors` already offers every value Megatron accepts, the user's among them
            # (a listed value beside the marker would be taken for a list: autotune.search.space).
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


def estimate_line(job: UserJob) -> tuple[str, bool]:
    """The user's layout, predicted: one line, and whether it is predicted to fit."""
    memory = estimate_memory(job.model, job.layout, job.cluster)
    cost = estimate_cost(job.model, job.layout, job.cluster)
    fits = "fits" if memory.fits else "does NOT fit"
    return (f"yours ({job.command.source}, line {job.command.line}): {job.layout.describe()} "
            f"on {job.cluster.num_gpus} x {job.cluster.gpu.name}, gbs {job.layout.gbs}: "
            f"predicted {cost.tokens_per_s:,.0f} tokens/s, peak "
            f"{memory.peak_bytes / _GIB:.1f} GiB of {memory.capacity_bytes / _GIB:.1f} ({fits})",
            memory.fits)


def _figure(record: TrialRecord | None, result: SearchResult) -> tuple[float | None, str]:
    """The record's tokens/s as the search ranks it (a finalist's over its runs:
    SearchResult.figure) and as shown."""
    if record is None:
        return None, "not tried"
    kind = "predicted" if record.predicted else "measured"
    if record.tokens_per_s is None:
        why = f": {record.reason}" if record.reason else ""
        return None, f"{record.status}{why} ({kind})"
    figure = result.figure(record)
    if figure is None or len(figure.runs) < 2:
        return record.tokens_per_s, f"{record.tokens_per_s:,.0f} tokens/s ({kind})"
    return figure.tokens_per_s, (f"{figure.tokens_per_s:,.0f} tokens/s ({kind}, mean of "
                                 f"{len(figure.runs)} runs ± {figure.error:.1%})")


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """The user's layout against the best found: what a --from-megatron search ends with, as
    lines or (with --json) as one object."""

    yours: str
    """The user's layout, as the tables label layouts."""
    yours_shown: str
    """Its figure (measured or predicted tokens/s) or why there is none."""
    yours_tokens_per_s: float | None
    best: str | None
    best_tokens_per_s: float | None
    best_shown: str = ""
    changes: list[RowChange] = field(default_factory=list)
    export: str | None = None
    """The `autotune export` command that writes the user's file with these flags changed,
    shell-quoted: the file name is the user's, and a pasted line must run nothing else."""
    best_exported_tokens_per_s: float | None = None
    """With the best measured with sdpa standing in for te (megatron_args.exported_layout):
    the model's tokens/s of the te layout the user's command runs, not measured; else None."""
    yours_measured_as_written: bool = True
    """False when the user's layout ran with another impl than their command's (sdpa for te):
    its figure is not a measurement of their command."""
    ranking: str | None = None
    """How sure the top of the ranking is, over the finalists' runs
    (autotune.search.finalists.ranking_line); the search summary prints it above."""

    @property
    def best_measured_as_exported(self) -> bool:
        return self.best_exported_tokens_per_s is None

    @property
    def gain(self) -> float | None:
        if not self.yours_tokens_per_s or self.best_tokens_per_s is None:
            return None
        return self.best_tokens_per_s / self.yours_tokens_per_s - 1

    def lines(self) -> list[str]:
        if self.best is None:
            return [f"yours: {self.yours_shown}; no layout completed"]
        gain = "" if self.gain is None else f" ({self.gain:+.1%})"
        out = [f"yours: {self.yours}: {self.yours_shown}",
               f"best found: {self.best}: {self.best_shown}{gain}"]
        if self.best_exported_tokens_per_s is not None:
            # sdpa stood in for the te the command runs: its figure is not the command's.
            out.append("the best's figure is sdpa's, standing in for te (Transformer Engine is "
                       "not installed here); with te it is predicted "
                       f"{self.best_exported_tokens_per_s:,.0f} tokens/s, not measured")
        if not self.changes:
            out.append("your layout is the best found: no flag changes"
                       if self.best_measured_as_exported and self.yours_measured_as_written
                       else "no flag changes found: your layout was measured with sdpa "
                       "standing in for te, so this is not a measurement of your command")
            return out
        out.append("flags that change: " + "; ".join(c.describe() for c in self.changes))
        out.append(f"{self.export}   writes your file with these flags changed")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"yours": {"layout": self.yours, "tokens_per_s": self.yours_tokens_per_s,
                          "figure": self.yours_shown},
                "best": None if self.best is None else {
                    "layout": self.best, "tokens_per_s": self.best_tokens_per_s,
                    "figure": self.best_shown,
                    "measured_as_exported": self.best_measured_as_exported,
                    "exported_predicted_tokens_per_s": self.best_exported_tokens_per_s},
                "yours_measured_as_written": self.yours_measured_as_written,
                "gain": self.gain,
                "ranking": self.ranking,
                "changes": [{"row": c.row, "before": list(c.before), "after": list(c.after)}
                            for c in self.changes],
                "export": self.export}


def _study_place(results_dir: str | None, storage: str | None,
                 result: SearchResult) -> list[str]:
    """The export's --storage or --results-dir where the search's study is not the default's."""
    from pathlib import Path

    from autotune.search.storage import DEFAULT_RESULTS_DIR

    if storage is not None:
        return ["--storage", result.storage]
    if results_dir is not None and \
            Path(results_dir).resolve() != Path(DEFAULT_RESULTS_DIR).resolve():
        return ["--results-dir", str(Path(results_dir).resolve())]
    return []


def compare(job: UserJob, result: SearchResult, *, study: str, results_dir: str | None = None,
            storage: str | None = None) -> Comparison:
    """The user's layout against the best of `result`, with the flags that change. The export
    line names --results-dir (absolute) when the study is not under ./results and --storage
    (`result.storage`, its password redacted) when one was given: it runs from anywhere."""
    from autotune.search.finalists import ranking_line
    from autotune.search.records import Source

    mine = next((r for r in result.records if r.source == Source.USER), None)
    yours, shown = _figure(mine, result)
    label = mine.label if mine else job.layout.describe()
    best = result.best(1)
    if not best:
        return Comparison(yours=label, yours_shown=shown, yours_tokens_per_s=yours, best=None,
                          best_tokens_per_s=None)
    top = best[0]
    best_tokens, best_shown = _figure(top, result)
    same = mine is not None and top.number == mine.number
    changes = [] if same else layout_changes(job.command, job.layout, top.layout)
    words = ["autotune", "export", "--from-megatron", job.command.source,
             *([] if job.line_option is None else ["--line", str(job.line_option)]),
             *_study_place(results_dir, storage, result),
             "--study", study, "-o", "tuned.sh"]
    te = None if measured_as_exported(top.layout) else estimate_cost(
        job.model, exported_layout(top.layout), job.cluster).tokens_per_s
    return Comparison(yours=label, yours_shown=shown, yours_tokens_per_s=yours,
                      best=top.label, best_tokens_per_s=best_tokens,
                      best_shown=best_shown, changes=changes,
                      export=" ".join(shlex.quote(w) for w in words) if changes else None,
                      best_exported_tokens_per_s=te,
                      yours_measured_as_written=mine is None or mine.layout == job.layout,
                      ranking=ranking_line(result))
