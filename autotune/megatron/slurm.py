"""How many processes Slurm's `srun` starts for a launch written without torchrun.

Megatron-LM's own Slurm examples and many cluster scripts start `pretrain_gpt.py` with
`srun python pretrain_gpt.py ...`: one task per GPU, its count from srun's options or, where
srun gives none, from the batch script's `#SBATCH` lines (Slurm's sbatch reads them up to the
first command of the script; srun inside the allocation inherits them, and its own options
win: https://slurm.schedmd.com/sbatch.html, "Use of #SBATCH", and srun.html). The count is
read, never run: an option whose value is not a plain count (a variable, a node range) makes
the count unknown, and the caller asks for --gpus.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SlurmCount", "sbatch_options", "srun_processes"]

# Option spellings -> the one name used here (srun's and sbatch's are the same).
_NAMES = {"-N": "nodes", "--nodes": "nodes", "--ntasks-per-node": "ntasks_per_node",
          "-n": "ntasks", "--ntasks": "ntasks"}
_SBATCH = re.compile(r"#SBATCH\s+(.*)")


@dataclass(frozen=True, slots=True)
class SlurmCount:
    """Processes per node and nodes, or why they cannot be told; `source` names where they
    came from (for the line that says so)."""

    per_node: int | None
    nodes: int | None
    why: str | None
    source: str


def sbatch_options(text: str, command_line: Sequence[str] = ()) -> dict[str, str]:
    """The task-count options of the script's `#SBATCH` lines (name -> value as written),
    read as sbatch reads them: from the top, up to the first line that is neither blank nor a
    comment; a later line overrides an earlier one, and sbatch's own options (`command_line`,
    the words after `sbatch` of `sbatch -N 2 <<EOF`) override them all."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            break
        match = _SBATCH.match(stripped)
        if match is None:
            continue
        try:
            words = shlex.split(match[1], comments=True)
        except ValueError:
            continue  # an unbalanced quote: sbatch would refuse the line as well
        out.update(_options(words))
    return {**out, **_options(command_line)}


def srun_processes(words: Sequence[str | None], sbatch: dict[str, str],
                   shown: Sequence[str] | None = None) -> SlurmCount:
    """Processes per node and nodes of `srun WORDS...` (the words after srun, up to and past
    the launched program; None: a word the script does not tell, `shown` as written), srun's
    own options over `sbatch`'s."""
    written = list(shown) if shown is not None else [w or "" for w in words]
    options: list[str] = []
    k = 0
    while k < len(words):
        word = words[k]
        text = word if word is not None else written[k]
        if not text.startswith("-"):
            break  # the launched program
        name = text.partition("=")[0]
        if word is None:
            if name in _NAMES:
                return SlurmCount(None, None, f"srun {name} is not set in the script", "srun")
            k += 1  # another option, its value unknown (`--output=${DIR}/log`)
            continue
        options.append(word)
        if "=" not in word and (name in _NAMES or name in _TAKES_VALUE) and k + 1 < len(words):
            value = words[k + 1]
            if value is None and name in _NAMES:
                return SlurmCount(None, None, f"srun {name} is not set in the script", "srun")
            options.append("" if value is None else value)
            k += 1
        k += 1
    own = _options(options)
    given = {**sbatch, **own}
    source = "srun" if own else "#SBATCH"
    counts: dict[str, int] = {}
    for name, value in given.items():
        if not value.isdigit() or int(value) < 1:
            return SlurmCount(None, None, f"Slurm's {name.replace('_', '-')} {value!r} is not "
                              "a count", source)
        counts[name] = int(value)
    nodes = counts.get("nodes")
    per_node = counts.get("ntasks_per_node")
    total = counts.get("ntasks")
    if per_node is None and total is not None:
        nodes = nodes or 1  # the processes are the total; how they spread does not change it
        if total % nodes:
            return SlurmCount(None, None, f"{total} tasks do not fill {nodes} nodes evenly",
                              source)
        per_node = total // nodes
    if per_node is None:
        return SlurmCount(None, None, "srun is given no --ntasks-per-node or --ntasks "
                          "(in its options or #SBATCH lines)", source)
    if nodes is None:
        # sbatch's command line usually gives it (`sbatch -N 4 SRUN.sh`, Megatron-LM's sc21):
        # Slurm's default of one node would be a guess.
        return SlurmCount(None, None, "the script gives srun no node count (-N, --nodes, or "
                          "#SBATCH --nodes; sbatch's command line may)", source)
    return SlurmCount(per_node, nodes, None, source)


def _options(words: Sequence[str]) -> dict[str, str]:
    """The task-count options among `words` (`--name=value`, `--name value`, `-N value`,
    `-Nvalue`), stopping at the first word that is not an option or its value."""
    out: dict[str, str] = {}
    k = 0
    while k < len(words):
        word = words[k]
        if not word.startswith("-"):
            break
        name, eq, value = word.partition("=")
        if name in _NAMES:
            if eq:
                out[_NAMES[name]] = value
            elif k + 1 < len(words):
                out[_NAMES[name]] = words[k + 1]
                k += 1
        elif name[:2] in ("-N", "-n") and len(name) > 2 and not name.startswith("--"):
            out[_NAMES[name[:2]]] = name[2:]
        elif not eq and k + 1 < len(words) and not words[k + 1].startswith("-") \
                and word in _TAKES_VALUE:
            k += 1  # another option's value
        k += 1
    return out


_TAKES_VALUE = frozenset({
    "-A", "--account", "-p", "--partition", "-t", "--time", "-J", "--job-name", "-o",
    "--output", "-e", "--error", "--mpi", "--container-image", "--container-mounts",
    "--container-name", "--container-workdir", "-c", "--cpus-per-task", "--gpus-per-node",
    "--gpus-per-task", "--gres", "--mem", "--qos", "--export", "-w", "--nodelist",
    "--cpu-bind", "--distribution", "-m",
})
"""srun/sbatch options that take a separate value, so that the value is not read as the
launched program (Megatron-LM's and NVIDIA's Slurm recipes use these); `--opt=value` needs no
entry."""
