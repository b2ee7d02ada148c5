# Sourced by the one-GPU device scripts that run autotune with Transformer Engine
# (tools/device_issue26.sh, device_qwen3.sh, device_shared_expert.sh, device_moe_experts.sh):
# the NCCL settings the lent machines need, the carried wheels installed once per machine
# (.whl .whl-search .whl-te), PYTHONPATH, $out (= $OUT), `elapsed`, and versions.txt. With
# CLOCKS=1 it also records NVML clocks to $out/clocks.csv for the script's lifetime.
source tools/device_env.sh
if [[ ! -d /tmp/site/transformer_engine ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl .whl-search/*.whl .whl-te/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD
echo "installed at $(elapsed)"
python3 -c "import sys, torch, megatron.core as mc, transformer_engine as te, optuna
print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'megatron-core', mc.__version__, 'te', te.__version__, 'optuna', optuna.__version__)" \
  2>&1 | grep -v -i warn | tee "$out/versions.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader \
  | tee -a "$out/versions.txt"
if [[ ${CLOCKS:-0} == 1 ]]; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
      --format=csv -lms 1000 > "$out/clocks.csv" 2>&1 &
  smi=$!
  trap 'kill $smi 2>/dev/null' EXIT
fi
# fixed_grid NAME SHAPE SPACE: one study of tools/shapes/SHAPE.yaml over tools/spaces/SPACE.yaml
# by the grid sampler at fixed steps (3 warm-up, 6 timed; tools/device_search.sh), in /tmp/r;
# skipped when fewer than 60 s of the call's CALL_LIMIT_S are left.
fixed_grid() {
  if (( $(date +%s) - start > ${CALL_LIMIT_S:?the caller sets it} - 60 )); then
    echo "$1 skipped"; return
  fi
  bash tools/device_search.sh "$1" -- "tools/shapes/$2.yaml" --gpus 1 --sampler grid \
      --stop-rule none --stable-cv 0 --warmup-steps 3 --steps 6 \
      --space "tools/spaces/$3.yaml" > /dev/null
  echo "$1 done at $(elapsed)"; tail -2 "/tmp/r/$1.err"
}
# grid_summary: the studies of /tmp/r as $OUT/summary.txt (6 timed steps), losses.txt and
# results.tgz.
grid_summary() {
  python3 tools/study_table.py /tmp/r 6 > "$out/summary.txt" 2>&1
  python3 tools/trial_losses.py /tmp/r > "$out/losses.txt" 2>&1
  tar czf "$out/results.tgz" -C /tmp r
  cat "$out/summary.txt"
  echo "total $(elapsed)"
}
