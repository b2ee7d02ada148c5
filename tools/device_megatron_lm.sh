#!/usr/bin/env bash
# Megatron-LM's own pretrain_gpt.py on the device machine, two ways:
#   1. a worker trial (impl local) is exported with `autotune export --format megatron-lm` and
#      the script it writes runs unchanged;
#   2. `autotune ... --backend megatron-lm` runs a small search whose trials are pretrain_gpt.py.
#
#   tools/device_megatron_lm.sh MODEL SPACE_YAML
#   PARTS="1 2" (default) picks the parts to run.
#
# Carry .whl (megatron-core), .whl-search (optuna, typer, pydantic...) and .carry/megatron-lm:
# Megatron-LM's training code at tag core_v0.16.1, not part of this repository:
#   git --git-dir MIRROR archive core_v0.16.1 pretrain_gpt.py gpt_builders.py model_provider.py \
#       megatron/training megatron/legacy megatron/post_training megatron/rl | tar x -C .carry/megatron-lm
# (training.py imports megatron.rl at its top: without it every run stops at the import), and
# its extra wheels (six, regex, pyyaml) in .carry/megatron-lm/wheels.
# tools/run_pretrain_gpt.py, copied beside pretrain_gpt.py, skips the two build steps
# pretrain_gpt.py takes from a source checkout (make of the dataset helpers, which the
# megatron-core wheel ships prebuilt; nvcc -V, with no CUDA toolkit on the machine) and then
# runs pretrain_gpt.py unchanged.
set -u
model=${1:?model} space=${2:?space yaml}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl .whl-search/*.whl .carry/megatron-lm/wheels/six-*.whl \
    .carry/megatron-lm/wheels/regex-*.whl .carry/megatron-lm/wheels/pyyaml-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
out=${OUT:-/tmp/out}
r=/tmp/r
mkdir -p "$r" "$out"
# The wrapper beside pretrain_gpt.py finds the checkout by its own folder.
cp tools/run_pretrain_gpt.py .carry/megatron-lm/run_pretrain_gpt.py
mlm=$PWD/.carry/megatron-lm/run_pretrain_gpt.py
at() { python3 -m autotune.cli "$@"; }
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, torch, megatron.core as mc, optuna; print('python', sys.version.split()[0], 'torch', torch.__version__, 'megatron-core', mc.__version__, 'optuna', optuna.__version__)"
} 2>&1 | tee "$r/versions.txt"
common=(--gpus 1 --space "$space" --steps 4 --warmup-steps 2 --results-dir "$r" --json)

parts=" ${PARTS:-1 2} "
if [[ $parts == *" 1 "* ]]; then
echo "=== 1. worker trial, then its exported Megatron-LM command, unchanged"
# A worker study of an earlier call, carried as .carry/r/mlm-worker, is exported as it is.
if [[ -d .carry/r/mlm-worker ]]; then
  cp -r .carry/r/mlm-worker "$r/"
else
  at "$model" "${common[@]}" --backend worker --trials 1 --study mlm-worker \
      > "$r/mlm-worker.out" 2> "$r/mlm-worker.err"; echo "worker rc=$?"
fi
at export --study mlm-worker --results-dir "$r" --format megatron-lm --megatron-lm "$mlm" \
    --train-iters 10 -o "$r/exported-megatron-lm.sh"; echo "export rc=$?"
start=$(date +%s)
bash "$r/exported-megatron-lm.sh" > "$r/exported-megatron-lm.log" 2>&1
echo "exported script rc=$? wall=$(( $(date +%s) - start ))s"
grep -E "iteration +[0-9]+/|memory \(MB\)" "$r/exported-megatron-lm.log" | tail -6
fi

if [[ $parts == *" 2 "* ]]; then
echo "=== 2. --backend megatron-lm"
start=$(date +%s)
at "$model" "${common[@]}" --backend megatron-lm --megatron-lm "$mlm" \
    --trials "${BACKEND_TRIALS:-2}" \
    --study mlm-backend > "$r/mlm-backend.out" 2> "$r/mlm-backend.err"
echo "backend search rc=$? wall=$(( $(date +%s) - start ))s"
tail -5 "$r/mlm-backend.err"
fi
python3 tools/study_table.py "$r" 4 > "$out/summary.txt" 2>&1
tar czf "$out/results.tgz" -C /tmp r
cat "$out/summary.txt"
