#!/usr/bin/env python3
"""A stand-in for Slurm's `srun` that runs an M-node job step on one multi-GPU machine.

    AUTOTUNE_SRUN="python3 $PWD/tools/local_srun.py" autotune MODEL --gpus 2 --nodes 2 \
        --gpus-per-node 1 --launcher slurm --rdzv-endpoint 127.0.0.1:29555 ...

Each "node" is one task process that sees only its own `--gpus-per-node` GPUs
(CUDA_VISIBLE_DEVICES is split in order), with SLURM_NODEID / SLURM_PROCID / SLURM_NNODES set as
srun sets them. So the multi-node launch path (one torchrun per node, c10d rendezvous, global
ranks assigned across agents) runs for real on a machine without a second node. With
LOCAL_SRUN_NET=1, NCCL's peer-to-peer and shared-memory transports are switched off, so ranks
of different "nodes" talk over sockets as they would between hosts.

Like `srun --kill-on-bad-exit=1`, the first task that fails ends the others (SIGTERM, then
SIGKILL after a grace period); SIGTERM and SIGINT are passed on to every task. The exit code is
the first failing task's, else 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from types import FrameType

_GRACE_S = 10.0


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="local_srun", add_help=False)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--ntasks-per-node", type=int, default=1)
    parser.add_argument("--gpus-per-node", type=int, default=0)
    parser.add_argument("--kill-on-bad-exit", default="0")
    # srun's options end at the first word that is not one (`--opt value`, `--opt=value`), as
    # autotune.trials.launchers.split_srun_argv reads them; repeated here because this script must
    # run on any python3, where autotune may not be importable.
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 1 if "=" in argv[i] else 2
    options, command = argv[:i], argv[i:]
    opts, unknown = parser.parse_known_args(options)
    if unknown:
        sys.exit(f"local_srun: unsupported srun options {unknown}")
    if not command:
        sys.exit("local_srun: no command")
    if opts.ntasks_per_node != 1:
        sys.exit("local_srun: only --ntasks-per-node 1 is emulated")
    return opts, command


def _visible_gpus() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # set, even empty ("no GPUs"), it is the answer
        return [g for g in visible.split(",") if g.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    except OSError:
        return []
    return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]


def _node_env(node: int, nodes: int, gpus: list[str]) -> dict[str, str]:
    env = dict(os.environ, SLURM_NODEID=str(node), SLURM_PROCID=str(node),
               SLURM_NNODES=str(nodes), SLURM_NTASKS=str(nodes), SLURM_LOCALID="0")
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    if os.environ.get("LOCAL_SRUN_NET") == "1":
        env.update(NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1")
    return env


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + _GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv: list[str]) -> int:
    procs: list[subprocess.Popen[bytes]] = []
    stopping: list[int] = []

    def forward(signum: int, _: FrameType | None) -> None:
        # Installed before anything else: a signal during start-up reaches every task started
        # so far, and no further task is started.
        stopping.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    opts, command = _parse(argv)
    g = opts.gpus_per_node
    gpus = _visible_gpus() if g else []
    need = opts.nodes * g
    if g and len(gpus) < need:
        sys.exit(f"local_srun: {opts.nodes} nodes x {g} GPUs need {need} GPUs, this machine "
                 f"shows {len(gpus)}")
    for n in range(opts.nodes):
        if stopping:
            break
        procs.append(subprocess.Popen(command, env=_node_env(
            n, opts.nodes, gpus[n * g:(n + 1) * g] if g else [])))
    if stopping:
        _stop(procs)
        return 128 + stopping[0]
    kill_on_bad_exit = opts.kill_on_bad_exit not in ("0", "false")
    while True:
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            if kill_on_bad_exit:
                _stop(procs)
            else:
                for p in procs:
                    p.wait()
            code = int(failed[0])
            return 128 - code if code < 0 else code  # killed by a signal: as a shell reports
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
