"""Issue 28 item 2: the caching allocator's reserve against the memory model (CPU only).

    PYTHONPATH=. python results/benchmarks/2026-11-27-cpu-memory-reserve/reserve.py [PART...]

PART is any of `lanes`, `trials`, `terms`, `families`, `cv`, `oracle` (default: all). It reads
tests/data/measured_trials.json and the H200 lanes' trial results
(results/benchmarks/2026-11-27-h200x4-lanes/lanes-trials.tgz, the only stored trials with
torch's max_memory_reserved), and prints:
- lanes: per trial, reserved - allocated (the allocator's reserve, exact) and NVML - reserved
  (what lies outside torch's allocator: the CUDA context, NCCL);
- trials: per single-GPU OK trial of measured_trials.json, the reserve estimated as NVML - peak
  allocated - the context measured in `lanes` (2.91 GiB on an H100, 3.04 on an H200), against
  the fp32 logits block;
- terms: candidate reserve terms added to the shipped model (nothing refitted), per GPU: the
  band (worst under-prediction), the worst over-prediction, the median |error| and how many
  trials' |error| grows by more than one point;
- families: the same per family (shipped constants) for the least-squares candidates;
- cv: leave-one-family-out cross-validation of the memory model, as tools/fit_constants.py
  runs it (context, NCCL and fragmentation refitted per fold), without and with a block term;
- oracle: the band if the reserve were known exactly (measured), the model's allocated bytes
  kept: how much of the band the reserve is at all.
"""

from __future__ import annotations

import io
import json
import math
import statistics
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from autotune.dimensions import Recompute
from autotune.layouts.layout import Layout
from autotune.predict.calibration import _fit, load_trials, trial_model_ref
from autotune.predict.memory import GIB, MemoryEstimate, MemoryParams, estimate_memory
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.presets import load_model

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data" / "measured_trials.json"
LANES = ROOT / "results" / "benchmarks" / "2026-11-27-h200x4-lanes" / "lanes-trials.tgz"
CONTEXT_GIB = {"h100-80gb": 2.91, "h200": 3.04}
"""NVML - max reserved on one GPU (no NCCL): 2.91 GiB on an H100 (gpt2-xl mbs 16 te, 76.78
used against 73.87 reserved, 2026-11-23-h100-te-build-and-runs.md; 2026-11-25-h100-fp8.md's
two precision-aware rows agree to 0.01), 3.04 on an H200 (every one-GPU lane below)."""
DEFAULT = MemoryParams()

Term = Callable[[Layout, MemoryEstimate], list[float]]
"""Bytes a candidate adds to each reported stage (the peak is re-taken over the stages)."""


@dataclass(frozen=True, slots=True)
class Row:
    source: str
    family: str
    gpu: str
    gpus: int
    layout: Layout
    estimate: MemoryEstimate
    used: float
    allocated: float | None


def _rows() -> list[Row]:
    data = json.loads(DATA.read_text())
    rows = []
    for t in data["trials"]:
        if t["status"] != "OK":
            continue
        s = Layout(**t["strategy"])
        model = load_model(trial_model_ref(t["model"], DATA)).with_overrides(
            global_batch_size=s.gbs, seq_length=t.get("seq_length"))
        c = ClusterSpec(num_gpus=t["gpus"], gpus_per_node=t["gpus"], gpu=gpu_spec(t["gpu"]))
        rows.append(Row(source=t["source"], family=t.get("family", t["model"]), gpu=t["gpu"],
                        gpus=t["gpus"], layout=s, estimate=estimate_memory(model, s, c),
                        used=float(t["device_used_bytes"]),
                        allocated=t.get("peak_allocated_bytes")))
    return rows


def _block(s: Layout, e: MemoryEstimate) -> list[float]:
    """The fp32 logits block per stage (0 off the last stage)."""
    return [st.largest_block_bytes for st in e.stages]


def _no_full(s: Layout) -> float:
    """The block margin's rule (memory.BLOCK_MARGIN): no logits block under full recompute."""
    return 0.0 if s.recompute == Recompute.FULL else 1.0


def _peak(e: MemoryEstimate, term: Term, s: Layout) -> float:
    return max(st.total_bytes + add for st, add in zip(e.stages, term(s, e), strict=True))


