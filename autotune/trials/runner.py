"""Launching trials: with autotune.trials.rank_group (the warm pool's and the standby's ranks),
the only modules that start processes.

A trial runs as one process tree in its own session: torchrun and its workers (or a test double),
stdout and stderr into `<trial_dir>/log.txt`, under a wall-clock timeout. On timeout or Ctrl-C the
whole tree gets SIGTERM, a grace period, then SIGKILL, and nothing is left running.

The tree is followed through /proc, signalled and reaped by autotune.trials.proctree (torchrun's
workers leave its process group, so killing that group alone would orphan them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import ConfigError, LaunchError
from autotune.megatron.megatron_args import megatron_lm_args, training_script
from autotune.trials.launchers import (
    DEFAULT_RDZV_PORT,
    LOG_NAME,
    OTHER_NODES_NAME,
    SRUN,
    SRUN_ENV,
    TORCHRUN,
    TORCHRUN_ENV,
    MultiNode,
    multinode_argv,
)
from autotune.trials.ports import free_port
from autotune.trials.proctree import ProcessTree, become_subreaper, shutdown, wait
from autotune.trials.protocol import (
    DEFAULT_NCCL_TIMEOUT_S,
    NCCL_TIMEOUT_ENV,
    SPEC_NAME,
    STACKS_NAME,
    STACKS_SIGNAL,
    WORKER,
    distributed_timeout_minutes,
    started_ranks,
    worker_args,
)
from autotune.trials.trial import TrialSpec

__all__ = [
    "DEFAULT_GRACE_S",
    "STACKS_WAIT_S",
    "RunOutput",
    "TrialInterrupted",
    "ask_for_stacks",
    "launcher_argv",
    "megatron_lm_argv",
    "note",
    "run_command",
    "run_megatron_lm_trial",
    "run_multinode_trial",
    "run_trial",
    "slurm_first_node",
    "torchrun_argv",
    "trial_env",
]

logger = logging.getLogger(__name__)

DEFAULT_GRACE_S = 10.0
"""Seconds between SIGTERM and SIGKILL."""

# Set on every trial, over whatever the parent has: the GPU hosts need them, and a trial that
# inherits a different value would measure something else.
_FORCED_ENV: dict[str, str] = {
    # torch 2.x ProcessGroupNCCL.hpp, ErrorHandlingMode: 0 no handling, 1 tear down the process
    # after aborting the communicators, 2 abort the communicators only, 3 tear down without
    # ncclCommAbort (the default; abort itself can hang). 3: a failed collective ends the rank.
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    # Non-blocking wait(): errors surface through the watchdog, which honours the timeout above.
    "TORCH_NCCL_BLOCKING_WAIT": "0",
    # No flight-recorder dump on timeout: it writes files and delays the exit of a failed trial.
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
    # NVLink SHARP / multicast stay off: the GPU hosts we use require it.
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    # The log must hold the last lines before a crash or a kill.
    "PYTHONUNBUFFERED": "1",
    # Megatron asserts it with TP or CP (arguments.py): kernels queue in issue order, so the TP/SP
    # communication overlaps compute as scheduled.
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
}
_DEFAULT_ENV: dict[str, str] = {
    # One OpenMP thread per rank unless the user chose: 8 ranks x all cores oversubscribe the CPU.
    "OMP_NUM_THREADS": "1",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOutput:
    """What a finished (or stopped) trial process left behind; metrics turns it into figures."""

    argv: tuple[str, ...]
    pid: int
    """The launched process; with start_new_session it is also its process group and session."""
    returncode: int
    """The launched process's exit status; negative: killed by that signal."""
    timed_out: bool
    interrupted: bool
    """Stopped by Ctrl-C (KeyboardInterrupt) in the orchestrator."""
    wall_time_s: float
    """Seconds from launch until every process of the trial was gone."""
    log_path: Path
    trial_dir: Path


class TrialInterrupted(KeyboardInterrupt):
    """Ctrl-C during a trial, raised after the trial's processes are gone.

    A KeyboardInterrupt, so the search stops as on any Ctrl-C; `output` tells what was running.
    """

    def __init__(self, output: RunOutput) -> None:
        super().__init__(f"interrupted trial in {output.trial_dir}")
        self.output = output


