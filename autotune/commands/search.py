"""`autotune MODEL --gpus N`: pick the backend, run the study with progress, print the best."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from autotune.commands.counts import StudyCounts, count_trials
from autotune.errors import AutotuneError, ConfigError, Interrupted
from autotune.inputs.numbers import check_count
from autotune.layouts.layout import DIMENSIONS, Layout
from autotune.levers.fp8 import Fp8
from autotune.megatron.megatron_args import exported_layout, measured_as_exported
from autotune.predict.calibration import load_calibration
from autotune.predict.trust import (
    STEP_TIME_BAND,
    memory_band,
    outside_range,
    trust_line,
    within_memory_band,
)
from autotune.search.backends import Backend, BackendName, Isolation, make_backend
from autotune.search.space import SearchSpace
from autotune.specs.hardware import ClusterSpec, local_gpu_count
from autotune.specs.model import ModelSpec
from autotune.trials.launchers import MultiNode
from autotune.trials.protocol import te_available
from autotune.trials.trial import DEFAULT_STABLE_CV

if TYPE_CHECKING:  # the search (optuna) is imported when a search runs, not for --help
    from autotune.commands.from_megatron import Comparison
    from autotune.search import SearchConfig
    from autotune.search.loop import Search
    from autotune.search.records import SearchResult

__all__ = ["dry_run_space", "multinode_options", "run_search_command", "space_path"]

DEFAULT_REAL_TRIALS = 20


def multinode_options(gpus: int, gpus_per_node: int | None, nodes: int | None,
                      launcher: str | None, rdzv_endpoint: str | None,
                      backend: str = "auto") -> tuple[int | None, MultiNode | None]:
    """--nodes/--launcher/--rdzv-endpoint checked against --gpus: (GPUs per node, MultiNode).

    With --backend simulate the nodes only shape the plan; otherwise more than one node needs a
    --launcher that starts the trials there. GPUs per node default to --gpus / --nodes.
    """
    if nodes is None:
        if launcher is not None or rdzv_endpoint is not None:
            raise ConfigError("--launcher and --rdzv-endpoint need --nodes M")
        return gpus_per_node, None
    check_count("--nodes", nodes)
    if gpus_per_node is None:
        if gpus % nodes:
            raise ConfigError(f"--gpus {gpus} is not a multiple of --nodes {nodes}")
        gpus_per_node = gpus // nodes
    if gpus != nodes * gpus_per_node:
        raise ConfigError(f"--gpus {gpus} must equal --nodes {nodes} x --gpus-per-node "
                          f"{gpus_per_node} = {nodes * gpus_per_node}")
    if launcher is None:
        if rdzv_endpoint is not None:
            raise ConfigError("--rdzv-endpoint needs --launcher torchrun or slurm")
        if nodes > 1 and backend != "simulate":
            raise ConfigError(f"--nodes {nodes} needs --launcher slurm or torchrun to run "
                              "trials there (or --backend simulate to plan)")
        return gpus_per_node, None
    return gpus_per_node, MultiNode(launcher=launcher, nodes=nodes,
                                    gpus_per_node=gpus_per_node, rdzv_endpoint=rdzv_endpoint)


def space_path(name: str | None) -> str | None:
    """--space as a file to read: a file that exists as given, else a shipped space by name
    (`one-node` or `one-node.yaml`: search_spaces/one-node.yaml); an unknown name without a
    folder in it is refused with the shipped names. None is the default space."""
    from autotune.specs.presets import shipped_yaml

    if name is None or Path(name).exists() or "/" in name or "\\" in name:
        return name
    shipped = shipped_yaml()
    found = shipped.get(name.removesuffix(".yaml"))
    if found is None:
        raise ConfigError(f"--space {name}: no such file, nor a shipped search space (shipped: "
                          f"{', '.join(sorted(shipped))}; or give a YAML file's path)")
    return str(found)


def _choose_backend(requested: str, cluster: ClusterSpec,
                    multi: MultiNode | None = None) -> BackendName:
    local = local_gpu_count()
    name = BackendName.parse(requested)
    if multi is not None and multi.nodes > 1:
        # The trials run on the allocation's (or the rendezvous') nodes, not only this one: the
        # machine autotune runs on may be a GPU-less head node.
        if name == BackendName.AUTO:
            name = BackendName.WORKER
        if name == BackendName.MEGATRON_LM:
            raise ConfigError("multi-node trials run autotune's worker; --backend megatron-lm "
                              "runs on one node (use --backend worker or simulate)")
        return name
    if name == BackendName.AUTO:
        if local == 0:
            print("autotune: no GPU on this machine; planning with the analytical models "
                  "(--backend simulate): every figure is a prediction", file=sys.stderr)
            return BackendName.SIMULATE
        name = BackendName.WORKER
    if name in (BackendName.WORKER, BackendName.MEGATRON_LM):
        if local == 0:
            # Bad input (exit 2), as the README says: this machine cannot run what was asked.
            raise ConfigError(f"--backend {name} needs NVIDIA GPUs; none found (use "
                              "--backend simulate to plan without them)")
        if cluster.num_gpus > local:
            raise ConfigError(f"--gpus {cluster.num_gpus} but this node has {local} GPU(s); "
                              "for trials over several nodes give --nodes M with --launcher "
                              "slurm|torchrun (or plan with --backend simulate)")
    return name


def _runnable_space(space: SearchSpace, backend: str, model: ModelSpec | None = None,
                    cluster: ClusterSpec | None = None) -> SearchSpace:
    """The space with the implementations `backend` may rank (autotune.search.impls decides:
    what the export writes, what is installed, what the user asked for, what `model`'s head dim
    runs), and a line naming those left out."""
    from autotune.search.impls import rankable_impls

    space = _runnable_precision(space, backend)
    impls = space.candidates.get("impl")
    if impls is None:
        return space
    choice = rankable_impls(impls, backend, te_installed=te_available(),
                            asked="impl" in space.chosen, model=model,
                            compute_capability=None if cluster is None
                            else cluster.gpu.compute_capability)
    note = choice.note()
    if note is not None:
        print(note, file=sys.stderr)
    return replace(space, candidates={**space.candidates, "impl": choice.kept})


def dry_run_space(space: SearchSpace, backend: str, model: ModelSpec | None = None,
                  cluster: ClusterSpec | None = None) -> SearchSpace:
    """The space `--dry-run` explains: what the search on `backend` would rank
    (_runnable_space: a plan ranks te in sdpa's place), without refusing what only running
    needs (GPUs for the worker): `auto` is the worker on a machine with GPUs, else the plan."""
    name = BackendName.parse(backend)
    if name == BackendName.AUTO:
        name = BackendName.WORKER if local_gpu_count() else BackendName.SIMULATE
    return _runnable_space(space, name, model, cluster)


def _runnable_precision(space: SearchSpace, backend: str) -> SearchSpace:
    """Real trials run FP8 only through Transformer Engine (autotune.levers.fp8): without it
    the space's FP8 formats are dropped as `te` is, and said so; bf16 stays."""
    formats = space.candidates.get("fp8")
    if formats is None or backend == BackendName.SIMULATE or te_available():
        return space
    kept = tuple(f for f in formats if f == Fp8.OFF) or (Fp8.OFF,)
    if kept != formats:
        print(f"autotune: fp8 {', '.join(str(f) for f in formats if f != Fp8.OFF)} left out: "
              "Transformer Engine is not installed on this machine", file=sys.stderr)
    return replace(space, candidates={**space.candidates, "fp8": kept})


def run_search_command(model: ModelSpec, cluster: ClusterSpec, space: SearchSpace, *,
                       backend: str, megatron_lm: str | None, sampler: str,
                       trials: int | None, time_budget: float | None, patience: int | None,
                       results_dir: str, study: str | None, storage: str | None, resume: bool,
                       steps: int, warmup_steps: int, trial_timeout: float | None,
                       as_json: bool, calibration: str | None = None,
                       multi: MultiNode | None = None,
                       isolation: str = Isolation.WARM, seeds: tuple[Layout, ...] = (),
                       stable_cv: float = DEFAULT_STABLE_CV, stop_rule: str = "model",
                       compare: Callable[[SearchResult], Comparison] | None = None) -> None:
    """Run the search and print its best layouts. `seeds` run first (a user's own layout,
    `--from-megatron`); `compare` says what they are against the best (after the table, or
    as the JSON object's "comparison")."""
    again = dict(locals())  # the same search again, in a widened space (last_resort)
    from autotune.megatron.identity import run_key
    from autotune.report.progress import LiveProgress, best_groups, best_table
    from autotune.search import SearchConfig
    from autotune.search.config import Sampler, StopRule
    from autotune.search.last_resort import LAST_RESORT_SUFFIX, widened_for_memory
    from autotune.search.loop import Search
    from autotune.search.records import Source
    from autotune.search.storage import check_study_name
    from autotune.search.timesplit import time_split

    name = _choose_backend(backend, cluster, multi)
    cost_params, memory_params = (load_calibration(calibration) if calibration
                                  else (None, None))
    chosen: Backend = make_backend(name, cluster, megatron_lm, cost_params, memory_params,
                                   multi, isolation=Isolation.parse(isolation))
    space = _runnable_space(space, chosen.name, model, cluster)
    if seeds:
        from autotune.commands.from_megatron import runnable_seed

        seeds = tuple(runnable_seed(s, space) for s in seeds)
    if trials is None and not chosen.predicted and time_budget is None:
        trials = DEFAULT_REAL_TRIALS
    cfg = SearchConfig(model=model, cluster=cluster, space=space, backend=chosen,
                       results_dir=Path(results_dir), study_name=study, storage=storage,
                       sampler=Sampler.parse(sampler), n_trials=trials, time_budget_s=time_budget,
                       patience=patience, resume=resume, train_steps=steps,
                       warmup_steps=warmup_steps, trial_timeout_s=trial_timeout,
                       cost_params=cost_params, memory_params=memory_params, seeds=seeds,
                       stable_cv=stable_cv, stop_rule=StopRule.parse(stop_rule))
    console = Console(stderr=True)
    quiet = as_json or chosen.predicted
    if quiet:
        search = Search(cfg)
        stored = _finished(search)
        result = search.run()
    else:
        search = Search(cfg)  # the study opens (or is refused in one line) before the display
        stored = _finished(search)
        with LiveProgress(trials, console) as progress:
            result = search.run(progress)
    # Trials of the stored study read back (a planning run shown again, a --resume) are not
    # trials this run simulated or launched.
    nothing = None if result.interrupted or result.best(1) else _why_nothing(result, cfg)
    wider = None if seeds or not isinstance(nothing, ConfigError) \
        else widened_for_memory(space)
    if wider is not None and not _fits_somewhere(replace(cfg, space=wider)):
        wider = None  # no room there either: the one line below says what stood in the way
    if wider is not None:
        # Nothing fits: the memory levers of last resort, in a study of their own (the space
        # names a default one; a named one gets LAST_RESORT_SUFFIX), said in one line
        # (autotune.search.last_resort). This study stays: the same command with --resume
        # reads it, finds nothing fits again and resumes the widened one (the widened study,
        # made after it, is the newest: the one export and report pick).
        again_study = None if study is None else check_study_name(study + LAST_RESORT_SUFFIX)
        print(f"autotune: {nothing}; searching again with the optimizer's CPU offload (the "
              "precision-aware optimizer, the offloaded percent derived from the memory "
              f"model){'' if study is None else f' in study {again_study}'}", file=sys.stderr)
        return run_search_command(**{**again, "space": wider, "study": again_study})
    if isinstance(nothing, ConfigError):
        # The model does not fit these GPUs: bad input like a GPU count no layout can use,
        # one line and exit 2, without an empty table.
        if chosen.predicted and not stored:
            _discard_new_plan(cfg, result.study_name)
        mine = next((r for r in result.records if r.source == Source.USER), None)
        if mine is not None and mine.predicted_peak_bytes:
            # --from-megatron: the user's own layout after the conclusion, in the same line.
            raise ConfigError(f"{nothing}; yours ({mine.label}) is predicted at "
                              f"{mine.predicted_peak_bytes / 2**30:,.1f} GiB") from None
        raise nothing
    counts = count_trials(result.records, stored)
    split = time_split(result.records)
    verb = "simulated" if chosen.predicted else "launched"
    summary = _summary(counts, verb, result.valid_layouts, chosen.predicted)
    identity = functools.partial(run_key, model)
    groups = best_groups(result, 10, identity)
    comparison = None if compare is None else compare(result)
    # The bands the figures carry are the best layout's allocator's (autotune.predict.gate).
    top = result.best(1)
    xseg = bool(top) and top[0].layout.expandable_segments
    if as_json:
        from autotune.search.finalists import ranking_line

        trust = ({"trust": trust_line(model, cluster, xseg),
                  "outside_measured_range": outside_range(model, cluster),
                  "within_memory_band": _within_memory_band(result, cluster)}
                 if chosen.predicted else {})
        print(json.dumps({
            "study": result.study_name, "storage": result.storage, "model": model.name,
            "gpus": cluster.num_gpus, "gpus_per_node": cluster.gpus_per_node,
            "gpu": cluster.gpu.name, "space": space.source, "predicted": chosen.predicted,
            **trust,
            "stop_reason": result.stop_reason, "valid_layouts": result.valid_layouts,
            "trials": counts.to_dict(), "summary": f"{summary}; stopped: {result.stop_reason}",
            # How sure the top of the ranking is over the finalists' runs (issue 25).
            "ranking": ranking_line(result), "verdict": _verdict_lines(result, cfg),
            "best": [_best_row(r, cluster, result, cfg) for r in result.best(10)],
            # The text table's rows: each trial shown, with those it stands for.
            "table": [{"trial": first.number, "same_figures": [r.number for r in twins],
                       "similar": [r.number for r in similar]}
                      for (first, *twins), similar in groups],
            **({} if chosen.predicted else {"time": asdict(split),
                                            "time_summary": split.describe()}),
            **({} if comparison is None else {"comparison": comparison.as_dict()})},
            indent=2))
    else:
        out = Console()
        out.print(best_table(result, title=f"{model.name} on {cluster.num_gpus} x "
                             f"{cluster.gpu.name}: best layouts"
                             + (" (predicted)" if chosen.predicted else ""), run_key=identity))
        if chosen.predicted:  # how far to trust the figures (autotune.predict.trust, issue 28)
            out.print(trust_line(model, cluster, xseg))
            risky = _within_memory_band(result, cluster)
            if risky:
                out.print(f"within the memory band ({memory_band(cluster, xseg):.1%}) of the "
                          f"{cluster.gpu.memory_bytes / 2**30:.1f} GiB capacity, may run out "
                          f"of memory: trial{'s' if len(risky) > 1 else ''} "
                          + ", ".join(str(n) for n in risky)
                          + f" (ranked below roomier layouts predicted up to "
                          f"{STEP_TIME_BAND:.1%} slower: within the step-time band the model "
                          "cannot tell them apart)")
        out.print(f"{summary}; stopped: {result.stop_reason}")
        for line in _verdict_lines(result, cfg):
            out.print(line)
        if split.describe():
            out.print(split.describe())
        out.print(f"study {result.study_name} in {result.storage}")
        for line in [] if comparison is None else comparison.lines():
            out.print(line, soft_wrap=True)
    if result.interrupted:
        raise Interrupted(f"study {result.study_name} is consistent; --resume continues it")
    if nothing is not None:
        raise nothing


_PLAN_FILES = ("study.db", "study.lock", "study.db-journal", "study.db-wal", "study.db-shm")
"""What a plan's default SQLite storage leaves in its study folder."""


def _discard_new_plan(cfg: Any, name: str) -> None:
    """Take away the study folder this plan created, when no layout is predicted to fit: bad
    input leaves nothing behind, as a GPU count no layout can use does. Left standing, the
    folder of ruled-out trials became the newest study under --results-dir, the one `autotune
    export` and `report` pick without --study ("no COMPLETE trial"), hiding the user's last
    real plan. Only the default SQLite storage, only a folder holding nothing but the plan's
    own files (a study with trials from before this run is never discarded: the caller
    checks that this run found it empty)."""
    from autotune.search.lock import lock_study
    from autotune.search.storage import storage_url

    if cfg.storage:
        return
    folder = Path(cfg.results_dir) / name
    try:
        # Under the study's lock again: no other search can have opened it in between.
        lock = lock_study(name, storage_url(Path(cfg.results_dir), name, None))
    except ConfigError:
        return  # another process holds it now: it is that process's study
    try:
        if {p.name for p in folder.iterdir()} - set(_PLAN_FILES):
            return
        for file in _PLAN_FILES:
            (folder / file).unlink(missing_ok=True)
        folder.rmdir()
    except OSError:
        return  # a folder we cannot tidy keeps what it holds; the error line still stands
    finally:
        if lock is not None:
            lock.release()


def _within_memory_band(result: Any, cluster: ClusterSpec) -> list[int]:
    """Trial numbers of the ten best whose predicted peak lies within the memory model's error
    band of the capacity (the gate's `risky`): picks that may run out of memory."""
    return [r.number for r in result.best(10)
            if r.metrics is not None and within_memory_band(r.metrics.peak_bytes or 0, cluster,
                                                            r.layout.expandable_segments)]


def _summary(counts: StudyCounts, verb: str, valid: int, predicted: bool) -> str:
    """`2802 trials simulated, 2889 in the study (2889 valid layouts): 2802 ranked, 87
    predicted out of memory (not simulated)`: every trial of the study counted once."""
    read, ran = counts.read, counts.ran
    done = (f"{ran} trials {verb}" if not read
            else f"read {read} trials from the stored study, {verb} {ran or 'none'} more"
            if ran or not predicted
            else f"read {read} trials from the stored study (nothing new to simulate)")
    return (f"{done}, {counts.in_study} in the study ({valid} valid layouts): "
            f"{counts.breakdown(verb)}")


def _finished(search: Search) -> set[int]:
    """The numbers of the trials the study holds finished before the search runs."""
    return {t.number for t in search.store.study.get_trials(deepcopy=False)
            if t.state.is_finished()}


def _smallest_peak(cfg: SearchConfig) -> tuple[float, str] | None:
    """The smallest predicted peak memory per GPU over the space's valid layouts, with its
    label: what the nearest layout lacks when none is predicted to fit."""
    from autotune.predict.memory import estimate_memory
    from autotune.search.space import enumerate_space

    peaks = ((estimate_memory(cfg.model, s, cfg.cluster, cfg.memory_params).peak_bytes, s)
             for s in enumerate_space(cfg.space, cfg.model, cfg.cluster).valid)
    least = min(peaks, key=lambda pair: pair[0], default=None)
    return None if least is None else (least[0], least[1].describe())


def _fits_somewhere(cfg: SearchConfig) -> bool:
    """Whether some valid layout of the space is predicted to fit the GPU."""
    least = _smallest_peak(cfg)
    return least is not None and least[0] <= cfg.cluster.gpu.memory_bytes


def _why_nothing(result: SearchResult, cfg: SearchConfig) -> AutotuneError:
    """The error of a study without a single successful layout, in one line saying what stood
    in the way: ConfigError (exit 2) when no layout is predicted to fit, the input's problem
    (the model is too large for the GPUs and the space); AutotuneError (exit 1) when launched
    trials failed or nothing was tried."""
    from collections import Counter

    from autotune.trials.trial import TrialStatus

    cluster = cfg.cluster

    launched = [r for r in result.records if r.launched]
    if launched:
        counts = Counter(r.status.value for r in launched)
        statuses = ", ".join(f"{n} {status}" for status, n in counts.most_common())
        return AutotuneError(f"none of the {len(launched)} launched trials completed "
                             f"({statuses}); their logs are under the study's trials/ folder")
    oom = [(r.predicted_peak_bytes, r.label) for r in result.records
           if r.status is TrialStatus.PREDICTED_OOM and r.predicted_peak_bytes]
    # The records hold only the layouts tried: the ranked and grid samplers skip what is
    # predicted not to fit without a trial, and what was told PREDICTED_OOM may be only the
    # seeds (a --from-megatron user's own layout, Alpa's) or TPE's proposals. The space itself
    # says how far the nearest layout is; the records' peaks join it (a derived count
    # they were judged with may lie below the space's).
    smallest = min([*oom, *filter(None, [_smallest_peak(cfg)])], default=None)
    if smallest is not None and smallest[0] > cluster.gpu.memory_bytes:
        peak, label = smallest
        return ConfigError(f"no layout is predicted to fit: the smallest peak is "
                           f"{peak / 2**30:,.1f} GiB per GPU ({label}) against "
                           f"{cluster.gpu.memory_bytes / 2**30:.1f} GiB on {cluster.gpu.name}; "
                           "use more GPUs, or a space with more recompute, pipeline stages or "
                           "the distributed optimizer")
    return AutotuneError(f"no layout was tried ({result.stop_reason})")


def _best_row(record: object, cluster: ClusterSpec, result: SearchResult,
              cfg: SearchConfig) -> dict[str, object]:
    from autotune.search import TrialRecord

    assert isinstance(record, TrialRecord)
    s, m = record.layout, record.metrics
    peak = m.peak_bytes if m else None
    figure = result.figure(record)
    repeats = result.repeats(record)
    # Every layout field, from the dimension table (JSON: enums print as their values).
    return {"trial": record.number, **{name: getattr(s, name) for name in DIMENSIONS},
            "tokens_per_s": figure.tokens_per_s if figure else record.tokens_per_s,
            "tokens_per_s_error": figure.error if figure else None,
            "runs": [{"trial": r.number, "tokens_per_s": r.tokens_per_s,
                      "fresh": bool(r.metrics and r.metrics.warm is False),
                      "throttled": r.throttled, "noise": r.noise}
                     for r in [record, *repeats]],
            "mfu": m.mfu if m else None,
            "step_time_s": m.step_time_s if m else None,
            "step_time_cv": m.step_time_cv if m else None,
            "clocks": m.clocks.to_dict() if m and m.clocks else None,
            "throttled": bool(figure and figure.throttled),
            "peak_memory_gib": None if peak is None else peak / 2**30,
            "predicted": bool(m and m.predicted),
            "measured_as_exported": measured_as_exported(s),
            "exported_impl": exported_layout(s).impl.value,
            "exported_predicted_tokens_per_s": None if measured_as_exported(s)
            else _exported_prediction(s, cfg)}


def _exported_prediction(layout: Layout, cfg: SearchConfig) -> float:
    """The model's tokens/s of the layout the export writes for `layout` (te for sdpa)."""
    from autotune.predict.cost import estimate_cost

    return estimate_cost(cfg.model, exported_layout(layout), cfg.cluster,
                         cfg.cost_params).tokens_per_s


def _verdict_lines(result: SearchResult, cfg: SearchConfig) -> list[str]:
    """What the summary says of the winner beyond its row: how sure the ranking is
    (autotune.search.finalists), a winner measured while the GPU throttled, and a winner
    measured with sdpa standing in for the te the export writes."""
    from autotune.search.finalists import ranking_line

    best = result.best(1)
    if not best or cfg.backend.predicted:
        return []
    top = best[0]
    lines = [line] if (line := ranking_line(result)) else []
    figure = result.figure(top)
    clocks = top.metrics.clocks if top.metrics is not None else None
    if figure is not None and figure.throttled and clocks is not None:
        lines.append(f"the best, #{top.number}, was measured while the GPU throttled "
                     f"({clocks.describe()}): its figure may be below what the layout does")
    if not measured_as_exported(top.layout):
        exported = exported_layout(top.layout)
        lines.append(f"the best's figure is sdpa's, standing in for {exported.impl} "
                     "(Transformer Engine is not installed here); the export writes "
                     f"{exported.describe()}, predicted "
                     f"{_exported_prediction(top.layout, cfg):,.0f} tokens/s, not measured")
    return lines