def lanes() -> None:
    print("## lanes: torch's reserve where max_memory_reserved was recorded (H200)")
    print("| lane/trial | model | seq | layout | allocated | reserved - allocated | "
          "NVML - reserved | fp32 logits block |")
    print("|---|---|---|---|---|---|---|---|")
    from autotune.trials.trial import TrialSpec

    with tarfile.open(LANES) as tar:
        names = sorted(n for n in tar.getnames() if n.endswith("/result.json"))
        for name in names:
            trial = name[: -len("result.json")] + "trial.json"
            result = json.load(io.BytesIO(tar.extractfile(name).read()))  # type: ignore[union-attr]
            if result["status"] != "OK" or trial not in tar.getnames():
                continue
            spec = TrialSpec.from_json(tar.extractfile(trial).read().decode())  # type: ignore[union-attr]
            s, m = spec.layout, spec.model
            g = s.tp * s.pp * s.dp * s.cp
            e = estimate_memory(m, s, ClusterSpec(num_gpus=g, gpus_per_node=g,
                                                  gpu=gpu_spec(spec.gpu_name or "h200")))
            alloc, rsv = result["peak_allocated_bytes"], result["peak_reserved_bytes"]
            used = result["device_used_bytes"] or 0
            print(f"| {name.split('/r/')[1].removesuffix('/result.json')} | {m.name} | "
                  f"{m.seq_length} | {s.describe()} | {alloc / GIB:.2f} | "
                  f"{(rsv - alloc) / GIB:.2f} | {(used - rsv) / GIB:.2f} | "
                  f"{e.stages[-1].largest_block_bytes / GIB:.2f} |")


def trials(rows: list[Row]) -> None:
    print("## trials: single-GPU OK trials, reserve = NVML - peak allocated - context")
    print("| source | model/GPU | layout | reserve GiB | fp32 block GiB | reserve / block | "
          "under-prediction |")
    print("|---|---|---|---|---|---|---|")
    seen = set()
    for r in sorted(rows, key=lambda r: (r.family, r.gpu, r.source)):
        if r.gpus != 1 or not r.allocated:
            continue
        key = (r.family, r.gpu, r.layout)
        if key in seen:  # the same layout measured twice: one row
            continue
        seen.add(key)
        reserve = (r.used - r.allocated) / GIB - CONTEXT_GIB[r.gpu]
        block = r.estimate.stages[-1].largest_block_bytes / GIB
        print(f"| {r.source} | {r.family}/{r.gpu} | {r.layout.describe()} | "
              f"{reserve:.2f} | {block:.2f} | {reserve / block:.2f} | "
              f"{1 - r.estimate.peak_bytes / r.used:.1%} |")


def _least_squares(rows: list[Row], shape: Callable[[Layout], float]) -> float:
    """The block coefficient k minimizing calibration's log-ratio residuals, the shipped
    constants kept (autotune.predict.calibration's objective, one unknown)."""
    from scipy.optimize import minimize_scalar

    def loss(k: float) -> float:
        return sum(math.log(_peak(r.estimate, lambda s, e: [k * shape(s) * b
                                                           for b in _block(s, e)],
                                  r.layout) / r.used) ** 2 for r in rows)

    return float(minimize_scalar(loss, bounds=(0.0, 2.0), method="bounded").x)


def _candidates(rows: list[Row]) -> dict[str, Term]:
    k_all = _least_squares(rows, lambda s: 1.0)
    k_no_full = _least_squares(rows, _no_full)
    terms: dict[str, Term] = {"shipped (no term)": lambda s, e: [0.0] * len(e.stages)}
    for k in (0.25, 0.5, 1.0):
        terms[f"{k:g} x block"] = lambda s, e, k=k: [k * b for b in _block(s, e)]
        terms[f"{k:g} x block, none under full recompute"] = (
            lambda s, e, k=k: [k * _no_full(s) * b for b in _block(s, e)])
    terms[f"least squares: {k_all:.2f} x block"] = (
        lambda s, e: [k_all * b for b in _block(s, e)])
    terms[f"least squares: {k_no_full:.2f} x block, none under full recompute"] = (
        lambda s, e: [k_no_full * _no_full(s) * b for b in _block(s, e)])
    return terms


