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
export STUDY_TIMEOUT_S=${STUDY_TIMEOUT_S:-240}
: "${CALL_LIMIT_S:=590}"
fixed_grid mla-up-proj deepseek-v2-lite-dense-6l mla-up-proj-1gpu
fixed_grid shared-experts deepseek-v2-lite-6l shared-experts-1gpu
grid_summary
