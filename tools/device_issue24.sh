#!/usr/bin/env bash
# Issue 24 on one H100: the default search against a hand grid over the derived lever's values,
# in the same call, for the memory-tight cases named in CASES (default "llama").
#
#   CASES="xl llama" PARTS="search grid" bash tools/device_issue24.sh
#
#   llama  Llama-3.2-3B (tests/data/hf/llama-3.2-3b.json), seq 8192, gbs 4
#   xl     gpt2-xl, seq 32768, gbs 1
#   PARTS (default "search grid below"), per case:
#   search `autotune MODEL --gpus 1 --seq-len S --global-batch-size B` with default flags (the
#          default space: recompute_num_layers derive, mbs divisors): wall time, launches, first
#          trial. SEARCH_TIMEOUT_S (300) bounds it.
#   grid   the hand grid: `--sampler grid --space tools/spaces/<case>-grid.yaml` (every second or
#          fourth layer count the model says may fit, in the warm pool); GRID_STEPS fixes the
#          timed steps (default: adaptive, as a search), GRID_TIMEOUT_S (300) bounds it.
#   below  the counts below the grid's, that the memory model predicts not to fit, run ungated
#          and cold through tools/device_layouts.py: does the model's boundary hold?
#   standby (once, after the cases) Transformer Engine installed from .whl-te into /tmp/site-te
#          and put on the path, a standby started on its own (tools/standby_check.py): does it
#          get ready with no GPU process before a hand-over? Skipped without .whl-te.
# Throughout, $OUT/gpu.txt gets one line a second: the GPU's compute processes (pid, MiB) and the
# worker processes (pid, standby or not), so that the standby's hand-over shows on the driver.
# Carry: .whl (megatron-core 0.16.1) and .whl-search (optuna and deps, tree-sitter).
# $OUT: summary.txt (every trial: layout, status, measured against predicted), results.tgz,
# layouts-CASE.txt, timing-CASE.txt.
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
parts=" ${PARTS:-search grid below} "
( while :; do
    apps=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null \
           | tr '\n' ';')
    procs=$(pgrep -af 'autotune.worker' 2>/dev/null | grep -v pgrep \
            | awk '{print $1 ($0 ~ /--standby/ ? ":standby" : ":worker")}' | tr '\n' ' ')
    echo "$(date +%s) gpu[$apps] procs[$procs]"
    sleep 1
  done > "$out/gpu.txt" ) &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT
for case in ${CASES:-${CASE:-llama}}; do
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
  t0=$(date +%s)
  if [[ $parts == *" search "* ]]; then
    STUDY_TIMEOUT_S=${SEARCH_TIMEOUT_S:-300} bash tools/device_search.sh "$case-default" -- \
        "$model" --gpus 1 --seq-len $seq --global-batch-size $gbs > /dev/null
  fi
  t1=$(date +%s)
  if [[ $parts == *" grid "* ]]; then
    steps=()
    [[ -n ${GRID_STEPS:-} ]] && steps=(--steps "$GRID_STEPS" --stable-cv 0 --warmup-steps 2)
    STUDY_TIMEOUT_S=${GRID_TIMEOUT_S:-300} bash tools/device_search.sh "$case-grid" -- \
        "$model" --gpus 1 --seq-len $seq --global-batch-size $gbs --space "$grid" \
        --sampler grid "${steps[@]}" > /dev/null
  fi
  t2=$(date +%s)
  if [[ $parts == *" below "* ]]; then
    PYTHONPATH=/tmp/site:$PWD python3 tools/device_layouts.py --seq-len $seq "$model" 1 \
        h100-80gb /tmp/layouts "${below[@]}" > "$out/layouts-$case.txt" 2>&1
    tail -20 "$out/layouts-$case.txt"
  fi
  t3=$(date +%s)
  {
    echo "search: $((t1 - t0)) s; grid: $((t2 - t1)) s; ungated layouts: $((t3 - t2)) s"
    for n in "$case-default" "$case-grid"; do
      [[ -f /tmp/r/$n.err ]] || continue
      echo "== $n stderr (tail)"; tail -15 "/tmp/r/$n.err"
      echo "== $n stdout (tail)"; tail -40 "/tmp/r/$n.out"
    done
  } > "$out/timing-$case.txt"
  head -1 "$out/timing-$case.txt"
done
if [[ $parts == *" standby "* && -d .whl-te ]]; then
  [[ -d /tmp/site-te/transformer_engine ]] || python3 -m pip install -q --no-index --no-deps \
      --no-compile --target /tmp/site-te .whl-te/*.whl > "$out/te-install.txt" 2>&1
  PYTHONPATH=/tmp/site-te:/tmp/site:$PWD python3 -c \
      "import transformer_engine as te; print('transformer_engine', te.__version__)" \
      > "$out/standby-te.txt" 2>&1
  PYTHONPATH=/tmp/site-te:/tmp/site:$PWD timeout 200 python3 tools/standby_check.py \
      /tmp/standby-te 1 120 >> "$out/standby-te.txt" 2>&1
  echo "standby with TE: rc=$?" >> "$out/standby-te.txt"
  tail -3 "$out/standby-te.txt"
fi
cp /tmp/r/commands.txt "$out/commands.txt" 2>/dev/null
cat "$out/summary.txt" 2>/dev/null | grep -v -E "INVALID|PREDICTED_SLOW" | cut -c1-240
