"""NVIDIA's published Megatron layouts on DGX-H100, against autotune's plan (`--backend simulate`).

    PYTHONPATH=. python tools/published_recipes.py [--out FILE.json] [--no-search] [ROW ...]

Each row is one published table line (its source below, cited, never copied code): the model,
GPUs, precision, sequence, global and micro batch, TP/PP/CP/VPP/EP and the measured tokens/s per
GPU. Per row the tool (1) pins the layout in `autotune estimate` (does autotune accept it, what
does it predict: tokens/s per GPU and peak memory), and (2) lets `autotune MODEL --backend
simulate --sampler ranked` search the same GPU count, global batch and sequence freely (what it
picks, predicted). It prints a markdown table and, with --out, writes every figure as JSON.

What the pinned layout cannot say, the row's `unmodeled` field does: levers NVIDIA's runs use
that autotune has no lever for (Megatron FSDP, bf16 gradient reduce, TP communication overlap
with userbuffers, a hand-written pipeline layout). Those are named in the report, not patched in.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = str(ROOT / "search_spaces" / "clusters" / "dgx-h100.yaml")
BRIDGE = "github.com/NVIDIA-NeMo/Megatron-Bridge@067f987d"
BRIDGE_ARCHIVE = f"{BRIDGE}:docs/performance-summary-archive.md"
BRIDGE_H100 = f"{BRIDGE}:src/megatron/bridge/perf_recipes/llama/h100"
NEMO_2407 = "github.com/NVIDIA/NeMo@070a0bb1:docs/source/performance/performance_summary.md"


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One published DGX-H100 pre-training result and its layout."""

    name: str
    """Short id for the command line."""
    model: str
    """An autotune preset or a config.json under tests/data/hf/."""
    gpus: int
    precision: str
    """As published: bf16, fp8 (NeMo 24.07: delayed scaling) or fp8-cs (current scaling)."""
    seq: int
    gbs: int
    mbs: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    vpp: int = 1
    ep: int = 1
    recompute: tuple[str, str, int] | None = None
    """(granularity, method, layers) where the recipe recomputes."""
    embedding_loss_split: bool = False
    published_tokens_per_gpu: float
    source: str
    unmodeled: str = ""
    """What the published run uses that autotune does not model."""
    bf16_grads: bool = False
    """Gradients reduced in bf16 (`--grad-reduce-bf16`): every Megatron-Bridge perf recipe
    (perf_recipes/_common.py, grad_reduce_in_fp32 = False)."""

    @property
    def fp8_recipe(self) -> str | None:
        return {"bf16": None, "fp8": "delayed", "fp8-cs": "tensorwise"}[self.precision]


_TP_OVERLAP = "TP comm overlap (userbuffers)"

