#!/usr/bin/env bash
# Build Transformer Engine (PyTorch only, one GPU architecture) on a machine without internet,
# from the archive tools/te_sources.sh packs, and leave a wheel small enough to carry.
#
#   tools/te_build.sh SOURCES.tar.xz OUTDIR
#
# Needs on the machine: nvcc matching torch's CUDA, CMake, ninja, pybind11, setuptools, wheel,
# and cuDNN's headers (the nvidia-cudnn-cu13 wheel has them). Environment it reads:
#   NVTE_CUDA_ARCHS   GPU architectures, default 90 (Hopper: H100, H200)
#   MAX_JOBS          parallel compiles, default every core
#   TE_BUILD_DIR      where the sources are unpacked, default /tmp/te-build
# OUTDIR gets the wheel (debug symbols stripped), build.txt (versions, times, sizes) and, when the
# wheel is larger than PART_MIB (default 15), the same wheel cut into parts with its sha256, which
# `cat PARTS > WHEEL` joins again (the device tool returns files of 16 MiB at most).
set -euo pipefail
src=${1:?usage: te_build.sh SOURCES.tar.xz OUTDIR}
out=${2:?usage: te_build.sh SOURCES.tar.xz OUTDIR}
work=${TE_BUILD_DIR:-/tmp/te-build}
export NVTE_FRAMEWORK=pytorch
export NVTE_CUDA_ARCHS=${NVTE_CUDA_ARCHS:-90}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
# The archive holds the submodules at TE's pinned commits but no .git to check them against.
export NVTE_SKIP_SUBMODULE_CHECKS_DURING_BUILD=1
mkdir -p "$out" "$work"
report=$out/build.txt
say() { echo "$*" | tee -a "$report"; }
fail() { say "te_build.sh: $*"; exit 1; }

nvcc_bin=$(command -v nvcc || true)
[[ -z $nvcc_bin && -x /usr/local/cuda/bin/nvcc ]] && nvcc_bin=/usr/local/cuda/bin/nvcc
[[ -n $nvcc_bin ]] || fail "no nvcc on PATH or in /usr/local/cuda/bin"
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$nvcc_bin")")")}
export PATH=$CUDA_HOME/bin:$PATH
for tool in cmake ninja; do command -v $tool > /dev/null || fail "no $tool on PATH"; done
python3 -c "import pybind11, setuptools, wheel, torch" 2> /dev/null \
  || fail "python3 lacks one of pybind11, setuptools, wheel, torch"
: > "$report"
say "started $(date -u +%FT%TZ) on $(nproc) cores, MAX_JOBS=$MAX_JOBS, NVTE_CUDA_ARCHS=$NVTE_CUDA_ARCHS"
say "nvcc: $("$nvcc_bin" --version | grep -o 'release [0-9.]*')  CUDA_HOME=$CUDA_HOME"
say "$(python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)')"
say "cmake $(cmake --version | head -1 | awk '{print $3}'), ninja $(ninja --version)"

t0=$(date +%s)
rm -rf "$work/TransformerEngine"
tar xJf "$src" -C "$work"
cd "$work/TransformerEngine"
say "sources: $(tr '\n' ' ' < 3rdparty/PINNED)"
t1=$(date +%s)
python3 -m pip wheel -v --no-build-isolation --no-deps --no-cache-dir -w "$work/dist" . \
  > "$out/pip-wheel.log" 2>&1 || { tail -40 "$out/pip-wheel.log"; fail "pip wheel failed"; }
t2=$(date +%s)
say "unpack $((t1 - t0)) s, build $((t2 - t1)) s"
gzip -f "$out/pip-wheel.log"

# Release builds compile with -g0 but keep the symbol tables; stripping them is most of what
# separates the built libraries from what must travel.
whl=$(ls "$work"/dist/transformer_engine-*.whl)
rm -rf "$work/unpacked" && mkdir -p "$work/unpacked"
python3 -m wheel unpack -d "$work/unpacked" "$whl" > /dev/null
for so in $(find "$work/unpacked" -name '*.so*'); do
  before=$(stat -c %s "$so"); strip --strip-unneeded "$so"
  say "$(basename "$so"): $((before / 1048576)) MiB -> $(( $(stat -c %s "$so") / 1048576 )) MiB stripped"
done
lib=$(find "$work/unpacked" -name 'libtransformer_engine.so' | head -1)
say "GPU code in libtransformer_engine.so: $(cuobjdump --list-elf "$lib" 2> /dev/null \
  | grep -o 'sm_[0-9]*[a-z]*' | sort | uniq -c | tr '\n' ' ')"
rm -f "$out"/transformer_engine-*.whl "$out"/*.part-*
python3 -m wheel pack -d "$out" "$work"/unpacked/* > /dev/null
final=$(ls "$out"/transformer_engine-*.whl)
size_mib=$(( $(stat -c %s "$final") / 1048576 ))
say "wheel: $(basename "$final") $size_mib MiB, $(( $(date +%s) - t0 )) s in all"
if (( size_mib > ${PART_MIB:-15} )); then
  (cd "$out" && sha256sum "$(basename "$final")" > "$(basename "$final").sha256" \
    && split -b "${PART_MIB:-15}M" -d "$(basename "$final")" "$(basename "$final").part-")
  rm "$final"
  say "cut into $(ls "$out"/*.part-* | wc -l) parts; join: cat NAME.part-* > NAME && sha256sum -c NAME.sha256"
fi
