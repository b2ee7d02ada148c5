#!/usr/bin/env bash
# Session 25 on one H200 (about 6 minutes): where the step of Llama-3.1-8B at seq 4096, mbs 1,
# full recompute, with the precision-aware optimizer and 1% of it offloaded to the CPU, spends
# its time in bf16 and with FP8 delayed and FP8 parameters: measured 5.00 and 5.53 s, predicted
# 4.93 and 3.64 s (results/benchmarks/2026-11-29-h200-offload-8b-s25.md). tools/device_profile.py
# on the search's own trial.json of each (carried in .carry/l8b, git-ignored).
#
#   bash tools/device_fp8_offload_profile.sh     (carry .whl .whl-search .whl-te .carry/l8b)
#
# $OUT: profiles.txt (both summaries), logs.tgz.
source tools/device_te_prelude.sh
mkdir -p /tmp/prof
port=29650
for case in bf16 fp8; do
  if (( $(date +%s) - start > ${CALL_LIMIT_S:-400} - 120 )); then
    echo "$case skipped at $(elapsed)"; continue
  fi
  port=$((port + 1))
  timeout 200 torchrun --nproc-per-node 1 --rdzv-endpoint "127.0.0.1:$port" \
      tools/device_profile.py ".carry/l8b/$case.json" "/tmp/prof/$case.txt" --timed-steps 3 \
      > "/tmp/prof/$case.log" 2>&1
  echo "== $case rc=$? at $(elapsed)" | tee -a "$out/profiles.txt"
  if [[ -f /tmp/prof/$case.txt ]]; then
    sed -n '1,60p' "/tmp/prof/$case.txt" >> "$out/profiles.txt"
  else
    grep -E "Error|error" "/tmp/prof/$case.log" | tail -5 | tee -a "$out/profiles.txt"
  fi
done
tar czf "$out/logs.tgz" -C /tmp prof
cat "$out/profiles.txt"
echo "total $(elapsed)"
