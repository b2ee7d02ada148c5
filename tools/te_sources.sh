#!/usr/bin/env bash
# Pack Transformer Engine's sources, with the two submodules its build needs, into one archive
# that an offline GPU machine can build from (tools/te_build.sh). Runs on a machine that has the
# git repositories; needs git, tar and xz. docs/OFFLINE.md says why this version and how.
#
#   tools/te_sources.sh --te GITDIR [--ref v2.11] [--cutlass GITDIR] [--cudnn-frontend GITDIR]
#                       [--out .te/te-src-v2.11.tar.xz]
#
# GITDIR is a clone (`git clone --recursive https://github.com/NVIDIA/TransformerEngine`) or a
# bare mirror. The submodules are taken at the commits TE's REF pins (`git ls-tree REF 3rdparty/`),
# from --cutlass / --cudnn-frontend or else from the clone's own .git/modules. Only what the
# PyTorch build reads travels: TE without its tests, docs, examples and JAX bindings; CUTLASS's
# headers; cudnn-frontend's headers and its cuDNN CMake module.
set -euo pipefail
te="" ref="v2.11" cutlass="" cudnn_fe="" out=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --te) te=$2; shift 2 ;;
    --ref) ref=$2; shift 2 ;;
    --cutlass) cutlass=$2; shift 2 ;;
    --cudnn-frontend) cudnn_fe=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "te_sources.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n $te ]] || { echo "te_sources.sh: --te GITDIR is required" >&2; exit 2; }
out=${out:-.te/te-src-$ref.tar.xz}

gitdir_of() {  # a clone's .git, or the directory itself when it is bare
  if [[ -d $1/.git ]]; then echo "$1/.git"; else echo "$1"; fi
}
te_git=$(gitdir_of "$te")
git --git-dir "$te_git" rev-parse --verify -q "$ref^{commit}" > /dev/null \
  || { echo "te_sources.sh: $te has no $ref" >&2; exit 2; }
pinned() { git --git-dir "$te_git" ls-tree "$ref" "3rdparty/$1" | awk '{print $3}'; }
cutlass=${cutlass:-$te_git/modules/3rdparty/cutlass}
cudnn_fe=${cudnn_fe:-$te_git/modules/3rdparty/cudnn-frontend}

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/TransformerEngine
mkdir -p "$root"
git --git-dir "$te_git" archive "$ref" \
  | tar x -C "$root" --exclude=tests --exclude=docs --exclude=examples --exclude=qa \
        --exclude=benchmarks --exclude=transformer_engine/jax --exclude=.github
for sub in cutlass:include:tools/util/include cudnn-frontend:include:cmake; do
  name=${sub%%:*} paths=${sub#*:}
  repo=$cutlass; [[ $name == cudnn-frontend ]] && repo=$cudnn_fe
  commit=$(pinned "$name")
  git --git-dir "$(gitdir_of "$repo")" cat-file -e "$commit^{commit}" 2> /dev/null \
    || { echo "te_sources.sh: $repo lacks $name commit $commit that $ref pins" >&2; exit 2; }
  mkdir -p "$root/3rdparty/$name"
  # shellcheck disable=SC2086  # paths is a colon list made into words on purpose
  git --git-dir "$(gitdir_of "$repo")" archive "$commit" ${paths//:/ } \
    | tar x -C "$root/3rdparty/$name"
  echo "$name $commit" >> "$root/3rdparty/PINNED"
done
echo "$ref $(git --git-dir "$te_git" rev-parse "$ref^{commit}")" >> "$root/3rdparty/PINNED"
mkdir -p "$(dirname "$out")"
tar c -C "$stage" TransformerEngine | xz -9 -T0 > "$out"
echo "$out: $(du -h "$out" | cut -f1) ($(find "$root" -type f | wc -l) files)"
cat "$root/3rdparty/PINNED"
