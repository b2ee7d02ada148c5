#!/usr/bin/env bash
# Issue 25 on one H100: the repeatability check and the Megatron-LM gap, clocks logged all along.
#
#   PARTS="repeat" SET=a bash tools/device_issue25.sh    (then SET=b in a second call)
#   PARTS="gap" bash tools/device_issue25.sh
#   PARTS="decide" bash tools/device_issue25.sh
#
#   repeat  tools/repeatability.py on gpt2-xl: 10 layouts (SET a: the first five, b: the last
#           five, all: every one; each set of five fits in one call), micro-batch 1-8, no,
#           selective and full recompute, te where Transformer Engine is installed (else sdpa
#           only, and report.md says so). REPEAT_LAYOUTS replaces the set's layouts. ROUNDS (3)
#           rounds, each a warm and a cold pass, which goes first alternating; GBS (default 8:
#           short steps, so that 3 rounds fit) and FIXED (default 1: 2 + 8 fixed steps; FIXED= for adaptive
#           timing, as a search). Stops starting trials
#           after DEADLINE_S (420). -> repeat-SET.md, repeat-SET.jsonl
#   gap     tools/megatron_gap.py: GAP_MODEL (gpt2-xl; GAP_SEQ_LEN overrides its sequence length)
#           GAP_LAYOUT (mbs=16, impl te with TE, else local: the
#           Megatron-LM spec the worker also has) as a worker trial, the exported Megatron-LM
#           command and a worker trial again, GAP_STEPS (35) steps each. -> gap.md, gap-steps.json,
#           megatron-lm.log
#           PROFILE=1 (with py-spy in /tmp/pyspy, tools/device_host_profile.sh installs it):
#           every process sampled, -> gap-prof.txt
#   decide  issue 25's "a search shown deciding correctly between two layouts closer than the
#           spread": `autotune gpt2-xl --gpus 1 --gbs GBS (8) --json` with default flags, host-bound
#           at that batch (tools/device_search.sh, DECIDE_SEARCH_S (240) at most), then its two
#           best (tools/finalist_fields.py) measured by tools/repeatability.py, ROUNDS (3) rounds
#           warm and cold, fixed steps, as the truth the search's order and its ranking line are
#           held against. -> decide-search.json, decide.md, decide.jsonl (~8 min)
#   Always: nvidia-smi's SM and memory clocks, power, temperature and clock event reasons every
#   500 ms for the whole call -> clocks.csv; versions -> versions.txt; everything raw -> raw.tgz.
#
# Carry: .whl (megatron-core), .whl-search (optuna and deps); optional .whl-te (the TE wheel
# and its deps, tools/te_build.sh): without it te layouts are left out; for gap also
# .carry/megatron-lm (Megatron-LM's training code at core_v0.16.1 and its wheels six, regex,
# pyyaml; tools/device_megatron_lm.sh). Wall: repeat about 8 min per SET, gap about 5 min.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
# cuDNN writes why it failed (its errors only: nothing in a run without one), so that a crash such
# as TE's CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED in the warm pool comes back with its reason.
export CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr
out=${OUT:-/tmp/out}
raw=/tmp/issue25
mkdir -p "$out" "$raw"
parts=" ${PARTS:-repeat} "
set_name=${SET:-a}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv -lms 500 > "$out/clocks.csv" 2>&1 &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT

