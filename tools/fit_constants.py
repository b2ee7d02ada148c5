"""Fit the cost and memory models' constants to tests/data/measured_trials.json, with
leave-one-family-out cross-validation (autotune.predict.calibration.cross_validate).

    PYTHONPATH=. python tools/fit_constants.py [--data FILE] [--json] [--also NAME,...]
        [--start NAME=VALUE,...] [--with-left-out]

A family is a model on a GPU type (gpt2-xl on H100, gpt2-large on H200, ...): trials of one
family share the shape-dependent terms (GEMM sizes, vocabulary, attention) and the machine, so
holding a whole family out asks what simulate is asked for a model or GPU it never saw. It prints
the held-out step-time and memory errors per family and the constants fitted to all trials,
which are the defaults of autotune.predict.cost.CostParams and
autotune.predict.memory.MemoryParams. The trials of autotune.predict.calibration.CV_LEFT_OUT
(misses of a cause the models leave out, which a fit would bend the shared constants toward)
are left out, as the tests' cross-validation leaves them; --with-left-out fits them too.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

from autotune.predict.calibration import (
    ATTENTION_FIT_FIELDS,
    COST_FIT_FIELDS,
    CV_LEFT_OUT,
    MEMORY_FIT_FIELDS,
    cross_validate,
    gemm_rate_fields,
    lever_fit_fields,
    load_trials,
)
from autotune.predict.cost import CostParams

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "measured_trials.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--also", default="", help=(
        "comma-separated CostParams constants fitted besides the default ones, e.g. "
        + ",".join(ATTENTION_FIT_FIELDS) + " (attention with and without dropout)"))
    parser.add_argument("--start", default="", help=(
        "comma-separated NAME=VALUE CostParams start values, e.g. gemm_rate_scale=1 (the "
        "measured GEMM rates on, their scale fitted: autotune.specs.gemm_rates)"))
    parser.add_argument("--with-left-out", action="store_true", help=(
        "fit the trials CV_LEFT_OUT leaves out too (autotune.predict.calibration)"))
    args = parser.parse_args(argv)
    also = tuple(name for name in args.also.split(",") if name)
    start = replace(CostParams(), **{k: float(v) for k, v in (
        kv.split("=", 1) for kv in args.start.split(",") if kv)})
    left_out = {} if args.with_left_out else CV_LEFT_OUT
    trials = load_trials(args.data, leave_out=left_out)
    cv = cross_validate(trials, extra_cost=also, start_cost=start)
    # The levers' constants join the fit where a trial turns the lever (FP8, the optimizer's
    # offload): autotune.predict.calibration.lever_fit_fields.
    cost_fields = (*COST_FIT_FIELDS, *gemm_rate_fields(start), *also,
                   *lever_fit_fields([t[2] for t in trials]))
    if args.json:
        print(json.dumps({"families": [asdict(f) for f in cv.families],
                          "cost": {n: getattr(cv.cost, n) for n in cost_fields},
                          "memory": {n: getattr(cv.memory, n) for n in MEMORY_FIT_FIELDS},
                          "left_out": left_out}, indent=2))
        return 0
    print("| family | trials | held-out step time: median / worst | in-sample | shipped | "
          "held-out memory: median / worst | in-sample | shipped |")
    print("|---|---|---|---|---|---|---|---|")
    for f in cv.families:
        print(f"| {f.family} | {f.trials} | {f.step_median:.1%} / {f.step_worst:.1%} | "
              f"{f.step_in_sample:.1%} | {f.step_shipped:.1%} | {f.memory_median:.1%} / "
              f"{f.memory_worst:.1%} | {f.memory_in_sample:.1%} | {f.memory_shipped:.1%} |")
    print(f"\nfitted to the {len(trials)} trials:")
    for n in cost_fields:
        print(f"  CostParams.{n} = {getattr(cv.cost, n):.6g}")
    for n in MEMORY_FIT_FIELDS:
        print(f"  MemoryParams.{n} = {getattr(cv.memory, n):.6g}")
    if left_out:
        print("\nleft out (--with-left-out fits them):")
        for prefix, why in left_out.items():
            print(f"  {prefix}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
