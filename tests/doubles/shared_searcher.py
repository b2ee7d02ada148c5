"""One searcher of a shared study (tests/test_postgres.py): a grid search over a small space with
the scripted FakeBackend, against the storage URL it is given.

`python shared_searcher.py URL STUDY LAUNCH_LOG [--resume] [--delay S] [--block-on N --marker P]`
With --block-on, the searcher's N-th launch writes P and blocks until the process is killed.
Heartbeat timing comes from AUTOTUNE_HEARTBEAT_INTERVAL_S / AUTOTUNE_HEARTBEAT_GRACE_S.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for `doubles`

from doubles.fake_backend import (
    FakeBackend,
    small_cluster,
    small_model,
    small_space,
)

from autotune.search import SearchConfig, run_search
from autotune.search.space import SearchSpace
from autotune.search.storage import redact_url

CLUSTER = small_cluster(memory_gib=80.0)
"""Every layout of SPACE fits: all 16 are launched."""


def shared_space() -> SearchSpace:
    """16 valid layouts of gpt2-medium on 4 GPUs (tp x pp x mbs x distributed optimizer)."""
    return small_space(mbs=[1, 2], overlap_param_gather=[False], sequence_parallel=[False])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("study")
    parser.add_argument("launch_log", type=Path)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--delay", type=float, default=0.3)
    parser.add_argument("--block-on", type=int, default=None)
    parser.add_argument("--marker", type=Path, default=None)
    parser.add_argument("--results-dir", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    backend = FakeBackend(CLUSTER, delay_s=args.delay, launch_log=args.launch_log,
                          block_on_call=args.block_on, started_marker=args.marker)
    result = run_search(SearchConfig(model=small_model(), cluster=CLUSTER, space=shared_space(),
                                     backend=backend, results_dir=args.results_dir,
                                     study_name=args.study, storage=args.url, sampler="grid",
                                     resume=args.resume, finalists=0))
    print(f"launched {len(backend.calls)}; stopped: {result.stop_reason}; "
          f"storage {redact_url(args.url)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
