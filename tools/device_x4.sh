#!/usr/bin/env bash
# The 4 x H200 stand-in for issue 8 in one device call: the search, its exported launch command
# run unchanged, then the exhaustive grid of the same space (search_spaces/four-gpu.yaml).
#
#   tools/device_x4.sh MODEL       (carry .whl and .whl-search)
set -u
model=${1:?model}
common=(--gpus 4 --space search_spaces/four-gpu.yaml --backend worker --steps 5
        --warmup-steps 2 --json)
TIMED_STEPS=5 bash tools/device_search.sh x4-search -- "$model" "${common[@]}" --patience 2 \
    --time-budget 150
export PYTHONPATH=/tmp/site:$PWD
python3 -m autotune.cli export --study x4-search --results-dir /tmp/r --format torchrun \
    -o /tmp/r/x4-exported.sh; echo "export rc=$?"
mkdir -p /tmp/r/x4-exported
start=$(date +%s)
(cd /tmp/r/x4-exported && bash ../x4-exported.sh > log.txt 2>&1); echo "exported rc=$? wall=$(( $(date +%s) - start ))s"
python3 -c "import json; d = json.load(open('/tmp/r/x4-exported/result.json')); print('exported', d['status'], {k: v for k, v in d.items() if k in ('tokens_per_s', 'mfu', 'step_time_s', 'peak_allocated_bytes')})" \
    || tail -5 /tmp/r/x4-exported/log.txt
TIMED_STEPS=5 bash tools/device_search.sh x4-grid -- "$model" "${common[@]}" --sampler grid \
    --time-budget "${GRID_BUDGET:-330}"
