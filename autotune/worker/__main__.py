"""`python -m autotune.worker --spec trial.json --out-dir DIR`, one process per GPU (torchrun),
runs one trial; `python -m autotune.worker --serve DIR` serves trial after trial as a rank of a
warm pool (autotune.worker.serve); `python -m autotune.worker --standby DIR` makes a cold
launch's imports ahead of time and runs the one trial it is then handed, cold
(autotune.worker.standby).

Exit codes: 0 OK, 2 bad arguments, else autotune.trials.protocol.EXIT_CODES (3 OOM, 4 CRASH or
NCCL_ERROR). Files, log lines and environment variables are autotune.trials.protocol's too.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import NoReturn, TextIO

_STARTED = time.perf_counter()

# Imported after _STARTED on purpose: the start-up phase counts autotune's own imports.
from autotune.trials.protocol import STACKS_NAME, STACKS_SIGNAL, started_line  # noqa: E402

__all__ = ["main", "parse_args"]

_stacks_file: TextIO | None = None
"""Kept open for the life of the process: faulthandler writes into it on STACKS_SIGNAL."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m autotune.worker",
                                     description="Run one autotune trial on this rank "
                                                 "(launched by torchrun).")
    parser.add_argument("--spec", type=Path, help="trial.json (a TrialSpec)")
    parser.add_argument("--out-dir", type=Path,
                        help="where result.json and failure-rank<r>.json go")
    parser.add_argument("--serve", type=Path, metavar="POOL_DIR",
                        help="serve the trials written to POOL_DIR (a warm pool) instead")
    parser.add_argument("--standby", type=Path, metavar="STANDBY_DIR",
                        help="import, then run the one trial written to STANDBY_DIR, cold")
    args = parser.parse_args(argv)
    folders = [f"--{name}" for name in ("serve", "standby") if getattr(args, name) is not None]
    if len(folders) > 1:
        parser.error("give one of --serve and --standby")
    if not folders and (args.spec is None or args.out_dir is None):
        parser.error("give --spec and --out-dir (one trial), --serve POOL_DIR or "
                     "--standby STANDBY_DIR")
    if folders and (args.spec is not None or args.out_dir is not None):
        parser.error(f"{folders[0]} takes no --spec or --out-dir")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    # The runner reads this to tell a launch that never reached a rank (torchrun's rendezvous
    # failed) from a trial that started and then failed, and to find the ranks' pids when it
    # asks a timed-out trial for its stacks: the pid is given only once the handler is in
    # place, since STACKS_SIGNAL would otherwise kill the rank.
    where = args.serve or args.standby or args.out_dir
    line = (started_line(rank, pid=os.getpid(), host=socket.gethostname())
            if _register_stack_dump(where, rank) else started_line(rank))
    print(line, file=sys.stderr, flush=True)
    logging.basicConfig(level=logging.WARNING, format=f"[rank{rank}] %(name)s: %(message)s")
    from autotune.worker.report import exit_with_failure

    if args.serve is not None:
        _serve(args.serve, rank)
    if args.standby is not None:
        _stand_by(args.standby, rank)
    try:
        from autotune.trials.trial import TrialSpec
        from autotune.worker.run import prepare_environment, run_rank

        spec = TrialSpec.from_json(args.spec.read_text())
        prepare_environment(spec)
        run_rank(spec, args.out_dir, started=_STARTED)
    except BaseException as exc:  # every failure becomes a status; SystemExit included
        exit_with_failure(rank, exc, args.out_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter and NCCL teardown: the result is written, and destroy_process_group can
    # block for seconds (or hang when a peer is gone).
    os._exit(0)


def _serve(pool_dir: Path, rank: int) -> NoReturn:
    """Serve the pool's trials, then leave as a one-trial worker does (never returns). A failure
    outside any trial (the default group's init) is written to the pool's folder."""
    from autotune.worker.report import exit_with_failure

    try:
        from autotune.worker.serve import serve

        serve(pool_dir, rank, _STARTED)
    except BaseException as exc:
        exit_with_failure(rank, exc, pool_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _stand_by(standby_dir: Path, rank: int) -> NoReturn:
    """Stand by, then run the trial handed over as a one-trial worker does (never returns). A
    failure before the hand-over (CUDA touched by the imports) is written to the standby's
    folder, and the standby ends: the orchestrator then launches the trial cold."""
    from autotune.worker.report import exit_with_failure

    out_dir = standby_dir
    try:
        from autotune.worker.standby import stand_by

        job, phases = stand_by(standby_dir, rank, _STARTED)
        if job is not None:
            from autotune.trials.trial import TrialSpec
            from autotune.worker.run import prepare_environment, run_rank

            out_dir = job.out_dir
            spec = TrialSpec.from_json(job.spec.read_text())
            prepare_environment(spec)
            run_rank(spec, job.out_dir, phases=phases)
    except BaseException as exc:  # every failure becomes a status; SystemExit included
        exit_with_failure(rank, exc, out_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _register_stack_dump(out_dir: Path, rank: int) -> bool:
    """On STACKS_SIGNAL write every thread's Python stack to out_dir/stacks-rank<r>.txt.
    False when the file cannot be opened: the trial still runs, a timeout says less."""
    global _stacks_file
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        _stacks_file = (out_dir / STACKS_NAME.format(rank=rank)).open("w")
    except OSError:
        return False
    faulthandler.register(STACKS_SIGNAL, file=_stacks_file, all_threads=True)
    return True


if __name__ == "__main__":
    main()
