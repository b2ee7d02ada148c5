#!/usr/bin/env bash
# Real searches on the device machine: the CLI exactly as a user runs it, one study per run.
#
#   tools/device_search.sh NAME -- AUTOTUNE_ARGS...      (repeatable: NAME -- ARGS ;; NAME -- ARGS)
#
# Needs .whl (megatron-core) and .whl-search (optuna and its deps: alembic, sqlalchemy, greenlet,
# colorlog, mako) carried; the machine's own typer is used (typer 0.29 needs pydantic). Studies go to
# /tmp/r (kept between calls while the machine stays warm); $OUT gets results.tgz and
# summary.txt (every trial: layout, status, measured vs predicted). STUDY_TIMEOUT_S bounds each
# study's wall time (timeout(1); 0, the default: none). RESULTS (default /tmp/r) moves the
# studies elsewhere, so that searches on different GPUs of one host keep apart.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
if [[ ! -d /tmp/site/optuna ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl .whl-search/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}  # keep a caller's path (a lane's TE)
source tools/device_bytecode.sh /tmp/site
out=${OUT:-/tmp/out}
r=${RESULTS:-/tmp/r}
mkdir -p "$r" "$out"
# Studies of an earlier call, brought back and carried as .carry/r, continue with --resume.
[[ -d .carry/r ]] && cp -rn .carry/r/. "$r/"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, torch, megatron.core as mc, optuna; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'megatron-core', mc.__version__, 'optuna', optuna.__version__)"
} 2>&1 | tee "$r/versions.txt"
while [[ $# -gt 0 ]]; do
  name=$1; shift; [[ ${1:-} == -- ]] && shift
  args=()
  while [[ $# -gt 0 && $1 != ";;" ]]; do args+=("$1"); shift; done
  [[ ${1:-} == ";;" ]] && shift
  echo "=== $name: autotune ${args[*]}" | tee -a "$r/commands.txt"
  start=$(date +%s)
  timeout "${STUDY_TIMEOUT_S:-0}" python3 -m autotune.cli "${args[@]}" --results-dir "$r" --study "$name" \
      > "$r/$name.out" 2> "$r/$name.err"
  echo "$name rc=$? wall=$(( $(date +%s) - start ))s" | tee -a "$r/commands.txt"
  tail -5 "$r/$name.err"
done
python3 tools/study_table.py "$r" "${TIMED_STEPS:-10}" > "$out/summary.txt" 2>&1
tar czf "$out/results.tgz" -C "$(dirname "$r")" "$(basename "$r")"
cat "$out/summary.txt"
