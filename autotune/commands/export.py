"""`autotune export`: a study's winning layout (or --trial N) as a launch script or JSON."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.errors import ConfigError
from autotune.inputs.files import output_file
from autotune.inputs.numbers import check_count
from autotune.megatron.megatron_args import SDPA_STANDS_IN, exported_layout, measured_as_exported
from autotune.outputs import write_text
from autotune.predict.trust import memory_risk, trust_line

if TYPE_CHECKING:  # optuna and the report's loader are imported when an export runs
    from autotune.layouts.layout import Layout
    from autotune.megatron.megatron_versions import MegatronVersion
    from autotune.report.load import LoadedStudy, StudyRef
    from autotune.search.records import TrialRecord
    from autotune.specs.model import ModelSpec

__all__ = ["DEFAULT_FORMAT", "output_path", "pick_record", "run_export"]

DEFAULT_FORMAT = "megatron-lm"
"""What `export` writes without --format: the launch script (torchrun + Megatron-LM's
pretrain_gpt.py), the command a Megatron user runs; the others are for autotune's own worker
(torchrun), a batch system (slurm) and `estimate --layout` (json)."""


def pick_record(loaded: LoadedStudy, trial: int | None) -> TrialRecord:
    """The best COMPLETE trial by tokens/s, or trial `trial`, which must be COMPLETE."""
    ranked = loaded.complete_rows()
    best = f"; the best is trial {ranked[0]['trial']}" if ranked else ""
    if trial is None:
        if not ranked:
            raise ConfigError(f"study {loaded.ref.name} has no COMPLETE trial with a tokens/s "
                              "figure to export")
        return loaded.record(ranked[0]["trial"])
    state = loaded.row(trial)["state"]  # Optuna's state: the record does not hold it
    record = loaded.records.get(trial)
    if state != "COMPLETE" or record is None or not record.tokens_per_s:
        why = state if record is None else f"{state}, {record.status}" + (
            f": {record.reason}" if record.reason else "")
        raise ConfigError(f"trial {trial} of study {loaded.ref.name} is not COMPLETE ({why}); "
                          f"only COMPLETE trials can be exported{best}")
    return record


def _study_files(ref: StudyRef) -> list[Path]:
    """The study's SQLite database (with its journal, WAL and shared-memory files), wherever
    its URL puts it; none for a server database."""
    from sqlalchemy.engine import make_url

    try:
        url = make_url(ref.url)
    except Exception:  # not a URL SQLAlchemy reads: nothing of it is a local file
        return []
    if not url.drivername.startswith("sqlite") or not url.database or \
            url.database == ":memory:":
        return []
    db = Path(url.database).resolve()
    return [db, *(db.with_name(db.name + tail) for tail in ("-journal", "-wal", "-shm"))]


def output_path(output: str, ref: StudyRef, mine: str | None = None) -> Path:
    """`-o FILE`, checked before anything is written (autotune.inputs.files.output_file), and
    neither a file of the study (its database with its journal wherever it is, and no file
    already in the study's folder) nor `mine`, the user's own --from-megatron command: the
    edited copy must not replace what it was made from."""
    path = output_file(output)
    target = path.resolve()  # follows links: a link onto study.db is the study too
    study_files = _study_files(ref)
    folder = ref.folder.resolve()
    same = path.exists() and any(f.exists() and os.path.samefile(path, f) for f in study_files)
    if target in study_files or same or (path.exists() and target.is_relative_to(folder)):
        raise ConfigError(f"-o {output} is a file of study {ref.name}; refusing to overwrite "
                          "it (write the export elsewhere)")
    if mine is not None and path.exists() and Path(mine).exists() \
            and os.path.samefile(path, mine):
        raise ConfigError(f"-o {output} is your --from-megatron command; refusing to overwrite "
                          "it (write the edited copy elsewhere, e.g. -o tuned.sh)")
    return path


_WRITES = {"json": "the layout, no command", "torchrun": "autotune's worker, not Megatron-LM"}
"""What the formats without a Megatron-LM command write, for the options that shape one."""


def _refuse_unused(fmt: str, **given: object) -> None:
    """Options that shape a Megatron-LM command, refused where the format writes none (they
    were dropped in silence), as --from-megatron refuses those its command keeps."""
    unused = {"megatron_lm": "--megatron-lm", "train_iters": "--train-iters",
              "megatron_version": "--megatron-version", "nodes": "--nodes"}
    if fmt == "torchrun":
        unused.pop("nodes")  # checked against the layout below: one node only
    if fmt in _WRITES:
        for key, name in unused.items():
            if given[key] is not None:
                raise ConfigError(f"{name} has no place with --format {fmt}: it writes "
                                  f"{_WRITES[fmt]}")


def run_export(*, study: str | None, results_dir: str, storage: str | None, trial: int | None,
               fmt: str | None, output: str | None, megatron_lm: str | None,
               nodes: int | None, model: str | None = None, train_iters: int | None = None,
               from_megatron: str | None = None, line: int | None = None,
               megatron_version: str | None = None) -> str:
    """Build the export text, write it to `output` (or stdout) and return it. With
    `from_megatron` (the user's own command file) the text is that file with only the flags
    of the study's layout that differ from theirs edited on its launch command (the one on
    `line`, when given: --line N). Megatron-LM's flags are spelled for `megatron_version`
    (default: the installed megatron-core, else the release autotune is written against)."""
    from autotune.megatron.megatron_versions import running
    from autotune.report.load import load_study, resolve_study
    from autotune.report.scripts import (
        FORMATS,
        check_megatron_lm,
        layout_json,
        megatron_lm_script,
        slurm_script,
        torchrun_script,
    )
    from autotune.trials.trial import TrialSpec

    if from_megatron is not None:
        if fmt not in (None, "megatron-lm"):
            raise ConfigError("--from-megatron writes your own Megatron-LM command: --format "
                              f"megatron-lm or none, not {fmt}")
        for name, value in (("--megatron-lm", megatron_lm), ("--nodes", nodes),
                            ("--train-iters", train_iters)):
            if value is not None:
                raise ConfigError(f"{name} has no place with --from-megatron: your command "
                                  "keeps its own")
        fmt = "megatron-lm"
    elif line is not None:
        raise ConfigError("--line names the launch in a --from-megatron FILE; give that too")
    elif fmt is None:
        fmt = DEFAULT_FORMAT
    if fmt not in FORMATS:
        raise ConfigError(f"unknown --format {fmt!r}; choose {', '.join(FORMATS)}")
    _refuse_unused(fmt, megatron_lm=megatron_lm, train_iters=train_iters,
                   megatron_version=megatron_version, nodes=nodes)
    check_count("--nodes", nodes)
    check_count("--train-iters", train_iters)
    iters = {} if train_iters is None else {"train_iters": train_iters}
    version = running(megatron_version)  # an unknown or unsupported version: refused here
    check_megatron_lm(megatron_lm)
    ref = resolve_study(study, Path(results_dir), storage)
    path = None if output is None else output_path(output, ref, from_megatron)
    loaded = load_study(ref, model)
    record = pick_record(loaded, trial)
    layout = record.layout
    # A finalist's figure is over its runs (autotune.search.finalists).
    tokens = loaded.figure_tokens(record.number, record.tokens_per_s or 0.0)
    chosen = "the best COMPLETE trial" if trial is None else "--trial"
    # What export says on stderr, printed once the text is made: a refusal on the way (--nodes
    # that do not divide the GPUs, another model's command) is then its one line alone.
    notes = [f"autotune: exporting trial {record.number} ({chosen}) of study {ref.name}: "
             f"{record.label}, as --format {fmt}"]
    spec_model, cluster = loaded.model, loaded.cluster
    if fmt == "json":
        text = layout_json(layout, model=spec_model.name if spec_model else None,
                           gpus=layout.world_size,
                           gpu=cluster.gpu.name if cluster else None,
                           tokens_per_s=tokens, predicted=record.predicted,
                           study=ref.name, trial=record.number,
                           seq_length=spec_model.seq_length if spec_model else None,
                           gpus_per_node=cluster.gpus_per_node if cluster else None)
    else:
        if spec_model is None:
            raise ConfigError(f"the model of study {ref.name} is unknown (not a default study "
                              "name, no trial.json); pass --model PRESET_OR_YAML")
        figure = "predicted by autotune's analytical models, not measured" \
            if record.predicted else "measured"
        gpu = cluster.gpu.name if cluster else "GPU"
        title = [f"autotune export --format {fmt}: {spec_model.name} (seq "
                 f"{spec_model.seq_length}) on {layout.world_size} x {gpu}",
                 f"study {ref.name}, trial {record.number}: {record.label}, gbs {layout.gbs}",
                 f"{tokens:,.0f} tokens/s, {figure}."]
        if record.predicted and cluster is not None:  # the figure's band and range (issue 28)
            xseg = layout.expandable_segments
            title.append(trust_line(spec_model, cluster, xseg) + ".")
            risk = memory_risk(record.predicted_peak_bytes, cluster, xseg)
            if risk:
                title.append(f"Memory: {risk}.")
        if not measured_as_exported(layout) and cluster is not None:
            from autotune.predict.cost import estimate_cost

            te = estimate_cost(spec_model, exported_layout(layout), cluster).tokens_per_s
            title.append(f"That figure is sdpa's, standing in for te: with te, as this command "
                         f"runs, the model predicts {te:,.0f} tokens/s (not measured).")
        default_nodes = cluster.num_nodes if cluster else 1
        if from_megatron is not None:
            # The user's file is theirs byte for byte unless a release is named: then their
            # other flags are respelled for it too.
            text, said_of_it = _user_command(from_megatron, spec_model, layout, ref.name, line,
                                             version if megatron_version is not None else None)
            notes += said_of_it
            if not measured_as_exported(layout):  # the user's file takes no header: say it here
                said = title[-1] if cluster is not None else ""
                notes.append(f"autotune: {SDPA_STANDS_IN} {said}".rstrip())
        elif fmt == "megatron-lm":
            text = megatron_lm_script(spec_model, layout, title=title,
                                      nodes=nodes or default_nodes, megatron_lm=megatron_lm,
                                      megatron_version=version, **iters)
        elif fmt == "slurm":
            text = slurm_script(spec_model, layout, title=title, nodes=nodes or default_nodes,
                                megatron_lm=megatron_lm,
                                job_name=f"autotune-{spec_model.name}",
                                megatron_version=version, **iters)
        else:
            if (nodes or default_nodes) > 1:
                raise ConfigError("--format torchrun runs autotune's worker on one node; use "
                                  "--format megatron-lm or slurm for several nodes")
            spec = TrialSpec(model=spec_model, layout=layout)
            if cluster is not None:  # MFU against the study's GPU, not the default H100
                spec = replace(spec, gpu_peak_bf16_flops=cluster.gpu.peak_bf16_flops)
            text = torchrun_script(spec, title=title)
    if path is None:
        print("\n".join(notes), file=sys.stderr)
        sys.stdout.write(text)
    else:
        try:
            # Whole or not at all (a full disk leaves no empty script); executable unless JSON.
            write_text(path, text, executable=fmt != "json")
        except OSError as exc:
            raise ConfigError(f"-o {output}: cannot write it ({exc.strerror or exc})") from None
        print("\n".join([*notes, f"autotune: wrote {path}"]), file=sys.stderr)
    return text


def _user_command(path: str, model: ModelSpec, layout: Layout, study: str,
                  line: int | None, version: MegatronVersion | None = None
                  ) -> tuple[str, list[str]]:
    """The user's file with `layout`'s changed flags edited in place
    (autotune.megatron.script_patch) and, with `version` (--megatron-version), their other flags
    respelled for that release; refused in one line when the study searched another model or GPU
    count than the command runs. Nothing is added to it (no header): the file differs from theirs
    only in those flags, which the lines returned with it list (for stderr)."""
    from autotune.commands.from_megatron import read_user_job
    from autotune.megatron.megatron_command import layout_changes
    from autotune.megatron.script_patch import patch_script, respellings

    job = read_user_job(path, gpus=layout.world_size, gpus_per_node=None, gpu=None, line=line)
    if replace(job.model, name=model.name) != model:
        raise ConfigError(f"study {study} searched {model.name}, not the model of {path}'s "
                          "command (its flags give another shape, sequence or batch)")
    changes = layout_changes(job.command, job.layout, layout)
    described = "; ".join(c.describe() for c in changes) or "none, the layout is yours"
    notes = [*job.warnings,
             f"autotune: {path}, line {job.command.line}: flags that change: {described}"]
    if version is not None:
        respelled = "; ".join(r.describe() for r in respellings(job.command, version)) or \
            "none, they are its spelling already"
        notes.append(f"autotune: {path}, line {job.command.line}: flags respelled for "
                     f"megatron-core {version.version}: {respelled}")
    return patch_script(job.command, layout, changes, version), notes
