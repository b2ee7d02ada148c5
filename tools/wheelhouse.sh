#!/usr/bin/env bash
# Offline installs: build a wheelhouse of autotune and its runtime dependencies on a machine with
# network access, copy it over, install from it with no index. See docs/OFFLINE.md.
#
#   tools/wheelhouse.sh build   [--python 3.12] [--platform manylinux_2_28_x86_64] \
#                               [--extras EXTRA[,EXTRA]] [--megatron-core] [--out wheelhouse]
#   tools/wheelhouse.sh install [--wheelhouse wheelhouse] [--extras EXTRA[,EXTRA]] \
#                               [--megatron-core]
#
# Environment: PYTHON, the interpreter whose pip does the work (default python3). For `build` it
# may differ from the target: pip downloads for --python/--platform, not for itself. For
# `install` it is the interpreter (or venv) that receives autotune.
set -euo pipefail

PYTHON=${PYTHON:-python3}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# megatron-core as the `megatron` extra pins it; --megatron-core adds it without its dependencies
# (torch, numpy, packaging), which an NGC PyTorch container already has: torch's CUDA wheels
# alone are several GB.
MEGATRON_CORE="megatron-core==0.16.1"

usage() {
    sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 2
}

die() {
    echo "wheelhouse.sh: $*" >&2
    exit 2
}

# `autotune` or `autotune[a,b]`
requirement() {
    if [[ -n "$1" ]]; then echo "autotune[$1]"; else echo "autotune"; fi
}

build() {
    local python_version=3.12 out="$REPO/wheelhouse" extras="" megatron_core=0
    # Wheels for glibc >= 2.28 (RHEL 8, Ubuntu 20.04 and later, NGC images) and the older
    # manylinux2014 tags many packages still ship; pure-Python wheels always match.
    local platforms=(manylinux_2_28_x86_64 manylinux2014_x86_64)
    local custom_platform=0
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --python) python_version=${2:?--python needs a version like 3.12}; shift 2 ;;
            --platform)
                [[ $custom_platform == 1 ]] || platforms=()
                custom_platform=1
                platforms+=("${2:?--platform needs a wheel platform tag}"); shift 2 ;;
            --extras) extras=${2:?--extras needs a comma-separated list}; shift 2 ;;
            --megatron-core) megatron_core=1; shift ;;
            --out) out=${2:?--out needs a directory}; shift 2 ;;
            -h|--help) usage ;;
            *) die "unknown build option $1" ;;
        esac
    done
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    local platform_args=()
    for p in "${platforms[@]}"; do platform_args+=(--platform "$p"); done

    echo "==> autotune wheel -> $out"
    "$PYTHON" -m pip wheel --no-deps --wheel-dir "$out" "$REPO"

    # pip resolves autotune's dependencies from the wheel just built (found through
    # --find-links) and downloads binary wheels for the target interpreter and platform.
    echo "==> dependencies for Python $python_version on ${platforms[*]}"
    "$PYTHON" -m pip download --dest "$out" --find-links "$out" \
        --only-binary=:all: --python-version "$python_version" "${platform_args[@]}" \
        "$(requirement "$extras")"
    if [[ $megatron_core == 1 ]]; then
        echo "==> $MEGATRON_CORE (without torch, numpy, packaging)"
        "$PYTHON" -m pip download --dest "$out" --no-deps \
            --only-binary=:all: --python-version "$python_version" "${platform_args[@]}" \
            "$MEGATRON_CORE"
    fi
    echo "==> $(find "$out" -name '*.whl' | wc -l) wheels in $out"
}

install() {
    local wheelhouse="$REPO/wheelhouse" extras="" megatron_core=0
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --wheelhouse) wheelhouse=${2:?--wheelhouse needs a directory}; shift 2 ;;
            --extras) extras=${2:?--extras needs a comma-separated list}; shift 2 ;;
            --megatron-core) megatron_core=1; shift ;;
            -h|--help) usage ;;
            *) die "unknown install option $1" ;;
        esac
    done
    [[ -d "$wheelhouse" ]] || die "no wheelhouse at $wheelhouse (run: tools/wheelhouse.sh build)"
    "$PYTHON" -m pip install --no-index --find-links "$wheelhouse" "$(requirement "$extras")"
    if [[ $megatron_core == 1 ]]; then
        # --no-deps: torch comes from the container, not from the wheelhouse.
        "$PYTHON" -m pip install --no-index --find-links "$wheelhouse" --no-deps \
            "$MEGATRON_CORE"
    fi
}

[[ $# -ge 1 ]] || usage
command=$1
shift
case "$command" in
    build) build "$@" ;;
    install) install "$@" ;;
    -h|--help|help) usage ;;
    *) die "unknown command $command (build or install)" ;;
esac
