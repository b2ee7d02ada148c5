#!/usr/bin/env bash
# Session 23 on one H200 (about 8 minutes): Multi-Latent Attention on a GPU for the first time.
# DeepSeek-V2-Lite's attention on its dense MLP (tools/shapes/mla-dense-6l.yaml): mbs 1 and 4,
# bf16 and FP8 (tools/spaces/mla-1gpu.yaml), and full recompute at mbs 4
# (tools/spaces/mla-recompute-1gpu.yaml); then its MoE layer (deepseek-v2-lite-6l.yaml) at mbs 1
# and 4 in bf16. Fixed steps, one warm pool per study.
#
#   bash tools/device_mla.sh      (carry .whl .whl-search .whl-te)
#
# $OUT: summary.txt (tools/study_table.py), losses.txt, clocks.csv, versions.txt, results.tgz.
CLOCKS=1 source tools/device_te_prelude.sh
fixed=(--gpus 1 --sampler grid --stop-rule none --stable-cv 0 --warmup-steps 3 --steps 6)
export STUDY_TIMEOUT_S=${STUDY_TIMEOUT_S:-170}
run() {  # NAME SHAPE SPACE
  if (( $(date +%s) - start > ${CALL_LIMIT_S:-550} - 60 )); then echo "$1 skipped"; return; fi
  bash tools/device_search.sh "$1" -- "tools/shapes/$2.yaml" "${fixed[@]}" \
      --space "tools/spaces/$3.yaml" > /dev/null
  echo "$1 done at $(elapsed)"; tail -2 "/tmp/r/$1.err"
}
run mla-dense mla-dense-6l mla-1gpu
run mla-dense-rc mla-dense-6l mla-recompute-1gpu
run mla-moe deepseek-v2-lite-6l moe-experts-1gpu
python3 tools/study_table.py /tmp/r 6 > "$out/summary.txt" 2>&1
python3 tools/trial_losses.py /tmp/r > "$out/losses.txt" 2>&1
tar czf "$out/results.tgz" -C /tmp r
cat "$out/summary.txt"
echo "total $(elapsed)"
