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
export STUDY_TIMEOUT_S=${STUDY_TIMEOUT_S:-170}
: "${CALL_LIMIT_S:=550}"
fixed_grid mla-dense mla-dense-6l mla-1gpu
fixed_grid mla-dense-rc mla-dense-6l mla-recompute-1gpu
fixed_grid mla-moe deepseek-v2-lite-6l moe-experts-1gpu
grid_summary