def trial_env(base: Mapping[str, str] | None = None, *,
              nccl_timeout_s: int = DEFAULT_NCCL_TIMEOUT_S) -> dict[str, str]:
    """The parent's environment (or `base`) plus the settings every trial needs."""
    if nccl_timeout_s <= 0:
        raise ConfigError(f"nccl_timeout_s must be positive, got {nccl_timeout_s}")
    env = dict(os.environ if base is None else base)
    env.update(_FORCED_ENV)
    for key, value in _DEFAULT_ENV.items():
        env.setdefault(key, value)
    env[NCCL_TIMEOUT_ENV] = str(nccl_timeout_s)
    return env


def launcher_argv(nproc: int, port: int, launcher: Sequence[str]) -> list[str]:
    """torchrun's own arguments for `nproc` ranks on this node."""
    if nproc < 1:
        raise ConfigError(f"nproc must be >= 1, got {nproc}")
    # Flag spellings as `python -m torch.distributed.run --help` prints them (torch 2.13); the
    # underscore forms are aliases. One node, c10d rendezvous on a port of our choosing.
    return [*launcher, "--nproc-per-node", str(nproc), "--nnodes", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]


def torchrun_argv(spec: TrialSpec, trial_dir: Path, nproc: int, port: int, *,
                  launcher: Sequence[str] = TORCHRUN,
                  worker: Sequence[str] = WORKER) -> list[str]:
    """torchrun over the autotune worker (or `worker`, e.g. a test double script)."""
    world = spec.layout.world_size
    if nproc != world:
        raise ConfigError(f"a single-node trial needs nproc = world size: nproc={nproc}, "
                          f"dp x tp x pp x cp = {world}")
    trial_dir = Path(trial_dir).resolve()
    return [*launcher_argv(nproc, port, launcher), *worker, *worker_args(trial_dir)]


def megatron_lm_argv(megatron_lm_path: Path, spec: TrialSpec, nproc: int, port: int, *,
                     launcher: Sequence[str] = TORCHRUN,
                     nccl_timeout_s: int = DEFAULT_NCCL_TIMEOUT_S,
                     extra_args: Sequence[str] = ()) -> list[str]:
    """torchrun over Megatron-LM's pretrain_gpt.py on mock data for warm-up + timed iterations."""
    world = spec.layout.world_size
    if nproc != world:
        raise ConfigError(f"a single-node trial needs nproc = world size: nproc={nproc}, "
                          f"dp x tp x pp x cp = {world}")
    script = Path(training_script(str(megatron_lm_path))).resolve()
    args = megatron_lm_args(spec.model, spec.layout,
                            train_iters=spec.warmup_steps + spec.train_steps, mock_data=True,
                            # Megatron-LM refuses seed 0, the worker's default.
                            seed=spec.seed if spec.seed > 0 else 1234,
                            distributed_timeout_minutes=distributed_timeout_minutes(
                                nccl_timeout_s),
                            extra_args=extra_args)
    return [*launcher_argv(nproc, port, launcher), str(script), *args]


def run_trial(spec: TrialSpec, trial_dir: Path, *, timeout_s: float,
              grace_s: float = DEFAULT_GRACE_S, nccl_timeout_s: int = DEFAULT_NCCL_TIMEOUT_S,
              env: Mapping[str, str] | None = None, launcher: Sequence[str] = TORCHRUN,
              worker: Sequence[str] = WORKER) -> RunOutput:
    """Write trial.json and run the worker under torchrun on this node's GPUs."""
    trial_dir = Path(trial_dir).resolve()
    trial_dir.mkdir(parents=True, exist_ok=True)
    spec.write(trial_dir / SPEC_NAME)
    argv = torchrun_argv(spec, trial_dir, spec.layout.world_size, free_port(),
                         launcher=launcher, worker=worker)
    return run_command(argv, trial_dir, timeout_s,
                       trial_env(env, nccl_timeout_s=nccl_timeout_s), grace_s=grace_s)


