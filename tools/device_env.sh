# Sourced first by the device scripts (tools/device_te_prelude.sh, device_host_coupling.sh): the
# NCCL settings the lent machines need (NVLink multicast off: the device tool's KINDS.md says
# why), unbuffered Python output, $out (= $OUT, created), $start and `elapsed`.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
mkdir -p "$out"
start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start ))s"; }
