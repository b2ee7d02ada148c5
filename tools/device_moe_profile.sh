#!/usr/bin/env bash
# Session 23 on one H200 (about 8 minutes): megatron-core's two token dispatchers at ep 1 on the
# same MoE layouts (autotune's worker builds alltoall; its Megatron-LM export wrote allgather),
# and where an MoE layer's host time goes (tools/device_profile.py: MoELayer's phases, the
# host's synchronizations, GPU busy share, setup phases). One torchrun per case.
#
#   bash tools/device_moe_profile.sh      (carry .whl .whl-search .whl-te)
#
# $OUT: profiles.txt (every case's summary), profiles.tgz (full tables), versions.txt.
source tools/device_te_prelude.sh
work=/tmp/prof
mkdir -p "$work"
port=29600
cases=${CASES:-"e64:1 e8:1 e64:4 qwen:1"}
for case in $cases; do
  IFS=: read -r shape mbs <<< "$case"
  model=tools/shapes/moe-$shape-6l.yaml
  [[ $shape == qwen ]] && model=tools/shapes/qwen1.5-moe-6l.yaml
  for disp in alltoall allgather; do
    if (( $(date +%s) - start > ${CALL_LIMIT_S:-540} - 60 )); then
      echo "$shape mbs$mbs $disp skipped at $(elapsed)"; continue
    fi
    dir=$work/$shape-mbs$mbs-$disp
    python3 tools/device_worker_bench.py spec "$dir" "$model" te "$mbs" none || continue
    port=$((port + 1))
    timeout 150 torchrun --nproc-per-node 1 --rdzv-endpoint "127.0.0.1:$port" \
        tools/device_profile.py "$dir/trial.json" "$dir/profile.txt" --moe-dispatcher "$disp" \
        > "$dir/log.txt" 2>&1
    echo "== $shape mbs$mbs $disp rc=$? at $(elapsed)" | tee -a "$out/profiles.txt"
    if [[ -f $dir/profile.txt ]]; then
      sed -n '1,40p' "$dir/profile.txt" | grep -v "^-" >> "$out/profiles.txt"
    else
      grep -E "Error|error" "$dir/log.txt" | tail -5 | tee -a "$out/profiles.txt"
    fi
  done
done
grep -E "^==|timed steps|profiled step|setup" "$out/profiles.txt"
tar czf "$out/profiles.tgz" -C /tmp prof
echo "total $(elapsed)"
