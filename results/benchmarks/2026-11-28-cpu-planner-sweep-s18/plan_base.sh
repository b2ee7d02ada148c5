#!/bin/sh
# one fresh plan: a new results folder each run, so nothing is read back
d=$(mktemp -d /tmp/sw/fb.XXXXXX)
PYTHONPATH=/tmp/base exec /work/main/.venv/bin/python -m autotune "$@" --backend simulate --results-dir "$d"
