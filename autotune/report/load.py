"""Studies from storage: which study, which model and GPUs it searched, and one row per trial.

A study stores each trial's layout and figures (its record, autotune.search.records, read here
with `read_records`) but not the model it was searched for. That comes, in order, from the
study's user attributes `model` / `cluster` (when a search writes them), from a trial's
trials/<n>/trial.json (real runs write one), from the default study name
`<model>-<N>gpu-<gpu>-<backend>-<hash>` with the preset of that name, or from `--model`.
A `--model` that disagrees with the model the study stores (attributes or trial.json) is
refused: it would label the study's figures with another model's name and shape.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.errors import AutotuneError, ConfigError
from autotune.layouts.layout import DIMENSIONS, Layout
from autotune.levers.fp8 import Fp8
from autotune.search.records import (
    RECORD_ATTR,
    Figure,
    TrialRecord,
    rank_tokens,
    stored_record,
)
from autotune.search.storage import (
    as_stored,
    check_study_name,
    redact_url,
    storage_errors,
    storage_url,
)
from autotune.search.timesplit import overhead_s
from autotune.specs.hardware import DEFAULT_GPU, ClusterSpec, GpuSpec, gpu_spec
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model
from autotune.trials.protocol import SPEC_NAME
from autotune.trials.trial import StopReason, TrialSpec

__all__ = ["LAYOUT_FIELDS", "LoadedStudy", "StudyRef", "find_studies", "load_study",
           "read_records", "resolve_study", "trial_row"]

LAYOUT_FIELDS: tuple[str, ...] = tuple(DIMENSIONS)
"""Every layout field (autotune.layouts.layout.DIMENSIONS): a report row's layout columns."""
_FIGURES = ("tokens_per_s", "tokens_per_s_per_gpu", "step_time_s", "step_time_p90_s",
            "tflops_per_gpu", "mfu", "mfu_fp8", "peak_memory_gib", "predicted_tokens_per_s",
            "predicted_peak_memory_gib", "tokens_error_pct", "memory_error_pct")
_TIMING = ("stop_reason", "timed_steps", "warmup_s", "timed_s", "overhead_s")
"""How a measured trial's time went (TrialMetrics): why timing ended, the timed steps, the
seconds of warm-up and timed steps, and the rest of its wall time (overhead)."""
_GIB = 2**30
_DEFAULT_NAME = re.compile(r"^(?P<model>.+?)-(?P<gpus>\d+)gpu-(?P<gpu>[a-z0-9-]+?)-"
                           r"(?P<backend>simulate|worker|megatron-lm)-[0-9a-f]{8}$")
optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass(frozen=True, slots=True, kw_only=True)
class StudyRef:
    """Where a study lives: its name, storage URL and the folder its outputs go to."""

    name: str
    url: str
    folder: Path

    @property
    def redacted(self) -> str:
        return redact_url(self.url)


