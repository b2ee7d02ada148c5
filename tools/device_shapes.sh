#!/usr/bin/env bash
# New model shapes for the constants fit of issue 28, on ONE H100 (about 8 minutes): Llama-style
# GQA + SwiGLU + RMSNorm + RoPE models of hidden 2048 (llama-1b), 3072 (llama-3b) and 8192
# (wide-8k: Llama 3 70B's layer, 2 of them), at seq 4096 and, for llama-1b, 16384; a few layouts
# each, full recompute where the model says memory is short, and one layout the model predicts
# NOT to fit (llama-3b mbs 2), to check the largest-block margin (memory.BLOCK_MARGIN).
#
#   bash tools/device_shapes.sh          (carry: .whl = megatron-core 0.16.1 and its wheels)
#
# Every layout goes through tools/device_layouts.py (autotune's runner + worker, one trial per
# launch, 2 warm-up + 5 timed steps, as the previous sessions' tools/device_*.sh did), gbs 16,
# impl sdpa (no TE needed). Writes to $OUT: shapes.txt (measured against predicted, per model)
# and rows/<model>-<seq>.json (tools/device_layouts.py's rows.json), shapes.tgz (logs). The
# 2026-11-25 run is in tests/data/measured_trials.json as s7-shapes/N (N the launch order, model
# tools/shapes/<model>.yaml, its `family` the model); `PYTHONPATH=. python tools/fit_constants.py`
# refits and cross-validates (results/benchmarks/2026-11-25-h100-model-shapes.md).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
work=/tmp/shapes
mkdir -p "$out/rows" "$work"
start=$(date +%s)
if [[ ! -d /tmp/site/megatron ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD
gpu=h100-80gb
txt=$out/shapes.txt
: > "$txt"
# run MODEL SEQ LAYOUT...: one tools/device_layouts.py call; skipped past 7 minutes of wall.
run() {
  local model=$1 seq=$2; shift 2
  local dir=$work/$model-$seq
  if (( $(date +%s) - start > 420 )); then
    echo "## $model seq $seq: SKIPPED (7-minute guard; run it in a second call)" | tee -a "$txt"
    return
  fi
  rm -rf "$dir" && mkdir -p "$dir"
  echo "## $model seq $seq on 1 x $gpu" | tee -a "$txt"
  timeout 300 python3 tools/device_layouts.py --seq-len "$seq" "tools/shapes/$model.yaml" 1 \
      "$gpu" "$dir" "$@" > "$dir/stdout.txt" 2> "$dir/stderr.txt"
  echo "rc=$? wall=$(( $(date +%s) - start ))s" | tee -a "$txt"
  grep "^|" "$dir/stdout.txt" | tee -a "$txt"
  [[ -f $dir/rows.json ]] && cp "$dir/rows.json" "$out/rows/$model-$seq.json"
}
run llama-1b 4096 mbs=2,gbs=16,impl=sdpa mbs=4,gbs=16,recompute=full,impl=sdpa
run wide-8k 4096 mbs=1,gbs=16,impl=sdpa mbs=2,gbs=16,impl=sdpa
run llama-3b 4096 mbs=1,gbs=16,impl=sdpa mbs=2,gbs=16,recompute=full,impl=sdpa \
    mbs=2,gbs=16,impl=sdpa
run llama-1b 16384 mbs=1,gbs=16,recompute=full,impl=sdpa
tar czf "$out/shapes.tgz" -C "$work" . 2>/dev/null
echo "total wall $(( $(date +%s) - start ))s" | tee -a "$txt"
