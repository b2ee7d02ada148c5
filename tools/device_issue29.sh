#!/usr/bin/env bash
# Issue 29 on one H100 (about 7 minutes; the timeouts bound it under 9): autotune's worker on
# megatron-core 0.19.x against 0.16.1 in one call, a default search on 0.19.x, and the rules
# cross-check on 0.19.x.
#
#   tools/device_issue29.sh            (run with carry [".whl"]; WHL=DIR for another folder)
#
# .whl/ (git-ignored) holds, downloaded with `pip download --no-deps --python-version 3.12
# --only-binary=:all: --platform manylinux_2_28_x86_64 ...`:
#   mcore016/megatron_core-0.16.1-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl
#   mcore019/megatron_core-0.19.2-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl
#   search/  optuna 5.0.0, alembic, sqlalchemy, greenlet, colorlog, mako (the machine has none)
# Everything else (torch 2.11+cu130, triton, numpy, packaging, typer, rich, pyyaml, nvidia-ml-py)
# is the machine's own. Each megatron-core goes into its own folder, chosen per step through
# PYTHONPATH; autotune.megatron.megatron_versions reads the version from that folder's metadata.
#
# Steps:
#  1. the same 8 one-GPU layouts (tools/spaces/issue29-versions.yaml: gpt2-large, gbs 16, impl
#     local/sdpa, mbs 2/4, recompute none/selective) as a grid through the CLI (warm pool, fixed
#     2 warm-up + 6 timed steps, no stop rule), under 0.16.1, then under 0.19.x;
#  2. the rules cross-check (tools/rules_crosscheck.py, CPU) under 0.19.x, in the background
#     of steps 3 and 4;
#  3. tests/test_worker_gpu.py's tiny MoE trial and OOM under 0.19.x (MoE without TE, OOM path);
#  4. `autotune gpt2-large --gpus 1` with the default space and search under 0.19.x (80 s
#     budget);
#  5. prints the versions, the joined table (tools/versions_table.py: tokens/s within 3%?), the
#     cross-check's summary and the search's trials. $OUT gets summary.md, results.tgz (the
#     studies and logs) and the cross-check's report (rules-crosscheck-<version>.json/.md).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
work=/tmp/i29
mkdir -p "$out" "$work"
start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start ))s"; }

install() {  # TARGET WHEEL...
  local target=$1; shift
  [[ -d $target ]] || python3 -m pip install -q --no-index --no-deps --no-compile \
      --no-cache-dir --target "$target" "$@" || exit 1
}
whl=${WHL:-.whl}
install /tmp/site "$whl"/search/*.whl
install /tmp/mc016 "$whl"/mcore016/*.whl
install /tmp/mc019 "$whl"/mcore019/*.whl
use() { export PYTHONPATH=/tmp/mc$1:/tmp/site:$PWD; }

{
  echo "# Issue 29: megatron-core 0.16.1 and 0.19.x on one GPU"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  for v in 016 019; do
    use $v
    python3 -c "import sys, torch, optuna, megatron.core as mc
from autotune.megatron.megatron_versions import installed_version, running
print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'megatron-core', mc.__version__, '(metadata', installed_version(), 'row',
      running().version + ')', 'optuna', optuna.__version__)" 2>&1 | grep -v Warning
  done
  echo "installed in $(elapsed)"
} | tee "$work/summary.md"

grid() {  # VERSION
  use "$1"
  echo "=== grid under megatron-core $1 ($(elapsed))"
  timeout 140 python3 -m autotune.cli gpt2-large --gpus 1 --gbs 16 \
      --space tools/spaces/issue29-versions.yaml --sampler grid --stop-rule none \
      --stable-cv 0 --steps 6 --warmup-steps 2 --results-dir "$work/grid-$1" \
      > "$work/grid-$1.out" 2> "$work/grid-$1.err"
  echo "grid $1 rc=$? at $(elapsed)"
  tail -3 "$work/grid-$1.err"
}
grid 016
grid 019

use 019
OMP_NUM_THREADS=2 python3 tools/rules_crosscheck.py --out "$out" > "$work/rules.log" 2>&1 &
rules=$!

echo "=== tiny MoE trial and OOM under megatron-core 0.19 ($(elapsed))"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_worker_gpu.py -k "moe or oom" \
    > "$work/worker-gpu-019.log" 2>&1
echo "worker GPU tests rc=$? at $(elapsed)"
tail -2 "$work/worker-gpu-019.log"

echo "=== default search under megatron-core 0.19 ($(elapsed))"
timeout 140 python3 -m autotune.cli gpt2-large --gpus 1 --time-budget 80 \
    --results-dir "$work/search-019" > "$work/search-019.out" 2> "$work/search-019.err"
echo "search rc=$? at $(elapsed)"
tail -4 "$work/search-019.err"
wait "$rules"
rules_rc=$?

{
  echo
  echo "## Same layouts, 0.16.1 against 0.19.x (gpt2-large, gbs 16, 6 timed steps, warm pool)"
  python3 tools/versions_table.py 0.16.1 "$work/grid-016" 0.19.x "$work/grid-019"
  echo "versions table rc=$?"
  echo
  echo "## Worker GPU tests under 0.19.x: $(tail -1 "$work/worker-gpu-019.log")"
  echo
  echo "## Rules cross-check under 0.19.x (rc=$rules_rc)"
  grep -E "^Result|DISAGREES" "$out"/rules-crosscheck-*.md 2>/dev/null || tail -5 "$work/rules.log"
  echo
  echo "## Default search under 0.19.x"
  tail -3 "$work/search-019.err"
  python3 tools/study_table.py "$work/search-019" 6
  echo
  echo "total wall $(elapsed)"
} 2>&1 | tee -a "$work/summary.md"
cp "$work/summary.md" "$out/summary.md"
tar czf "$out/results.tgz" -C /tmp i29
