#!/usr/bin/env bash
# Session 26 on one H200 (about 8 minutes): FP8's host time under full recompute. Two warm grids
# at fixed steps (2 warm-up, 4 timed) through the CLI, bf16 against FP8 delayed and tensorwise,
# without and with full recompute of every layer:
#   Llama-3.2-3B at seq 4096, gbs 8, mbs 1 and 2 (tools/spaces/fp8-recompute-host-llama3b.yaml)
#   gpt2-xl at gbs 32, mbs 4 and 8 (tools/spaces/fp8-recompute-host-gpt2xl.yaml)
#
#   bash tools/device_fp8_recompute_host.sh      (carry .whl .whl-search .whl-te)
#
# $OUT: summary.txt (every trial), losses.txt, clocks.csv, versions.txt, results.tgz.
CLOCKS=1 source tools/device_te_prelude.sh
grid() {  # NAME TIMEOUT_S MODEL_ARGS...
  local name=$1 limit=$2; shift 2
  STUDY_TIMEOUT_S=$limit bash tools/device_search.sh "$name" -- "$@" --gpus 1 --sampler grid \
      --stop-rule none --stable-cv 0 --warmup-steps 2 --steps 4 > /dev/null
  echo "$name done at $(elapsed)"; tail -2 "/tmp/r/$name.err"
}
grid rch-llama3b 240 tests/data/hf/llama-3.2-3b.json --seq-len 4096 --gbs 8 \
    --space tools/spaces/fp8-recompute-host-llama3b.yaml
grid rch-gpt2xl 270 gpt2-xl --gbs 32 --space tools/spaces/fp8-recompute-host-gpt2xl.yaml
grid_summary
