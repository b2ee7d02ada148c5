#!/usr/bin/env bash
# One 4-GPU host (nvidia-h100-x4 / nvidia-h200-x4) used as lanes that run side by side, each on
# its own GPUs and its own CPU cores (taskset), then all four GPUs together. Written for
# session 10 (2026-11-27): a 4-GPU machine counts its whole held time, so four GPUs busy at
# once cost what one would. Start it in the background and wait for it over several calls:
#
#   bash tools/device_background.sh start s10 560 -- bash tools/device_lanes.sh
#   bash tools/device_background.sh wait s10 590           (again until "s10 done")
#   COLLECT=1 bash tools/device_lanes.sh                    (the TE wheel's parts into $OUT)
#
# Timeline (seconds from the start; every part is bounded by timeout(1)):
#   0     wheels installed; nvidia-smi logs every GPU's clocks each second (clocks.csv)
#   0     Transformer Engine 2.11 built on cores 32-63 (tools/te_build.sh), then installed
#   0     GPU-bound lanes that need no TE, on cores 0-31:
#           shapes  GPU 0  issue 28: wide-8k (hidden 8192) at seq 2048/4096/8192
#           long    GPU 1  issue 28: llama-1b at seq 8192/16384/32768 (the attention term)
#           xl32k   GPU 3  issue 24: gpt2-xl seq 32768 gbs 1, default search, then the grid
#   TE    lanes that need TE (each waits for the wheel):
#           fp8x2   GPUs 0,1  issue 30 group 3: FP8 against bf16 at tp 2 and dp 2, then
#                             group 1: interleaved warm/cold repeats on 6 layouts with cp
#           fp8xl   GPU 2     issue 26: gpt2-xl bf16 against FP8 at mbs 8/16, the default
#                             search with TE, its winner exported to Megatron-LM and run there
#           optim   GPU 3     issue 24: the optimizer's CPU offload against recompute
#   then  all 4 GPUs (issue 30 group 4): `autotune gpt2-xl --gpus 4`, default flags.
# Every lane writes to /tmp/bg/s10/<lane>/ (summary.txt, results.tgz, logs), which
# device_background.sh brings back as s10.tgz.
#
# Carry: .whl (megatron-core 0.16.1), .whl-search (optuna and deps), .te (TE's sources from
# tools/te_sources.sh), .carry/megatron-lm (Megatron-LM's training code at core_v0.16.1 and its
# wheels, see tools/device_megatron_lm.sh).
set -u
# shellcheck source=tools/lanes_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lanes_lib.sh"  # at, pin_self, search, lane, finish_by, ...
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
root=/tmp/bg/s10
te_out=/tmp/te-out
if [[ ${COLLECT:-0} == 1 ]]; then
  mkdir -p "${OUT:-/tmp/out}"
  cp "$te_out"/*.part-* "$te_out"/*.sha256 "$te_out"/build.txt "${OUT:-/tmp/out}/" 2>/dev/null
  ls -la "${OUT:-/tmp/out}"
  exit 0
fi
mkdir -p "$root"
start=$(date +%s)

install_wheels /tmp/site .whl/*.whl .whl-search/*.whl .carry/megatron-lm/wheels/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/tools
gpu=$(gpu_kind)
{
  host_facts
  python3 -c "import sys, torch, megatron.core as mc, optuna
print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'megatron-core', mc.__version__, 'optuna', optuna.__version__)"
} > "$root/versions.txt" 2>&1
cat "$root/versions.txt"
log_clocks "$root/clocks.csv"
smi=$!
trap 'kill $smi 2>/dev/null' EXIT

# --- Transformer Engine, built on the cores the lanes leave free -------------------------
(
  pin_self 32-63
  MAX_JOBS=32 bash tools/te_build.sh .te/te-src-v2.11.tar.xz "$te_out" \
      > "$root/te-build.log" 2>&1 || { echo "te build failed" >> "$root/te-build.log"; exit 1; }
  mkdir -p /tmp/te-whl
  (cd "$te_out" && if ls ./*.part-* > /dev/null 2>&1; then
     cat ./*.part-* > /tmp/te-whl/"$(basename ./*.sha256 .sha256)"; else cp ./*.whl /tmp/te-whl/; fi)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/site /tmp/te-whl/*.whl >> "$root/te-build.log" 2>&1 || exit 1
  python3 -c "import transformer_engine as te  # check_fp8_support: quantization.py since TE 2.9
from transformer_engine.pytorch.quantization import check_fp8_support
ok, why = check_fp8_support(); print('te', te.__version__, 'fp8', ok, why)" \
      2>&1 | grep -v -i warn >> "$root/versions.txt"
  touch /tmp/te.ready
) &
te_job=$!
wait_te() {  # a lane that needs TE waits for it (or gives up with the build)
  while [[ ! -f /tmp/te.ready ]] && kill -0 "$te_job" 2> /dev/null; do sleep 5; done
  [[ -f /tmp/te.ready ]]
}

# layouts LANE NAME GPUS SEQ MODEL LAYOUT...: tools/device_layouts.py, ungated, one launch each
layouts() {
  local lane=$1 name=$2 gpus=$3 seq=$4 model=$5; shift 5
  timeout 420 python3 tools/device_layouts.py --seq-len "$seq" "$model" "$gpus" "$gpu" \
      "$root/$lane/$name" "$@" > "$root/$lane/$name.txt" 2> "$root/$lane/$name.err"
  at "$lane: $name rc=$?"
}

lane_shapes() {  # GPU 0: more hidden-8192 data for the constants fit (issue 28)
  mkdir -p "$root/shapes"
  local m=tools/shapes/wide-8k.yaml
  layouts shapes wide-4096 1 4096 $m mbs=4,gbs=16,recompute=full,impl=sdpa \
      mbs=4,gbs=16,recompute=selective,impl=sdpa mbs=8,gbs=16,recompute=full,impl=sdpa
  layouts shapes wide-2048 1 2048 $m mbs=2,gbs=16,impl=sdpa mbs=8,gbs=16,recompute=selective,impl=sdpa
  layouts shapes wide-8192 1 8192 $m mbs=1,gbs=16,impl=sdpa mbs=2,gbs=16,recompute=full,impl=sdpa
}
lane_long() {  # GPU 1: llama-1b at long sequences, where attention dominates (issue 28)
  mkdir -p "$root/long"
  local m=tools/shapes/llama-1b.yaml
  layouts long l1b-16384 1 16384 $m mbs=1,gbs=16,recompute=selective,impl=sdpa \
      mbs=1,gbs=16,impl=sdpa mbs=2,gbs=16,recompute=full,impl=sdpa
  layouts long l1b-8192 1 8192 $m mbs=1,gbs=16,impl=sdpa mbs=2,gbs=16,recompute=selective,impl=sdpa
  layouts long l1b-32768 1 32768 $m mbs=1,gbs=8,recompute=full,impl=sdpa
}
lane_xl32k() {  # GPU 3: issue 24's second memory-tight case, search and grid in one call
  mkdir -p "$root/xl32k"
  search xl32k xl32k-default 360 -- gpt2-xl --gpus 1 --seq-len 32768 --global-batch-size 1 --json
  search xl32k xl32k-grid 300 -- gpt2-xl --gpus 1 --seq-len 32768 --global-batch-size 1 \
      --space tools/spaces/xl-32k-grid.yaml --sampler grid --json
}
lane_optim() {  # GPU 3 after xl32k: the optimizer's CPU offload (issue 24)
  mkdir -p "$root/optim"
  wait_te || { at "optim: no TE"; return; }
  search optim optim-offload 360 -- tests/data/hf/llama-3.2-3b.json --gpus 1 --seq-len 8192 \
      --global-batch-size 4 --space tools/spaces/optimizer-offload-1gpu.yaml --sampler grid \
      --stop-rule none --json
}
lane_fp8x2() {  # GPUs 0,1 after shapes/long: issue 30 groups 3 and 1
  mkdir -p "$root/fp8x2"
  wait_te || { at "fp8x2: no TE"; return; }
  search fp8x2 fp8-2gpu 300 -- tests/data/hf/llama-3.2-3b.json --gpus 2 --seq-len 4096 \
      --global-batch-size 8 --space tools/spaces/fp8-2gpu.yaml --sampler grid --stop-rule none \
      --stable-cv 0 --steps 8 --warmup-steps 3 --json
  timeout 380 python3 tools/repeatability.py --gpus 2 --rounds 2 --gbs 32 --deadline-s 330 \
      --fixed gpt2-large "$gpu" "$root/fp8x2/repeat" \
      mbs=8,impl=sdpa tp=2,sequence_parallel=1,mbs=16,impl=sdpa pp=2,vpp=2,mbs=4,impl=sdpa \
      cp=2,mbs=8,impl=te mbs=8,impl=sdpa,distributed_optimizer=1,overlap_grad_reduce=1 \
      mbs=4,recompute=full,impl=sdpa \
      > "$root/fp8x2/repeat.out" 2> "$root/fp8x2/repeat.err"
  at "fp8x2: repeat rc=$?"
}
lane_fp8xl() {  # GPU 2: issue 26 on one GPU, and the export run in Megatron-LM
  mkdir -p "$root/fp8xl"
  wait_te || { at "fp8xl: no TE"; return; }
  search fp8xl fp8-xl 240 -- gpt2-xl --gpus 1 --sampler grid --stop-rule none --stable-cv 0 \
      --warmup-steps 3 --steps 8 --space tools/spaces/fp8-gpt2xl.yaml --json
  local t0; t0=$(date +%s)
  search fp8xl xl-default 300 -- gpt2-xl --gpus 1 --json
  at "fp8xl: default search wall $(( $(date +%s) - t0 ))s"
  cp tools/run_pretrain_gpt.py .carry/megatron-lm/run_pretrain_gpt.py
  python3 -m autotune.cli export --study xl-default --results-dir "$root/fp8xl/r" \
      --format megatron-lm --megatron-lm "$PWD/.carry/megatron-lm/run_pretrain_gpt.py" \
      --train-iters 30 -o "$root/fp8xl/exported-megatron-lm.sh" > "$root/fp8xl/export.txt" 2>&1
  at "fp8xl: export rc=$?"
  t0=$(date +%s)
  (cd "$root/fp8xl" && timeout 240 bash exported-megatron-lm.sh > exported-megatron-lm.log 2>&1)
  at "fp8xl: exported Megatron-LM script rc=$? wall=$(( $(date +%s) - t0 ))s"
  grep -E "iteration +[0-9]+/|memory \(MB\)|fp8" "$root/fp8xl/exported-megatron-lm.log" \
      | tail -8 > "$root/fp8xl/exported-megatron-lm.tail"
}
lane_all4() {  # all four GPUs: issue 30 group 4
  mkdir -p "$root/all4"
  local t0; t0=$(date +%s)
  search all4 xl4-default "${ALL4_TIMEOUT_S:-400}" -- gpt2-xl --gpus 4 --json
  at "all4: default search wall $(( $(date +%s) - t0 ))s"
}

# Each lane (lanes_lib.sh): a process group of its own, on its GPUs, pinned to its cores.
p0=$(lane shapes 0 0-7 "$PYTHONPATH" lane_shapes)
p1=$(lane long 1 8-15 "$PYTHONPATH" lane_long)
p2=$(lane xl2 2 16-23 "$PYTHONPATH" lane_fp8xl)
p3=$(lane xl3 3 24-31 "$PYTHONPATH" lane_xl32k lane_optim)
finish_by "${SHAPES_DEADLINE_S:-420}" "$p0" "$p1"
at "shapes and long done"
p01=$(lane fp8x2 0,1 0-15 "$PYTHONPATH" lane_fp8x2)
finish_by "${LANES_DEADLINE_S:-1100}" "$p2" "$p3" "$p01"
at "lanes done"
wait "$te_job"
lane_all4 > "$root/lane-all4.log" 2>&1
at "all done"
grep -h "^\[" "$root"/lane-*.log | sort -t'[' -k2 -n
