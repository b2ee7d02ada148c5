#!/bin/bash
# usage: replay.sh TREE TAG PERTURB SEED -- args
tree=$1; tag=$2; pert=$3; seed=$4; shift 5
out=/tmp/s22/replay-$tag-p$pert-s$seed.txt
cd $tree && PYTHONPATH=$tree /work/main/.venv/bin/python tools/replay_search.py /work/.device/2/summary.txt --perturb $pert --seed $seed --results-dir /tmp/s22/r-$tag-p$pert-s$seed -- "$@" > $out 2>&1
