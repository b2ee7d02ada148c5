#!/usr/bin/env bash
# Session 22 on one H200 (about 8 minutes; timeouts bound each part): session 21's model terms
# (Qwen3's kv_channels != hidden / heads and its QK norm, under TE and torch norms) and lever
# (--grad-reduce-in-bf16) on Qwen3-4B as a grid in the warm pool, then the default search on it,
# as a user runs it, ending by itself.
#
#   bash tools/device_qwen3.sh      (carry .whl .whl-search .whl-te)
#
# Parts (PARTS, default all): grid (tools/spaces/qwen3-4b-grad-bf16.yaml: 8 trials, fixed
# steps), search (`autotune tests/data/hf/qwen3-4b.json --gpus 1 --seq-len 4096 --gbs 16`,
# default flags, bounded by what is left of CALL_LIMIT_S).
# $OUT: summary.txt (tools/study_table.py), losses.txt, clocks.csv, versions.txt, results.tgz.
CLOCKS=1 source tools/device_te_prelude.sh
parts=" ${PARTS:-grid search} "

qwen=tests/data/hf/qwen3-4b.json
export STUDY_TIMEOUT_S
if [[ $parts == *" grid "* ]]; then
  STUDY_TIMEOUT_S=${GRID_TIMEOUT_S:-240} bash tools/device_search.sh q4-grid -- "$qwen" --gpus 1 \
      --sampler grid --stop-rule none --stable-cv 0 --warmup-steps 3 --steps 6 --seq-len 4096 \
      --gbs 8 --space tools/spaces/qwen3-4b-grad-bf16.yaml > /dev/null
  echo "grid done at $(elapsed)"; tail -2 /tmp/r/q4-grid.err
fi
if [[ $parts == *" search "* ]]; then
  left=$(( ${CALL_LIMIT_S:-570} - $(date +%s) + start - 20 ))
  if (( left > 60 )); then
    STUDY_TIMEOUT_S=$left bash tools/device_search.sh q4-default -- "$qwen" --gpus 1 \
        --seq-len 4096 --gbs 16 --time-budget $(( left - 25 )) > /dev/null
    echo "search done at $(elapsed)"; tail -3 /tmp/r/q4-default.err
  else
    echo "search skipped: ${left}s left"
  fi
fi
python3 tools/study_table.py /tmp/r 6 > "$out/summary.txt" 2>&1
python3 tools/trial_losses.py /tmp/r > "$out/losses.txt" 2>&1
tar czf "$out/results.tgz" -C /tmp r
cat "$out/summary.txt"; cat "$out/losses.txt"
echo "total $(elapsed)"
