#!/usr/bin/env bash
# Real worker trials on the device machine, one torchrun per case, then one table.
#
#   tools/device_worker_bench.sh CASE...
#   CASE = name:model:impl:mbs:recompute[:sdpa_backend[:VAR=value[:gbs]]]
#          e.g. xl-sdpa8:gpt2-xl:sdpa:8:none     (model: a preset name or a .yaml path;
#          impl sdpa+cef adds Megatron's fused cross entropy)
#   A name starting with "prof" runs tools/device_profile.py on that trial instead.
#
# Needs the megatron-core wheel in .whl/ (carried). Logs of every case go to $OUT/runs.tgz,
# the table to $OUT/table.txt. CASE_TIMEOUT (s, default 180) bounds each case.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
out=${OUT:-/tmp/out}
work=/tmp/bench
mkdir -p "$work" "$out"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, torch, megatron.core as mc; print('python', sys.version.split()[0],
'torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(),
'megatron-core', mc.__version__)"
} 2>&1 | tee "$work/versions.txt"

port=29500
for case in "$@"; do
  IFS=: read -r name model impl mbs recompute backend extra gbs <<< "$case"
  [[ $model == *.yaml ]] || model=search_spaces/models/$model.yaml
  dir=$work/$name
  port=$((port + 1))
  python3 tools/device_worker_bench.py spec "$dir" "$model" \
      "$impl" "$mbs" "$recompute" ${gbs:+"$gbs"} || continue
  start=$(date +%s.%N)
  if [[ $name == prof* ]]; then
    entry=(tools/device_profile.py "$dir/trial.json" "$dir/profile.txt")
  else
    entry=(-m autotune.worker --spec "$dir/trial.json" --out-dir "$dir")
  fi
  env AUTOTUNE_SDPA_BACKEND="${backend:-auto}" ${extra:+"$extra"} timeout "${CASE_TIMEOUT:-180}" \
      torchrun --nproc-per-node 1 --rdzv-endpoint "127.0.0.1:$port" "${entry[@]}" \
      > "$dir/log.txt" 2>&1
  echo $? > "$dir/rc"
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f\n", b - a }' > "$dir/wall_s"
  echo "== $case rc=$(cat "$dir/rc") wall=$(cat "$dir/wall_s")s"
  grep -E "AUTOTUNE_|Error|error" "$dir/log.txt" | grep -v Warning | tail -4
  [[ $name == prof* ]] && head -16 "$dir/profile.txt"
done

runs=()
for d in "$work"/*/; do [[ $(basename "$d") == prof* ]] || runs+=("$d"); done
python3 tools/device_worker_bench.py table "${runs[@]}" | tee "$out/table.txt"
cat "$work/versions.txt" >> "$out/table.txt"
tar czf "$out/runs.tgz" -C /tmp bench
