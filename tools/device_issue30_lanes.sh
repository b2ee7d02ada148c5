#!/usr/bin/env bash
# Issue 30 on one 4-GPU H200 host (nvidia-h200-x4, needs_h200: the 13B model does not fit two
# H100s), as two 2-GPU lanes side by side, each on its own GPUs and CPU cores, then all four:
#
#   bash tools/device_background.sh start i30 560 -- bash tools/device_issue30_lanes.sh
#   bash tools/device_background.sh wait i30 590              (again until "i30 done")
#
#   lane A  GPUs 0,1, cores 0-15, Transformer Engine on its path:
#           group 1: tools/repeatability.py --gpus 2, six gpt2-large layouts (dp 2, tp 2 + sp,
#           pp 2 + vpp 2, cp 2 (TE attention), distributed optimizer with overlap, full
#           recompute), 2 rounds of a warm and a cold pass, fixed steps;
#           then group 3: FP8 against bf16 (delayed, tensorwise, blockwise) with dp 2, tp 2 and
#           tp 2 + sp (tools/spaces/fp8-2gpu.yaml), fixed steps.
#   lane B  GPUs 2,3, cores 32-47, no Transformer Engine (bf16, as issue 16's llama3-8b case):
#           group 2: llama2-13b at global batch 16, the bounded hand grid
#           (tools/spaces/llama13b-2gpu-bounded.yaml, fixed steps), then
#           `autotune llama2-13b --gpus 2 --gbs 16` with default flags.
#   all4    if time is left: gpt2-xl on 4 GPUs, dp 4 mbs 16 with the distributed optimizer,
#           te against sdpa (group 4: TE measured 124.6k where sdpa had 169.6k).
#
# Lane A measures noise: lane B beside it is GPU-bound (5-6 s steps, two processes on cores of
# their own), and every trial records the host's CPU and steal seconds (repeatability.py).
# Carry: .whl (megatron-core 0.16.1 cp312), .whl-search (optuna and deps), .whl-te (TE 2.11.0).
set -u
# shellcheck source=tools/lanes_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lanes_lib.sh"  # at, pin_self, search, lane, finish_by, ...
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
root=/tmp/bg/i30
mkdir -p "$root/a" "$root/b" "$root/all4"
start=$(date +%s)

install_wheels /tmp/site .whl/*.whl .whl-search/*.whl || exit 1
install_wheels /tmp/site-te .whl-te/*.whl || exit 1
base_path=/tmp/site:$PWD:$PWD/tools
te_path=/tmp/site-te:$base_path
gpu=$(gpu_kind)
{
  host_facts
  PYTHONPATH=$te_path python3 -c "import sys, torch, megatron.core as mc, optuna
import transformer_engine as te
from transformer_engine.pytorch.quantization import check_fp8_support
print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'megatron-core', mc.__version__, 'optuna', optuna.__version__, 'te', te.__version__,
      'fp8', check_fp8_support())" 2>&1 | grep -v -i warn
} > "$root/versions.txt" 2>&1
cat "$root/versions.txt"
log_clocks "$root/clocks.csv"
smi=$!
top -b -d 10 -n 200 > "$root/top.txt" 2>&1 &
topp=$!
trap 'kill $smi $topp 2>/dev/null' EXIT

lane_a() {
  timeout "${REPEAT_TIMEOUT_S:-900}" python3 tools/repeatability.py --gpus 2 --rounds 2 --gbs 32 \
      --deadline-s "${REPEAT_DEADLINE_S:-780}" --fixed gpt2-large "$gpu" "$root/a/repeat" \
      mbs=8,impl=sdpa tp=2,sequence_parallel=1,mbs=16,impl=sdpa pp=2,vpp=2,mbs=4,impl=sdpa \
      cp=2,mbs=8,impl=te mbs=8,impl=sdpa,distributed_optimizer=1,overlap_grad_reduce=1 \
      mbs=4,recompute=full,impl=sdpa \
      > "$root/a/repeat.out" 2> "$root/a/repeat.err"
  at "a: repeat rc=$?"
  search a fp8-2gpu "${FP8_TIMEOUT_S:-330}" -- tests/data/hf/llama-3.2-3b.json --gpus 2 \
      --seq-len 4096 --global-batch-size 8 --space tools/spaces/fp8-2gpu.yaml --sampler grid \
      --stop-rule none --stable-cv 0 --steps 8 --warmup-steps 3 --json
}
lane_b() {
  search b l13b-grid "${GRID_TIMEOUT_S:-450}" -- llama2-13b --gpus 2 --global-batch-size 16 \
      --space tools/spaces/llama13b-2gpu-bounded.yaml --sampler grid --stop-rule none \
      --stable-cv 0 --steps 3 --warmup-steps 1 --json
  local t0; t0=$(date +%s)
  search b l13b-default "${SEARCH_TIMEOUT_S:-720}" -- llama2-13b --gpus 2 --global-batch-size 16 \
      --json
  at "b: default search wall $(( $(date +%s) - t0 ))s"
}

# Each lane (lanes_lib.sh): a process group of its own, on its GPUs, pinned to its cores.
pa=$(lane a 0,1 0-15 "$te_path" lane_a)
pb=$(lane b 2,3 32-47 "$base_path" lane_b)
finish_by "${LANES_DEADLINE_S:-1230}" "$pa" "$pb"
at "lanes done"
cp "$root/a/repeat/report.md" "$root/a/repeat.md" 2>/dev/null
if (( $(date +%s) - start < ${ALL4_BY_S:-1240} )); then
  export PYTHONPATH=$te_path
  timeout 200 python3 tools/device_layouts.py gpt2-xl 4 "$gpu" "$root/all4/x" \
      mbs=16,impl=sdpa,distributed_optimizer=1,overlap_grad_reduce=1 \
      mbs=16,impl=te,distributed_optimizer=1,overlap_grad_reduce=1 \
      > "$root/all4/dp4.txt" 2> "$root/all4/dp4.err"
  at "all4: rc=$?"
fi
rm -rf "$root"/*/r/*/checkpoints 2>/dev/null
at "all done"
grep -h "^\[" "$root"/lane-*.log | sort -t'[' -k2 -n
