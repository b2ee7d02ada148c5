#!/usr/bin/env bash
# Issue 30 on one host with 2 GPUs (nvidia-h200-x2 or nvidia-h100-x2): the warm pool, the
# interleaved warm/cold check, and the memory-tight llama3-8b search against the hand layout.
#
#   PARTS="repeat" bash tools/device_issue30.sh          (one call each: pool took 9 min on
#   PARTS="pool" bash tools/device_issue30.sh             2 x H200 on 2026-11-27, repeat ~8)
#   PARTS="llama" bash tools/device_background.sh start i30 540 -- bash tools/device_issue30.sh
#   bash tools/device_background.sh wait i30 470          (llama took 89 s + 773 s: longer than
#                                                         a call, the background runner keeps it
#                                                         going between calls on the warm machine)
#
#   pool    tools/device_pool_check.py on gpt2-large: six layouts (dp, tp + sp, pp, pp + vpp,
#           full recompute, distributed optimizer with overlap) warm against cold at fixed steps,
#           then an OOM and a hang inside the pool, each followed by a trial that must still run
#           (issue 15's checks, with the release-order fix). -> pool.md
#   repeat  tools/repeatability.py --gpus 2 on gpt2-large at gbs 32, aimed at issue 30's open
#           question (pp 2 + vpp 2 at 0.81-0.82 warm/cold in sessions 10 and 12, full recompute
#           0.86 in session 12; both ran after tp 2 + sp in their pool): tp 2 + sp, pp 2 + vpp 2,
#           full recompute, the warm pass in that order (--no-rotate), each round a cold pass
#           and a "first" run of pp 2 + vpp 2 and of full recompute as the first trial of a fresh
#           pool; 2 warm-up and STEPS (12) timed steps. Every rank's main-thread CPU, context
#           switches, busy threads, step split and process state (env, affinity, trials before)
#           are in repeat.jsonl. ~510 s on 2 x H200 by estimate (DEADLINE_S 430 stops new trials).
#           REPEAT_LAYOUTS / REPEAT_FIRST override the layouts. -> repeat.md, repeat.jsonl
#   llama   issue 16's hand layout for llama3-8b at global batch 16 (dp 2, distributed optimizer,
#           full recompute of 2 layers by block, mbs 1) measured with tools/device_layouts.py,
#           then `autotune llama3-8b --gpus 2 --gbs 16` with default flags
#           (tools/device_search.sh). -> llama-hand.txt, summary.txt, results.tgz
#   recipe  (4 or 8 GPUs, carry .whl-te too) NVIDIA's published Llama3-8B layout
#           (tools/published_recipes.py llama3-8b-8-fp8cs: mbs 1, FP8 current scaling, full
#           recompute of 5 layers by block, all GPUs data parallel; Megatron FSDP there, the
#           distributed optimizer with overlap here) at seq 8192 and RECIPE_GBS (default 8
#           micro-batches per GPU), measured with tools/device_layouts.py, then
#           `autotune llama3-8b --gpus N --gbs RECIPE_GBS` with default flags (TE present: FP8
#           is in its space). -> recipe-hand.txt, summary.txt, results.tgz
#   Always: nvidia-smi clocks every second -> clocks.csv; versions -> versions.txt.
#
# On a kind that can be taken back between calls (nvidia-h200-x4 on 2026-11-28: the machine of a
# background start was gone when the wait came, straight after), run a part in ONE call: e.g.
#   PARTS=recipe RECIPE_HAND=0 RECIPE_GBS=16 STUDY_TIMEOUT_S=470 bash tools/device_issue30.sh
# (session 19: install 40 s, then the study until its timeout, under the 600 s call limit).
#
# Carry: .whl (megatron-core 0.16.1 cp312) and .whl-search (optuna and its deps, pydantic,
# tree-sitter); see tools/device_search.sh.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
raw=/tmp/bg/i30
mkdir -p "$out" "$raw"
parts=" ${PARTS:-repeat} "