def run_megatron_lm_trial(megatron_lm_path: Path, spec: TrialSpec, trial_dir: Path, *,
                          timeout_s: float, grace_s: float = DEFAULT_GRACE_S,
                          nccl_timeout_s: int = DEFAULT_NCCL_TIMEOUT_S,
                          env: Mapping[str, str] | None = None,
                          launcher: Sequence[str] = TORCHRUN,
                          extra_args: Sequence[str] = ()) -> RunOutput:
    """Run Megatron-LM's pretrain_gpt.py from a checkout at `megatron_lm_path`."""
    script = Path(training_script(str(megatron_lm_path)))
    if not script.is_file():
        raise LaunchError(f"{script} does not exist: --megatron-lm must point at a "
                          "Megatron-LM checkout or the .py script to launch")
    trial_dir = Path(trial_dir).resolve()
    trial_dir.mkdir(parents=True, exist_ok=True)
    spec.write(trial_dir / SPEC_NAME)  # the record of what ran, though Megatron-LM never reads it
    argv = megatron_lm_argv(megatron_lm_path, spec, spec.layout.world_size, free_port(),
                            launcher=launcher, nccl_timeout_s=nccl_timeout_s,
                            extra_args=extra_args)
    return run_command(argv, trial_dir, timeout_s,
                       trial_env(env, nccl_timeout_s=nccl_timeout_s), grace_s=grace_s)


# --- Multi-node trials -----------------------------------------------------------------------
# One torchrun per node, c10d rendezvous on one host, the worker unchanged: the same launch as
# `autotune export --format slurm` writes. The search (this process) stays on one node; every
# node must see the trial folder at the same path (a shared filesystem): the remote ranks read
# trial.json from it, and global rank 0, which writes result.json, may be on any node.

def _command_from_env(name: str, default: Sequence[str]) -> tuple[str, ...]:
    value = os.environ.get(name, "").strip()
    return tuple(shlex.split(value)) if value else tuple(default)


def slurm_first_node(nodelist: str | None = None) -> str:
    """The first host of the allocation ($SLURM_JOB_NODELIST, compressed like `gpu[01-04]`)."""
    nodelist = nodelist if nodelist is not None else os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise LaunchError("--launcher slurm runs inside an allocation (sbatch or salloc): "
                          "SLURM_JOB_NODELIST is not set (or give --rdzv-endpoint HOST:PORT)")
    try:
        # Only scontrol expands Slurm's compressed host lists reliably (gpu[01-03,07],x1).
        done = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"cannot run scontrol show hostnames {nodelist}: {exc}") from exc
    hosts = done.stdout.split()
    if done.returncode != 0 or not hosts:
        raise LaunchError(f"scontrol show hostnames {nodelist} failed: "
                          f"{done.stderr.strip() or 'no hosts'}")
    return hosts[0]


def _rdzv_endpoint(multi: MultiNode) -> str:
    if multi.rdzv_endpoint is not None:
        return multi.rdzv_endpoint
    host = slurm_first_node()
    # On the rendezvous host (where sbatch runs the batch script, and so autotune) a port free
    # now avoids a clash with a previous trial's store still closing; elsewhere the fixed one.
    here = socket.gethostname().split(".")[0]
    port = free_port("") if here == host.split(".")[0] else DEFAULT_RDZV_PORT
    return f"{host}:{port}"


def run_multinode_trial(spec: TrialSpec, trial_dir: Path, multi: MultiNode, *,
                        timeout_s: float, grace_s: float = DEFAULT_GRACE_S,
                        nccl_timeout_s: int = DEFAULT_NCCL_TIMEOUT_S,
                        env: Mapping[str, str] | None = None,
                        srun: Sequence[str] | None = None,
                        launcher: Sequence[str] | None = None,
                        worker: Sequence[str] = WORKER) -> RunOutput:
    """Write trial.json and run the worker over `multi.nodes` nodes.

    `srun` and `launcher` default to $AUTOTUNE_SRUN and $AUTOTUNE_TORCHRUN, else SRUN and
    TORCHRUN.

    With srun as the launched process, the runner's process-group kill reaches the remote ranks
    too: srun forwards SIGTERM (and the SIGKILL after the grace period ends the step) to its
    tasks on every node.
    """
    trial_dir = Path(trial_dir).resolve()
    trial_dir.mkdir(parents=True, exist_ok=True)
    spec.write(trial_dir / SPEC_NAME)
    endpoint = _rdzv_endpoint(multi)
    # Unique per launch (time too): a relaunch of the same trial must not meet a late agent of
    # the failed launch in the same rendezvous.
    rdzv_id = (f"autotune-{os.getpid()}-{trial_dir.parent.name}-{trial_dir.name}-"
               f"{time.monotonic_ns() % 10**9}")
    argv = multinode_argv(spec, trial_dir, multi, endpoint, rdzv_id,
                          srun=srun if srun is not None else _command_from_env(SRUN_ENV, SRUN),
                          launcher=(launcher if launcher is not None
                                    else _command_from_env(TORCHRUN_ENV, TORCHRUN)),
                          worker=worker)
    if multi.launcher == "torchrun":
        # The same torchrun on every node joins the one rendezvous; c10d assigns node ranks.
        script = trial_dir / OTHER_NODES_NAME
        script.write_text("#!/usr/bin/env bash\n# Run on each of the other "
                          f"{multi.nodes - 1} node(s) while autotune waits for this trial.\n"
                          + " ".join(shlex.quote(a) for a in argv) + "\n")
        logger.info("trial %s waits for %d other node(s): run bash %s on each", trial_dir.name,
                    multi.nodes - 1, script)
    return run_command(argv, trial_dir, timeout_s,
                       trial_env(env, nccl_timeout_s=nccl_timeout_s), grace_s=grace_s)


