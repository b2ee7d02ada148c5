#!/bin/bash
# batch.sh NAME PERTS SEEDS -- args : before and after, at most 6 at once
name=$1; perts=$2; seeds=$3; shift 4
for pert in $perts; do for seed in $seeds; do for tag in before after; do
  tree=/tmp/s22/base; [ $tag = after ] && tree=/work/wt-22c
  while [ $(jobs -r | wc -l) -ge 6 ]; do sleep 2; done
  /tmp/s22/replay.sh $tree $name-$tag $pert $seed -- "$@" &
done; done; done; wait
