#!/usr/bin/env bash
# Session 25 on one H200 (about 9 minutes): the memory model's error with expandable segments,
# over models and levers the allocator trials of session 24 did not cover, at 80-101% of the
# device memory by the model (the gate's band with expandable segments is set from these and
# tests/data/measured_allocator_trials.json). Two parts, in the order of their worth:
# 1. ungated, cold, through tools/device_layouts.py: layouts the model puts at 97-101% of the
#    device (whether the edge holds), FP8 among them (no loss guard: this measures memory);
# 2. warm grids through the CLI (tools/device_search.sh, fixed steps: 2 warm-up, 4 timed),
#    gated as a search is: block recompute near the capacity, an 8B model with the optimizer
#    levers.
#
#   bash tools/device_xseg_band.sh      (carry .whl .whl-search .whl-te)
#
# $OUT: layouts.jsonl (part 1, one JSON row per trial), summary.txt (part 2), clocks.csv,
# versions.txt, results.tgz.
CLOCKS=1 source tools/device_te_prelude.sh
CALL_LIMIT_S=${CALL_LIMIT_S:-570}
gpu=h200
[[ $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) == *H200* ]] || gpu=h100-80gb
mkdir -p /tmp/cold
left() { echo $(( CALL_LIMIT_S - ($(date +%s) - start) )); }
cold() {  # NAME SEQ MODEL LAYOUT...
  local name=$1 seq=$2 model=$3; shift 3
  if (( $(left) < 90 )); then echo "$name skipped"; return; fi
  timeout $(( $(left) - 20 )) python3 tools/device_layouts.py --seq-len "$seq" "$model" 1 "$gpu" \
      "/tmp/cold/$name" "$@" > "/tmp/cold/$name.txt" 2> "/tmp/cold/$name.err"
  echo "$name rc=$? at $(elapsed)"
  grep '^{' "/tmp/cold/$name.txt" | python3 -c "import json, sys
for line in sys.stdin:
    row = json.loads(line); row.update(case='$name', model='$model', seq=$seq)
    print(json.dumps(row))" >> "$out/layouts.jsonl" || tail -3 "/tmp/cold/$name.err"
}
warm() {  # NAME SPACE MODEL ARGS...
  local name=$1 space=$2 model=$3; shift 3
  if (( $(left) < 80 )); then echo "$name skipped"; return; fi
  STUDY_TIMEOUT_S=$(( $(left) - 15 )) bash tools/device_search.sh "$name" -- "$model" --gpus 1 \
      --sampler grid --stop-rule none --stable-cv 0 --warmup-steps 2 --steps 4 \
      --space "tools/spaces/$space.yaml" "$@" > /dev/null
  echo "$name done at $(elapsed)"; tail -2 "/tmp/r/$name.err"
}
L3=tests/data/hf/llama-3.2-3b.json
X=expandable_segments=1,impl=te,gbs=8
cold l3b-edge 8192 $L3 "mbs=4,$X,recompute=full,recompute_method=block,recompute_num_layers=8" \
    "mbs=4,$X,fp8=hybrid,distributed_optimizer=1,precision_aware_optimizer=1"
warm l3b-block xseg-block-1gpu $L3 --seq-len 8192 --gbs 8 --mbs 4 --recompute-num-layers 10,12
warm l8b-pao xseg-pao-1gpu tests/data/hf/llama-3.1-8b.json --seq-len 4096 --gbs 8
warm l1b-64k xseg-block-1gpu tools/shapes/llama-1b.yaml --seq-len 65536 --gbs 1 --mbs 1 \
    --recompute-num-layers 4,6
cold q4b-fp8 4096 tests/data/hf/qwen3-4b.json \
    "mbs=4,$X,fp8=hybrid,recompute=full,recompute_method=block,recompute_num_layers=6"
warm q4b-block xseg-block-1gpu tests/data/hf/qwen3-4b.json --seq-len 4096 --gbs 8 --mbs 4 \
    --recompute-num-layers 8,10
python3 tools/study_table.py /tmp/r 4 > "$out/summary.txt" 2>&1
tar czf "$out/results.tgz" -C /tmp r cold
cat "$out/summary.txt"
python3 - "$out/layouts.jsonl" << 'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["case"], r["layout"], r["status"], "alloc", r["peak_allocated_gib"], "reserved",
          r["peak_reserved_gib"], "used", r["device_used_gib"], "pred", round(r["predicted_peak_gib"], 2),
          "step", r["step_time_s"], "pred step", round(r["predicted_step_time_s"], 3), r["error"])
PY
echo "total $(elapsed)"
