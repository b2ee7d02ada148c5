#!/usr/bin/env bash
# Where a host-bound trial's host time goes (issue 25): py-spy samples a cold worker trial's
# whole process tree while it runs, once at the Python level and once with native frames.
#
#   LAYOUTS="mbs=1,impl=sdpa,gbs=8 mbs=4,recompute=full,impl=sdpa,gbs=32" bash tools/device_host_profile.sh
#
# Each layout of gpt2-xl (MODEL) runs cold through tools/device_layouts.py (2 warm-up, 5 timed
# steps), under `py-spy record --subprocesses --nonblocking --format raw` (RATE, default 100 Hz;
# --nonblocking: the sampled process is not paused, so the step times stay the process's own),
# then again with --native (MODES, default "py native"). tools/host_profile.py reads the raw files.
# Carry: .whl (megatron-core), .whl-search (optuna and deps), .whl-pyspy (py-spy 0.4.x).
# $OUT: prof-<i>-<py|native>.txt (raw stacks), run-<i>-<py|native>.txt (measured figures).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
mkdir -p "$out"
if [[ ! -d /tmp/site/optuna ]]; then
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl .whl-search/*.whl || exit 1
fi
[[ -x /tmp/pyspy/bin/py-spy ]] || python3 -m pip install -q --no-index --no-deps \
    --target /tmp/pyspy .whl-pyspy/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
gpu=$(case $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) in
        *H200*) echo h200 ;; *) echo h100-80gb ;; esac)
i=0
for layout in ${LAYOUTS:-mbs=1,impl=sdpa,gbs=8}; do
  for mode in ${MODES:-py native}; do
    flags=(--subprocesses --threads --format raw --rate "${RATE:-100}")
    # py-spy refuses --native with --nonblocking: the native run pauses the process per sample.
    if [[ $mode == native ]]; then flags+=(--native); else flags+=(--nonblocking); fi
    timeout 300 /tmp/pyspy/bin/py-spy record "${flags[@]}" -o "$out/prof-$i-$mode.txt" -- \
        python3 tools/device_layouts.py "${MODEL:-gpt2-xl}" 1 "$gpu" "/tmp/hp-$i-$mode" \
        "$layout" > "$out/run-$i-$mode.txt" 2>&1
    echo "$layout $mode rc=$?"; grep -E "OK|OOM|FAIL|CRASH" "$out/run-$i-$mode.txt" | tail -2
  done
  i=$((i + 1))
done