@dataclass(slots=True, kw_only=True)
class LoadedStudy:
    """A study with what report and export need to know about it."""

    ref: StudyRef
    study: optuna.Study
    trials: list[FrozenTrial]
    records: dict[int, TrialRecord]
    """Each trial's record by trial number (read_records); a trial without one is absent."""
    rows: list[dict[str, Any]]
    """One flat row per trial (trial_row): the report's tables and trials.csv."""
    model: ModelSpec | None
    model_source: str
    """Where `model` came from, for the report: study attributes, trial.json, name, --model."""
    cluster: ClusterSpec | None
    backend: str | None
    predicted: bool
    """True when every figure comes from the analytical models."""
    notes: list[str] = field(default_factory=list)

    def row(self, number: int) -> dict[str, Any]:
        for r in self.rows:
            if r["trial"] == number:
                return r
        raise ConfigError(f"study {self.ref.name} has no trial {number} "
                          f"(trials 0..{len(self.rows) - 1})")

    def record(self, number: int) -> TrialRecord:
        found = self.records.get(number)
        if found is None:
            raise ConfigError(f"trial {number} of study {self.ref.name} has no record")
        return found

    def complete_rows(self) -> list[dict[str, Any]]:
        """Rows of COMPLETE trials with a tokens/s figure, best first; among equal tokens/s
        the lighter layout, then the lower trial number. Trials pruned slow are left out: a
        few steps of a layout below the best by construction (TrialRecord.pruned_slow)."""
        done = [r for r in self.rows if r["state"] == "COMPLETE" and r["tokens_per_s"]
                and r["stop_reason"] != StopReason.SLOW and r.get("repeat_of") is None]
        # A finalist's figure is over its runs (autotune.search.finalists); its repeats are
        # not rows of their own here. A predicted figure ranks as the search ranked it
        # (records.rank_tokens), so that export picks the search's winner.
        return sorted(done, key=lambda r: (-self.rank_tokens(r), r["peak_memory_gib"]
                                           or float("inf"), r["trial"]))

    def rank_tokens(self, row: dict[str, Any]) -> float:
        """What a row's tokens/s ranks by: records.rank_tokens of its record's figure."""
        tokens = self.figure_tokens(row["trial"], row["tokens_per_s"])
        record = self.records.get(row["trial"])
        return tokens if record is None else rank_tokens(record, tokens, self.cluster)

    def figure(self, number: int) -> Figure | None:
        """Trial `number`'s figure over its runs (its repeats' too: records.Figure)."""
        record = self.records.get(number)
        if record is None:
            return None
        repeats = [r for r in self.records.values() if r.repeat_of == number]
        return Figure.of([record, *sorted(repeats, key=lambda r: r.number)])

    def figure_tokens(self, number: int, default: float) -> float:
        figure = self.figure(number)
        return figure.tokens_per_s if figure is not None else default


def find_studies(results_dir: Path) -> list[Path]:
    """Study folders (those with a study.db) under results_dir, newest study.db first."""
    if not results_dir.is_dir():
        return []
    found = [p.parent for p in results_dir.glob("*/study.db")]
    return sorted(found, key=lambda p: (p / "study.db").stat().st_mtime, reverse=True)


def resolve_study(name: str | None, results_dir: Path, storage: str | None) -> StudyRef:
    """The study to read: `name`, else the newest under results_dir (or in `storage`)."""
    if storage:
        try:
            summaries = optuna.get_all_study_summaries(storage)
        except Exception as exc:  # SQLAlchemy raises many types for a bad URL or server
            raise ConfigError(f"cannot open storage {redact_url(storage)}: "
                              f"{str(exc).splitlines()[0]}") from None
        if not summaries:
            raise ConfigError(f"no studies in {redact_url(storage)}")
        names = [s.study_name for s in summaries]
        if name is None:
            # An RDB has no file times; the study that started last stands for the newest.
            newest = max(summaries, key=lambda s: (s.datetime_start is not None,
                                                   s.datetime_start or 0, s._study_id))
            name = newest.study_name
        elif name not in names:
            raise ConfigError(f"unknown study {name} in {redact_url(storage)} "
                              f"(studies: {', '.join(sorted(names))})")
        # A name read from a server's database becomes a folder under results_dir: it must be
        # as safe as one typed with --study.
        check_study_name(name)
        return StudyRef(name=name, url=storage, folder=results_dir / name)
    if name is None:
        found = find_studies(results_dir)
        if not found:
            raise ConfigError(f"no studies under {results_dir} (run `autotune MODEL --gpus N "
                              "--results-dir DIR` first, or pass --results-dir)")
        name = found[0].name
    folder = results_dir / name
    if not (folder / "study.db").is_file():
        known = ", ".join(p.name for p in find_studies(results_dir)) or "none"
        raise ConfigError(f"unknown study {name} under {results_dir} (studies: {known})")
    return StudyRef(name=name, url=storage_url(results_dir, name, None), folder=folder)


def _error_pct(measured: float | None, predicted: float | None) -> float | None:
    if measured is None or not predicted:
        return None
    return 100.0 * (measured - predicted) / predicted


