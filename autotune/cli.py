"""The `autotune` command line: thin commands over the library.

`autotune MODEL --gpus N` is the search; the other commands are named. Errors become one line on
stderr and an exit code here, at the edge, and nowhere else.
"""

from __future__ import annotations

import inspect
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from autotune.commands.aliases import option_names
from autotune.commands.estimate import defaults_note
from autotune.commands.pins import FIX_OPTION, Pins, describe_pins, parse_pins, pin_space
from autotune.commands.precision import (
    PRECISION_HELP,
    Precision,
    fp8_hint,
    kept_precision,
    parse_precision,
)
from autotune.dimensions import Dimension
from autotune.errors import INTERRUPTED_EXIT, AutotuneError, ConfigError, Interrupted
from autotune.inputs.numbers import check_count, check_seconds
from autotune.inputs.untrusted import for_terminal
from autotune.layouts.layout import DIMENSIONS, RULE_LEVELS, SEARCHED
from autotune.layouts.legend import legend_lines
from autotune.levers.fp8 import Fp8
from autotune.search.space import (
    SearchSpace,
    SpaceSummary,
    any_valid,
    batch_shortfall,
    enumerate_space,
    load_space,
)
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.presets import list_presets, load_model
from autotune.trials.trial import DEFAULT_STABLE_CV

__all__ = ["STORAGE_EXAMPLE", "app", "main"]

log = logging.getLogger(__name__)
_COMMANDS = ("models", "search", "estimate", "calibrate", "report", "export")
FROM_MEGATRON = "--from-megatron"
"""`autotune --from-megatron FILE` searches around a user's own Megatron-LM command."""
LineOption = Annotated[int | None, typer.Option(
    "--line", help=f"With {FROM_MEGATRON}: the line of the pretrain_gpt.py launch to read, "
                   "where the file has several or one the shell may not run as written (in "
                   "an if, a loop, a function).", show_default=False)]
STORAGE_EXAMPLE = "postgresql+psycopg://user@host/db"
"""The --storage example; README.md gives the same one (tests/test_vocabulary.py)."""


