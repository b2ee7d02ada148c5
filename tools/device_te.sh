#!/usr/bin/env bash
# Transformer Engine (2.11, built by tools/te_build.sh) on the device machine: its install, TE
# against sdpa on the same layouts, context and sequence parallelism, and a default search whose
# winner runs again as Megatron-LM's own pretrain_gpt.py.
#
#   PARTS="install pairs" bash tools/device_te.sh     (PARTS: any of the parts below, in order)
#
#   install  times the pip install of .whl .whl-search .whl-te into /tmp/site on a fresh machine
#            (skipped, and said so, when /tmp/site/transformer_engine is there: machine warm) and
#            the first `import transformer_engine.pytorch`; versions. -> install.txt
#   pairs    1 GPU: the same layouts with impl=te and impl=sdpa, through tools/device_layouts.py.
#            PAIRS_MODELS (default "gpt2-xl"; "gpt2-large" in a second call: both in one call
#            come near the 10-minute limit). -> pairs.txt
#   cp       2 GPUs: gpt2-xl, gbs 4, seq 4096/8192/16384 (CP_SEQS), cp=2 te against cp=1 dp=2
#            (te and, for reference, sdpa). -> cp.txt
#   sp       2 GPUs: gpt2-large tp=2 with and without sequence parallelism, te against sdpa.
#            -> sp.txt
#   search   1 GPU: `autotune gpt2-xl --gpus 1` (no other flag) through tools/device_search.sh
#            (-> summary.txt, results.tgz), then `autotune export --format megatron-lm` of its
#            winner, run unchanged with .carry/megatron-lm; worker against Megatron-LM tokens/s.
#            -> search.txt. An sdpa winner (Megatron-LM runs it with TE's spec) also gets its te
#            twin measured by the worker, beside Megatron-LM's figure.
#   Every part's raw output (trial folders, rows.json, logs) goes to /tmp/te/PART, all of it to
#   te.tgz at the end: at most 8 files in $OUT (install pairs cp sp search .txt, summary.txt,
#   results.tgz, te.tgz).
#
# Carry: .whl (megatron-core), .whl-search (optuna and deps), .whl-te (the TE wheel with
# pydantic, pydantic_core, annotated_types, typing_inspection, typing_extensions,
# importlib_metadata); for search also .carry/megatron-lm (Megatron-LM's training code at
# core_v0.16.1 and its wheels six, regex, pyyaml; see tools/device_megatron_lm.sh).
# Each part runs even when an earlier one failed; its rc and wall time are printed.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
te=/tmp/te
mkdir -p "$out" "$te"
parts=" ${PARTS:-install pairs} "
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# The wheels, once per machine: every part needs them; `install` reports the time.
if [[ -d /tmp/site/transformer_engine ]]; then
  install_note="skipped: /tmp/site/transformer_engine exists (machine still warm)"
