"""Repeatability check (issue 25): the same layouts measured several times, warm and cold
interleaved, with what the host and the GPU did during each trial's timed steps.

    python tools/repeatability.py [--rounds 3] [--gbs 32] [--deadline-s 480] [--fixed]
                                  [--steps 8] [--no-rotate] [--first-in-pool LAYOUT]...
                                  [--gpus 1] MODEL GPU OUT_DIR LAYOUT...
    LAYOUT = comma-separated Layout fields (tools/device_layouts.py), e.g. mbs=8,recompute=full

One GPU by default, or --gpus N on one host (the layouts then name their tp, pp, cp, dp
split). Each round is a warm pass (every layout in one warm pool, autotune.trials.pool, as a search
runs them) and a cold pass (every layout in a launch of its own, autotune.trials.runner), the
passes alternating which goes first (W C, C W, W C: never all of one kind, then the other), and the
layouts in a rotated order each pass so that none always follows the same one. Trials run as a
search runs them (adaptive timing at the default --stable-cv), or with --fixed: 2 warm-up and 8
timed steps, so that every spread is over the same number of steps.

Per trial (trials.jsonl): tokens/s, the timed steps, their spread (step_time_cv), the host's CPU
seconds against wall seconds over the timed steps (this rank's process, all threads), the
machine's steal seconds (/proc/stat), the process's threads, the garbage collector's passes and
their seconds over the timed steps (gc.callbacks; none expected: the worker holds it off;
gc_pauses_all_steps counts the warm-up's too), and from NVML the SM
clock, power, temperature, utilization (1 - utilization: the GPU's idle share, a cheap stand-in
for the gaps between kernels, which would need a profiler) and clock event reasons.

Issue 30 (warm slower than cold on 2 x H200 for pp 2 + vpp 2 and full recompute, in the
same pool position each time): --first-in-pool LAYOUT adds, each round, a "first" run of that
layout as the first trial of a freshly started pool (the warm path, no earlier trial in the
process), and --no-rotate keeps the warm pass in the order given, so that a layout always
follows the same ones. warm < first = cold: what earlier trials leave behind; first = warm < cold:
the warm path itself. Each row also keeps every rank's host figures (autotune.worker.host: the
main thread's CPU seconds and context switches, the other threads that used CPU, by name; the
step's host split into schedule, optimizer and GPU wait) and every rank's process as the trial
started (autotune.worker.run.process_state: trials before it, environment, affinity, groups,
objects, threads), and report.md has a table of them per layout and kind.

report.md: per layout, the warm and the cold mean with the spread between runs, warm / cold,
whether they agree within the runs' own spread, and the host's figures. Trials stop being
started once --deadline-s is spent (the report says which did not run), so a call on the device
ends with its files written.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

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
from autotune.trials.protocol import RESULT_NAME, te_available
from autotune.trials.runner import run_trial
from autotune.trials.trial import DEFAULT_STABLE_CV, TrialSpec

FIXED_WARMUP, FIXED_STEPS = 2, 8


KINDS = ("warm", "cold", "first")


def _result(trial_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((trial_dir / RESULT_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _host(data: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's host figures from a result.json's data (autotune.worker.host), {} when absent."""
    hosts = data.get("host") or []
    return {**(hosts[0] or {}), "step_times_s": data.get("step_times_s")} if hosts else {}


def plan(n_layouts: int, rounds: int, *, rotate: bool = True,
         first: tuple[int, ...] = ()) -> list[tuple[int, str, list[int]]]:
    """The passes in the order they run: (round, kind, layout indices). Warm and cold alternate
    which goes first; each pass's layouts are rotated unless `rotate` is off; a "first" pass
    (the `first` layouts, each as the first trial of a fresh pool) ends every round."""
    out: list[tuple[int, str, list[int]]] = []
    order = list(range(n_layouts))
    for round_ in range(rounds):
        kinds = ("warm", "cold") if round_ % 2 == 0 else ("cold", "warm")
        for kind in kinds:
            shift = (2 * round_ + kinds.index(kind)) % n_layouts if rotate else 0
            out.append((round_, kind, order[shift:] + order[:shift]))
        if first:
            out.append((round_, "first", list(first)))
    return out