wheels=(.whl/*.whl .whl-search/*.whl)
ls .whl-te/transformer_engine-*.whl > /dev/null 2>&1 && wheels+=(.whl-te/*.whl)
[[ $parts == *" gap "* ]] && wheels+=(.carry/megatron-lm/wheels/*.whl)
if [[ ! -d /tmp/site/megatron ]]; then
  t0=$(now)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "${wheels[@]}" || exit 1
  echo "install: $(since "$t0") s"
fi
export PYTHONPATH=/tmp/site:$PWD:$PWD/tools
source tools/device_bytecode.sh /tmp/site
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader
  python3 -c "import sys, torch, megatron.core as mc, optuna
from autotune.trials.protocol import te_available
te = __import__('transformer_engine').__version__ if te_available() else 'not installed'
print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'megatron-core', mc.__version__, 'optuna', optuna.__version__, 'te', te)"
} 2>&1 | tee "$out/versions.txt"
gpu=$(case $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) in
        *H200*) echo h200 ;; *) echo h100-80gb ;; esac)

part_repeat() {
  local lays
  # Host-bound first (small micro-batches, full recompute), then the larger ones; te pairs.
  local a=(mbs=1,impl=sdpa mbs=2,recompute=selective,impl=sdpa mbs=4,recompute=full,impl=sdpa
           mbs=8,recompute=full,impl=sdpa mbs=8,recompute=selective,impl=sdpa)
  # Set b as of session 15: gpt2-xl mbs 16 without recompute does not fit an H100 (76 GiB, the
  # fp32 logits' 3.07 GiB over), and mbs 1 with full recompute takes 5 s a step; both cost session
  # 15's first set b call most of its rounds (2026-11-28-h100-issue25-repeat-s15.md).
  local b=(mbs=8,impl=sdpa mbs=4,impl=sdpa mbs=2,impl=sdpa
           mbs=8,impl=te mbs=8,recompute=selective,impl=te)
  case $set_name in a) lays=("${a[@]}") ;; b) lays=("${b[@]}") ;; *) lays=("${a[@]}" "${b[@]}") ;; esac
  # shellcheck disable=SC2206  # REPEAT_LAYOUTS is words
  [[ -n ${REPEAT_LAYOUTS:-} ]] && lays=($REPEAT_LAYOUTS)
  # Fixed steps and a small batch by default: at gbs 32 with adaptive timing one round of set a
  # took the whole call (2026-11-28, results/benchmarks/2026-11-28-h100-issue25-repeat-s14.md:
  # mbs 1 ran 6.7 s steps, every trial to its 10-step cap).
  local gbs=${GBS:-8} fixed=${FIXED-1}
  python3 tools/repeatability.py --rounds "${ROUNDS:-3}" --gbs "$gbs" \
      --deadline-s "${DEADLINE_S:-420}" ${fixed:+--fixed} gpt2-xl "$gpu" "$raw/repeat-$set_name" \
      "${lays[@]}" > "$raw/repeat-$set_name.out" 2> "$raw/repeat-$set_name.err"
  local rc=$?
  cp "$raw/repeat-$set_name/report.md" "$out/repeat-$set_name.md" 2>/dev/null
  cp "$raw/repeat-$set_name/trials.jsonl" "$out/repeat-$set_name.jsonl" 2>/dev/null
  cat "$out/repeat-$set_name.md" 2>/dev/null || tail -20 "$raw/repeat-$set_name.err"
  return $rc
}

part_gap() {
  [[ -f .carry/megatron-lm/pretrain_gpt.py ]] || { echo "no .carry/megatron-lm"; return 1; }
  cp tools/run_pretrain_gpt.py .carry/megatron-lm/run_pretrain_gpt.py
  local impl=local
  python3 -c "from autotune.trials.protocol import te_available; exit(0 if te_available() else 1)" && impl=te
  # PROFILE=1: py-spy samples every process of the gap (the worker's ranks and Megatron-LM's),
  # raw stacks to gap-prof.txt; tools/host_profile.py --process pretrain_gpt reads Megatron-LM's.
  local spy=()
  [[ -n ${PROFILE:-} && -x /tmp/pyspy/bin/py-spy ]] && spy=(/tmp/pyspy/bin/py-spy record
      --subprocesses --threads --nonblocking --format raw --rate 100 -o "$out/gap-prof.txt" --)
  "${spy[@]}" python3 tools/megatron_gap.py --steps "${GAP_STEPS:-35}" \
      ${GAP_SEQ_LEN:+--seq-len "$GAP_SEQ_LEN"} "${GAP_MODEL:-gpt2-xl}" "$gpu" "$raw/gap" \
      "$PWD/.carry/megatron-lm/run_pretrain_gpt.py" "${GAP_LAYOUT:-mbs=16,impl=$impl}" \
      > "$raw/gap.out" 2> "$raw/gap.err"
  local rc=$?
  cp "$raw/gap/gap.md" "$out/gap.md" 2>/dev/null
  cp "$raw/gap/steps.json" "$out/gap-steps.json" 2>/dev/null
  tail -c 200000 "$raw/gap/megatron-lm.log" > "$out/megatron-lm.log" 2>/dev/null
  cat "$raw/gap.out"; [[ $rc == 0 ]] || tail -20 "$raw/gap.err"
  return $rc
}

part_decide() {
  local gbs=${GBS:-8}
  OUT=$raw/decide-search STUDY_TIMEOUT_S=${DECIDE_SEARCH_S:-240} bash tools/device_search.sh \
      decide -- gpt2-xl --gpus 1 --gbs "$gbs" --json
  cp /tmp/r/decide.out "$out/decide-search.json" 2>/dev/null
  local top
  mapfile -t top < <(python3 tools/finalist_fields.py /tmp/r/decide.out 2)
  (( ${#top[@]} == 2 )) || { echo "the search named ${#top[@]} layouts"; return 1; }
  echo "the search's two best: ${top[*]}"
  grep -m1 '"ranking"' /tmp/r/decide.out
  python3 tools/repeatability.py --rounds "${ROUNDS:-3}" --gbs "$gbs" \
      --deadline-s "${DEADLINE_S:-240}" --fixed gpt2-xl "$gpu" "$raw/decide" "${top[@]}" \
      > "$raw/decide.out" 2> "$raw/decide.err"
  local rc=$?
  cp "$raw/decide/report.md" "$out/decide.md" 2>/dev/null
  cp "$raw/decide/trials.jsonl" "$out/decide.jsonl" 2>/dev/null
  cat "$out/decide.md" 2>/dev/null || tail -20 "$raw/decide.err"
  return $rc
}

for part in repeat gap decide; do
  [[ $parts == *" $part "* ]] || continue
  echo "=== $part"
  start=$(now)
  "part_$part"
  echo "=== $part rc=$? wall=$(since "$start")s"
done
kill $smi 2>/dev/null
tar czf "$out/raw.tgz" --exclude='*.pt' -C /tmp issue25
