"""Measured trials of a device call as tests/data/measured_trials.json rows: what the accuracy
tests (tests/measured.py) and tools/fit_constants.py read.

    python tools/measured_from_study.py study STUDY_DIR PREFIX [--model REF] [--family NAME]
        [--omit-default-seq] [--into PATH]
    python tools/measured_from_study.py layouts FILE PREFIX MODEL GPUS GPU LAYOUT...
        [--seq-len N] [--family NAME] [--omit-default-seq] [--into PATH]

`study`: every launched trial of the study (or studies) in STUDY_DIR/study.db, the folder a
search writes (results.tgz of tools/device_search.sh holds one). Each row is the trial's own
record: its layout as the search stored it (checked to print the record's label), the worker's
step time (the timed steps' median), NVML's device memory in use and the allocated peak.
Source PREFIX/N, N the study's trial number. Rows kept: status OK; OOM (the measurements null,
as older OOM rows); DIVERGED (failed by the loss guard after its timed steps: status OK with
"loss_guard": "DIVERGED", as session 16's rows). Left out: duplicates (no launch), predicted
or INVALID trials, trials still RUNNING when the call ended. Finalist repeats are separate
launches and each is kept, as measured (sessions 20 and 22 did the same).

`layouts`: the JSON lines tools/device_layouts.py prints (e.g. recipe-hand.txt), with the
LAYOUT arguments that call was given: each rebuilds its layout and must print that line's
label. Source PREFIX/N, N the line's order. The lines carry GiB figures (rounded to bytes).

--model: the model as a row names it (a preset, or a path relative to the repository root);
default the study's model name. The row's model, at the trial's batch and sequence, must
rebuild the study's recorded model (every field but rope_fusion). "rope_fusion": true is
written where the run fused RoPE (a RoPE model, the worker's default since session 17).
--omit-default-seq: leave seq_length out where the run used the model's default, as the
older gpt2 rows do (tools/recompute_slopes.py groups series by the field as written).
--into PATH: append the rows to that measured_trials.json (a source already there is an
error), else print them (a JSON list).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import optuna
from device_layouts import layout_fields
from study_table import studies

from autotune.commands.estimate import layout_from_fields
from autotune.errors import ConfigError
from autotune.layouts.layout import DIMENSIONS, Layout
from autotune.predict.calibration import trial_model_ref
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model

GIB = 2**30
DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "measured_trials.json"
# A study's model field that a row does not name: the worker's RoPE fusion is the row's
# rope_fusion field (autotune.predict.calibration.row_inputs reads it).
_NOT_COMPARED = {"rope_fusion"}


class UsageError(Exception):
    """Input the tool cannot convert: one line and exit 2 (main)."""


def strategy(layout: Layout) -> dict[str, Any]:
    """Every Layout field, JSON-ready (enums as their strings), in field order."""
    return {name: (str(v) if not isinstance(v, (bool, int)) else v)
            for name, v in ((n, getattr(layout, n)) for n in DIMENSIONS)}


def row_model(ref: str, gbs: int, seq: int) -> ModelSpec:
    return load_model(trial_model_ref(ref, DATA)).with_overrides(
        global_batch_size=gbs, seq_length=seq)


def check_model(ref: str, recorded: dict[str, Any], gbs: int) -> ModelSpec:
    """The row's model at the trial's batch and sequence; exit 2 unless it is the model the
    study recorded."""
    model = row_model(ref, gbs, int(recorded["seq_length"]))
    mine = asdict(model)
    diff = sorted(k for k in recorded if k not in _NOT_COMPARED and mine.get(k) != recorded[k])
    if diff:
        raise UsageError(f"--model {ref} is not the study's model: "
                         + ", ".join(f"{k} {mine.get(k)!r} != {recorded[k]!r}" for k in diff))
    return model


def entry(source: str, ref: str, family: str, gpu: str, gpus: int, model: ModelSpec,
          default_seq: int, omit_default_seq: bool, layout: Layout, status: str,
          step_s: float | None, used: int | None, alloc: int | None) -> dict[str, Any]:
    e: dict[str, Any] = {"source": source, "model": ref, "family": family, "gpu": gpu,
                         "gpus": gpus}
    if not (omit_default_seq and model.seq_length == default_seq):
        e["seq_length"] = model.seq_length
    e.update({"strategy": strategy(layout), "status": status, "step_time_s": step_s,
              "device_used_bytes": used, "peak_allocated_bytes": alloc})
    if model.position_embedding == "rope" and model.rope_fusion:
        e["rope_fusion"] = True
    return e


def from_study(folder: Path, prefix: str, ref: str | None, family: str | None,
               omit_default_seq: bool) -> list[dict[str, Any]]:
    db = folder / "study.db"
    if not db.is_file():
        raise UsageError(f"no study.db in {folder}")
    out = []
    for study in studies(db):
        recorded = study.user_attrs["model"]
        cluster = study.user_attrs["cluster"]
        name = ref or recorded["name"]
        default_seq = load_model(trial_model_ref(name, DATA)).seq_length
        for t in study.trials:
            r = t.user_attrs.get("record") or {}
            status = r.get("status")
            if r.get("duplicate_of") is not None or status not in ("OK", "OOM", "DIVERGED"):
                continue
            m = r.get("metrics") or {}
            if m.get("predicted"):
                continue  # an estimate, not a launch
            layout = Layout(**r["layout"])
            if layout.describe() != r["strategy"]:
                raise UsageError(f"trial {t.number}: layout prints {layout.describe()!r}, "
                                 f"recorded {r['strategy']!r}")
            model = check_model(name, recorded, layout.gbs)
            ok = status != "OOM"
            e = entry(f"{prefix}/{t.number}", name, family or recorded["name"], cluster["gpu"],
                      int(cluster["num_gpus"]), model, default_seq, omit_default_seq, layout,
                      "OK" if ok else "OOM",
                      m["step_time_s"] if ok else None, m["device_used_bytes"] if ok else None,
                      m["peak_allocated_bytes"] if ok else None)
            if status == "DIVERGED":
                e["loss_guard"] = "DIVERGED"
            out.append(e)
    return out


def from_layouts(path: Path, prefix: str, ref: str, gpus: int, gpu: str, texts: list[str],
                 seq_len: int | None, family: str | None,
                 omit_default_seq: bool) -> list[dict[str, Any]]:
    lines = [json.loads(s) for s in path.read_text().splitlines() if s.startswith("{")]
    if len(lines) != len(texts):
        raise UsageError(f"{path} has {len(lines)} layout lines, {len(texts)} LAYOUT given")
    base = load_model(trial_model_ref(ref, DATA))
    model0 = base.with_overrides(seq_length=seq_len)
    cluster = ClusterSpec.make(gpus, gpu=gpu)
    out = []
    for i, (line, text) in enumerate(zip(lines, texts, strict=True)):
        layout = layout_from_fields(model0, cluster, layout_fields(text))
        if layout.describe() != line["layout"]:
            raise UsageError(f"line {i}: LAYOUT prints {layout.describe()!r}, the line has "
                             f"{line['layout']!r}")
        model = model0.with_overrides(global_batch_size=layout.gbs)
        if line["status"] not in ("OK", "OOM"):
            continue
        ok = line["status"] == "OK"
        out.append(entry(f"{prefix}/{i}", ref, family or base.name, gpu, gpus, model,
                         base.seq_length, omit_default_seq, layout, line["status"],
                         line["step_time_s"] if ok else None,
                         _bytes(line["device_used_gib"]) if ok else None,
                         _bytes(line["peak_allocated_gib"]) if ok else None))
    return out


def _bytes(gib: float | None) -> int | None:
    """A GiB figure of tools/device_layouts.py's line in bytes."""
    return None if gib is None else round(gib * GIB)