def terms(rows: list[Row]) -> None:
    print("## terms: candidates added to the shipped model (nothing refitted)")
    print("| term | H100 band | H100 worst over | H100 median abs | H200 band | "
          "H200 worst over | H200 median abs | trials 1 point worse | OK trials not fitting |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, term in _candidates(rows).items():
        by_gpu: dict[str, list[float]] = {}
        worse = not_fitting = 0
        for r in rows:
            before = r.estimate.peak_bytes / r.used - 1
            after = _peak(r.estimate, term, r.layout) / r.used - 1
            worse += abs(after) > abs(before) + 0.01
            by_gpu.setdefault(r.gpu, []).append(after)
            # MemoryEstimate.fits with the term in the peak: the peak within the capacity and
            # the peak plus the block margin within the usable memory (the gate runs a layout
            # that only the margin rules out as a risk, after the safe ones).
            e = r.estimate
            required = max(st.total_bytes + add + st.block_margin_bytes
                           for st, add in zip(e.stages, term(r.layout, e), strict=True))
            not_fitting += not (_peak(e, term, r.layout) <= e.capacity_bytes
                                and required <= e.limit_bytes)
        cells = []
        for gpu in ("h100-80gb", "h200"):
            errs = by_gpu[gpu]
            cells += [f"{-min(errs):.1%}", f"{max(errs):+.1%}",
                      f"{statistics.median(abs(x) for x in errs):.1%}"]
        print(f"| {name} | " + " | ".join(cells) + f" | {worse} | {not_fitting} |")


def families(rows: list[Row]) -> None:
    print("## families: shipped constants, |error| median / worst (worst under-prediction)")
    chosen = {n: t for n, t in _candidates(rows).items()
              if n.startswith(("shipped", "least squares"))}
    print("| family | trials | " + " | ".join(chosen) + " |")
    print("|---|---|" + "---|" * len(chosen))
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(f"{r.family}/{r.gpu}", []).append(r)
    for fam, group in sorted(groups.items()):
        cells = []
        for term in chosen.values():
            errs = [_peak(r.estimate, term, r.layout) / r.used - 1 for r in group]
            cells.append(f"{statistics.median(abs(x) for x in errs):.1%} / "
                         f"{max(abs(x) for x in errs):.1%} ({-min(errs):.1%})")
        print(f"| {fam} | {len(group)} | " + " | ".join(cells) + " |")


@dataclass(frozen=True)
class _Fitted:
    """MemoryParams' fitted fields and the block coefficient, for calibration._fit."""

    cuda_context_bytes: float = DEFAULT.cuda_context_bytes
    nccl_bytes_per_group: float = DEFAULT.nccl_bytes_per_group
    fragmentation: float = DEFAULT.fragmentation
    block: float = 0.1


def cv() -> None:
    print("## cv: leave one family out (context, NCCL, fragmentation refitted per fold)")
    data = load_trials(DATA)
    variants: dict[str, Callable[[Layout], float] | None] = {
        "no term": None, "k x block": lambda s: 1.0,
        "k x block, none under full recompute": _no_full}
    results: dict[str, dict[str, tuple[float, float]]] = {}
    for name, shape in variants.items():
        names = [f.name for f in fields(_Fitted)][: 3 if shape is None else 4]

        def predict(p: Any, m: Any, s: Layout, c: ClusterSpec,
                    shape: Callable[[Layout], float] | None = shape) -> float:
            mp = MemoryParams(cuda_context_bytes=p.cuda_context_bytes,
                              nccl_bytes_per_group=p.nccl_bytes_per_group,
                              fragmentation=p.fragmentation)
            e = estimate_memory(m, s, c, mp)
            if shape is None:
                return e.peak_bytes
            return _peak(e, lambda s, e: [p.block * shape(s) * b for b in _block(s, e)], s)

        out = {}
        for family in sorted({t[0] for t in data}):
            fitted = _fit(_Fitted(), names, [(m, s, c, u) for f, m, s, c, _, u in data
                                             if f != family], predict)
            errs = [abs(predict(fitted, m, s, c) / u - 1) for f, m, s, c, _, u in data
                    if f == family]
            out[family] = (statistics.median(errs), max(errs))
        everything = _fit(_Fitted(), names, [(m, s, c, u) for _, m, s, c, _, u in data],
                          predict)
        print(f"{name}: fitted to all trials: " + ", ".join(
            f"{n} {getattr(everything, n) / (GIB if 'bytes' in n else 1):.4g}"
            for n in names))
        results[name] = out
    print("| family | " + " | ".join(f"{n}: median / worst" for n in variants) + " |")
    print("|---|" + "---|" * len(variants))
    for family in sorted(next(iter(results.values()))):
        print(f"| {family} | " + " | ".join(
            f"{results[n][family][0]:.1%} / {results[n][family][1]:.1%}" for n in variants)
              + " |")


def oracle(rows: list[Row]) -> None:
    print("## oracle: single-GPU trials, the measured reserve in place of the fragmentation")
    # The two FP8 precision-aware trials of 2026-11-25 recorded no allocated peak in
    # measured_trials.json; their report gives both figures (2026-11-25-h100-fp8.md).
    reported = {"s8-fp8-l3b/mbs2-pao-delayed": (65.95, 73.33),
                "s8-fp8-l3b/mbs2-pao-bf16": (61.35, 67.62)}
    by_gpu: dict[str, list[tuple[float, str]]] = {}
    for r in rows:
        if r.gpus != 1:
            continue
        if r.source in reported:
            allocated, reserved = (x * GIB for x in reported[r.source])
            reserve = reserved - allocated
        elif r.allocated:
            reserve = r.used - r.allocated - CONTEXT_GIB[r.gpu] * GIB
        else:
            continue
        predicted = r.estimate.peak.allocated_bytes + CONTEXT_GIB[r.gpu] * GIB + reserve
        by_gpu.setdefault(r.gpu, []).append((1 - predicted / r.used, r.source))
    for gpu, errs in sorted(by_gpu.items()):
        print(f"{gpu}: {len(errs)} trials; worst under-prediction {max(errs)[0]:.1%} "
              f"({max(errs)[1]}), worst over {min(errs)[0]:.1%} ({min(errs)[1]})")


def main(argv: list[str]) -> None:
    parts = argv or ["lanes", "trials", "terms", "families", "cv", "oracle"]
    rows = _rows()
    for part in parts:
        {"lanes": lambda: lanes(), "trials": lambda: trials(rows),
         "terms": lambda: terms(rows), "families": lambda: families(rows), "cv": cv,
         "oracle": lambda: oracle(rows)}[part]()
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
