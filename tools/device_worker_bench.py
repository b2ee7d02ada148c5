"""Helpers for tools/device_worker_bench.sh: write a trial.json, print a table of results.

    python tools/device_worker_bench.py spec OUT_DIR MODEL_YAML IMPL MBS RECOMPUTE [GBS] [STEPS]
    python tools/device_worker_bench.py table RUN_DIR...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from autotune.layouts.layout import Layout
from autotune.specs.presets import load_model
from autotune.trials.trial import TrialSpec

_GIB = 1024**3
_H100_PEAK_BF16 = 989e12


def write_spec(out_dir: str, model_yaml: str, impl: str, mbs: str, recompute: str,
               gbs: str | None = None, steps: str | None = None) -> None:
    model = load_model(model_yaml)
    # "sdpa+cef": the impl with Megatron's fused cross entropy (Layout.cross_entropy_fusion).
    impl, _, fusion = impl.partition("+")
    layout = Layout(mbs=int(mbs), gbs=int(gbs or model.global_batch_size), impl=impl,
                    recompute=recompute, cross_entropy_fusion=fusion == "cef")
    spec = TrialSpec(model=model, layout=layout, train_steps=int(steps or 5),
                     warmup_steps=2, gpu_peak_bf16_flops=_H100_PEAK_BF16)
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    spec.write(path / "trial.json")


def _row(run: Path) -> str:
    spec = json.loads((run / "trial.json").read_text())
    s, m = spec["strategy"], spec["model"]
    wall = float((run / "wall_s").read_text()) if (run / "wall_s").exists() else float("nan")
    label = f"{m['name']:<8} {s['impl']:<5} mbs{s['mbs']:<3} {s['recompute']:<9}"
    result = run / "result.json"
    if result.exists():
        r = json.loads(result.read_text())
        timed = sum(r["step_times_s"])
        phases = r.get("worker_phases_s", {})
        return (f"{label} OK    {r['tokens_per_s']:>9.0f} {r['mfu'] * 100:>6.1f}% "
                f"{r['step_time_s']:>7.3f} {r['step_time_p90_s']:>7.3f} "
                f"{r['peak_allocated_bytes'] / _GIB:>6.1f} "
                f"{r['peak_reserved_bytes'] / _GIB:>6.1f} "
                f"{(r['device_used_bytes'] or 0) / _GIB:>6.1f} {r['loss']:>6.2f} "
                f"{wall:>6.1f} {wall - timed:>6.1f} {_phases(phases)}")
    failures = sorted(run.glob("failure-rank*.json"))
    if failures:
        f = json.loads(failures[0].read_text())
        return f"{label} {f['status']:<5} wall={wall:.1f}s rc={_rc(run)} {f['error'][:90]}"
    return f"{label} NONE  wall={wall:.1f}s rc={_rc(run)} (no result, no failure file)"


def _phases(phases: dict[str, float]) -> str:
    shown = dict(phases)
    if "train_s" in shown and "timed_s" in shown:
        shown["warmup_s"] = shown.pop("train_s") - shown.pop("timed_s")
    return " ".join(f"{k.removesuffix('_s')}={v:.1f}" for k, v in shown.items())


def _rc(run: Path) -> str:
    return (run / "rc").read_text().strip() if (run / "rc").exists() else "?"


def table(runs: list[str]) -> None:
    print(f"{'model':<8} {'impl':<5} {'mbs':<6} {'recompute':<9} {'stat':<5} {'tok/s':>9} "
          f"{'MFU':>7} {'med_s':>7} {'p90_s':>7} {'alloc':>6} {'resvd':>6} {'nvml':>6} "
          f"{'loss':>6} {'wall':>6} {'wall-timed':>6}")
    for run in runs:
        print(_row(Path(run)))


if __name__ == "__main__":
    if sys.argv[1] == "spec":
        write_spec(*sys.argv[2:])
    else:
        table(sys.argv[2:])
