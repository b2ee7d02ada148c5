#!/usr/bin/env bash
# Session 22 on one H200 (about 7 minutes): the MoE layer's host time against the experts on a
# rank, three models that differ in the expert count alone (tools/shapes/moe-e{8,24,64}-6l.yaml),
# mbs 1 and 4 (tools/spaces/moe-experts-1gpu.yaml), and full recompute of each at mbs 4
# (tools/spaces/moe-recompute-1gpu.yaml). Fixed steps, one warm pool.
#
#   bash tools/device_moe_experts.sh      (carry .whl .whl-search .whl-te)
#
# $OUT: summary.txt (tools/study_table.py), losses.txt, versions.txt, results.tgz.
source tools/device_te_prelude.sh
fixed=(--gpus 1 --sampler grid --stop-rule none --stable-cv 0 --warmup-steps 3 --steps 6)
export STUDY_TIMEOUT_S=${STUDY_TIMEOUT_S:-150}
for e in ${EXPERTS:-8 24 64}; do
  bash tools/device_search.sh "e$e" -- "tools/shapes/moe-e$e-6l.yaml" "${fixed[@]}" \
      --space tools/spaces/moe-experts-1gpu.yaml > /dev/null
  echo "e$e done at $(elapsed)"; tail -1 "/tmp/r/e$e.err"
done
for e in ${RECOMPUTE_EXPERTS:-64 8}; do
  if (( $(date +%s) - start > ${CALL_LIMIT_S:-540} - 70 )); then echo "rc e$e skipped"; continue; fi
  bash tools/device_search.sh "e$e-rc" -- "tools/shapes/moe-e$e-6l.yaml" "${fixed[@]}" \
      --space tools/spaces/moe-recompute-1gpu.yaml > /dev/null
  echo "e$e-rc done at $(elapsed)"; tail -1 "/tmp/r/e$e-rc.err"
done
python3 tools/study_table.py /tmp/r 6 > "$out/summary.txt" 2>&1
python3 tools/trial_losses.py /tmp/r > "$out/losses.txt" 2>&1
tar czf "$out/results.tgz" -C /tmp r
cat "$out/summary.txt"
echo "total $(elapsed)"
