"""Test double of a successful worker: prints progress, writes result.json, exits 0."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--spec")
parser.add_argument("--out-dir", required=True)
args = parser.parse_args()

for step in range(3):
    print(f"step {step} time 0.50 s", flush=True)
result = {"status": "OK", "step_time_s": 0.5, "step_time_p90_s": 0.52, "tokens_per_s": 8192.0,
          "tflops_per_gpu": 300.0, "mfu": 0.3, "peak_allocated_bytes": 1 << 30,
          "peak_reserved_bytes": 1 << 31, "loss_finite": True,
          "ranks": [{"rank": 0, "peak_allocated_bytes": 1 << 30,
                     "peak_reserved_bytes": 1 << 31, "device_used_bytes": None}]}
Path(args.out_dir, "result.json").write_text(json.dumps(result))
