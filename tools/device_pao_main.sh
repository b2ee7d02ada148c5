#!/usr/bin/env bash
# Session 25 on one H200 (about 6 minutes), two parts:
# 1. the optimizer step's memory: Llama-3.2-3B at seq 1024 (the step, not the activations, sets
#    the peak) with the precision-aware optimizer and bf16 gradients on and off, a warm grid at
#    fixed steps (2 warm-up, 4 timed) through the CLI (tools/spaces/pao-step-1gpu.yaml);
# 2. the main job as a user runs it, timed to its end: `autotune gpt2-xl --gpus 1` with TE
#    (expandable segments and their memory band in the default space).
#
#   bash tools/device_pao_main.sh      (carry .whl .whl-search .whl-te)
#
# $OUT: summary.txt (every trial), main.out/main.err (the search's own output), clocks.csv,
# versions.txt, results.tgz.
CLOCKS=1 source tools/device_te_prelude.sh
CALL_LIMIT_S=${CALL_LIMIT_S:-570}
left() { echo $(( CALL_LIMIT_S - ($(date +%s) - start) )); }
STUDY_TIMEOUT_S=150 bash tools/device_search.sh pao-step -- tests/data/hf/llama-3.2-3b.json \
    --gpus 1 --seq-len 1024 --gbs 8 --sampler grid --stop-rule none --stable-cv 0 \
    --warmup-steps 2 --steps 4 --space tools/spaces/pao-step-1gpu.yaml > /dev/null
echo "pao-step done at $(elapsed)"; tail -3 /tmp/r/pao-step.err
main_start=$(date +%s)
STUDY_TIMEOUT_S=$(( $(left) - 25 )) bash tools/device_search.sh main -- gpt2-xl --gpus 1 \
    > /dev/null
echo "main done at $(elapsed): $(( $(date +%s) - main_start )) s"
cp /tmp/r/main.out /tmp/r/main.err "$out/" 2>/dev/null
python3 tools/study_table.py /tmp/r 4 > "$out/summary.txt" 2>&1
tar czf "$out/results.tgz" -C /tmp r
cat "$out/summary.txt"
tail -30 /tmp/r/main.out
echo "total $(elapsed)"
