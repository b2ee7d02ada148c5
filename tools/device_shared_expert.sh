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
CLOCKS=1 source tools/device_te_prelude.sh
parts=" ${PARTS:-grid search} "

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
