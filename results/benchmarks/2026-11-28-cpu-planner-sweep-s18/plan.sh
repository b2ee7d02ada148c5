#!/bin/sh
# one fresh plan: a new results folder each run, so nothing is read back
d=$(mktemp -d /tmp/sw/fb.XXXXXX)
PYTHONPATH=/work/wt-18a exec /work/main/.venv/bin/python -m autotune "$@" --backend simulate --results-dir "$d"
