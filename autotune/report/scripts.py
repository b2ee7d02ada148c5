"""Layouts -> launch scripts: Megatron-LM under torchrun, autotune's worker, Slurm, or JSON.

Megatron-LM flags come from autotune.megatron.megatron_args.megatron_lm_args, the one function that
spells them; this module only arranges them into scripts. Pure: returns text, writes nothing. The
`autotune export` command that reads a study and calls it is autotune.commands.export.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from typing import Any

from autotune.errors import ConfigError
from autotune.inputs.files import usable_name
from autotune.layouts.layout import DIMENSIONS, Layout
from autotune.megatron.environment import export_lines
from autotune.megatron.megatron_args import (
    SDPA_STANDS_IN,
    exported_layout,
    measured_as_exported,
    megatron_lm_args,
    training_script,
)
from autotune.megatron.megatron_versions import MegatronVersion, running
from autotune.specs.model import ModelSpec
from autotune.trials.protocol import SPEC_NAME, WORKER
from autotune.trials.trial import TrialSpec

__all__ = ["FORMATS", "TRAIN_ITERS", "check_megatron_lm", "layout_json", "megatron_lm_script",
           "slurm_script", "torchrun_script"]

FORMATS: tuple[str, ...] = ("megatron-lm", "torchrun", "slurm", "json")
TRAIN_ITERS = 100
"""Iterations of an exported Megatron-LM run: enough to read a steady step time."""
RDZV_PORT = 29500
JSON_KEYS: tuple[str, ...] = tuple(DIMENSIONS)
"""Every layout field (autotune.layouts.layout.DIMENSIONS); estimate --layout reads them back."""
JSON_INFO_KEYS: tuple[str, ...] = ("tokens_per_s", "predicted", "study", "trial")
"""What layout_json writes beside the layout and its machine: the figure and where it came
from, which estimate --layout accepts and does not read."""
_INDENT = "    "


def layout_json(layout: Layout, *, model: str | None, gpus: int, gpu: str | None,
                tokens_per_s: float | None, predicted: bool, study: str, trial: int,
                seq_length: int | None = None, gpus_per_node: int | None = None) -> str:
    """The layout as JSON; `autotune estimate MODEL --gpus N --layout FILE` reads it back."""
    data: dict[str, Any] = {k: getattr(layout, k) for k in JSON_KEYS}
    data.update(model=model, gpus=gpus, gpu=gpu, seq_length=seq_length,
                gpus_per_node=gpus_per_node,
                tokens_per_s=tokens_per_s, predicted=predicted, study=study, trial=trial)
    return json.dumps(data, indent=2) + "\n"


def _comment(line: str) -> str:
    """`line` as one bash comment line. Text in it comes from the study (its name, the model's
    name): a newline would end the comment and run the rest, so every character that is not
    printable (newlines, carriage returns, other controls, Unicode line separators) becomes
    '?'."""
    text = "".join(c if c.isprintable() else "?" for c in line)
    return f"# {text}" if text else "#"


def _header(lines: Sequence[str]) -> list[str]:
    return ["#!/usr/bin/env bash", *[_comment(line) for line in lines]]


def _job_name(name: str) -> str:
    """A Slurm job name from `name`: letters, digits, '.', '_' and '-' only (an #SBATCH line is
    parsed by sbatch, not by a shell, and %-patterns would expand), at most 64 characters."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")[:64]
    return safe or "autotune"


def _continued(shell: Sequence[str], args: Sequence[str]) -> str:
    """Lines of shell text as given, then one line per flag with its values, each argument
    shell-quoted; joined with backslash continuations into one command."""
    groups: list[list[str]] = []
    for arg in args:
        if arg.startswith("--") or not groups:
            groups.append([arg])
        else:
            groups[-1].append(arg)
    lines = [shell[0], *[_INDENT + line for line in shell[1:]],
             *[_INDENT + " ".join(shlex.quote(a) for a in g) for g in groups]]
    return " \\\n".join(lines)