class _SearchByDefault(typer.core.TyperGroup):
    """Routes `autotune MODEL ...` to the search command: the first word names no command, or
    is an option of the search's (`autotune --gpus 8 MODEL`), not one of `autotune`'s own
    (--help, --version)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args:  # bare `autotune`: its help, as `autotune --help` prints it
            typer.echo(ctx.get_help())
            ctx.exit(0)
        own = {name for param in self.get_params(ctx)
               for name in (*param.opts, *param.secondary_opts)}
        first = args[0]
        if (not first.startswith("-") and first not in self.commands) or (
                first.startswith("-") and first.split("=", 1)[0] not in own):
            _refuse_mistyped_command(first, list(self.commands))
            args = ["search", *args]
        return super().parse_args(ctx, args)


def _refuse_mistyped_command(word: str, commands: list[str]) -> None:
    """`autotune estimat`: a first word that names no preset, no file and no path but is close
    to a command is a mistyped command, not a model; one line says which."""
    import difflib

    if word.startswith("-") or word in list_presets() or Path(word).exists() or \
            any(c in word for c in "/\\."):
        return
    close = difflib.get_close_matches(word, commands, n=1, cutoff=0.75)
    if close:
        raise ConfigError(f"unknown command {word!r}; did you mean {close[0]!r}?")


app = typer.Typer(
    cls=_SearchByDefault,
    help="Find the fastest Megatron parallel layout for a model on a given set of GPUs.\n\n"
    "Run `autotune MODEL --gpus N` to search, `autotune models` for the presets.",
    # \b keeps click from rewrapping the legend's aligned lines.
    epilog="Layout labels (the search's tables, `autotune estimate`, reports):\n\n\b\n"
    + "\n".join(legend_lines()),
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        from autotune import __version__

        try:
            typer.echo(f"autotune {version('autotune')}")
        except PackageNotFoundError:  # run from a source tree that is not installed
            typer.echo(f"autotune {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print autotune's version and exit.")] = False) -> None:
    # The options of `autotune` itself; the help text is the Typer's.
    pass


@app.command()
def models() -> None:
    """List the model presets with their sizes."""
    from autotune.commands.listing import print_models

    print_models()


def _load_inputs(model_name: str, gpus: int, gpus_per_node: int | None, seq_len: int | None,
                 global_batch_size: int | None, gpu: str | None) -> tuple[ModelSpec, ClusterSpec]:
    for flag, value in (("--gpus", gpus), ("--gpus-per-node", gpus_per_node),
                        ("--seq-len", seq_len), ("--global-batch-size", global_batch_size)):
        check_count(flag, value)
    if gpus_per_node is not None and gpus_per_node > gpus:
        raise ConfigError(f"--gpus-per-node {gpus_per_node} is more than --gpus {gpus}: the job "
                          "uses --gpus GPUs in all")
    model = load_model(model_name).with_overrides(seq_length=seq_len,
                                                  global_batch_size=global_batch_size)
    return model, ClusterSpec.make(gpus, gpus_per_node, gpu)


Gpus = Annotated[int, typer.Option("--gpus", help="Number of GPUs the job uses.")]
GpusPerNode = Annotated[int | None, typer.Option(
    "--gpus-per-node", help="GPUs that share NVLink in one node (default: min(8, --gpus)).")]
SeqLen = Annotated[int | None, typer.Option(
    *option_names("seq_length", "--seq-len"), help="Override the preset's sequence length "
                                                   "(--seq-length is the same option).")]
GlobalBatch = Annotated[int | None, typer.Option(
    *option_names("global_batch_size", "--global-batch-size", "--gbs"),
    help="Override the preset's global batch size in sequences (--gbs is the same option).")]
Gpu = Annotated[str | None, typer.Option(
    "--gpu", "--cluster", help="GPU type: h100-80gb, h200, a100-80gb, a100-40gb, b200 "
                               "(default: detected, else h100-80gb); or a cluster YAML file "
                               "with the GPU type, GPUs per node and links, or a shipped "
                               "one by name (dgx-h100: search_spaces/clusters/).")]


def _search(
    model: Annotated[str | None, typer.Argument(
        help="A preset name (see `autotune models`), a model YAML file, or a Hugging Face "
             "config.json (or its folder); left out with --from-megatron.", metavar="MODEL",
        show_default=False)] = None,
    gpus: Annotated[int | None, typer.Option(
        "--gpus", help="Number of GPUs the job uses (with --from-megatron: the command's "
                       "torchrun, unless it cannot tell).", show_default=False)] = None,
    gpus_per_node: GpusPerNode = None,
    seq_len: SeqLen = None,
    global_batch_size: GlobalBatch = None,
    space: Annotated[str | None, typer.Option(
        "--space", help="Search space: a shipped one by name (default, one-node, "
                        "single-gpu, ...) or a YAML file (default: default).")] = None,
    gpu: Gpu = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Only explain the search space: its size, the valid layouts and "
                          "why the others are rejected.")] = False,
    backend: Annotated[str, typer.Option(
        "--backend", help="auto (worker with GPUs, else simulate), simulate (analytical "
                          "models), worker (megatron-core steps on this node's GPUs), "
                          "megatron-lm (pretrain_gpt.py from --megatron-lm).")] = "auto",
    megatron_lm: Annotated[str | None, typer.Option(
        "--megatron-lm", help="A Megatron-LM checkout (or the .py script to launch instead "
                              "of its pretrain_gpt.py), for --backend megatron-lm.")] = None,
    sampler: Annotated[str, typer.Option(
        "--sampler", help="auto, tpe (after Alpa's seeds), grid (every valid layout) or "
                          "ranked (the analytical model's best first).")] = "auto",
    trials: Annotated[int | None, typer.Option(
        "--trials", help="Stop after this many launched trials.")] = None,
    time_budget: Annotated[float | None, typer.Option(
        "--time-budget", help="Stop after this many seconds.")] = None,
    patience: Annotated[int | None, typer.Option(
        "--patience", help="Stop after this many launched trials without improvement.")
    ] = None,
    results_dir: Annotated[str, typer.Option(
        "--results-dir", help="Where studies are written.")] = "results",
    study: Annotated[str | None, typer.Option(
        "--study", help="Study name: up to 100 letters, digits, '.', '_', '-' (default: "
                         "derived from model, GPUs, space, backend).")
    ] = None,
    storage: Annotated[str | None, typer.Option(
        "--storage", help=f"Optuna storage URL, e.g. {STORAGE_EXAMPLE} (default: SQLite "
                          "at RESULTS_DIR/STUDY/study.db).")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue an existing study without repeating finished trials.")
    ] = False,
    steps: Annotated[int, typer.Option(
        "--steps", help="The most timed training steps per trial (fewer once the step time "
                        "is stable, --stable-cv).")] = 10,
    stable_cv: Annotated[float, typer.Option(
        "--stable-cv", help="Timing ends once the mean step time is known to within this "
                            "fraction (relative standard error; 0: always --steps).")
    ] = DEFAULT_STABLE_CV,
    stop_rule: Annotated[str, typer.Option(
        "--stop-rule", help="model: skip layouts the refitted cost model, widened by its "
                            "measured error, puts below the best measured, stop once no "
                            "untried layout could beat it, and stop timing trials that "
                            "cannot come near it; none: launch every proposal and time it to "
                            "the end. Real trials only; --sampler grid always measures every "
                            "layout.")] = "model",
    warmup_steps: Annotated[int, typer.Option(
        "--warmup-steps", help="Untimed steps before timing.")] = 3,
    trial_timeout: Annotated[float | None, typer.Option(
        "--trial-timeout", help="Seconds per trial (default: from the predicted step time).")
    ] = None,
    isolation: Annotated[str, typer.Option(
        "--isolation", help="warm: the worker's ranks stay up between trials (one pool per "
                            "search, started again after a failure); cold: a launch of its "
                            "own per trial. Multi-node trials are always cold.")] = "warm",
    calibration: Annotated[str | None, typer.Option(
        "--calibration", help="Constants fitted by `autotune calibrate`.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    nodes: Annotated[int | None, typer.Option(
        "--nodes", help="Nodes the --gpus span (--gpus = --nodes x --gpus-per-node); real "
                        "trials over several nodes need --launcher.")] = None,
    launcher: Annotated[str | None, typer.Option(
        "--launcher", help="How multi-node trials start: slurm (srun from inside an "
                           "allocation) or torchrun (this node hosts the rendezvous at "
                           "--rdzv-endpoint; the other nodes run each trial's "
                           "other_nodes.sh). See docs/MULTINODE.md.")] = None,
    rdzv_endpoint: Annotated[str | None, typer.Option(
        "--rdzv-endpoint", help="HOST:PORT of the c10d rendezvous (slurm default: the "
                                "allocation's first node).")] = None,
    from_megatron: Annotated[str | None, typer.Option(
        FROM_MEGATRON, help="A shell script or text file with your pretrain_gpt.py command "
                            "(read, never run): its model and layout are the first trial, "
                            "and the result says what to change.")] = None,
    line: LineOption = None,
    fix: Annotated[list[str] | None, typer.Option(
        FIX_OPTION, help="Pin a dimension: DIM=VALUES, e.g. tp=2, pp=1,2, recompute=none,full "
                         "(repeatable; DIM as in the space file, its option or its Megatron-LM "
                         "flag). Each dimension's own option below does the same.",
        metavar="DIM=VALUES")] = None,
    precision: Annotated[str | None, typer.Option(
        "--precision", help=PRECISION_HELP, metavar="bf16|any")] = None,
    **dimensions: Any,
) -> None:
    _check_search_options(backend, megatron_lm, trials=trials, patience=patience, steps=steps,
                          time_budget=time_budget, trial_timeout=trial_timeout,
                          warmup_steps=warmup_steps)
    pins = parse_pins(dimensions, fix or ())
    asked = parse_precision(precision, pins)
    if asked == Precision.BF16 and from_megatron is None:
        pins = {**pins, "fp8": (Fp8.OFF,)}
    job = None
    if line is not None and from_megatron is None:
        raise ConfigError(f"--line names the launch in a {FROM_MEGATRON} FILE; give that too")
    if from_megatron is not None:
        from autotune.commands.from_megatron import estimate_line, read_user_job

        if model is not None:
            raise ConfigError(f"give MODEL or {FROM_MEGATRON} FILE, not both (the command's "
                              "flags are the model)")
        if seq_len is not None or global_batch_size is not None:
            raise ConfigError(f"{FROM_MEGATRON}: the sequence and global batch are the "
                              "command's --seq-length and --global-batch-size")
        if pins:
            raise ConfigError(f"{FROM_MEGATRON} searches around your own layout; pins "
                              f"({describe_pins(pins)}) narrow a MODEL search only")
        job = read_user_job(from_megatron, gpus=gpus, gpus_per_node=gpus_per_node, gpu=gpu,
                            line=line)
        for warning in job.warnings:
            print(warning, file=sys.stderr)
        gpus, gpus_per_node = job.cluster.num_gpus, job.cluster.gpus_per_node
        yours, fits = estimate_line(job)
        if fits:
            print(f"autotune: {yours}", file=sys.stderr)
        # else the search says it: with the best found after the table, or, where no layout
        # fits, in the one line of that error, after its conclusion.
    elif model is None:
        raise ConfigError("Missing argument 'MODEL' (or --from-megatron FILE)")
    if gpus is None:
        raise ConfigError("Missing option '--gpus'")
    multi = None
    if nodes is not None or launcher is not None or rdzv_endpoint is not None:
        from autotune.commands.search import multinode_options

        gpus_per_node, multi = multinode_options(gpus, gpus_per_node, nodes, launcher,
                                                 rdzv_endpoint,
                                                 "simulate" if dry_run else backend)
    if job is not None:
        spec, cluster = job.model, ClusterSpec.make(gpus, gpus_per_node, gpu)
    else:
        assert model is not None
        spec, cluster = _load_inputs(model, gpus, gpus_per_node, seq_len, global_batch_size,
                                     gpu)
    if space is not None:
        from autotune.commands.search import space_path

        space = space_path(space)
    space_spec = pin_space(load_space(space), pins)
    if job is not None:
        from autotune.commands.from_megatron import widen_space

        space_spec = widen_space(space_spec, job.layout)
        # The command's precision is kept unless --precision says otherwise: FP8 changes
        # the numbers the training computes, not only its speed.
        space_spec = pin_space(space_spec, kept_precision(job.layout, asked))
        hint = None if asked == Precision.ANY else fp8_hint(spec, cluster, job.layout)
        if hint is not None:
            print(f"autotune: {hint}", file=sys.stderr)
    if dry_run:
        from autotune.commands.search import dry_run_space

        space_spec = dry_run_space(space_spec, backend, spec, cluster)
    # A search enumerates the space it searches (the backend's) itself, so the check before it
    # stops at the first valid layout (any_valid); the whole enumeration is needed here only
    # to print it (--dry-run) or to say why no layout is valid.
    if dry_run or not any_valid(space_spec, spec, cluster):
        summary = enumerate_space(space_spec, spec, cluster)
        if not summary.valid:
            raise _no_layout(summary, space_spec, spec, cluster, pins)
        if dry_run:
            from autotune.commands.listing import print_dry_run

            print_dry_run(spec, cluster, space_spec, summary, as_json)
            return
    from autotune.commands.search import run_search_command

    _check_places(study, results_dir, storage)
    run_search_command(spec, cluster, space_spec, backend=backend, megatron_lm=megatron_lm,
                       sampler=sampler, trials=trials, time_budget=time_budget,
                       patience=patience, results_dir=results_dir, study=study,
                       storage=storage, resume=resume, steps=steps, warmup_steps=warmup_steps,
                       trial_timeout=trial_timeout, calibration=calibration,
                       as_json=as_json, multi=multi, isolation=isolation,
                       stable_cv=stable_cv, stop_rule=stop_rule,
                       seeds=() if job is None else (job.layout,),
                       compare=None if job is None else _comparison(job, results_dir, storage))


def _check_search_options(backend: str, megatron_lm: str | None, *, trials: int | None,
                          patience: int | None, steps: int, time_budget: float | None,
                          trial_timeout: float | None, warmup_steps: int) -> None:
    """The search's own options, checked before anything is read or enumerated (a plan can
    take half a minute before a late check would refuse a typo)."""
    for flag, value in (("--trials", trials), ("--patience", patience), ("--steps", steps)):
        check_count(flag, value)
    # inf is no limit and NaN none at all: "no limit" is the option left out.
    check_seconds("--time-budget", time_budget, absent="no limit")
    # A negative warm-up reaches the worker's trial.json reader (which refuses it: every trial
    # would crash), and a timeout of 0 or less or NaN would time every trial out at once.
    if warmup_steps < 0:
        raise ConfigError(f"--warmup-steps must be 0 or more, got {warmup_steps}")
    check_seconds("--trial-timeout", trial_timeout,
                  absent="a timeout from the predicted step time")
    if megatron_lm is not None:
        from autotune.search.backends import check_checkout

        # A path given is checked with every backend (a typo is a typo); only megatron-lm's
        # trials launch it, which the note says where another backend runs them.
        check_checkout(megatron_lm)
        if backend != "megatron-lm":
            print(f"autotune: --megatron-lm is read by --backend megatron-lm only; this "
                  f"search (--backend {for_terminal(backend)}) does not use it",
                  file=sys.stderr)


_search.__doc__ = (
    "Search for the fastest layout of MODEL on --gpus GPUs, or around your own Megatron-LM "
    "command (--from-megatron FILE).\n\n"
    "Megatron-LM's own flag names work too (--tensor-model-parallel-size 2, --seq-length, "
    "--micro-batch-size). A dimension's option (--tp 2, --pp 1,2, --sp) or --fix DIM=VALUES "
    "pins it: the search only tries those values, in a study of its own.")


def _no_layout(summary: SpaceSummary, space: SearchSpace, model: ModelSpec,
               cluster: ClusterSpec, pins: Pins) -> ConfigError:
    """The error of a space without a valid layout, naming what rules them out."""
    # The rules of the deepest level reached are the ones that bind: a layout rejected there
    # passed every rule before it.
    deepest = sorted(summary.rejected.items(), key=lambda kv: (-RULE_LEVELS[kv[0]],
                                                               -kv[1].count))
    reasons = deepest[0][1].examples[0]
    if pins:
        shipped = space.source.split(" + ")[0]
        return ConfigError(f"no layout of {model.name} on {cluster.num_gpus} GPUs takes the "
                           f"pins {describe_pins(pins)} in space {shipped} ({reasons})")
    shortfall = batch_shortfall(space, model, cluster)
    if shortfall is not None:
        # The batch's rule names one layout's numbers; the cause is every layout's.
        return ConfigError(shortfall.describe(model, cluster.num_gpus))
    return ConfigError(f"no layout of {model.name} can use {cluster.num_gpus} GPUs with this "
                       f"search space ({reasons})")


def _comparison(job: Any, results_dir: str, storage: str | None) -> Any:
    """What a --from-megatron search ends with: the user's layout against the best."""
    from autotune.commands.from_megatron import compare

    return lambda result: compare(job, result, study=result.study_name,
                                  results_dir=results_dir, storage=storage)


