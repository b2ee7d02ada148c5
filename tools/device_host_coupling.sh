#!/usr/bin/env bash
# Why host-bound layouts run slower per layer and micro-batch on several ranks than on one
# (results/benchmarks/2026-11-29-cpu-x4-step-miss-s26.md, section 6): the same per-rank work on
# one machine, cold launches through autotune's runner and worker (tools/device_layouts.py, 2
# warm-up and 5 timed steps), with one thing changed at a time.
#
#   CALL_LIMIT_S=560 bash tools/device_host_coupling.sh     (carry .whl .whl-search [.whl-pyspy])
#
# CASES: one per line, "NAME GPUS KNOBS LAYOUT [MODEL [SEQ]]":
#   GPUS   ranks of one run; "1+1" runs two one-GPU trials at once, one per GPU (two processes
#          on the host, no collectives between them)
#   KNOBS  comma-separated, "-" for none: nocheck (both NaN checks off: the layout's
#          nan_checks=0, autotune.levers.nan_checks), nogradcheck (only the gradient buckets'
#          check off, as NeMo's performance recipes run: megatron-core's DDP config patched),
#          pin (each rank on its own nproc/GPUS cores, by LOCAL_RANK; on 2 x H200 the 2-rank
#          pinned run hung, 2026-11-29), spy (py-spy records the
#          run's process tree, Python frames, --nonblocking; needs .whl-pyspy)
# The knobs are set by a sitecustomize module on PYTHONPATH, so the worker runs unchanged.
# $OUT: rows.txt (one JSON row per run, with the case's name), table.md, host.txt (the ranks'
# host records), trials.tgz (every trial folder), clocks.csv, versions.txt, prof-*.txt.
source tools/device_env.sh
# TE is not needed: the cases run megatron-core's own layers (impl sdpa or local).
[[ -d /tmp/site/optuna ]] || python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whl-search/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
source tools/device_bytecode.sh /tmp/site
python3 -c "import sys, torch, megatron.core as mc
print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'megatron-core', mc.__version__)" 2>&1 | grep -v -i warn > "$out/versions.txt"
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm,power.limit \
    --format=csv,noheader >> "$out/versions.txt"
echo "cores $(nproc)" >> "$out/versions.txt"
cat "$out/versions.txt"
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,utilization.gpu,clocks_event_reasons.active \
    --format=csv -lms 500 > "$out/clocks.csv" 2>&1 &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT
[[ -x /tmp/pyspy/bin/py-spy || ! -d .whl-pyspy ]] || python3 -m pip install -q --no-index \
    --no-deps --target /tmp/pyspy .whl-pyspy/*.whl
gpu=$(case $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) in
        *H200*) echo h200 ;; *) echo h100-80gb ;; esac)
ngpu=$(nvidia-smi -L | wc -l)
root=/tmp/hc
mkdir -p "$root"
knob_dir() {  # knob_dir KNOBS: a folder whose sitecustomize.py applies them
  local dir=$root/site-${1//,/_}
  mkdir -p "$dir"
  {
    echo "import os"
    # The worker's build imports core_config by name: patched before it is imported.
    [[ ,$1, == *,nogradcheck,* ]] && cat <<'EOF'
import dataclasses
import autotune.megatron.core_config as _c
_built = _c.core_config
def _unchecked(model, layout):
    config = _built(model, layout)
    return dataclasses.replace(config, ddp={**config.ddp, "check_for_nan_in_grad": False})
_c.core_config = _unchecked
EOF
    [[ ,$1, == *,pin,* ]] && cat <<EOF
if "LOCAL_RANK" in os.environ:
    _n = os.cpu_count() // $ngpu
    _r = int(os.environ["LOCAL_RANK"]) + int(os.environ.get("HC_LANE", "0"))
    os.sched_setaffinity(0, range(_r * _n, (_r + 1) * _n))
EOF
  } > "$dir/sitecustomize.py"
  echo "$dir"
}
one() {  # one NAME GPUS KNOBS LAYOUT MODEL SEQ [LANE]: a run; its JSON row goes to rows.txt
  local name=$1 gpus=$2 knobs=$3 layout=$4 model=$5 seq=$6 lane=${7:-0} site cmd
  site=$(knob_dir "$knobs")
  [[ ,$knobs, == *,nocheck,* ]] && layout+=",nan_checks=0"
  cmd=(python3 tools/device_layouts.py --seq-len "$seq" "$model" "$gpus" "$gpu" "$root/$name"
       "$layout")
  if [[ ,$knobs, == *,spy,* && -x /tmp/pyspy/bin/py-spy ]]; then
    cmd=(/tmp/pyspy/bin/py-spy record --subprocesses --threads --nonblocking --format raw
         --rate 100 -o "$out/prof-$name.txt" -- "${cmd[@]}")
  fi
  HC_LANE=$lane PYTHONPATH=$site:$PYTHONPATH timeout -k 10 "${RUN_LIMIT_S:-120}" "${cmd[@]}" \
      > "$root/$name.log" 2>&1
  local rc=$?
  # A run stopped at its limit can leave its ranks behind, holding the GPUs: end them.
  (( rc == 124 || rc == 137 )) && pkill -9 -f "autotune.worker" 2>/dev/null
  grep '^{' "$root/$name.log" | sed "s/^{/{\"case\": \"$name\", \"knobs\": \"$knobs\", /" \
      >> "$out/rows.txt"
  echo "$name rc=$rc at $(elapsed): $(grep -o '"status": "[A-Z_]*"\|"step_time_s": [0-9.]*' \
      "$root/$name.log" | tr '\n' ' ')"
}
: > "$out/rows.txt"
while read -r name gpus knobs layout model seq; do
  [[ -z $name || $name == \#* ]] && continue
  if (( $(date +%s) - start > ${CALL_LIMIT_S:-560} - 60 )); then echo "$name skipped"; continue; fi
  model=${model:-gpt2-xl}; seq=${seq:-1024}
  if [[ $gpus == 1+1 ]]; then
    CUDA_VISIBLE_DEVICES=0 one "$name-a" 1 "$knobs" "$layout" "$model" "$seq" 0 &
    CUDA_VISIBLE_DEVICES=1 one "$name-b" 1 "$knobs" "$layout" "$model" "$seq" 1 &
    wait
  else
    one "$name" "$gpus" "$knobs" "$layout" "$model" "$seq"
  fi
done <<< "${CASES:?one case per line}"
python3 - "$out/rows.txt" > "$out/table.md" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print("| case | knobs | layout | status | step s | pred step s | err % | tokens/s |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    m, p = r["step_time_s"], r["predicted_step_time_s"]
    err = f"{(m / p - 1) * 100:+.1f}" if m else "-"
    print(f"| {r['case']} | {r['knobs']} | {r['layout']} gbs{r['gbs']} | {r['status']} | "
          f"{m or 0:.3f} | {p:.3f} | {err} | {r['tokens_per_s'] or 0:,.0f} |")
EOF
find "$root" -name 'result*.json' | sort | while read -r f; do
  echo "== $f"; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d.get('host', d.get('ranks', '')))[:3000])" "$f"
done > "$out/host.txt" 2>&1
tar czf "$out/trials.tgz" -C /tmp hc
cat "$out/table.md"
echo "total $(elapsed)"