def trial_row(kind: str, round_: int, s: Layout, trial_dir: Path, wall_s: float,
         metrics: Any) -> dict[str, Any]:
    clocks = metrics.clocks
    data = _result(trial_dir)
    host = _host(data)
    process = data.get("process") or []
    return {
        "kind": kind, "round": round_, "layout": s.describe(), "status": metrics.status.value,
        "tokens_per_s": metrics.tokens_per_s, "step_time_s": metrics.step_time_s,
        "step_time_cv": metrics.step_time_cv, "timed_steps": metrics.timed_steps,
        "stop_reason": metrics.stop_reason.value if metrics.stop_reason else None,
        "wall_s": wall_s, "cpu_s": host.get("cpu_s"), "host_wall_s": host.get("wall_s"),
        "steal_s": host.get("steal_s"), "threads": host.get("threads"),
        "gc_pauses": host.get("gc_pauses"), "gc_pause_s": host.get("gc_pause_s"),
        "gc_pauses_all_steps": host.get("gc_pauses_all_steps"),
        "step_times_s": host.get("step_times_s"),
        "sm_mhz": clocks.sm_mhz.median if clocks and clocks.sm_mhz else None,
        "sm_mhz_min": clocks.sm_mhz.min if clocks and clocks.sm_mhz else None,
        "power_w": clocks.power_w.median if clocks and clocks.power_w else None,
        "temperature_c": clocks.temperature_c.max if clocks and clocks.temperature_c else None,
        "gpu_idle": 1 - clocks.utilization.median if clocks and clocks.utilization else None,
        "reasons": list(clocks.reasons) if clocks else None,
        "throttled": metrics.throttled,
        "error": (metrics.error or "").splitlines()[:1],
        # Every rank's figures (a pipeline's slow stage need not be rank 0).
        "trials_before": (process[0] or {}).get("trials_before") if process else None,
        "after": (process[0] or {}).get("after") if process else None,
        "rank_host": [{k: v for k, v in (h or {}).items() if k != "thread_names"}
                      for h in data.get("host") or []],
        "rank_process": process,
        "thread_names": [(h or {}).get("thread_names") for h in data.get("host") or []],
    }


def trial_spec(model: ModelSpec, s: Layout, cluster: ClusterSpec, fixed: bool,
               steps: int = FIXED_STEPS) -> TrialSpec:
    spec = TrialSpec(model=model, layout=s, gpu_peak_bf16_flops=cluster.gpu.peak_bf16_flops,
                     gpu_name=cluster.gpu.name, stable_cv=0.0 if fixed else DEFAULT_STABLE_CV)
    return replace(spec, train_steps=steps, warmup_steps=FIXED_WARMUP) if fixed else spec


def _mean_spread(values: list[float]) -> tuple[float | None, float | None]:
    """Mean, and the runs' relative standard deviation (None with one run)."""
    if not values:
        return None, None
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / mean if len(values) > 1 and mean else None)