# .whl-te (Transformer Engine and its pydantic deps, tools/te_build.sh) is installed when carried.
te_wheels=(); [[ -d .whl-te ]] && te_wheels=(.whl-te/*.whl)
if [[ ! -d /tmp/site/optuna || ( ${#te_wheels[@]} -gt 0 && ! -d /tmp/site/transformer_engine ) ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl .whl-search/*.whl "${te_wheels[@]}" || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD:$PWD/tools
source tools/device_bytecode.sh /tmp/site
nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv -l 1 > "$raw/clocks.csv" 2>&1 &
smi=$!
trap 'kill $smi 2>/dev/null; cp "$raw/clocks.csv" "$out/" 2>/dev/null' EXIT
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader
  nvidia-smi topo -m | head -4
  python3 -c "import sys, torch, megatron.core as mc, optuna
print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'megatron-core', mc.__version__, 'optuna', optuna.__version__)"
} 2>&1 | tee "$raw/versions.txt"
cp "$raw/versions.txt" "$out/"
gpu=$(case $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) in
        *H200*) echo h200 ;; *) echo h100-80gb ;; esac)
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
echo "gpu=$gpu gpus=$gpus parts=$parts"

if [[ $parts == *" pool "* ]]; then
  t0=$(date +%s)
  python3 tools/device_pool_check.py gpt2-large "$gpus" "$gpu" "$raw/pc" \
      --oom mbs=32,impl=local --hang pp=2,mbs=1,impl=local,recompute=full --hang-budget 12 \
      mbs=16,impl=sdpa tp=2,mbs=16,impl=sdpa,sequence_parallel=1 pp=2,mbs=8,impl=sdpa \
      pp=2,vpp=2,mbs=8,impl=sdpa mbs=16,impl=sdpa,recompute=full \
      mbs=16,impl=sdpa,distributed_optimizer=1,overlap_grad_reduce=1 \
      > "$raw/pool.out" 2> "$raw/pool.err"
  echo "pool rc=$? wall=$(( $(date +%s) - t0 ))s"
  cp "$raw/pool.out" "$out/pool.md"
  cat "$raw/pool.out"; tail -5 "$raw/pool.err"
fi

if [[ $parts == *" repeat "* ]]; then
  t0=$(date +%s)
  layouts=${REPEAT_LAYOUTS:-tp=2,sequence_parallel=1,mbs=16,impl=sdpa pp=2,vpp=2,mbs=4,impl=sdpa mbs=4,recompute=full,impl=sdpa}
  firsts=${REPEAT_FIRST-pp=2,vpp=2,mbs=4,impl=sdpa mbs=4,recompute=full,impl=sdpa}
  first_args=()
  for f in $firsts; do first_args+=(--first-in-pool "$f"); done
  # shellcheck disable=SC2086  # the layouts are words
  python3 tools/repeatability.py --gpus "$gpus" --rounds "${ROUNDS:-2}" --gbs "${GBS:-32}" \
      --deadline-s "${DEADLINE_S:-430}" --fixed --steps "${STEPS:-12}" --no-rotate \
      "${first_args[@]}" gpt2-large "$gpu" "$raw/repeat" $layouts \
      > "$raw/repeat.out" 2> "$raw/repeat.err"
  echo "repeat rc=$? wall=$(( $(date +%s) - t0 ))s"
  cp "$raw/repeat/report.md" "$out/repeat.md" 2>/dev/null
  cp "$raw/repeat/trials.jsonl" "$out/repeat.jsonl" 2>/dev/null
  tail -c 20000 "$raw/repeat.err" > "$out/repeat.err.txt" 2>/dev/null
  cat "$out/repeat.md" 2>/dev/null || tail -20 "$raw/repeat.err"
fi

if [[ $parts == *" llama "* ]]; then
  t0=$(date +%s)
  python3 tools/device_layouts.py llama3-8b "$gpus" "$gpu" "$raw/hand" \
      gbs=16,distributed_optimizer=1,overlap_grad_reduce=1,recompute=full,recompute_method=block,recompute_num_layers=2,mbs=1,impl=sdpa \
      > "$raw/llama-hand.txt" 2> "$raw/llama-hand.err"
  echo "hand rc=$? wall=$(( $(date +%s) - t0 ))s"
  cat "$raw/llama-hand.txt"; tail -3 "$raw/llama-hand.err"
  cp "$raw/llama-hand.txt" "$out/"
  OUT=$raw STUDY_TIMEOUT_S=${STUDY_TIMEOUT_S:-900} bash tools/device_search.sh \
      l8b-default -- llama3-8b --gpus "$gpus" --gbs 16 --json
fi

if [[ $parts == *" recipe "* ]]; then
  t0=$(date +%s)
  rgbs=${RECIPE_GBS:-$(( 8 * gpus ))}
  if [[ ${RECIPE_HAND:-1} == 1 ]]; then  # 0: the search alone (the recipe measured before)
    python3 tools/device_layouts.py llama3-8b "$gpus" "$gpu" "$raw/recipe" \
        gbs=$rgbs,mbs=1,distributed_optimizer=1,overlap_grad_reduce=1,overlap_param_gather=1,recompute=full,recompute_method=block,recompute_num_layers=5,fp8=hybrid,fp8_recipe=tensorwise,impl=te \
        > "$raw/recipe-hand.txt" 2> "$raw/recipe-hand.err"
    echo "recipe hand rc=$? wall=$(( $(date +%s) - t0 ))s"
    cat "$raw/recipe-hand.txt"; grep -v -i warn "$raw/recipe-hand.err" | tail -3
    cp "$raw/recipe-hand.txt" "$out/"
  fi
  OUT=$raw STUDY_TIMEOUT_S=${STUDY_TIMEOUT_S:-900} bash tools/device_search.sh \
      l8b-recipe -- llama3-8b --gpus "$gpus" --gbs "$rgbs" --json
  cp "$raw/summary.txt" "$raw/results.tgz" "$out/" 2>/dev/null
fi