ROWS: tuple[Row, ...] = (
    Row(name="llama3-8b-8-fp8cs", model="llama3-8b", gpus=8, precision="fp8-cs", seq=8192,
        gbs=128, mbs=1, recompute=("full", "block", 5), published_tokens_per_gpu=14451,
        source=f"{BRIDGE_ARCHIVE} (25.11, DGX-H100); recipe {BRIDGE_H100}/llama3.py "
               "llama3_8b_pretrain_8gpu_h100_fp8cs_config",
        unmodeled="Megatron FSDP over 8 (table: FSDP 8)", bf16_grads=True),
    Row(name="llama3-8b-8-fp8-cp2", model="llama3-8b", gpus=8, precision="fp8", seq=8192,
        gbs=128, mbs=1, cp=2, published_tokens_per_gpu=12036, source=f"{NEMO_2407} (24.07)"),
    Row(name="llama3-70b-64-fp8cs", model="llama3-70b", gpus=64, precision="fp8-cs",
        seq=8192, gbs=256, mbs=1, tp=4, pp=8, vpp=5, published_tokens_per_gpu=1633,
        source=f"{BRIDGE_ARCHIVE} (26.04); recipe {BRIDGE_H100}/llama3.py "
               "llama3_70b_pretrain_64gpu_h100_fp8cs_config",
        unmodeled=f"{_TP_OVERLAP}, pipeline layout "
                  "'Et*2|(t*2|)*34,t*3|(t*2|)*3,tL' (pinned here as the even split)",
        bf16_grads=True),
    Row(name="llama3-70b-64-fp8-cp2", model="llama3-70b", gpus=64, precision="fp8", seq=8192,
        gbs=128, mbs=1, tp=4, pp=4, cp=2, vpp=5, published_tokens_per_gpu=1533,
        source=f"{NEMO_2407} (24.07)", unmodeled=_TP_OVERLAP),
    Row(name="llama31-405b-1024-fp8cs", model="tests/data/hf/llama-3.1-405b.json", gpus=1024,
        precision="fp8-cs", seq=8192, gbs=1536, mbs=1, tp=8, pp=8, cp=2, vpp=8,
        embedding_loss_split=True, published_tokens_per_gpu=326,
        source=f"{BRIDGE_ARCHIVE} (26.06); recipe {BRIDGE_H100}/llama31.py "
               "llama31_405b_pretrain_1024gpu_h100_fp8cs_config (126 layers: the embedding "
               "and loss counted in the split, recipes/llama/llama3.py)",
        unmodeled=_TP_OVERLAP, bf16_grads=True),
    Row(name="gpt3-175b-512-fp8", model="gpt3-175b", gpus=512, precision="fp8", seq=2048,
        gbs=2048, mbs=2, tp=4, pp=8, vpp=6, published_tokens_per_gpu=782,
        source=f"{NEMO_2407} (24.07)", unmodeled=_TP_OVERLAP),
    Row(name="gpt3-175b-128-fp8", model="gpt3-175b", gpus=128, precision="fp8", seq=2048,
        gbs=256, mbs=1, tp=4, pp=8, vpp=6, published_tokens_per_gpu=726,
        source=f"{NEMO_2407} (24.07)", unmodeled=_TP_OVERLAP),
    Row(name="llama2-13b-16-fp8", model="llama2-13b", gpus=16, precision="fp8", seq=4096,
        gbs=128, mbs=1, pp=4, vpp=10, published_tokens_per_gpu=8646,
        source=f"{NEMO_2407} (24.07)"),
    Row(name="qwen3-30b-a3b-16-fp8cs", model="tests/data/hf/qwen3-30b-a3b.json", gpus=16,
        precision="fp8-cs", seq=4096, gbs=1024, mbs=1, ep=16, published_tokens_per_gpu=8960,
        source=f"{BRIDGE_ARCHIVE} (26.04.01)", unmodeled="token-dropless, force-balanced",
        bf16_grads=True),
)


def _model_args(row: Row) -> list[str]:
    model = str(ROOT / row.model) if row.model.startswith("tests/") else row.model
    return [model, "--gpus", str(row.gpus), "--gbs", str(row.gbs), "--seq-len", str(row.seq),
            "--gpu", CLUSTER]


def pinned_args(row: Row) -> list[str]:
    """`autotune estimate` of the published layout, with the options NVIDIA's recipes set:
    Transformer Engine, the distributed optimizer with both overlaps, sequence parallelism
    with tp > 1, the row's FP8 recipe, bf16 gradient reduction where the recipe has it."""
    args = ["estimate", *_model_args(row), "--tp", str(row.tp), "--pp", str(row.pp),
            "--cp", str(row.cp), "--vpp", str(row.vpp), "--ep", str(row.ep),
            "--mbs", str(row.mbs), "--impl", "te", "--distributed-optimizer",
            "--overlap-grad-reduce", "--overlap-param-gather", "--json"]
    if row.tp > 1:
        args.append("--sp")
    if row.embedding_loss_split:
        args.append("--embedding-loss-split")
    if row.bf16_grads:
        args.append("--grad-reduce-bf16")
    if row.fp8_recipe:
        args += ["--fp8", "hybrid", "--fp8-recipe", row.fp8_recipe]
    if row.recompute:
        granularity, method, layers = row.recompute
        args += ["--recompute", granularity, "--recompute-method", method,
                 "--recompute-num-layers", str(layers)]
    return args


