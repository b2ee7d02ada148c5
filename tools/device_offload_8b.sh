#!/usr/bin/env bash
# Session 25 on one H200 (about 9 minutes): an 8B model on one GPU as a user runs it,
# `autotune tests/data/hf/llama-3.1-8b.json --gpus 1 --seq-len 4096 --gbs 8` with TE. Nothing in
# the default space is predicted to fit (18 B of state per parameter, 150 GB), so the search
# widens it with the optimizer's CPU offload, its percent derived from the memory model
# (autotune/search/last_resort.py), and measures those layouts.
#
#   bash tools/device_offload_8b.sh      (carry .whl .whl-search .whl-te)
#
# $OUT: summary.txt (every trial), l8b.out/l8b.err (the search's own output), clocks.csv,
# versions.txt, results.tgz.
CLOCKS=1 source tools/device_te_prelude.sh
STUDY_TIMEOUT_S=${STUDY_TIMEOUT_S:-530} bash tools/device_search.sh "${NAME:=l8b}" -- \
    tests/data/hf/llama-3.1-8b.json --gpus 1 --seq-len 4096 --gbs 8 --time-budget 420 > /dev/null
echo "$NAME done at $(elapsed)"
cp "/tmp/r/$NAME.out" "/tmp/r/$NAME.err" "$out/" 2>/dev/null
python3 tools/study_table.py /tmp/r 10 > "$out/summary.txt" 2>&1
tar czf "$out/results.tgz" -C /tmp r
cat "$out/summary.txt"
tail -25 "/tmp/r/$NAME.out"; grep -v -i warn "/tmp/r/$NAME.err" | tail -8
echo "total $(elapsed)"
