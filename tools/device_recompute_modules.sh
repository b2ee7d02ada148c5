#!/usr/bin/env bash
# Session 24 on one H200 (about 8 minutes): selective recompute of mla_up_proj and
# shared_experts on a GPU. DeepSeek-V2-Lite's dense layer with its latent norm
# (tools/shapes/deepseek-v2-lite-dense-6l.yaml) at mbs 4: none, mla_up_proj, mla_up_proj+mlp
# (tools/spaces/mla-up-proj-1gpu.yaml); its MoE layer with shared experts
# (deepseek-v2-lite-6l.yaml) at mbs 1: none, shared_experts, moe_act+shared_experts, moe
# (tools/spaces/shared-experts-1gpu.yaml). Fixed steps, one warm pool per study.
#
#   bash tools/device_recompute_modules.sh      (carry .whl .whl-search .whl-te)
#
# $OUT: summary.txt (tools/study_table.py), losses.txt, clocks.csv, versions.txt, results.tgz.
CLOCKS=1 source tools/device_te_prelude.sh
fixed=(--gpus 1 --sampler grid --stop-rule none --stable-cv 0 --warmup-steps 3 --steps 6)
export STUDY_TIMEOUT_S=${STUDY_TIMEOUT_S:-240}
run() {  # NAME SHAPE SPACE
  if (( $(date +%s) - start > ${CALL_LIMIT_S:-590} - 60 )); then echo "$1 skipped"; return; fi
  bash tools/device_search.sh "$1" -- "tools/shapes/$2.yaml" "${fixed[@]}" \
      --space "tools/spaces/$3.yaml" > /dev/null
  echo "$1 done at $(elapsed)"; tail -2 "/tmp/r/$1.err"
}
run mla-up-proj deepseek-v2-lite-dense-6l mla-up-proj-1gpu
run shared-experts deepseek-v2-lite-6l shared-experts-1gpu
python3 tools/study_table.py /tmp/r 6 > "$out/summary.txt" 2>&1
python3 tools/trial_losses.py /tmp/r > "$out/losses.txt" 2>&1
tar czf "$out/results.tgz" -C /tmp r
cat "$out/summary.txt"
echo "total $(elapsed)"
