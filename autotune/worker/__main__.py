"""`python -m autotune.worker --spec trial.json --out-dir DIR`, one process per GPU (torchrun).

Exit codes: 0 OK, 3 OOM, 4 CRASH or NCCL_ERROR, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

_STARTED = time.perf_counter()

__all__ = ["STARTED_MARKER", "main", "parse_args"]

STARTED_MARKER = "AUTOTUNE_STARTED"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m autotune.worker",
                                     description="Run one autotune trial on this rank "
                                                 "(launched by torchrun).")
    parser.add_argument("--spec", type=Path, required=True, help="trial.json (a TrialSpec)")
    parser.add_argument("--out-dir", type=Path, required=True,
                        help="where result.json and failure-rank<r>.json go")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    # The runner reads this to tell a launch that never reached a rank (torchrun's rendezvous
    # failed) from a trial that started and then failed.
    print(f"{STARTED_MARKER} rank={rank}", file=sys.stderr, flush=True)
    logging.basicConfig(level=logging.WARNING, format=f"[rank{rank}] %(name)s: %(message)s")
    from autotune.worker.report import exit_with_failure

    try:
        from autotune.trial import TrialSpec
        from autotune.worker.run import prepare_environment, run_trial

        spec = TrialSpec.from_json(args.spec.read_text())
        prepare_environment(spec)
        run_trial(spec, args.out_dir, started=_STARTED)
    except BaseException as exc:  # every failure becomes a status; SystemExit included
        exit_with_failure(rank, exc, args.out_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter and NCCL teardown: the result is written, and destroy_process_group can
    # block for seconds (or hang when a peer is gone).
    os._exit(0)


if __name__ == "__main__":
    main()