def append(rows: list[dict[str, Any]], path: Path) -> None:
    data = json.loads(path.read_text())
    have = {t["source"] for t in data["trials"]}
    taken = [r["source"] for r in rows if r["source"] in have]
    if taken:
        raise UsageError(f"{path} already holds {', '.join(taken)}")
    data["trials"].extend(rows)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def main() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    s = sub.add_parser("study")
    s.add_argument("folder", type=Path)
    s.add_argument("prefix")
    s.add_argument("--model", default=None)
    lay = sub.add_parser("layouts")
    lay.add_argument("file", type=Path)
    lay.add_argument("prefix")
    lay.add_argument("model")
    lay.add_argument("gpus", type=int)
    lay.add_argument("gpu")
    lay.add_argument("layouts", nargs="+", metavar="LAYOUT")
    lay.add_argument("--seq-len", type=int, default=None)
    for p in (s, lay):
        p.add_argument("--family", default=None)
        p.add_argument("--omit-default-seq", action="store_true")
        p.add_argument("--into", type=Path, default=None)
    args = parser.parse_args()
    try:
        if args.kind == "study":
            rows = from_study(args.folder, args.prefix, args.model, args.family,
                              args.omit_default_seq)
        else:
            rows = from_layouts(args.file, args.prefix, args.model, args.gpus, args.gpu,
                                args.layouts, args.seq_len, args.family, args.omit_default_seq)
        if args.into is not None:
            append(rows, args.into)
    except (UsageError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if args.into is not None:
        print(f"{len(rows)} rows appended to {args.into}", file=sys.stderr)
    else:
        json.dump(rows, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