def _estimate(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Argument(
        help="A preset name or a model YAML file (may be left out with --layout FILE when "
             "the file names it).", metavar="MODEL", show_default=False)] = None,
    gpus: Annotated[int | None, typer.Option(
        "--gpus", help="Number of GPUs the job uses (may be left out with --layout FILE "
                       "when the file says).", show_default=False)] = None,
    global_batch_size: GlobalBatch = None,
    seq_len: SeqLen = None,
    gpu: Gpu = None,
    gpus_per_node: GpusPerNode = None,
    layout_path: Annotated[str | None, typer.Option(
        "--layout", help="A JSON file from `autotune export --format json` (an option "
                         "that says otherwise is refused).")] = None,
    calibration: Annotated[str | None, typer.Option(
        "--calibration", help="Constants fitted by `autotune calibrate`.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    **dimensions: Any,
) -> None:
    from autotune.commands.estimate import run_estimate

    fields: dict[str, Any] = dict(dimensions)
    from_file: dict[str, Any] = {}
    if layout_path is not None:
        from autotune.commands.estimate import layout_file

        read = layout_file(layout_path, model_name=model, gpus=gpus, gpu=gpu, seq_len=seq_len,
                           gpus_per_node=gpus_per_node)
        model, gpus, gpu, seq_len, gpus_per_node = (read.model, read.gpus, read.gpu,
                                                     read.seq_len, read.gpus_per_node)
        from_file = read.fields
        # The file's values win; an option typed with another value is refused, not dropped.
        typed = {name: value for name, value in dimensions.items()
                 if getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"}
        if global_batch_size is not None:
            typed["gbs"] = global_batch_size
        clash = [name for name in typed if name in from_file and typed[name] != from_file[name]]
        if clash:
            sets = ", ".join(f"{name} {from_file[name]}" for name in clash)
            says = ", ".join(f"{DIMENSIONS[name].option} {typed[name]}" for name in clash)
            raise ConfigError(f"layout file {layout_path} sets {sets}; the options say {says}: "
                              "leave them out, or edit the file")
        fields.update(from_file)
    if model is None:
        raise ConfigError("Missing argument 'MODEL'" + (
            " (the --layout file names no model)" if layout_path is not None else ""))
    if gpus is None:
        raise ConfigError("Missing option '--gpus'" + (
            " (the --layout file gives no GPU count)" if layout_path is not None else ""))
    defaulted = [name for name in dimensions if name not in from_file
                 and getattr(ctx.get_parameter_source(name), "name", None) == "DEFAULT"]
    spec, cluster = _load_inputs(model, gpus, gpus_per_node, seq_len, global_batch_size, gpu)
    run_estimate(spec, cluster, fields, as_json=as_json, calibration=calibration,
                 defaulted=defaulted)


_estimate.__doc__ = (
    "Predict memory per pipeline stage, step time, tokens/s and MFU of one layout.\n\n"
    "Options left out take estimate's defaults, Megatron's own, not the search's choices ("
    + (defaults_note() or "") + ").")


def _estimate_option(dim: Dimension) -> inspect.Parameter:
    """estimate's option of one dimension: its value, Layout's default when left out. A switch
    that is on by default (the NaN checks) also takes `--no-...`, the only way to turn it off."""
    name = f"{dim.option}/--no-{dim.option[2:]}" if dim.kind is bool and dim.default \
        else dim.option
    option = typer.Option(*option_names(dim.name, name), help=dim.help.split("\n")[0],
                          metavar=dim.metavar)
    return inspect.Parameter(dim.name, inspect.Parameter.KEYWORD_ONLY, default=dim.default,
                             annotation=Annotated[dim.kind, option])


def _pin_option(dim: Dimension) -> inspect.Parameter:
    """The search's option of one dimension: a pin (autotune.commands.pins), None when left
    out. A switch pins on (`--sp`) or off (`--no-sp`); any other takes a comma list."""
    first = dim.help.split("\n")[0].rstrip(".")
    if dim.kind is bool:
        names = option_names(dim.name, f"{dim.option}/--no-{dim.option[2:]}")
        help_text = f"Pin: only layouts with (or, --no-..., without) this. {first}."
        annotation: Any = Annotated[bool | None, typer.Option(*names, help=help_text,
                                                              show_default=False)]
    else:
        choices = f" ({dim.metavar or '|'.join(dim.choices)})" if dim.choices else ""
        help_text = f"Pin: only these values, comma-separated{choices}. {first}."
        annotation = Annotated[str | None, typer.Option(
            *option_names(dim.name, dim.option), help=help_text, metavar="VALUES",
            show_default=False)]
    return inspect.Parameter(dim.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=annotation)


def _with_dimension_options(command: Any, make: Any = _estimate_option,
                            searched_only: bool = False) -> Any:
    """The command with one option per layout dimension, generated from the dimension table
    (autotune.layouts.layout.DIMENSIONS) by `make`: its flag and Megatron-LM's spelling of it
    (autotune.commands.aliases), help, type (an enum lists its choices) and default. dp
    follows from --gpus and gbs is the preset's unless --gbs says otherwise."""
    signature = inspect.signature(command, eval_str=True)
    fixed = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    generated = [make(dim) for dim in (SEARCHED if searched_only else DIMENSIONS).values()
                 if dim.name not in ("dp", "gbs")]
    command.__signature__ = signature.replace(parameters=[
        *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in fixed), *generated])
    return command


search = app.command("search")(_with_dimension_options(_search, _pin_option,
                                                       searched_only=True))
estimate = app.command("estimate")(_with_dimension_options(_estimate))


def _check_places(study: str | None, results_dir: str, storage: str | None, *,
                  writable: bool = True) -> None:
    """--study, --results-dir and --storage refused in one line where they enter: a study name
    outside the safe set (it is a folder and appears in scripts), a results folder that is a
    file or cannot be written, a storage URL SQLAlchemy would misread."""
    from autotune.search.storage import check_results_dir, check_storage_url, check_study_name

    if study is not None:
        check_study_name(study, "--study")
    check_results_dir(results_dir, writable=writable)
    if storage is not None:
        check_storage_url(storage)


StudyName = Annotated[str | None, typer.Option(
    "--study", help="Study name (default: the newest study under --results-dir).")]
ResultsDir = Annotated[str, typer.Option("--results-dir", help="Where studies are written.")]
Storage = Annotated[str | None, typer.Option(
    "--storage", help="Optuna storage URL the study lives in (default: SQLite at "
                      "RESULTS_DIR/STUDY/study.db).")]
StudyModel = Annotated[str | None, typer.Option(
    "--model", help="The study's model (preset or YAML), when its name does not say "
                    "(studies named with --study).")]


@app.command()
def report(study: StudyName = None, results_dir: ResultsDir = "results",
           storage: Storage = None, model: StudyModel = None) -> None:
    """Pareto fronts, tables and plots of a study, written into its folder."""
    from autotune.commands.report import run_report

    _check_places(study, results_dir, storage)
    run_report(study=study, results_dir=results_dir, storage=storage, model=model)


@app.command()
def export(
    fmt: Annotated[str | None, typer.Option(
        "--format", help="megatron-lm (the launch script: torchrun + pretrain_gpt.py, the "
                         "default), torchrun (autotune's worker), slurm (sbatch script) or "
                         "json (the layout).", show_default=False)] = None,
    study: StudyName = None,
    results_dir: ResultsDir = "results",
    storage: Storage = None,
    trial: Annotated[int | None, typer.Option(
        "--trial", help="Trial number (default: the best COMPLETE trial by tokens/s).")] = None,
    output: Annotated[str | None, typer.Option(
        "-o", "--output", help="Write to this file (default: stdout).")] = None,
    megatron_lm: Annotated[str | None, typer.Option(
        "--megatron-lm", help="Megatron-LM checkout on the machine that runs the script, or "
                              "the .py script to launch instead of its pretrain_gpt.py "
                              "(default: $MEGATRON_LM, else ./Megatron-LM).")] = None,
    nodes: Annotated[int | None, typer.Option(
        "--nodes", help="Nodes to spread the layout's GPUs over (default: the study's).")
    ] = None,
    model: StudyModel = None,
    train_iters: Annotated[int | None, typer.Option(
        "--train-iters", help="Iterations the megatron-lm or slurm command trains "
                              "(default 100: a short benchmark run).")] = None,
    from_megatron: Annotated[str | None, typer.Option(
        FROM_MEGATRON, help="Your pretrain_gpt.py command file (the one searched with "
                            "--from-megatron): written back with only the layout's flags "
                            "changed.")] = None,
    line: LineOption = None,
    megatron_version: Annotated[str | None, typer.Option(
        "--megatron-version", help="megatron-core release whose Megatron-LM flags to write, "
                                   "e.g. 0.19.2 (default: the installed megatron-core, else "
                                   "0.16.1); with --from-megatron, your flags are respelled "
                                   "for it.")] = None,
) -> None:
    """Launch command (or JSON) for a study's best layout or --trial N."""
    from autotune.commands.export import run_export

    _check_places(study, results_dir, storage, writable=False)
    run_export(study=study, results_dir=results_dir, storage=storage, trial=trial, fmt=fmt,
               output=output, megatron_lm=megatron_lm, nodes=nodes, model=model,
               train_iters=train_iters, from_megatron=from_megatron, line=line,
               megatron_version=megatron_version)


@app.command()
def calibrate(
    results_dir: Annotated[list[str], typer.Option(
        "--results-dir", help="Folders with measured trials (repeatable).")],
    output: Annotated[str, typer.Option("--output", "-o", help="Calibration file to write.")
    ] = "calibration.json",
    gpu: Annotated[str | None, typer.Option(
        "--gpu", help="The GPU the trials ran on, when their trial.json does not say.")
    ] = None,
) -> None:
    """Fit the memory and throughput models' constants to measured trials."""
    from autotune.commands.calibrate import run_calibrate

    run_calibrate(results_dir, gpu, output)


_SIGINT_EXIT = INTERRUPTED_EXIT


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script: runs the app, maps errors to exit codes."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    if debug:
        args.remove("--debug")
    try:
        code = app(args=args, prog_name="autotune", standalone_mode=False)
    except (typer.Exit, typer.Abort) as exc:
        if isinstance(exc, typer.Abort):
            print("autotune: interrupted", file=sys.stderr)
            return _SIGINT_EXIT
        return int(exc.exit_code or 0)
    except Interrupted as exc:  # a search stopped by Ctrl-C, its study consistent
        print(f"autotune: interrupted: {exc}", file=sys.stderr)
        return exc.exit_code
    except AutotuneError as exc:
        if debug:
            raise
        # Messages quote what the user gave: never an escape sequence or a second line.
        print(f"autotune: error: {for_terminal(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("autotune: interrupted", file=sys.stderr)
        return _SIGINT_EXIT
    except OSError as exc:
        # A file autotune had to read or write and could not: one line, never a traceback.
        if debug:
            raise
        name = str(exc.filename) if exc.filename is not None else ""
        where = f": {name if name.isprintable() else repr(name)}" if name else ""
        print(f"autotune: error: {' '.join(str(exc.strerror or exc).split())}{where}",
              file=sys.stderr)
        return 1
    except Exception as exc:
        # Usage errors (bad or missing options) are click exceptions; Typer vendors click in
        # recent releases, so they are recognised by shape rather than by class.
        if debug or not (hasattr(exc, "format_message") and hasattr(exc, "exit_code")):
            raise
        message = " ".join(exc.format_message().split())
        print(f"autotune: error: {message}", file=sys.stderr)
        return int(exc.exit_code or 1)
    if code == _SIGINT_EXIT:
        # Typer turns a KeyboardInterrupt inside a command into Exit(130), which
        # standalone_mode=False returns (as the app's value) instead of raising.
        print("autotune: interrupted", file=sys.stderr)
        return _SIGINT_EXIT
    return code if isinstance(code, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
