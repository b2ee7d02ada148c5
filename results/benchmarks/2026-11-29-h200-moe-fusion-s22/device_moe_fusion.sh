#!/usr/bin/env bash
# Session 22 on one H200 (about 4 minutes): Transformer Engine's fused MoE permutation and router
# (autotune.levers.moe_fusion), each on and off, on tools/shapes/moe-e64-6l.yaml at mbs 1
# (tools/spaces/moe-fusion-1gpu.yaml), fixed steps, one warm pool.
#
#   bash tools/device_moe_fusion.sh      (carry .whl .whl-search .whl-te)
#
# $OUT: summary.txt (tools/study_table.py), losses.txt, versions.txt, results.tgz.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
mkdir -p "$out"
start=$(date +%s)
if [[ ! -d /tmp/site/transformer_engine ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl .whl-search/*.whl .whl-te/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import sys, torch, megatron.core as mc, transformer_engine as te, optuna
print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'megatron-core', mc.__version__, 'te', te.__version__, 'optuna', optuna.__version__)" \
  2>&1 | grep -v -i warn | tee "$out/versions.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader \
  | tee -a "$out/versions.txt"
STUDY_TIMEOUT_S=${STUDY_TIMEOUT_S:-200} bash tools/device_search.sh fusion -- \
    tools/shapes/moe-e64-6l.yaml --gpus 1 --sampler grid --stop-rule none --stable-cv 0 \
    --warmup-steps 3 --steps 6 --space tools/spaces/moe-fusion-1gpu.yaml > /dev/null
tail -1 /tmp/r/fusion.err
python3 tools/study_table.py /tmp/r 6 > "$out/summary.txt" 2>&1
python3 tools/trial_losses.py /tmp/r > "$out/losses.txt" 2>&1
tar czf "$out/results.tgz" -C /tmp r
cat "$out/summary.txt" "$out/losses.txt"
echo "total $(( $(date +%s) - start ))s"
