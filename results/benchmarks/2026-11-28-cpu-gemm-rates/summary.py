# ruff: noqa
"""The sweep's summary tables for 2026-11-28-cpu-gemm-rates.md: squares and family GEMMs, H100
against H200, bf16 against fp8, and the fitted curves' residuals. From the repository root:

    PYTHONPATH=. python results/benchmarks/2026-11-28-cpu-gemm-rates/summary.py
"""
import math
import statistics

from autotune.specs.gemm_rates import FIT_MIN_SIZE, GEMM_RATES, SWEEP_FILES, gemm_x, load_sweep

rows = {g: load_sweep(p) for g, p in SWEEP_FILES.items()}
idx = {(g, r["case"], r["dtype"]): r["tflops"] for g, rs in rows.items() for r in rs}
cases = [r["case"] for r in rows["h100-80gb"] if r["dtype"] == "bf16"]
print("| case | M x N x K | x | H100 bf16 | H200 bf16 | H100 fp8 | H200 fp8 | fp8/bf16 H100 | H200 |")
print("|---|---|---|---|---|---|---|---|---|")
for r in (r for r in rows["h100-80gb"] if r["dtype"] == "bf16" and r["kind"] == "square"):
    c = r["case"]
    v = [idx.get((g, c, d)) for d in ("bf16", "fp8") for g in ("h100-80gb", "h200")]
    print(f"| {c} | {r['m']}x{r['n']}x{r['k']} | {gemm_x(r['m'], r['n'], r['k']):.0f} | "
          + " | ".join(f"{x:.0f}" for x in v) + f" | {v[2] / v[0]:.2f} | {v[3] / v[1]:.2f} |")
print()
print("| family | tokens | H100 bf16 min-max | H200 bf16 min-max | fp8/bf16 H100 (time-weighted) | H200 |")
print("|---|---|---|---|---|---|")
fams = []
for r in rows["h100-80gb"]:
    if r["kind"] != "square" and r["dtype"] == "bf16":
        f = r["case"].split()[0]
        if f not in fams:
            fams.append(f)
for f in fams:
    for m in (4096, 16384):
        out = [f, str(m)]
        ratios = []
        for g in ("h100-80gb", "h200"):
            sel = [r for r in rows[g] if r["kind"] != "square" and r["m"] == m
                   and (r["case"].startswith(f + " ") or f in " ".join(r.get("also", [])))]
            b = [r for r in sel if r["dtype"] == "bf16"]
            e = {(r["m"], r["n"], r["k"]): r["tflops"] for r in sel if r["dtype"] == "fp8"}
            tf = [r["tflops"] for r in b]
            out.append(f"{min(tf):.0f}-{max(tf):.0f}")
            fl = [r["m"] * r["n"] * r["k"] for r in b]
            tb = sum(x / r["tflops"] for x, r in zip(fl, b))
            t8 = sum(x / e[(r["m"], r["n"], r["k"])] for x, r in zip(fl, b))
            ratios.append(f"{tb / t8:.2f}")
        print("| " + " | ".join(out + ratios) + " |")
print()
print("| GPU | dtype | rate_max TFLOP/s | x_half | cases fitted | log-rms residual | worst |")
print("|---|---|---|---|---|---|---|")
for g, by in GEMM_RATES.items():
    for d, c in by.items():
        res = [math.log(c.rate(gemm_x(r["m"], r["n"], r["k"])) / (r["tflops"] * 1e12))
               for r in rows[g] if r["dtype"] == d and gemm_x(r["m"], r["n"], r["k"]) >= FIT_MIN_SIZE]
        worst = max(res, key=abs)
        print(f"| {g} | {d} | {c.rate_max / 1e12:.0f} | {c.x_half:.0f} | {len(res)} | "
              f"{math.sqrt(statistics.mean(x * x for x in res)):.1%} | {worst:+.1%} |")
print()
# The old form's rate for the same four GEMMs: one efficiency, 0.7328 (tools/fit_constants.py's
# gemm_efficiency_max fitted to all trials before this change) x x / (x + 256) x 989 TFLOP/s,
# x = min(tokens, hidden) at tp 1 (the sweep's model_x).
print("| family | tokens | H100 measured (4 GEMMs, time-weighted) | new curve | old fitted form | old / measured |")
print("|---|---|---|---|---|---|")
for f in fams:
    for m in (4096, 16384):
        b = [r for r in rows["h100-80gb"] if r["kind"] != "square" and r["m"] == m
             and r["dtype"] == "bf16"
             and (r["case"].startswith(f + " ") or f in " ".join(r.get("also", [])))]
        fl = [r["n"] * r["k"] for r in b]
        meas = sum(fl) / sum(x / r["tflops"] for x, r in zip(fl, b))
        c = GEMM_RATES["h100-80gb"]["bf16"]
        new = sum(fl) / sum(x / (c.rate(gemm_x(r["m"], r["n"], r["k"])) / 1e12) for x, r in zip(fl, b))
        x = b[0]["model_x"]
        old = 989 * 0.7328 * x / (x + 256)
        print(f"| {f} | {m} | {meas:.0f} | {new:.0f} | {old:.0f} | {old / meas:.2f} |")
