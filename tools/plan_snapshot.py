"""What a simulated plan produces, written down so that two versions of autotune can be compared
byte for byte (issue 24: planning made faster must not change a figure).

    PYTHONPATH=TREE python tools/plan_snapshot.py OUT_DIR [CASE ...]
    diff -r BEFORE_DIR AFTER_DIR

Per case (MODEL:GPUS, default the cases below): `--dry-run --json` (valid layouts, distinct
runs, what the rules rejected), the search's `--json` (the best layouts, the table), `export`'s
launch script and JSON of the best trial, and every trial of the study as Optuna stored it
(parameters, attributes, values). The study's path and the export's file names are replaced by
placeholders: they name OUT_DIR, not a result.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna

CASES = ("gpt-1t:3072", "gpt2-xl:8", "llama3-8b:16", "llama3-8b:64", "mixtral-8x7b:64")


def _cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"autotune {' '.join(args)}: exit {done.returncode}\n{done.stderr}")
    return done.stdout


def _trials(storage: str, study: str) -> list[dict[str, Any]]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    loaded = optuna.load_study(study_name=study, storage=storage)
    return [
        {
            "number": t.number,
            "state": t.state.name,
            "params": t.params,
            "values": t.values,
            "user_attrs": t.user_attrs,
            "system_attrs": t.system_attrs,
        }
        for t in loaded.trials
    ]


def snapshot(case: str, out: Path) -> None:
    model, gpus = case.split(":")
    name = f"{model}-{gpus}"
    work = out / "studies"
    common = [model, "--gpus", gpus, "--backend", "simulate"]
    if int(gpus) > 8:
        common += ["--gpus-per-node", "8"]
    dry = _cli("search", *common, "--dry-run", "--json")
    found = _cli("search", *common, "--results-dir", str(work), "--study", name, "--json")
    storage = f"sqlite:///{work / name / 'study.db'}"
    script = _cli("export", "--results-dir", str(work), "--study", name)
    layout = _cli("export", "--results-dir", str(work), "--study", name, "--format", "json")
    record = {
        "dry_run": json.loads(dry),
        "search": json.loads(found.replace(str(work), "WORK")),
        "export": script.replace(str(work), "WORK"),
        "export_json": json.loads(layout.replace(str(work), "WORK")),
        "trials": _trials(storage, name),
    }
    text = json.dumps(record, indent=1, sort_keys=True, default=repr)
    (out / f"{name}.json").write_text(text + "\n")


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for case in sys.argv[2:] or CASES:
        snapshot(case, out)
        print(case, "written", flush=True)


if __name__ == "__main__":
    main()