def check_megatron_lm(megatron_lm: str | None) -> str | None:
    """--megatron-lm as given, refused in one line when it is empty or holds a control character
    (it is shell-quoted into the script, but a path with a newline is no path anyone meant)."""
    if megatron_lm is not None:
        usable_name(megatron_lm, "--megatron-lm")
    return megatron_lm


def _megatron_parts(model: ModelSpec, layout: Layout, *, megatron_lm: str | None,
                    train_iters: int, megatron_version: MegatronVersion | None = None
                    ) -> tuple[list[str], str, list[str]]:
    """(comment lines, the pretrain_gpt.py path as shell text, Megatron-LM arguments)."""
    notes = []
    if not measured_as_exported(layout):
        # Megatron-LM has no "local spec with PyTorch SDPA"; TE's fused attention is its
        # nearest equivalent (the measured figures were taken with SDPA).
        layout = exported_layout(layout)
        notes.append(SDPA_STANDS_IN)
    version = megatron_version or running()
    notes.append(f"Flags of megatron-core {version.series[0]}.{version.series[1]}.x "
                 f"(Megatron-LM {version.megatron_lm_tag}); autotune export "
                 "--megatron-version X.Y writes another release's.")
    args = megatron_lm_args(model, layout, train_iters=train_iters, mock_data=True,
                            megatron_version=version)
    real = megatron_lm_args(model, layout, train_iters=train_iters, mock_data=False,
                            megatron_version=version)
    mock = args[len(real):] if args[:len(real)] == real else ["--mock-data"]
    notes += [f"Data: Megatron-LM's mock dataset ({' '.join(mock)})."
              " For real data replace those flags with --data-path PREFIX --tokenizer-type TYPE "
              "(and --tokenizer-model / --vocab-file as the tokenizer needs).",
              f"--train-iters {train_iters} is a short benchmark run; set your own for "
              "training (and --save/--load for checkpoints)."]
    if megatron_lm is not None:
        check_megatron_lm(megatron_lm)
        script = shlex.quote(training_script(megatron_lm))
    else:
        script = '"$MEGATRON_LM/pretrain_gpt.py"'
    return notes, script, args


def _env_lines(megatron_lm: str | None, layout: Layout) -> list[str]:
    lines = ["set -euo pipefail"]
    if megatron_lm is None:
        lines += ["# A Megatron-LM checkout (the NVIDIA/Megatron-LM repository), "
                  "or export with --megatron-lm PATH.",
                  'MEGATRON_LM="${MEGATRON_LM:-Megatron-LM}"']
    # Megatron-LM asserts it with tensor/sequence parallelism: kernels queue in issue order, so
    # the TP communication overlaps compute as scheduled.
    lines += ["export CUDA_DEVICE_MAX_CONNECTIONS=1"]
    # What the levers of the run's environment need (the allocator's expandable segments):
    # the trial measured the layout with them.
    return lines + export_lines(layout)


def _split(layout: Layout, nodes: int) -> int:
    """GPUs per node when the layout's GPUs are spread over `nodes` nodes."""
    gpus = layout.world_size
    if nodes < 1 or gpus % nodes:
        raise ConfigError(f"--nodes {nodes} must be a positive divisor of the layout's "
                          f"{gpus} GPUs")
    per_node = gpus // nodes
    if layout.tp > per_node:
        # The layout was chosen with TP inside a node (NVLink); spreading it thinner would
        # put tensor-parallel all-reduces on the network.
        raise ConfigError(f"--nodes {nodes} leaves {per_node} GPUs per node, fewer than the "
                          f"layout's tp={layout.tp}: tensor parallelism must stay inside a "
                          "node")
    return per_node


