#!/usr/bin/env bash
# Session 24, the second H200 call (about 9 minutes): expandable segments through autotune's own
# paths, and DeepSeek-V2-Lite's mixed layers on a GPU for the first time.
#  1. A grid in one warm pool: tools/shapes/deepseek-v2-lite-mixed-6l.yaml (first layer dense,
#     five MoE) x tools/spaces/mixed-xseg-1gpu.yaml (mbs 1 and 4, each with the allocator's
#     default segments and with expandable segments): the pool switches the allocator between
#     trials (autotune.worker.run.configure_allocator).
#  2. Near the capacity (tools/device_layouts.py, cold, ungated): gpt2-xl mbs 36 with the
#     default segments (predicted over the usable memory with its logits block's margin) and
#     with expandable segments (predicted to fit), and mbs 38 with expandable segments.
#  3. The mixed model's exported Megatron-LM script with expandable segments, run unchanged
#     (tools/device_export_mlm.sh, SPACE=tools/spaces/te-mbs4-xseg-1gpu.yaml).
#
#   bash tools/device_allocator_mixed.sh   (carry .whl .whl-search .whl-te .carry/megatron-lm)
#
# $OUT: summary.txt (study_table of 1 and 3's worker trial), near.txt and near.jsonl (2),
# mlm.txt (3), clocks.csv, versions.txt, results.tgz.
CLOCKS=1 source tools/device_te_prelude.sh
limit=${CALL_LIMIT_S:-570}
export STUDY_TIMEOUT_S=200
bash tools/device_search.sh mixed-xseg -- tools/shapes/deepseek-v2-lite-mixed-6l.yaml --gpus 1 \
    --sampler grid --stop-rule none --stable-cv 0 --warmup-steps 3 --steps 6 \
    --space tools/spaces/mixed-xseg-1gpu.yaml > /dev/null
echo "mixed-xseg done at $(elapsed)"; tail -3 /tmp/r/mixed-xseg.err
cp /tmp/r/mixed-xseg.out "$out/mixed-xseg.out" 2> /dev/null
near() {  # NAME LAYOUT
  if (( $(date +%s) - start > limit - 250 )); then echo "$1 skipped"; return; fi
  timeout 150 python3 tools/device_layouts.py gpt2-xl 1 h200 "/tmp/near/$1" "$2" \
      > "/tmp/near/$1.txt" 2> "/tmp/near/$1.err"
  echo "$1 rc=$? at $(elapsed)"
  head -1 "/tmp/near/$1.txt" >> "$out/near.jsonl"
  tail -1 "/tmp/near/$1.txt" | tee -a "$out/near.txt"
}
mkdir -p /tmp/near
near xl36-default mbs=36,gbs=72,impl=te
near xl36-xseg mbs=36,gbs=72,impl=te,expandable_segments=1
near xl38-xseg mbs=38,gbs=76,impl=te,expandable_segments=1
cp "$out/clocks.csv" "$out/clocks-part1.csv"
left=$(( limit - ($(date +%s) - start) ))
echo "export call with ${left}s left"
CALL_LIMIT_S=$left SPACE=tools/spaces/te-mbs4-xseg-1gpu.yaml CASES=deepseek-v2-lite-mixed-6l \
    bash tools/device_export_mlm.sh > "$out/export.log" 2>&1
grep -E "PYTORCH_CUDA_ALLOC_CONF|moe-layer-freq" /tmp/r/deepseek-v2-lite-mixed-6l-export.sh
tail -30 "$out/export.log"
tar czf "$out/near.tgz" -C /tmp near
echo "total $(elapsed)"