def search_args(row: Row) -> list[str]:
    """The free plan at the same GPUs, global batch and sequence (bf16 rows stay bf16)."""
    args = ["search", *_model_args(row), "--backend", "simulate", "--sampler", "ranked",
            "--json"]
    return args + (["--precision", "bf16"] if row.fp8_recipe is None else [])


def _autotune(args: list[str], cwd: Path) -> tuple[dict[str, Any] | None, str]:
    done = subprocess.run([sys.executable, "-m", "autotune.cli", *args], capture_output=True,
                          text=True, check=False, cwd=cwd,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    if done.returncode != 0 or not done.stdout.strip():
        return None, (errors or done.stderr.splitlines() or ["no output"])[-1]
    return json.loads(done.stdout), ""


def _layout_label(best: dict[str, Any]) -> str:
    parts = [f"tp{best['tp']} pp{best['pp']} dp{best['dp']}"]
    parts += [f"{key}{best[key]}" for key in ("cp", "ep", "vpp") if best[key] > 1]
    parts.append(f"mbs{best['mbs']}")
    if best["sequence_parallel"]:
        parts.append("sp")
    if best["recompute"] != "none":
        parts.append(f"rc={best['recompute']}")
    if best["fp8"] != "off":
        parts.append(f"fp8/{best['fp8_recipe']}" + (" pg" if best["fp8_param_gather"] else ""))
    return " ".join(parts)


def evaluate(row: Row, search: bool) -> dict[str, Any]:
    """The row's pinned prediction and, with `search`, the free plan's best."""
    out: dict[str, Any] = {"row": asdict(row), "pinned_args": pinned_args(row)}
    with tempfile.TemporaryDirectory() as tmp:
        pinned, error = _autotune(pinned_args(row), Path(tmp))
        out["pinned"] = None if pinned is None else {
            "tokens_per_gpu": pinned["tokens_per_s"] / row.gpus,
            "peak_memory_gib": pinned["peak_memory_gib"], "fits": pinned["fits"],
            "step_time_s": pinned["step_time_s"], "time_breakdown_s": pinned["time_breakdown_s"],
            "label": pinned["label"]}
        out["pinned_error"] = error
        if search and pinned is not None:
            out["search_args"] = search_args(row)
            plan, error = _autotune(search_args(row), Path(tmp))
            best = (plan or {}).get("best") or []
            out["search"] = None if not best else {
                "tokens_per_gpu": best[0]["tokens_per_s"] / row.gpus,
                "peak_memory_gib": best[0]["peak_memory_gib"], "label": _layout_label(best[0]),
                "valid_layouts": plan["valid_layouts"] if plan else None}
            out["search_error"] = error
    return out


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| row | published tok/s/GPU | pinned: predicted (ratio) | pinned peak GiB | "
             "searched best (predicted tok/s/GPU, vs pinned) |",
             "|---|---:|---|---:|---|"]
    for r in results:
        row, pinned, best = r["row"], r.get("pinned"), r.get("search")
        published = row["published_tokens_per_gpu"]
        if pinned is None:
            lines.append(f"| {row['name']} | {published:,.0f} | refused: {r['pinned_error']} "
                         "| | |")
            continue
        fits = "" if pinned["fits"] else " (does not fit)"
        found = "" if best is None else (
            f"{best['label']}: {best['tokens_per_gpu']:,.0f} "
            f"({best['tokens_per_gpu'] / pinned['tokens_per_gpu'] - 1:+.0%})")
        lines.append(f"| {row['name']} | {published:,.0f} | {pinned['tokens_per_gpu']:,.0f} "
                     f"({pinned['tokens_per_gpu'] / published:.2f}) | "
                     f"{pinned['peak_memory_gib']:.1f}{fits} | {found} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="*", help="row names (default: all)")
    parser.add_argument("--out", type=Path, help="write every figure as JSON here")
    parser.add_argument("--no-search", action="store_true", help="pinned layouts only")
    ns = parser.parse_args()
    rows = [row for row in ROWS if not ns.rows or row.name in ns.rows]
    results = [evaluate(row, not ns.no_search) for row in rows]
    if ns.out:
        ns.out.write_text(json.dumps(results, indent=1) + "\n")
    print(markdown(results))


if __name__ == "__main__":
    main()
