#!/usr/bin/env bash
# Issue 24 on one H100: the default search against a hand grid over the derived lever's values,
# in the same call, for one memory-tight case (CASE=llama or CASE=xl).
#
#   CASE=llama bash tools/device_issue24.sh   Llama-3.2-3B (tests/data/hf/llama-3.2-3b.json),
#                                             seq 8192, gbs 4
#   CASE=xl    bash tools/device_issue24.sh   gpt2-xl, seq 32768, gbs 1
#
# 1. `autotune MODEL --gpus 1 --seq-len S --global-batch-size B` with default flags (the
#    default space: recompute_num_layers derive, mbs divisors): wall time, launches, first trial.
# 2. The hand grid: `--sampler grid --space tools/spaces/<case>-grid.yaml` (every second or fourth
#    layer count the model says may fit, in the warm pool).
# 3. The counts below the grid's, that the memory model predicts not to fit, run ungated and
#    cold through tools/device_layouts.py: does the model's boundary hold?
# Carry: .whl (megatron-core 0.16.1) and .whl-search (optuna and deps, tree-sitter).
# $OUT: summary.txt (every trial: layout, status, measured against predicted), results.tgz,
# layouts.txt, timing.txt.
set -u
case=${CASE:-llama}
if [[ $case == llama ]]; then
  model=tests/data/hf/llama-3.2-3b.json; seq=8192; gbs=4
  grid=tools/spaces/llama3b-8k-grid.yaml
  below=("mbs=1,recompute=full,recompute_method=block,recompute_num_layers=6,impl=sdpa,gbs=4"
         "mbs=1,recompute=full,recompute_method=block,recompute_num_layers=8,impl=sdpa,gbs=4")
else
  model=gpt2-xl; seq=32768; gbs=1
  grid=tools/spaces/xl-32k-grid.yaml
  below=("mbs=1,recompute=full,recompute_method=block,recompute_num_layers=24,impl=sdpa,gbs=1")
fi
out=${OUT:-/tmp/out}
mkdir -p "$out"
t0=$(date +%s)
bash tools/device_search.sh "$case-default" -- "$model" --gpus 1 --seq-len $seq \
    --global-batch-size $gbs ";;" \
    "$case-grid" -- "$model" --gpus 1 --seq-len $seq --global-batch-size $gbs \
    --space "$grid" --sampler grid
t1=$(date +%s)
export PYTHONPATH=/tmp/site:$PWD
python3 tools/device_layouts.py --seq-len $seq "$model" 1 h100-80gb /tmp/layouts "${below[@]}" \
    > "$out/layouts.txt" 2>&1
t2=$(date +%s)
cp /tmp/r/commands.txt "$out/commands.txt" 2>/dev/null
{
  echo "searches (default + grid): $((t1 - t0)) s; ungated layouts: $((t2 - t1)) s"
  for n in "$case-default" "$case-grid"; do
    echo "== $n stderr (tail)"; tail -15 "/tmp/r/$n.err"
    echo "== $n stdout (tail)"; tail -25 "/tmp/r/$n.out"
  done
} > "$out/timing.txt"
cat "$out/layouts.txt" | tail -20
