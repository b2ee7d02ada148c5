#!/usr/bin/env bash
# A real search started from a user's Megatron-LM command (issue 17), on the device machine:
#
#   tools/device_from_megatron.sh [COMMAND_FILE] [AUTOTUNE_ARGS...]
#
# COMMAND_FILE defaults to tests/data/megatron/seed-tutorial.sh (the seed tutorial's gpt2-xl
# command, one GPU, micro-batch = global batch = 15). The search runs through
# tools/device_search.sh (carry .whl and .whl-search as it says), study `from-megatron`; then
# `autotune export --from-megatron` writes the user's command with the changed flags. $OUT gets
# search.out (the table and the yours / best found / flags lines), search.err, tuned.sh,
# summary.txt and results.tgz.
set -u
file=${1:-tests/data/megatron/seed-tutorial.sh}
shift || true
[[ $# -eq 0 ]] && set -- --trials 8
out=${OUT:-/tmp/out}
mkdir -p "$out"
tools/device_search.sh from-megatron -- --from-megatron "$file" "$@"
export PYTHONPATH=/tmp/site:$PWD
cp /tmp/r/from-megatron.out "$out/search.out"
cp /tmp/r/from-megatron.err "$out/search.err"
python3 -m autotune.cli export --from-megatron "$file" --study from-megatron \
    --results-dir /tmp/r -o "$out/tuned.sh"
echo "export rc=$?"
cat "$out/search.out"