def _from_params(params: dict[str, Any], like: Layout) -> Layout | None:
    """The layout of a trial's parameters, the dimensions they do not name (the space's fixed
    ones) taken from `like`, another layout of the same study; dp fills the same GPUs."""
    try:
        s = replace(like, **{k: v for k, v in params.items() if k in LAYOUT_FIELDS})
    except (TypeError, ValueError):
        return None
    inner = s.tp * s.pp * s.cp
    return replace(s, dp=like.world_size // inner) if like.world_size % inner == 0 else None


def read_records(trials: list[FrozenTrial]) -> dict[int, TrialRecord]:
    """The record of each trial that has one, by trial number.

    Records of earlier versions that lack a layout (DUPLICATE, INTERRUPTED) get theirs from
    the trial's parameters and the fixed dimensions of the study's other layouts."""
    records: dict[int, TrialRecord] = {}
    layoutless: list[FrozenTrial] = []
    for t in trials:
        record = stored_record(t)
        if record is not None:
            records[t.number] = record
        elif t.user_attrs.get(RECORD_ATTR):
            layoutless.append(t)
    like = next(iter(records.values()), None)
    for t in layoutless:
        s = _from_params(t.params, like.layout) if like is not None else None
        record = stored_record(t, s) if s is not None else None
        if record is not None:
            records[t.number] = record
    return records


def trial_row(trial: FrozenTrial, record: TrialRecord | None = None) -> dict[str, Any]:
    """One trial as a flat row: layout, status, measured and predicted figures. `record` is
    the trial's record (read_records); without it, the one the trial alone gives."""
    record = record or stored_record(trial)
    row: dict[str, Any] = {"trial": trial.number, "state": trial.state.name}
    if record is None:  # running, or failed before a record was written
        return {**row, "status": trial.state.name, "source": "", "layout": "", "gpus": None,
                **dict.fromkeys(LAYOUT_FIELDS), "predicted": False,
                **dict.fromkeys(_FIGURES), "duplicate_of": None, "repeat_of": None,
                "reason": "", "noise_pct": None, "throttled": False, "clocks": "",
                "wall_time_s": None, **dict.fromkeys(_TIMING)}
    s, m = record.layout, record.metrics
    tokens = record.tokens_per_s
    ok = m if tokens is not None else None  # the measurements of an OK trial
    peak, predicted_peak = record.peak_bytes, record.predicted_peak_bytes
    predicted_tokens = record.predicted_tokens_per_s
    # Errors compare a measurement with the model's prediction; a simulated trial has none.
    measured = not record.predicted and m is not None
    return {
        **row, "status": record.status.value, "source": record.source,
        "layout": record.label, "gpus": s.world_size,
        **{f: getattr(s, f) for f in LAYOUT_FIELDS},
        "predicted": record.predicted,
        "tokens_per_s": tokens,
        "tokens_per_s_per_gpu": tokens / s.world_size if tokens else None,
        "step_time_s": ok.step_time_s if ok else None,
        "step_time_p90_s": ok.step_time_p90_s if ok else None,
        "tflops_per_gpu": ok.tflops_per_gpu if ok else None,
        "mfu": ok.mfu if ok else None,
        "mfu_fp8": None,  # against the FP8 peak, where the GPU is known (load_study)
        "peak_memory_gib": None if peak is None else peak / _GIB,
        "predicted_tokens_per_s": predicted_tokens,
        "predicted_peak_memory_gib": None if predicted_peak is None else predicted_peak / _GIB,
        "tokens_error_pct": _error_pct(tokens, predicted_tokens) if measured else None,
        "memory_error_pct": _error_pct(peak, predicted_peak) if measured else None,
        "duplicate_of": record.duplicate_of,
        "repeat_of": record.repeat_of,
        "reason": record.reason,
        "noise_pct": 100 * m.step_time_cv if ok and m and m.step_time_cv is not None else None,
        "throttled": record.throttled,
        "clocks": m.clocks.describe() if m and m.clocks else "",
        "wall_time_s": m.wall_time_s if m else None,
        "stop_reason": m.stop_reason.value if m and m.stop_reason else None,
        "timed_steps": m.timed_steps if m else None,
        "warmup_s": m.warmup_s if m else None,
        "timed_s": m.timed_s if m else None,
        "overhead_s": overhead_s(record),
    }


def _model_from_attrs(study: optuna.Study) -> tuple[ModelSpec | None, dict[str, Any]]:
    attrs = study.user_attrs
    found = attrs.get("cluster")
    cluster: dict[str, Any] = found if isinstance(found, dict) else {}
    model = attrs.get("model")
    if isinstance(model, dict):
        try:
            return ModelSpec(**model), cluster
        except (TypeError, ConfigError):
            pass
    return None, cluster


def _model_from_trial_json(folder: Path) -> tuple[ModelSpec | None, float | None]:
    for path in sorted((folder / "trials").glob(f"*/{SPEC_NAME}")):
        try:
            spec = TrialSpec.read(path)
        except ConfigError:
            continue
        return spec.model, spec.gpu_peak_bf16_flops
    return None, None


def _check_model_arg(ref: StudyRef, arg: str, given: ModelSpec, stored: dict[str, Any],
                     where: str) -> None:
    """ConfigError in one line when `given` (--model `arg`) is not the model the study stores
    (`stored`, its fields as the study holds them, from `where`). The sequence length and
    global batch are the search's settings (--seq-len, --global-batch-size): `given` is
    compared as the search would have run it with the study's. Fields one side lacks (other
    versions) are not compared."""
    try:
        as_run = given.with_overrides(**{k: v for k in ("seq_length", "global_batch_size")
                                         if isinstance(v := stored.get(k), int)})
    except ConfigError:
        as_run = given
    mine = as_stored(asdict(as_run))
    differs = [k for k in mine if k in stored and mine[k] != stored[k]]
    if not differs:
        return
    shape = [k for k in differs if k != "name"] or differs  # both names are said anyway
    shown = ", ".join(f"{k} {mine[k]} against {stored[k]}" for k in shape[:4])
    more = f" and {len(shape) - 4} more" if len(shape) > 4 else ""
    label = arg if arg == given.name else f"{arg} ({given.name})"
    raise ConfigError(f"--model {label} disagrees with study {ref.name}, searched for "
                      f"{stored.get('name', '?')} ({where}): {shown}{more}; leave --model out "
                      "(the study's own model is used)")


def _inferred_seq_length(rows: list[dict[str, Any]]) -> int | None:
    # tokens/s = gbs * seq_length / step time (TrialMetrics.tokens_per_s), so an OK trial tells
    # the sequence length even when --seq-len overrode the preset's.
    for r in rows:
        if r["tokens_per_s"] and r["step_time_s"] and r["gbs"]:
            return round(float(r["tokens_per_s"]) * float(r["step_time_s"]) / int(r["gbs"]))
    return None


def _resolve_model(ref: StudyRef, study: optuna.Study, rows: list[dict[str, Any]],
                   model_arg: str | None) -> tuple[ModelSpec | None, str, dict[str, Any]]:
    match = _DEFAULT_NAME.match(ref.name)
    hints: dict[str, Any] = {"gpu": match["gpu"], "backend": match["backend"],
                             "num_gpus": int(match["gpus"])} if match else {}
    model, cluster = _model_from_attrs(study)
    hints.update({k: v for k, v in cluster.items() if v is not None})
    if isinstance(study.user_attrs.get("backend"), str):
        hints["backend"] = study.user_attrs["backend"]
    stored, where = study.user_attrs.get("model"), "study attributes"
    if model is not None:
        source = "study attributes"
    else:
        model, _ = _model_from_trial_json(ref.folder)
        source = "trials/*/trial.json"
        if model is not None:
            stored, where = asdict(model), source
    if model_arg is not None:
        given = load_model(model_arg)
        if isinstance(stored, dict):
            _check_model_arg(ref, model_arg, given, stored, where)
        if model is None:  # the study stores none (or one this version cannot read)
            model, source = given, "--model"
    elif model is None and match:
        try:
            model, source = load_model(match["model"]), f"preset {match['model']}"
        except ConfigError:
            model = None
    if model is None:
        return None, "unknown", hints
    gbs = next((r["gbs"] for r in rows if r["gbs"]), None)
    seq = _inferred_seq_length(rows)
    model = model.with_overrides(
        global_batch_size=gbs if gbs and gbs != model.global_batch_size else None,
        seq_length=seq if seq and seq != model.seq_length else None)
    return model, source, hints


def _fp8_mfu(rows: list[dict[str, Any]], gpu: GpuSpec) -> None:
    """Each FP8 trial's model FLOP/s against the GPU's dense FP8 peak (`mfu_fp8`); `mfu` stays
    against the bf16 peak for every trial (report.markdown.MFU_NOTE)."""
    if gpu.peak_fp8_flops is None:
        return
    for r in rows:
        if r.get("fp8", Fp8.OFF) != Fp8.OFF and r.get("tflops_per_gpu") is not None:
            r["mfu_fp8"] = gpu.fp8_peak_share(r["tflops_per_gpu"] * 1e12)


def load_study(ref: StudyRef, model_arg: str | None = None) -> LoadedStudy:
    """Read every trial of the study and work out its model and GPUs. A storage that fails
    (locked, damaged, full, a server gone) is one StorageError line (storage_errors)."""
    try:
        with warnings.catch_warnings(), storage_errors(ref.url, reading=True):
            warnings.simplefilter("ignore")
            study = optuna.load_study(study_name=ref.name, storage=ref.url)
    except KeyError:
        raise ConfigError(f"unknown study {ref.name} in {ref.redacted}") from None
    except AutotuneError:
        raise
    except Exception as exc:  # Optuna refuses a schema it cannot read (RuntimeError), ...
        raise ConfigError(f"cannot read study {ref.name} from {ref.redacted}: "
                          f"{str(exc).splitlines()[0]}") from None
    with storage_errors(ref.url, reading=True):
        trials = study.get_trials(deepcopy=False)
        records = read_records(trials)
        rows = [trial_row(t, records.get(t.number)) for t in trials]
        model, source, hints = _resolve_model(ref, study, rows, model_arg)
    gpus = next((r["gpus"] for r in rows if r["gpus"]), None) or hints.get("num_gpus")
    cluster = None
    notes: list[str] = []
    if gpus:
        gpu_name = hints.get("gpu") or DEFAULT_GPU
        try:
            gpu_spec(gpu_name)
        except ConfigError:
            notes.append(f"GPU type {gpu_name} unknown; memory figures assume {DEFAULT_GPU}")
            gpu_name = DEFAULT_GPU
        per_node = hints.get("gpus_per_node") or min(8, gpus)
        cluster = ClusterSpec.make(gpus, per_node, gpu_name)
        _fp8_mfu(rows, cluster.gpu)
    if model is None:
        notes.append(f"the model of study {ref.name} is unknown (not a default study name, no "
                     "trial.json); pass --model PRESET_OR_YAML for the memory breakdown")
    done = [r for r in rows if r["state"] == "COMPLETE"]
    predicted = bool(done) and all(r["predicted"] for r in done)
    return LoadedStudy(ref=ref, study=study, trials=trials, records=records, rows=rows,
                       model=model, model_source=source, cluster=cluster,
                       backend=hints.get("backend"), predicted=predicted, notes=notes)


def peer_studies(results_dir: Path, loaded: LoadedStudy) -> list[LoadedStudy]:
    """Other studies under results_dir of the same model, sequence, batch and GPU type."""
    if loaded.model is None or loaded.cluster is None:
        return []
    peers = []
    for folder in find_studies(results_dir):
        if folder.name == loaded.ref.name:
            continue
        match = _DEFAULT_NAME.match(folder.name)
        if match and match["model"] != loaded.model.name:
            continue  # cheap filter before reading a whole study
        try:
            other = load_study(resolve_study(folder.name, results_dir, None))
        except AutotuneError:  # a peer that cannot be read (locked, damaged) is left out
            continue
        if other.model is None or other.cluster is None:
            continue
        same = (other.model.name, other.model.seq_length, other.model.global_batch_size,
                other.cluster.gpu.name) == (loaded.model.name, loaded.model.seq_length,
                                            loaded.model.global_batch_size,
                                            loaded.cluster.gpu.name)
        if same:
            peers.append(other)
    return peers
