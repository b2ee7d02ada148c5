#!/usr/bin/env bash
# Session 24 on one H200 (about 9 minutes): the caching allocator's reserve with and without
# expandable segments (results/benchmarks/2026-11-27-cpu-memory-reserve.md, "Next"). Each case
# is one layout run twice through autotune's runner and worker (tools/device_layouts.py, cold,
# ungated): the allocator's default segments, then PYTORCH_CUDA_ALLOC_CONF=
# expandable_segments:True, so that a pair is complete before the next case starts. The cases
# are the one-GPU trials whose reserve set the memory bands: llama-1b at seq 16384 (H200 band),
# gpt2-xl mbs 32 (11.25 GiB of reserve), Llama-3.2-3B with the precision-aware optimizer,
# gpt2-xl at seq 32768 with 32 layers of block recompute (7.54 GiB), and DeepSeek-V2-Lite's
# attention at mbs 4 (5.8 GiB, session 23).
#
#   bash tools/device_allocator.sh      (carry .whl .whl-search .whl-te)
#
# $OUT: rows.jsonl (one JSON row per trial, with "allocator"), table.txt, clocks.csv,
# versions.txt, logs.tgz (the trials' logs).
CLOCKS=1 source tools/device_te_prelude.sh
gpu=h200
[[ $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) == *H200* ]] || gpu=h100-80gb
r=/tmp/alloc
mkdir -p "$r"
n=0
pair() {  # SEQ MODEL LAYOUT
  if (( $(date +%s) - start > ${CALL_LIMIT_S:-560} - 100 )); then echo "$2 $3 skipped"; return; fi
  local mode
  for mode in default expandable; do
    n=$((n + 1))
    local dir="$r/$(printf %02d $n)-$mode"
    if [[ $mode == expandable ]]; then
      PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 200 python3 tools/device_layouts.py \
          --seq-len "$1" "$2" 1 "$gpu" "$dir" "$3" > "$dir.txt" 2> "$dir.err"
    else
      env -u PYTORCH_CUDA_ALLOC_CONF timeout 200 python3 tools/device_layouts.py \
          --seq-len "$1" "$2" 1 "$gpu" "$dir" "$3" > "$dir.txt" 2> "$dir.err"
    fi
    echo "$n $mode $2 seq $1 $3 rc=$? at $(elapsed)"
    head -1 "$dir.txt" | python3 -c "import json, sys
row = json.loads(sys.stdin.read()); row.update(allocator='$mode', model='$2', seq=$1)
print(json.dumps(row))" >> "$out/rows.jsonl" 2> /dev/null || tail -3 "$dir.err"
  done
}
pair 16384 tools/shapes/llama-1b.yaml mbs=1,gbs=16,impl=sdpa
pair 1024 gpt2-xl mbs=32,gbs=64,impl=te
pair 8192 tests/data/hf/llama-3.2-3b.json \
    mbs=1,gbs=4,impl=te,distributed_optimizer=1,precision_aware_optimizer=1
pair 32768 gpt2-xl mbs=1,gbs=1,recompute=full,recompute_method=block,recompute_num_layers=32,impl=sdpa
pair 4096 tools/shapes/mla-dense-6l.yaml mbs=4,gbs=8,impl=te
python3 - "$out/rows.jsonl" > "$out/table.txt" << 'EOF'
import json, sys
G = 1
print("| model | seq | layout | allocator | status | step s | allocated GiB | reserved GiB "
      "| reserve GiB | device used GiB | used - reserved GiB |")
for line in open(sys.argv[1]):
    r = json.loads(line)
    a, v, u = r["peak_allocated_gib"], r["peak_reserved_gib"], r["device_used_gib"]
    f = lambda x: "-" if x is None else f"{x:.2f}"
    print(f"| {r['model']} | {r['seq']} | {r['layout']} | {r['allocator']} | {r['status']} | "
          f"{f(r['step_time_s'])} | {f(a)} | {f(v)} | {f(v - a if a and v else None)} | {f(u)} | "
          f"{f(u - v if u and v else None)} |")
EOF
tar czf "$out/logs.tgz" -C /tmp alloc
cat "$out/table.txt"
echo "total $(elapsed)"
