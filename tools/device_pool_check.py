"""Warm against cold on real GPUs: the same layouts measured in a warm pool and each in a launch
of its own, with the same fixed step counts, then once more in the pool with adaptive timing;
optionally an out-of-memory trial and a timed-out one inside the pool, each followed by a trial
that must still run. For the benchmark report of issue 15.

    python tools/device_pool_check.py MODEL GPUS GPU OUT_DIR [--oom LAYOUT] [--hang LAYOUT]
        LAYOUT...
    LAYOUT = comma-separated Layout fields, as tools/device_layouts.py takes them.

Writes OUT_DIR/pool_check.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

from device_layouts import layout_fields  # tools/ is on sys.path: run as a script

from autotune.commands.estimate import layout_from_fields
from autotune.layouts.layout import Layout
from autotune.predict.cost import estimate_cost
from autotune.search.backends import trial_timeout_s
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model
from autotune.trials.metrics import metrics_from_run
from autotune.trials.pool import WarmPool
from autotune.trials.runner import run_trial
from autotune.trials.trial import TrialMetrics, TrialSpec

GIB = 2**30
STEPS, WARMUP = 10, 3
STABLE_CV = 0.01


def _row(m: TrialMetrics) -> dict[str, object]:
    overhead = (m.wall_time_s - m.timed_s if m.wall_time_s is not None and m.timed_s is not None
                else None)
    return {"status": m.status.value, "tokens_per_s": m.tokens_per_s,
            "peak_allocated_gib": (m.peak_allocated_bytes or 0) / GIB or None,
            "peak_reserved_gib": (m.peak_reserved_bytes or 0) / GIB or None,
            "wall_s": m.wall_time_s, "timed_s": m.timed_s, "warmup_s": m.warmup_s,
            "overhead_s": overhead, "timed_steps": m.timed_steps,
            "stop": None if m.stop_reason is None else m.stop_reason.value,
            "error": (m.error or "").splitlines()[0] if m.error else None}


def _spec(model: ModelSpec, s: Layout, cluster: ClusterSpec, *, adaptive: bool) -> TrialSpec:
    return TrialSpec(model=model, layout=s, train_steps=STEPS, warmup_steps=WARMUP,
                     stable_cv=STABLE_CV if adaptive else 0.0,
                     gpu_peak_bf16_flops=cluster.gpu.peak_bf16_flops, gpu_name=cluster.gpu.name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("gpus", type=int)
    parser.add_argument("gpu")
    parser.add_argument("out", type=Path)
    parser.add_argument("layouts", nargs="+")
    parser.add_argument("--oom", help="a layout that runs out of memory, run inside the pool")
    parser.add_argument("--hang", help="a layout given --hang-budget seconds inside the pool, "
                                       "too few to finish, so it times out as a hang would")
    parser.add_argument("--hang-budget", type=float, default=15.0)
    parser.add_argument("--gbs", type=int, help="global batch size (default: the model's)")
    parser.add_argument("--seq-len", type=int, help="sequence length (default: the model's)")
    parser.add_argument("--warm-only", action="store_true",
                        help="only the warm pool at fixed steps: does each trial release "
                             "cleanly (the pool's log names what a leaking one leaves)")
    args = parser.parse_args()
    model = load_model(args.model)
    if args.gbs is not None:
        model = replace(model, global_batch_size=args.gbs)
    if args.seq_len is not None:
        model = replace(model, seq_length=args.seq_len)
    cluster = ClusterSpec.make(args.gpus, gpu=args.gpu)
    layouts = [layout_from_fields(model, cluster, layout_fields(t)) for t in args.layouts]
    timeouts = [trial_timeout_s(estimate_cost(model, s, cluster).step_time_s,
                                _spec(model, s, cluster, adaptive=False)) for s in layouts]
    rows: list[dict[str, object]] = [{"layout": s.describe()} for s in layouts]
    events: list[dict[str, object]] = []

    def save(**more: object) -> None:
        """After each phase, so a run stopped at its limit still leaves what it measured."""
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "pool_check.json").write_text(json.dumps(
            {"model": model.name, "gbs": model.global_batch_size, "gpus": args.gpus,
             "gpu": args.gpu, "rows": rows, "faults": events,
             "steps": {"warmup": WARMUP, "timed": STEPS, "stable_cv": STABLE_CV}, **more},
            indent=2))

    with WarmPool(args.out / "pool-fixed", args.gpus) as pool:
        for i, (s, timeout) in enumerate(zip(layouts, timeouts, strict=True)):
            spec = _spec(model, s, cluster, adaptive=False)
            m = metrics_from_run(pool.run(spec, args.out / "warm-fixed" / str(i), timeout))
            rows[i]["warm"] = _row(m)
        rows_starts = pool.starts
    save()
    if args.warm_only:
        save(pool_starts={"fixed": rows_starts})
        _print(rows, events)
        print(f"pool starts: {rows_starts} for {len(layouts)} trials")
        return
    with WarmPool(args.out / "pool-adaptive", args.gpus) as pool:
        n = 0
        for i, (s, timeout) in enumerate(zip(layouts, timeouts, strict=True)):
            if i == 1:
                for kind, text in (("oom", args.oom), ("hang", args.hang)):
                    if text is None:
                        continue
                    bad = layout_from_fields(model, cluster, layout_fields(text))
                    spec = _spec(model, bad, cluster, adaptive=True)
                    budget = args.hang_budget if kind == "hang" else timeout
                    start = time.monotonic()
                    m = metrics_from_run(pool.run(spec, args.out / "faults" / kind, budget))
                    events.append({"kind": kind, "layout": bad.describe(), **_row(m),
                                   "seconds": time.monotonic() - start,
                                   "pool_starts_after": pool.starts})
            spec = _spec(model, s, cluster, adaptive=True)
            m = metrics_from_run(pool.run(spec, args.out / "warm-adaptive" / str(n), timeout))
            rows[i]["adaptive"] = _row(m)
            n += 1
        adaptive_starts = pool.starts
    save(pool_starts={"fixed": rows_starts, "adaptive": adaptive_starts})
    for i, (s, timeout) in enumerate(zip(layouts, timeouts, strict=True)):
        spec = _spec(model, s, cluster, adaptive=False)
        m = metrics_from_run(run_trial(spec, args.out / "cold" / str(i), timeout_s=timeout))
        rows[i]["cold"] = _row(m)
        save()
    save(pool_starts={"fixed": rows_starts, "adaptive": adaptive_starts})
    _print(rows, events)


def _pct(a: object, b: object) -> str:
    if not isinstance(a, float) or not isinstance(b, float) or not b:
        return "-"
    return f"{(a / b - 1) * 100:+.1f}%"


def _f(x: object, fmt: str) -> str:
    return "-" if not isinstance(x, (int, float)) else format(x, fmt)


def _print(rows: list[dict[str, object]], events: list[dict[str, object]]) -> None:
    print("| layout | cold tok/s | warm tok/s | diff | cold peak alloc GiB | warm | diff | "
          "cold overhead s | warm fixed overhead s | adaptive overhead s | adaptive steps | "
          "adaptive tok/s | diff vs cold |")
    print("|" + "---|" * 13)
    over: dict[str, list[float]] = {"cold": [], "warm": [], "adaptive": []}
    for i, row in enumerate(rows):
        c, w, a = (row.get(k, {}) for k in ("cold", "warm", "adaptive"))
        assert isinstance(c, dict) and isinstance(w, dict) and isinstance(a, dict)
        for key, r in (("cold", c), ("warm", w), ("adaptive", a)):
            if i > 0 and isinstance(r.get("overhead_s"), float):
                over[key].append(r["overhead_s"])
        print(f"| {row['layout']} | {_f(c.get('tokens_per_s'), ',.0f')} | "
              f"{_f(w.get('tokens_per_s'), ',.0f')} | "
              f"{_pct(w.get('tokens_per_s'), c.get('tokens_per_s'))} | "
              f"{_f(c.get('peak_allocated_gib'), '.2f')} | "
              f"{_f(w.get('peak_allocated_gib'), '.2f')} | "
              f"{_pct(w.get('peak_allocated_gib'), c.get('peak_allocated_gib'))} | "
              f"{_f(c.get('overhead_s'), '.1f')} | {_f(w.get('overhead_s'), '.1f')} | "
              f"{_f(a.get('overhead_s'), '.1f')} | {a.get('timed_steps')} ({a.get('stop')}) | "
              f"{_f(a.get('tokens_per_s'), ',.0f')} | "
              f"{_pct(a.get('tokens_per_s'), c.get('tokens_per_s'))} |")
    for key, values in over.items():
        if values:
            print(f"median overhead from the second trial on, {key}: "
                  f"{statistics.median(values):.1f} s over {len(values)} trials")
    for e in events:
        print(f"fault {e['kind']}: {e['layout']} -> {e['status']} in {e['seconds']:.1f} s; "
              f"pool starts after: {e['pool_starts_after']}; {e.get('error')}")


if __name__ == "__main__":
    main()