def run_command(argv: Sequence[str], trial_dir: Path, timeout_s: float,
                env: Mapping[str, str] | None = None, *,
                grace_s: float = DEFAULT_GRACE_S) -> RunOutput:
    """Run `argv` (no shell) in its own session with output to `<trial_dir>/log.txt`.

    Returns when every process of the trial is gone. On timeout the tree is stopped and the output
    says `timed_out`; on Ctrl-C it is stopped and TrialInterrupted (a KeyboardInterrupt) raised.
    """
    if timeout_s <= 0:
        raise ConfigError(f"timeout_s must be positive, got {timeout_s}")
    if grace_s < 0:
        raise ConfigError(f"grace_s must be >= 0, got {grace_s}")
    trial_dir = Path(trial_dir).resolve()
    trial_dir.mkdir(parents=True, exist_ok=True)
    log_path = trial_dir / LOG_NAME
    become_subreaper()
    timed_out = interrupted = False
    start = time.monotonic()
    with log_path.open("wb") as log:
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, cwd=trial_dir,
                                    env=None if env is None else dict(env),
                                    start_new_session=True)
        except OSError as exc:
            raise LaunchError(f"cannot start {argv[0]}: {exc}") from exc
        tree = ProcessTree(proc.pid)
        try:
            timed_out = not wait(proc, tree, start + timeout_s)
        except KeyboardInterrupt:
            # The trial is in its own session, so the terminal's Ctrl-C reached only us.
            interrupted = True
        finally:
            if timed_out or interrupted:
                why = "timed out" if timed_out else "interrupted"
                note(log, f"[autotune] {why} after {time.monotonic() - start:.1f} s; "
                           f"stopping the process tree (grace {grace_s:g} s)")
            try:
                if timed_out:
                    ask_for_stacks(log, log_path, tree)
            except KeyboardInterrupt:
                interrupted = True  # Ctrl-C while the ranks write their stacks: stop now
            finally:
                shutdown(proc, tree, grace_s)
    output = RunOutput(argv=tuple(argv), pid=proc.pid, returncode=proc.returncode,
                       timed_out=timed_out, interrupted=interrupted,
                       wall_time_s=time.monotonic() - start, log_path=log_path,
                       trial_dir=trial_dir)
    if interrupted:
        raise TrialInterrupted(output)
    return output


STACKS_WAIT_S = 2.0
"""How long a timed-out trial's ranks get to write their stacks before SIGTERM."""


def ask_for_stacks(log: object, log_path: Path, tree: ProcessTree) -> None:
    """Send STACKS_SIGNAL to every rank the log says started and that is still in the trial's
    tree (pids are checked against it, so a reused pid is never signalled); wait for the dumps."""
    try:
        ranks = started_ranks(log_path.read_text(errors="replace"), socket.gethostname())
    except OSError:
        return
    present = tree.present() | ({tree.root} if not tree.root_reaped else set())
    asked = []
    for rank, pid in sorted(ranks.items()):
        if pid in present:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, STACKS_SIGNAL)
                asked.append(rank)
    if asked:
        note(log, f"[autotune] asked ranks {', '.join(map(str, asked))} for their Python "
                   f"stacks ({STACKS_NAME.format(rank='<r>')})")
        time.sleep(STACKS_WAIT_S)


def note(log: object, line: str) -> None:
    # The child shares this file description, so a flushed write lands after its output so far.
    with contextlib.suppress(OSError, ValueError):
        log.write(f"\n{line}\n".encode())  # type: ignore[attr-defined]
        log.flush()  # type: ignore[attr-defined]
