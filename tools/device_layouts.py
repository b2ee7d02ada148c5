"""Run a list of layouts through autotune's runner and worker (the product's trial path without
the search), and print measured against predicted for each. For benchmark reports.

    python tools/device_layouts.py [--seq-len N] MODEL GPUS GPU OUT_DIR LAYOUT...
    LAYOUT = comma-separated Layout fields, e.g. tp=2,sequence_parallel=1,mbs=32,impl=sdpa
    (dp is derived from GPUS; gbs=N overrides the model's global batch; unknown fields are an
    error). --seq-len N overrides the model's sequence length, as the CLI's --seq-len does.
    Trials that the memory model predicts not to fit are launched anyway: this tool measures the
    model, it does not gate.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from autotune.commands.estimate import layout_from_fields
from autotune.layouts.layout import DIMENSIONS
from autotune.predict.cost import estimate_cost
from autotune.predict.memory import estimate_memory
from autotune.search.backends import trial_timeout_s
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model
from autotune.trials.metrics import metrics_from_run
from autotune.trials.runner import run_trial
from autotune.trials.trial import TrialSpec

GIB = 2**30
STEPS, WARMUP = 5, 2


def layout_fields(text: str) -> dict[str, object]:
    """`tp=2,mbs=4,...` as Layout fields (tools/device_pool_check.py reads layouts alike)."""
    out: dict[str, object] = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key not in DIMENSIONS:
            raise SystemExit(f"unknown layout field {key!r}; known: {', '.join(DIMENSIONS)}")
        out[key] = DIMENSIONS[key].parse(value)
    return out


def add_seq_len(parser: argparse.ArgumentParser) -> None:
    """--seq-len N, as the CLI's (tools/megatron_gap.py takes it too)."""
    parser.add_argument("--seq-len", type=int, default=None,
                        help="Override the model's sequence length (the CLI's --seq-len).")


def model_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ModelSpec:
    """args.model with args.seq_len applied (add_seq_len); a non-positive one is a usage
    error."""
    if args.seq_len is not None and args.seq_len <= 0:
        parser.error(f"--seq-len must be a positive integer, got {args.seq_len}")
    return load_model(args.model).with_overrides(seq_length=args.seq_len)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_seq_len(parser)
    parser.add_argument("model")
    parser.add_argument("gpus", type=int)
    parser.add_argument("gpu")
    parser.add_argument("out_dir")
    parser.add_argument("layouts", nargs="+", metavar="LAYOUT")
    args = parser.parse_args()
    model = model_of(parser, args)
    cluster = ClusterSpec.make(args.gpus, gpu=args.gpu)
    out_dir, layouts = args.out_dir, args.layouts
    rows = []
    for i, text in enumerate(layouts):
        s = layout_from_fields(model, cluster, layout_fields(text))
        memory = estimate_memory(model, s, cluster)
        cost = estimate_cost(model, s, cluster)
        spec = TrialSpec(model=model, layout=s, train_steps=STEPS, warmup_steps=WARMUP,
                         gpu_peak_bf16_flops=cluster.gpu.peak_bf16_flops)
        trial_dir = Path(out_dir) / f"{i:02d}"
        start = time.monotonic()
        m = metrics_from_run(run_trial(spec, trial_dir,
                                       timeout_s=trial_timeout_s(cost.step_time_s, spec)))
        row = {"layout": s.describe(), "gbs": s.gbs, "status": m.status.value,
               "tokens_per_s": m.tokens_per_s, "mfu": m.mfu, "step_time_s": m.step_time_s,
               "peak_allocated_gib": (m.peak_allocated_bytes or 0) / GIB or None,
               "peak_reserved_gib": (m.peak_reserved_bytes or 0) / GIB or None,
               "device_used_gib": (m.device_used_bytes or 0) / GIB or None,
               "predicted_peak_gib": memory.peak_bytes / GIB, "predicted_fits": memory.fits,
               "predicted_tokens_per_s": cost.tokens_per_s,
               "predicted_step_time_s": cost.step_time_s,
               "wall_s": time.monotonic() - start,
               "overhead_s": (m.wall_time_s or 0) - STEPS * (m.step_time_s or 0),
               "error": (m.error or "").splitlines()[:1],
               # Every step's loss (warm-up and timed; None: not finite): an FP8 row's is
               # compared with its bf16 twin's by autotune.search.loss_guard.compare_losses.
               "losses": list(m.losses)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    (Path(out_dir) / "rows.json").write_text(json.dumps(rows, indent=1))
    print("| layout | status | tokens/s | pred tokens/s | MFU % | step s | pred step s | "
          "alloc GiB | reserved GiB | used GiB | pred GiB | wall s | overhead s |")
    for r in rows:
        def f(v: object, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)
        print(f"| {r['layout']} | {r['status']} | {f(r['tokens_per_s'], ',.0f')} | "
              f"{f(r['predicted_tokens_per_s'], ',.0f')} | "
              f"{f(r['mfu'] and r['mfu'] * 100, '.1f')} | {f(r['step_time_s'], '.3f')} | "
              f"{f(r['predicted_step_time_s'], '.3f')} | {f(r['peak_allocated_gib'], '.1f')} | "
              f"{f(r['peak_reserved_gib'], '.1f')} | {f(r['device_used_gib'], '.1f')} | "
              f"{f(r['predicted_peak_gib'], '.1f')} | {f(r['wall_s'], '.1f')} | "
              f"{f(r['overhead_s'], '.1f')} |")


if __name__ == "__main__":
    main()
