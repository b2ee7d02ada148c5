#!/usr/bin/env bash
# Issue 15's measurements on 2 GPUs (the 2 x H200 report): warm against cold on six layouts (dp,
# tp + sp, pp, vpp, recompute, distributed optimizer) with an OOM and a hang inside the pool;
# then the default search and the warm grid of the two-GPU search-vs-grid benchmark
# (gpt2-large, search_spaces/two-gpu.yaml; its cold grid is 2026-11-21-h200x2-search-vs-grid.md).
# Run through tools/device_background.sh: it takes longer than one device call.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/bg/i15
python3 tools/device_pool_check.py gpt2-large 2 h200 /tmp/bg/i15/pc \
    --oom mbs=32,impl=local --hang pp=2,mbs=1,impl=local,recompute=full --hang-budget 12 \
    mbs=16,impl=sdpa tp=2,mbs=16,impl=sdpa,sequence_parallel=1 pp=2,mbs=8,impl=sdpa \
    pp=2,vpp=2,mbs=8,impl=sdpa mbs=16,impl=sdpa,recompute=full \
    mbs=16,impl=sdpa,distributed_optimizer=1,overlap_grad_reduce=1 \
    > /tmp/bg/i15/pc.txt 2>&1
grep -v "Warning\|warnings.warn" /tmp/bg/i15/pc.txt | tail -20
OUT=/tmp/bg/i15 bash tools/device_search.sh l-default -- gpt2-large --gpus 2 \
    --space search_spaces/two-gpu.yaml --json \;\; \
    l-grid-warm -- gpt2-large --gpus 2 --space search_spaces/two-gpu.yaml --sampler grid --json
cp -r /tmp/r /tmp/bg/i15/r