else
  ls .whl-te/transformer_engine-*.whl > /dev/null 2>&1 || { echo "no TE wheel in .whl-te"; exit 1; }
  t0=$(now)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl .whl-search/*.whl .whl-te/*.whl || exit 1
  install_note="$(since "$t0") s wall (pip install of .whl .whl-search .whl-te, fresh machine)"
fi
export PYTHONPATH=/tmp/site:$PWD
echo "install: $install_note"

part_install() {
  local t0 f=$out/install.txt
  {
    echo "pip install: $install_note"
    echo "wheels: $(cd .whl-te && ls transformer_engine-*.whl) $(du -ch .whl-te/*.whl | tail -1 | cut -f1)"
    t0=$(now)
    python3 -c "import transformer_engine as te, transformer_engine.pytorch; print('te', te.__version__)"
    echo "first import transformer_engine.pytorch: rc=$? $(since "$t0") s wall"
    t0=$(now)
    python3 -c "import transformer_engine as te, transformer_engine.pytorch; print('te', te.__version__)"
    echo "second import (files cached): rc=$? $(since "$t0") s wall"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import sys, torch, megatron.core as mc, transformer_engine as te, optuna
print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'cudnn', torch.backends.cudnn.version(), 'te', te.__version__,
      'megatron-core', mc.__version__, 'optuna', optuna.__version__)"
    python3 -c "from autotune.trials.protocol import te_available; print('autotune te_available:', te_available())"
  } > "$f" 2>&1
  cat "$f"
}

gpu_name() {  # autotune's GPU name for the machine's first GPU
  case $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) in
    *H200*) echo h200 ;; *) echo h100-80gb ;;
  esac
}

# layouts DIR TXT MODEL GPUS [--seq-len N] -- LAYOUT...: tools/device_layouts.py, table to TXT.
layouts() {
  local dir=$1 txt=$2; shift 2
  local model=$1 gpus=$2; shift 2
  local opts=()
  while [[ $1 != -- ]]; do opts+=("$1"); shift; done; shift
  rm -rf "$dir" && mkdir -p "$dir"  # a warm machine's earlier call came back in its te.tgz
  local t0; t0=$(now)
  echo "## $model on $gpus x $(gpu_name) ${opts[*]}" | tee -a "$txt"
  python3 tools/device_layouts.py "${opts[@]}" "$model" "$gpus" "$(gpu_name)" "$dir" "$@" \
      > "$dir/stdout.txt" 2> "$dir/stderr.txt"
  local rc=$?
  grep "^|" "$dir/stdout.txt" | tee -a "$txt"
  echo "device_layouts rc=$rc wall=$(since "$t0")s" | tee -a "$txt"
  [[ $rc == 0 ]] || tail -5 "$dir/stderr.txt" | tee -a "$txt"
  [[ -f $dir/rows.json ]] && python3 -c "import json, sys
for r in json.load(open(sys.argv[1])):
    if r['error']: print('error:', r['layout'], '-', r['error'][0][:300])" "$dir/rows.json" \
      | tee -a "$txt"
  echo | tee -a "$txt"
}

# Each layout twice, impl=te then impl=sdpa.
both_impls() { local l; for l in "$@"; do echo "$l,impl=te" "$l,impl=sdpa"; done; }

part_pairs() {
  local model lays
  for model in ${PAIRS_MODELS:-gpt2-xl}; do
    case $model in
      # The sizes of 2026-11-21-h100-gpt2-xl-mfu.md and the self-stopping search (mbs16 sdpa
      # was the best without TE), with and without recompute.
      gpt2-xl) lays=(mbs=4 mbs=8 mbs=16 mbs=16,recompute=selective) ;;
      gpt2-large) lays=(mbs=8 mbs=16 mbs=32,recompute=selective) ;;
      *) lays=(mbs=4 mbs=8) ;;
    esac
    # shellcheck disable=SC2046
    layouts "$te/pairs/$model" "$out/pairs.txt" "$model" 1 -- $(both_impls "${lays[@]}")
  done
}

part_cp() {
  # The seed tutorial's CP experiment (/work/shared/seeds/000_*.txt, "Context Parallelism"):
  # gpt2-xl (a preset), GBS 4, seq 4096 (cp1 OOMed there on one 80 GB H100), 8192, 16384.
  # Here cp=2 (dp1) against cp=1 dp=2 on the same two GPUs, both mbs 1 (CP_EXTRA adds
  # layouts, e.g. cp=2,gbs=4,mbs=2,impl=te: the same tokens per GPU as dp=2 mbs 1). CP needs impl=te (layout rule); te
  # against sdpa is the pairs part's and the sp part's.
  local seq
  for seq in ${CP_SEQS:-4096 8192 16384}; do
    layouts "$te/cp/seq$seq" "$out/cp.txt" gpt2-xl 2 --seq-len "$seq" -- \
        cp=2,gbs=4,mbs=1,impl=te cp=1,gbs=4,mbs=1,impl=te ${CP_EXTRA:-}
  done
}

part_sp() {
  # TE's LayerNorm and its fused linear+norm under sequence parallelism against the local
  # spec's with sdpa; tp2 without SP as the reference (2026-11-21-h200x2-worker-layouts.md).
  # shellcheck disable=SC2046
  layouts "$te/sp" "$out/sp.txt" gpt2-large 2 -- $(both_impls \
      tp=2,sequence_parallel=1,mbs=32 tp=2,sequence_parallel=1,mbs=16 tp=2,mbs=32)
}

# Megatron-LM's log: the median of "elapsed time per iteration (ms)" from iteration 3 on, as
# tokens/s with the global batch and sequence length of the exported layout.
mlm_tokens() {
  python3 - "$1" "$2" << 'EOF'
import json, re, statistics, sys
log, layout = open(sys.argv[1], errors="replace").read(), json.load(open(sys.argv[2]))
it = [(int(a), float(b)) for a, b in re.findall(
    r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([\d.]+)", log)]
ms = [t for i, t in it if i >= 3]
mem = list(zip(re.findall(r"max allocated: ([\d.]+)", log),
               re.findall(r"max reserved: ([\d.]+)", log)))
if not ms:
    print("megatron-lm: no iteration times in the log"); sys.exit(1)
step = statistics.median(ms) / 1000
tok = layout["gbs"] * layout["seq_length"] / step
worker = layout["tokens_per_s"]
print(f"megatron-lm: {tok:,.0f} tokens/s (median {step:.3f} s of iterations 3-{it[-1][0]}, "
      f"{min(ms) / 1000:.3f}-{max(ms) / 1000:.3f} s)"
      # The last report: after iteration 1 Adam's states did not exist yet at the peak.
      + (f", max allocated {float(mem[-1][0]) / 1024:.2f} GiB, reserved "
         f"{float(mem[-1][1]) / 1024:.2f} GiB" if mem else ""))
print(f"worker: {worker:,.0f} tokens/s ({'predicted' if layout.get('predicted') else 'measured'})"
      f"; megatron-lm / worker = {tok / worker:.3f}")
EOF
}

part_search() {
  local f=$out/search.txt r=/tmp/r t0 rc
  [[ -f .carry/megatron-lm/pretrain_gpt.py ]] || { echo "no .carry/megatron-lm" | tee "$f"; return 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .carry/megatron-lm/wheels/*.whl || return 1
  t0=$(now)
  bash tools/device_search.sh te-default -- gpt2-xl --gpus 1
  echo "search (device_search.sh) rc=$? wall=$(since "$t0")s" | tee "$f"
  grep -v "Warning\|warnings.warn" "$r/te-default.err" | tail -4 | tee -a "$f"
  cp tools/run_pretrain_gpt.py .carry/megatron-lm/run_pretrain_gpt.py
  local mlm=$PWD/.carry/megatron-lm/run_pretrain_gpt.py
  python3 -m autotune.cli export --study te-default --results-dir "$r" --format json \
      -o "$r/winner.json" 2>&1 | tee -a "$f"
  python3 -m autotune.cli export --study te-default --results-dir "$r" --format megatron-lm \
      --megatron-lm "$mlm" --train-iters 10 -o "$r/exported-megatron-lm.sh" 2>&1 | tee -a "$f"
  grep "^# \|transformer-impl" "$r/exported-megatron-lm.sh" | tee -a "$f"
  t0=$(now)
  bash "$r/exported-megatron-lm.sh" > "$r/exported-megatron-lm.log" 2>&1
  rc=$?
  echo "exported script (unchanged) rc=$rc wall=$(since "$t0")s" | tee -a "$f"
  if [[ $rc != 0 ]]; then
    grep -v "Warning\|warnings.warn" "$r/exported-megatron-lm.log" | grep -m3 -B2 "Error" \
        | tee -a "$f"
  else
    mlm_tokens "$r/exported-megatron-lm.log" "$r/winner.json" 2>&1 | tee -a "$f"
  fi
  # Megatron-LM has no impl sdpa: an sdpa winner is exported with TE's spec. Its te twin, the
  # same layout measured by the worker with impl te, is the worker figure to set beside it.
  local twin
  twin=$(python3 -c "import json, sys
from autotune.layouts.layout import DIMENSIONS
w = json.load(open(sys.argv[1]))
if w['impl'] == 'sdpa':
    print(','.join(f'{k}={w[k]}' for k in DIMENSIONS if k not in ('impl', 'dp')) + ',impl=te')
" "$r/winner.json")
  if [[ -n $twin ]]; then
    layouts "$te/twin" "$f" gpt2-xl 1 -- "$twin"
    python3 - "$te/twin/rows.json" "$r/exported-megatron-lm.log" << 'EOF2' 2>&1 | tee -a "$f"
import json, re, statistics, sys
row = json.load(open(sys.argv[1]))[0]
log = open(sys.argv[2], errors="replace").read()
ms = [float(b) for a, b in re.findall(
    r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([\d.]+)", log) if int(a) >= 3]
if row.get("tokens_per_s") and ms:
    step = statistics.median(ms) / 1000
    print(f"worker te twin: {row['tokens_per_s']:,.0f} tokens/s; megatron-lm step {step:.3f} s; "
          f"megatron-lm / te twin = {row['step_time_s'] / step:.3f}")
EOF2
  fi
  grep -E "iteration +[0-9]+/|memory \(MB\)" "$r"/exported-megatron-lm*.log | tail -4 | tee -a "$f"
  tar czf "$out/results.tgz" -C /tmp r  # again, now with the exported scripts and logs
  return "$rc"
}

for part in install pairs cp sp search; do
  [[ $parts == *" $part "* ]] || continue
  echo "=== $part"
  start=$(now)
  "part_$part"
  rc=$?
  echo "=== $part rc=$rc wall=$(since "$start")s" | tee -a "$te/parts.txt"
done
tar czf "$out/te.tgz" -C /tmp te
