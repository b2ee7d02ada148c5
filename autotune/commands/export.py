"""`autotune export`: a study's winning layout (or --trial N) as a launch script or JSON."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError

__all__ = ["pick_row", "run_export"]


def pick_row(loaded: Any, trial: int | None) -> dict[str, Any]:
    """The best COMPLETE trial by tokens/s, or trial `trial`, which must be COMPLETE."""
    ranked = loaded.complete_rows()
    best = f"; the best is trial {ranked[0]['trial']}" if ranked else ""
    if trial is None:
        if not ranked:
            raise ConfigError(f"study {loaded.ref.name} has no COMPLETE trial with a tokens/s "
                              "figure to export")
        row: dict[str, Any] = ranked[0]
        return row
    row = loaded.row(trial)
    if row["state"] != "COMPLETE" or not row["tokens_per_s"]:
        why = f"{row['state']}, {row['status']}" + (f": {row['reason']}" if row["reason"] else "")
        raise ConfigError(f"trial {trial} of study {loaded.ref.name} is not COMPLETE ({why}); "
                          f"only COMPLETE trials can be exported{best}")
    return row


def run_export(*, study: str | None, results_dir: str, storage: str | None, trial: int | None,
               fmt: str, output: str | None, megatron_lm: str | None, nodes: int | None,
               model: str | None = None, train_iters: int | None = None) -> str:
    """Build the export text, write it to `output` (or stdout) and return it."""
    from autotune.export import (
        FORMATS,
        layout_json,
        megatron_lm_script,
        slurm_script,
        torchrun_script,
    )
    from autotune.report.load import load_study, resolve_study
    from autotune.strategy import Strategy
    from autotune.trial import TrialSpec

    if fmt not in FORMATS:
        raise ConfigError(f"unknown --format {fmt!r}; choose {', '.join(FORMATS)}")
    if nodes is not None and nodes < 1:
        raise ConfigError(f"--nodes must be a positive integer, got {nodes}")
    if train_iters is not None and train_iters < 1:
        raise ConfigError(f"--train-iters must be a positive integer, got {train_iters}")
    iters = {} if train_iters is None else {"train_iters": train_iters}
    ref = resolve_study(study, Path(results_dir), storage)
    loaded = load_study(ref, model)
    row = pick_row(loaded, trial)
    strategy = Strategy(**{k: row[k] for k in Strategy.__dataclass_fields__})
    chosen = "the best COMPLETE trial" if trial is None else "--trial"
    print(f"autotune: exporting trial {row['trial']} ({chosen}) of study {ref.name}: "
          f"{row['layout']}", file=sys.stderr)
    spec_model, cluster = loaded.model, loaded.cluster
    if fmt == "json":
        text = layout_json(strategy, model=spec_model.name if spec_model else None,
                           gpus=strategy.world_size,
                           gpu=cluster.gpu.name if cluster else None,
                           tokens_per_s=row["tokens_per_s"], predicted=row["predicted"],
                           study=ref.name, trial=row["trial"],
                           seq_length=spec_model.seq_length if spec_model else None,
                           gpus_per_node=cluster.gpus_per_node if cluster else None)
    else:
        if spec_model is None:
            raise ConfigError(f"the model of study {ref.name} is unknown (not a default study "
                              "name, no trial.json); pass --model PRESET_OR_YAML")
        figure = "predicted by autotune's analytical models, not measured" \
            if row["predicted"] else "measured"
        gpu = cluster.gpu.name if cluster else "GPU"
        title = [f"autotune export --format {fmt}: {spec_model.name} (seq "
                 f"{spec_model.seq_length}) on {strategy.world_size} x {gpu}",
                 f"study {ref.name}, trial {row['trial']}: {row['layout']}, gbs {strategy.gbs}",
                 f"{row['tokens_per_s']:,.0f} tokens/s, {figure}."]
        default_nodes = cluster.num_nodes if cluster else 1
        if fmt == "megatron-lm":
            text = megatron_lm_script(spec_model, strategy, title=title,
                                      nodes=nodes or default_nodes, megatron_lm=megatron_lm,
                                      **iters)
        elif fmt == "slurm":
            text = slurm_script(spec_model, strategy, title=title, nodes=nodes or default_nodes,
                                megatron_lm=megatron_lm,
                                job_name=f"autotune-{spec_model.name}", **iters)
        else:
            if (nodes or default_nodes) > 1:
                raise ConfigError("--format torchrun runs autotune's worker on one node; use "
                                  "--format megatron-lm or slurm for several nodes")
            spec = TrialSpec(model=spec_model, strategy=strategy)
            if cluster is not None:  # MFU against the study's GPU, not the default H100
                spec = replace(spec, gpu_peak_bf16_flops=cluster.gpu.peak_bf16_flops)
            text = torchrun_script(spec, title=title)
    if output is None:
        sys.stdout.write(text)
    else:
        path = Path(output)
        path.write_text(text)
        if fmt != "json":
            path.chmod(path.stat().st_mode | 0o111)
        print(f"autotune: wrote {path}", file=sys.stderr)
    return text
