#!/usr/bin/env bash
# Session 22 on one H200 (about 9 minutes; timeouts bound each part): the shared expert of an MoE
# layer (Qwen2-MoE's) on a GPU, against its twin without it, then the default search on the
# model with it, as a user runs it.
#
#   bash tools/device_shared_expert.sh      (carry .whl .whl-search .whl-te)
#
# Parts (PARTS, default all): grid (tools/spaces/moe-shared-1gpu.yaml on
# tools/shapes/qwen1.5-moe-6l.yaml and -noshared.yaml: 2 + 2 trials, fixed steps), search
# (`autotune tools/shapes/qwen1.5-moe-6l.yaml --gpus 1`, default flags, bounded by what is left
# of CALL_LIMIT_S).
# $OUT: summary.txt (tools/study_table.py), losses.txt, clocks.csv, versions.txt, results.tgz.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
mkdir -p "$out"
parts=" ${PARTS:-grid search} "
start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start ))s"; }
if [[ ! -d /tmp/site/transformer_engine ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl .whl-search/*.whl .whl-te/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD
echo "installed at $(elapsed)"
python3 -c "import sys, torch, megatron.core as mc, transformer_engine as te, optuna
print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'megatron-core', mc.__version__, 'te', te.__version__, 'optuna', optuna.__version__)" \
  2>&1 | grep -v -i warn | tee "$out/versions.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader \
  | tee -a "$out/versions.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv -lms 1000 > "$out/clocks.csv" 2>&1 &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT

grid=(--gpus 1 --sampler grid --stop-rule none --stable-cv 0 --warmup-steps 3 --steps 6
      --space tools/spaces/moe-shared-1gpu.yaml)
export STUDY_TIMEOUT_S
if [[ $parts == *" grid "* ]]; then
  for m in qwen1.5-moe-6l qwen1.5-moe-6l-noshared; do
    STUDY_TIMEOUT_S=${GRID_TIMEOUT_S:-150} bash tools/device_search.sh "$m" -- \
        "tools/shapes/$m.yaml" "${grid[@]}" > /dev/null
    echo "$m done at $(elapsed)"; tail -2 "/tmp/r/$m.err"
  done
fi
if [[ $parts == *" search "* ]]; then
  left=$(( ${CALL_LIMIT_S:-570} - $(date +%s) + start - 20 ))
  if (( left > 60 )); then
    STUDY_TIMEOUT_S=$left bash tools/device_search.sh moe-default -- \
        tools/shapes/qwen1.5-moe-6l.yaml --gpus 1 --time-budget $(( left - 25 )) > /dev/null
    echo "search done at $(elapsed)"; tail -3 /tmp/r/moe-default.err
  else
    echo "search skipped: ${left}s left"
  fi
fi
python3 tools/study_table.py /tmp/r 6 > "$out/summary.txt" 2>&1
python3 tools/trial_losses.py /tmp/r > "$out/losses.txt" 2>&1
tar czf "$out/results.tgz" -C /tmp r
cat "$out/summary.txt"; cat "$out/losses.txt"
echo "total $(elapsed)"
