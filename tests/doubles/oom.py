"""Test double of a rank that runs out of CUDA memory (the worker's contract: exit code 3)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--spec")
parser.add_argument("--out-dir", required=True)
parser.add_argument("--rank", type=int, default=int(os.environ.get("RANK", "0")))
parser.add_argument("--no-file", action="store_true", help="die before writing failure-rank*.json")
args = parser.parse_args()

message = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           "79.19 GiB of which 1.06 GiB is free.")
print("Traceback (most recent call last):", file=sys.stderr)
print('  File "worker.py", line 1, in <module>', file=sys.stderr)
print(f"torch.OutOfMemoryError: {message}", file=sys.stderr)
if not args.no_file:
    failure = {"rank": args.rank, "status": "OOM", "error": message}
    Path(args.out_dir, f"failure-rank{args.rank}.json").write_text(json.dumps(failure))
    print(f"AUTOTUNE_STATUS rank={args.rank} status=OOM", file=sys.stderr)
sys.exit(3)