def report(rows: list[dict[str, Any]], layouts: list[str], notes: list[str]) -> str:
    def f(v: object, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = ["# Repeatability", "", *notes, "",
             "| layout | warm tokens/s | runs spread | cold tokens/s | runs spread | warm/cold |"
             " agree | worst step cv | cpu/wall | steal s | gc passes | threads | gpu idle |"
             " sm MHz min | throttled |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label in layouts:
        mine = [r for r in rows if r["layout"] == label and r["tokens_per_s"]]
        warm = [r["tokens_per_s"] for r in mine if r["kind"] == "warm"]
        cold = [r["tokens_per_s"] for r in mine if r["kind"] == "cold"]
        wm, ws = _mean_spread(warm)
        cm, cs = _mean_spread(cold)
        ratio = wm / cm if wm and cm else None
        agree = None
        if wm and cm and ws is not None and cs is not None:
            # Within twice the standard error of the difference of the two means.
            se = math.hypot(ws / math.sqrt(len(warm)), cs / math.sqrt(len(cold)))
            agree = "yes" if abs(ratio - 1) <= 2 * se else "NO" if ratio else None
        cpu = [r["cpu_s"] / r["host_wall_s"] for r in mine if r["cpu_s"] and r["host_wall_s"]]
        lines.append(
            f"| {label} | {f(wm, ',.0f')} ({len(warm)}) | {f(ws, '.1%')} | {f(cm, ',.0f')} "
            f"({len(cold)}) | {f(cs, '.1%')} | {f(ratio, '.3f')} | {agree or '-'} | "
            f"{f(max((r['step_time_cv'] or 0 for r in mine), default=None), '.1%')} | "
            f"{f(statistics.fmean(cpu) if cpu else None, '.2f')} | "
            f"{f(max((r['steal_s'] or 0 for r in mine), default=None), '.2f')} | "
            f"{sum(r['gc_pauses'] or 0 for r in mine)} | "
            f"{f(max((r['threads'] or 0 for r in mine), default=None), 'd')} | "
            f"{f(max((r['gpu_idle'] or 0 for r in mine), default=None), '.0%')} | "
            f"{f(min((r['sm_mhz_min'] for r in mine if r['sm_mhz_min']), default=None), '.0f')}"
            f" | {sum(1 for r in mine if r['throttled'])} |")
    lines += ["", *host_table(rows, layouts)]
    failed = [r for r in rows if not r["tokens_per_s"]]
    if failed:
        lines += ["", "Failed trials:"] + [f"- {r['kind']} round {r['round']} {r['layout']}: "
                                           f"{r['status']} {r['error']}" for r in failed]
    return "\n".join(lines) + "\n"


def host_table(rows: list[dict[str, Any]], layouts: list[str]) -> list[str]:
    """Per layout and kind, means over its runs, each rank apart (r0/r1/...): tokens/s, the main
    thread's CPU seconds per timed step, the host's split of a step (schedule, optimizer, GPU
    wait: medians), involuntary context switches of the main thread per step, the other
    threads' CPU seconds per step, and where the warm runs sat in their pool."""
    def per_rank(mine: list[dict[str, Any]], key: str, per_step: bool, fmt: str) -> str:
        ranks = max((len(r["rank_host"]) for r in mine), default=0)
        out = []
        for i in range(ranks):
            vals = []
            for r in mine:
                h = r["rank_host"][i] if i < len(r["rank_host"]) else {}
                v = h.get(key)
                if v is None:
                    continue
                n = len(r["step_times_s"] or []) if per_step else 1
                if n:
                    vals.append(v / n)
            out.append(format(statistics.fmean(vals), fmt) if vals else "-")
        return " / ".join(out) or "-"

    lines = ["Host per timed step, each rank (r0 / r1 / ...), means over the runs:", "",
             "| layout | kind | runs | tokens/s | main CPU s | schedule s | optimizer s |"
             " GPU wait s | invol. switches | other threads CPU s | trials before (after) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label in layouts:
        for kind in KINDS:
            mine = [r for r in rows if r["layout"] == label and r["kind"] == kind
                    and r["tokens_per_s"] and r.get("rank_host")]
            if not mine:
                continue
            where = "; ".join(f"{r['trials_before']} ({', '.join(r['after'] or []) or '-'})"
                              for r in mine if r.get("trials_before") is not None)
            tokens = statistics.fmean(r["tokens_per_s"] for r in mine)
            lines.append(
                f"| {label} | {kind} | {len(mine)} | {tokens:,.0f} | "
                f"{per_rank(mine, 'main_cpu_s', True, '.3f')} | "
                f"{per_rank(mine, 'schedule_s', False, '.3f')} | "
                f"{per_rank(mine, 'optimizer_s', False, '.3f')} | "
                f"{per_rank(mine, 'gpu_wait_s', False, '.3f')} | "
                f"{per_rank(mine, 'main_ctx_involuntary', True, '.1f')} | "
                f"{per_rank(mine, 'other_threads_cpu_s', True, '.3f')} | {where or '-'} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gbs", type=int, default=None, help="Global batch (default: model's).")
    parser.add_argument("--deadline-s", type=float, default=480.0)
    parser.add_argument("--fixed", action="store_true",
                        help=f"{FIXED_WARMUP} warm-up and {FIXED_STEPS} timed steps per trial")
    parser.add_argument("--steps", type=int, default=FIXED_STEPS,
                        help="timed steps per trial with --fixed")
    parser.add_argument("--no-rotate", action="store_true",
                        help="run every pass in the order the layouts are given")
    parser.add_argument("--first-in-pool", action="append", default=[], metavar="LAYOUT",
                        help="each round, also run LAYOUT (one of the LAYOUTs) as the first "
                             "trial of a fresh pool (repeatable)")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs of the one host the trials use")
    parser.add_argument("model")
    parser.add_argument("gpu")
    parser.add_argument("out_dir")
    parser.add_argument("layouts", nargs="+", metavar="LAYOUT")
    args = parser.parse_args()
    start = time.monotonic()
    model = load_model(args.model)
    cluster = ClusterSpec.make(args.gpus, gpu=args.gpu)
    out = Path(args.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    notes = [f"{args.model} on {args.gpus} x {args.gpu}, {args.rounds} rounds, "
             + (f"fixed steps ({FIXED_WARMUP} warm-up, {args.steps} timed)" if args.fixed
                else "adaptive timing (--stable-cv default)")
             + ("" if not args.no_rotate else ", passes in the order given")]
    texts = list(args.layouts)
    if not te_available():
        dropped = [t for t in texts if "impl=te" in t]
        texts = [t for t in texts if "impl=te" not in t]
        if dropped:
            notes.append(f"Transformer Engine is not installed: sdpa only ({len(dropped)} te "
                         f"layouts left out: {' '.join(dropped)})")
    gbs = {"gbs": args.gbs} if args.gbs else {}
    def parse(text: str) -> Layout:
        return layout_from_fields(model, cluster, {**gbs, **layout_fields(text)})

    layouts = [parse(t) for t in texts]
    firsts = [parse(t) for t in args.first_in_pool if "impl=te" not in t or te_available()]
    unknown = [f.describe() for f in firsts if f not in layouts]
    if unknown:
        parser.error(f"--first-in-pool names a layout not among the LAYOUTs: {unknown}")
    if firsts:
        notes.append("first = the layout as the first trial of a freshly started pool: "
                     + ", ".join(f.describe() for f in firsts))
    notes.append("GPU idle = 1 - NVML utilization (median of 100 ms samples): gaps between "
                 "kernels themselves need a profiler, not taken here.")
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    log = (out / "trials.jsonl").open("w")
    pool = WarmPool(out / "pool", args.gpus)
    passes = plan(len(layouts), args.rounds, rotate=not args.no_rotate,
                  first=tuple(layouts.index(f) for f in firsts))
    try:
        for round_, kind, order in passes:
            for i in order:
                s = layouts[i]
                if time.monotonic() - start > args.deadline_s:
                    skipped.append(f"{kind} round {round_ + 1} {s.describe()}")
                    continue
                spec = trial_spec(model, s, cluster, args.fixed, args.steps)
                timeout = trial_timeout_s(estimate_cost(model, s, cluster).step_time_s, spec)
                trial_dir = out / f"r{round_ + 1}-{kind}-{s.describe().replace(' ', '_')}"
                t0 = time.monotonic()
                if kind == "cold":
                    run = run_trial(spec, trial_dir, timeout_s=timeout)
                elif kind == "warm":
                    run = pool.run(spec, trial_dir, timeout)
                else:  # a pool of its own, started for this one trial
                    with WarmPool(out / "pool-first", args.gpus) as fresh:
                        run = fresh.run(spec, trial_dir, timeout)
                row = trial_row(kind, round_ + 1, s, trial_dir, time.monotonic() - t0,
                                metrics_from_run(run))
                rows.append(row)
                log.write(json.dumps(row) + "\n")
                log.flush()
                print(json.dumps({k: row[k] for k in ("kind", "round", "layout",
                                                      "tokens_per_s", "step_time_cv",
                                                      "trials_before")}), flush=True)
            if kind == "warm":
                pool.close()  # the other passes run with no pool holding the GPU
    finally:
        pool.close()
        log.close()
    if skipped:
        notes.append(f"Not run, past --deadline-s {args.deadline_s:g}: " + "; ".join(skipped))
    text = report(rows, [s.describe() for s in layouts], notes)
    (out / "report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