def megatron_lm_script(model: ModelSpec, layout: Layout, *, title: Sequence[str],
                       nodes: int = 1, megatron_lm: str | None = None,
                       train_iters: int = TRAIN_ITERS,
                       megatron_version: MegatronVersion | None = None) -> str:
    """A bash script: torchrun over Megatron-LM's pretrain_gpt.py with every flag."""
    per_node = _split(layout, nodes)
    notes, script, args = _megatron_parts(model, layout, megatron_lm=megatron_lm,
                                          train_iters=train_iters,
                                          megatron_version=megatron_version)
    if nodes == 1:
        launch = f"torchrun --standalone --nproc-per-node {per_node}"
    else:
        notes.append(f"Run this same script on each of the {nodes} nodes, with MASTER_ADDR set "
                     "to the first node's address.")
        launch = (f"torchrun --nnodes {nodes} --nproc-per-node {per_node} --rdzv-id autotune "
                  # No apostrophe in the ${...:?...} message: bash reads quotes there, even
                  # inside double quotes, and the script would not parse.
                  f"--rdzv-backend c10d --rdzv-endpoint \"${{MASTER_ADDR:?set MASTER_ADDR to "
                  f"the address of the first node}}:{RDZV_PORT}\"")
    lines = [*_header([*title, *notes]), *_env_lines(megatron_lm, layout)]
    return "\n".join(lines) + "\n" + _continued([launch, script], args) + "\n"


def slurm_script(model: ModelSpec, layout: Layout, *, title: Sequence[str], nodes: int,
                 megatron_lm: str | None = None, train_iters: int = TRAIN_ITERS,
                 job_name: str = "autotune",
                 megatron_version: MegatronVersion | None = None) -> str:
    """An sbatch script: one torchrun per node (srun), c10d rendezvous on the first node."""
    per_node = _split(layout, nodes)
    notes, script, args = _megatron_parts(model, layout, megatron_lm=megatron_lm,
                                          train_iters=train_iters,
                                          megatron_version=megatron_version)
    sbatch = [f"#SBATCH --job-name={_job_name(job_name)}", f"#SBATCH --nodes={nodes}",
              "#SBATCH --ntasks-per-node=1", f"#SBATCH --gpus-per-node={per_node}",
              "#SBATCH --exclusive", "#SBATCH --output=%x-%j.out"]
    body = [*_env_lines(megatron_lm, layout),
            "# The first node of the allocation hosts the rendezvous.",
            'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
            "export MASTER_ADDR"]
    # $SLURM_NNODES and $MASTER_ADDR expand in the batch shell, before srun starts one torchrun
    # per node (--ntasks-per-node=1); each torchrun starts the node's GPUs' ranks.
    launch = (f"srun torchrun --nnodes \"$SLURM_NNODES\" --nproc-per-node {per_node} "
              f"--rdzv-id \"$SLURM_JOB_ID\" --rdzv-backend c10d "
              f"--rdzv-endpoint \"$MASTER_ADDR:{RDZV_PORT}\"")
    head = _header([])[0]
    text = "\n".join([head, *sbatch, *[_comment(n) for n in [*title, *notes]], *body])
    return text + "\n" + _continued([launch, script], args) + "\n"


def torchrun_script(spec: TrialSpec, *, title: Sequence[str]) -> str:
    """autotune's own worker under torchrun, with its trial.json written by a heredoc."""
    gpus = spec.layout.world_size
    marker = "AUTOTUNE_TRIAL_JSON"
    notes = ["Runs autotune's megatron-core worker (pip install 'autotune[megatron]') on one "
             "node; it writes result.json and its figures into the current folder."]
    body = spec.to_json()
    if marker in body.split("\n"):  # it would end the here-document early
        raise ConfigError(f"the trial specification holds a line {marker}")
    lines = [*_header([*title, *notes]), "set -euo pipefail",
             f"cat > {SPEC_NAME} <<'{marker}'", body, marker]
    launch = " ".join(shlex.quote(a) for a in
                      ["torchrun", "--standalone", "--nproc-per-node", str(gpus), *WORKER])
    command = _continued([launch], ["--spec", SPEC_NAME, "--out-dir", "."])
    return "\n".join(lines) + "\n" + command + "\n"
