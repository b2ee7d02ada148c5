#!/usr/bin/env bash
# Issue 28's GEMM sweep on ONE GPU (H100 or H200; about BUDGET_S + 15 s): the GEMM rate by size
# with the SM clock, power, temperature and clock-event reasons beside it, so that the rate and
# the power roof become measured constants (results/benchmarks/2026-11-28-cpu-attention-
# dropout.md, "What is left").
#
#   bash tools/device_gemm.sh                       (BUDGET_S=150: the sweep's wall in seconds)
#   BUDGET_S=200 bash tools/device_gemm.sh          (the default 69 cases all fit: ~170 s)
#   TOKENS=16384 BUDGET_S=150 bash tools/device_gemm.sh     (a second call: the other token count)
#
#   tools/gemm_sweep.py: torch.matmul in bf16, (a) squares 1024-16384 and (b) the QKV, proj, fc1
#   and fc2 GEMMs of every model family in tests/data/measured_trials.json at m = TOKENS
#   (4096,16384), each back to back for SECONDS_PER_CASE (2.0) of wall after a warm-up, timed with
#   CUDA events; clocks and power sampled every 100 ms over each window (pynvml when it imports,
#   else nvidia-smi). Cases that would end past BUDGET_S are skipped and listed; a case that fails
#   (OOM) is recorded and the sweep goes on. Options: FP8=1 (also e4m3 torch._scaled_mm, forward
#   only), PASSES=fwd,dgrad,wgrad (the backward layouts too), ONLY=REGEX (cases whose label
#   matches), SIZES=1024,... and FAMILIES=gpt2-xl,... (subsets; SIZES= for no squares), DRY_RUN=1
#   (list the cases, time nothing).
#   -> gemm-sweep.jsonl (one record per case: device, torch, M x N x K, TFLOP/s, SM MHz, W, °C,
#   clock events), gemm-sweep.md (the table), sweep.log (its output).
#   Always: nvidia-smi's SM and memory clocks, power, temperature and clock event reasons every
#   500 ms for the whole call -> clocks.csv; versions -> versions.txt.
#
# Nothing to carry, nothing installed: torch and pyyaml from the image, the repository on
# PYTHONPATH (gemm_sweep.py takes the clock reasons and datasheet peaks from autotune).
set -u
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
mkdir -p "$out"

nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv -lms 500 > "$out/clocks.csv" 2>&1 &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT

export PYTHONPATH=$PWD
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader
  python3 -c "import sys, torch
try:
    import pynvml; nvml = 'pynvml ' + getattr(pynvml, '__version__', '?')
except ImportError:
    nvml = 'no pynvml (nvidia-smi polled)'
print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, nvml)"
} 2>&1 | tee "$out/versions.txt"

args=(--out "$out" --budget-s "${BUDGET_S:-150}" --seconds "${SECONDS_PER_CASE:-2.0}"
      --tokens "${TOKENS-4096,16384}" --passes "${PASSES:-fwd}")
[[ ${FP8:-0} == 1 ]] && args+=(--fp8)
[[ -n ${ONLY:-} ]] && args+=(--only "$ONLY")
[[ -n ${SIZES+x} ]] && args+=(--sizes "$SIZES")
[[ -n ${FAMILIES:-} ]] && args+=(--families "$FAMILIES")
[[ ${DRY_RUN:-0} == 1 ]] && args+=(--dry-run)
python3 tools/gemm_sweep.py "${args[@]}" 2>&1 | tee "$out/sweep.log"
rc=${PIPESTATUS[0]}
exit "$rc"
