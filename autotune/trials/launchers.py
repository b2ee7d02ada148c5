"""The commands that launch a trial, and how a multi-node trial is laid out.

Data and argv only: nothing here starts a process (autotune.trials.runner does). A multi-node trial
is one torchrun per node, c10d rendezvous on one host, the worker unchanged: the same launch as
`autotune export --format slurm` writes. What the worker itself is told and leaves behind is
autotune.trials.protocol's.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import ConfigError
from autotune.trials.protocol import WORKER, worker_args
from autotune.trials.trial import TrialSpec

__all__ = [
    "DEFAULT_RDZV_PORT",
    "LAUNCHERS",
    "LOG_NAME",
    "OTHER_NODES_NAME",
    "SRUN",
    "SRUN_ENV",
    "TORCHRUN",
    "TORCHRUN_ENV",
    "MultiNode",
    "multinode_argv",
    "split_srun_argv",
]

LOG_NAME = "log.txt"
"""A trial's combined stdout and stderr, in its folder (written by the runner, not the worker)."""
TORCHRUN: tuple[str, ...] = (sys.executable, "-m", "torch.distributed.run")

LAUNCHERS: tuple[str, ...] = ("slurm", "torchrun")
SRUN: tuple[str, ...] = ("srun",)
DEFAULT_RDZV_PORT = 29500
"""Rendezvous port when the rendezvous host is another machine (its free ports are unknown)."""
OTHER_NODES_NAME = "other_nodes.sh"
"""With --launcher torchrun: the command each other node runs for this trial."""
SRUN_ENV = "AUTOTUNE_SRUN"
"""Replaces `srun` (split like a shell would): e.g. `srun --container-image=IMAGE
--container-mounts=...` when the trials run in a container and autotune outside it."""
TORCHRUN_ENV = "AUTOTUNE_TORCHRUN"
"""Replaces this interpreter's torchrun on the nodes: e.g. `python -m torch.distributed.run`
inside a container, where autotune's own interpreter path does not exist."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MultiNode:
    """How a trial spreads over nodes: `nodes` x `gpus_per_node` ranks, started by `launcher`.

    slurm: one `srun` step from inside an allocation (sbatch/salloc) starts a torchrun on each
    node; the rendezvous is on the allocation's first node unless `rdzv_endpoint` says otherwise.
    torchrun: autotune starts this node's torchrun, which hosts the rendezvous at
    `rdzv_endpoint`; the other nodes run the command written to other_nodes.sh.
    """

    launcher: str
    nodes: int
    gpus_per_node: int
    rdzv_endpoint: str | None = None
    """HOST:PORT of the c10d rendezvous."""

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ConfigError(f"--launcher {self.launcher!r}: choose {' or '.join(LAUNCHERS)}")
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ConfigError(f"--nodes {self.nodes} and --gpus-per-node {self.gpus_per_node} "
                              "must be positive")
        if self.launcher == "torchrun" and self.rdzv_endpoint is None:
            raise ConfigError("--launcher torchrun needs --rdzv-endpoint HOST:PORT (an address "
                              "of this node that the other nodes reach)")
        if self.rdzv_endpoint is not None:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"--rdzv-endpoint {self.rdzv_endpoint!r} must be HOST:PORT")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


def multinode_argv(spec: TrialSpec, trial_dir: Path, multi: MultiNode, endpoint: str,
                   rdzv_id: str, *, srun: Sequence[str] = SRUN,
                   launcher: Sequence[str] = TORCHRUN,
                   worker: Sequence[str] = WORKER) -> list[str]:
    """The argv autotune runs on this node for a trial over `multi.nodes` nodes."""
    world = spec.layout.world_size
    if world != multi.world_size:
        raise ConfigError(f"a trial over {multi.nodes} node(s) x {multi.gpus_per_node} GPUs "
                          f"needs world size {multi.world_size}: dp x tp x pp x cp = {world}")
    trial_dir = Path(trial_dir).resolve()
    # --rdzv-id unique per trial: a late agent of the previous trial never joins this one.
    torchrun = [*launcher, "--nnodes", str(multi.nodes), "--nproc-per-node",
                str(multi.gpus_per_node), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                "--rdzv-id", rdzv_id, *worker, *worker_args(trial_dir)]
    if multi.launcher == "torchrun":
        return torchrun
    # One task per node, each a torchrun that starts the node's ranks; --kill-on-bad-exit: a
    # node whose torchrun fails ends the step instead of leaving the others in the rendezvous.
    return [*srun, "--nodes", str(multi.nodes), "--ntasks-per-node", "1", "--gpus-per-node",
            str(multi.gpus_per_node), "--kill-on-bad-exit=1", *torchrun]


def split_srun_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """srun's own options and the task command, as `multinode_argv` writes them: options first,
    each `--opt value` (two words) or `--opt=value` (one); the first other word starts the task.
    For srun stand-ins (tools/local_srun.py, the tests' fake_srun)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 1 if "=" in argv[i] else 2
    return list(argv[:i]), list(argv[i:])

