#!/usr/bin/env bash
# A worker trial and its exported Megatron-LM command, unchanged, with Transformer Engine, on one
# GPU: does pretrain_gpt.py run what the worker measured? Session 23: MoE's token dispatcher and
# grouped GEMMs (the export wrote allgather and no --moe-grouped-gemm until then; OLD=1 also runs
# the script as that export wrote it), and Multi-Latent Attention.
#
#   CASES="qwen1.5-moe-6l" bash tools/device_export_mlm.sh   (carry .whl .whl-search .whl-te
#                                                               .carry/megatron-lm)
#
# A case is a shape of tools/shapes, run at tools/spaces/te-mbs4-1gpu.yaml's one layout.
# .carry/megatron-lm: Megatron-LM's training code at core_v0.16.1 and its wheels (see
# tools/device_megatron_lm.sh). $OUT: summary.txt (worker trials), mlm.txt (every Megatron-LM
# run's iteration times and memory), results.tgz, versions.txt, clocks.csv.
CLOCKS=1 source tools/device_te_prelude.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .carry/megatron-lm/wheels/*.whl || exit 1
cp tools/run_pretrain_gpt.py .carry/megatron-lm/run_pretrain_gpt.py
mlm=$PWD/.carry/megatron-lm/run_pretrain_gpt.py
r=/tmp/r
mkdir -p "$r"
mlm_run() {  # NAME SCRIPT
  if (( $(date +%s) - start > ${CALL_LIMIT_S:-560} - 90 )); then echo "$1 skipped"; return; fi
  local t0=$(date +%s)
  timeout 200 bash "$2" > "$r/$1.log" 2>&1
  echo "== $1 rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a "$out/mlm.txt"
  grep -E "iteration +[0-9]+/|memory \(MB\)|Error|error:" "$r/$1.log" | grep -v "^.*Warning" \
      | tail -14 | tee -a "$out/mlm.txt"
}
for m in ${CASES:-qwen1.5-moe-6l}; do
  if (( $(date +%s) - start > ${CALL_LIMIT_S:-560} - 120 )); then echo "$m skipped"; continue; fi
  bash tools/device_search.sh "$m" -- "tools/shapes/$m.yaml" --gpus 1 --sampler grid \
      --stop-rule none --stable-cv 0 --warmup-steps 3 --steps 6 \
      --space "${SPACE:-tools/spaces/te-mbs4-1gpu.yaml}" > /dev/null
  echo "$m worker done at $(elapsed)"; tail -2 "$r/$m.err"
  python3 -m autotune.cli export --study "$m" --results-dir "$r" --format megatron-lm \
      --megatron-lm "$mlm" --train-iters 12 -o "$r/$m-export.sh" || continue
  grep -E "moe-token-dispatcher|moe-grouped-gemm|multi-latent" "$r/$m-export.sh"
  mlm_run "$m-export" "$r/$m-export.sh"
  if [[ ${OLD:-0} == 1 ]] && grep -q -- "--moe-grouped-gemm" "$r/$m-export.sh"; then
    # The export before session 23: allgather at ep 1, no grouped GEMMs.
    sed -e 's/--moe-token-dispatcher-type alltoall/--moe-token-dispatcher-type allgather/' \
        -e '/--moe-grouped-gemm/d' "$r/$m-export.sh" > "$r/$m-old.sh"
    mlm_run "$m-old" "$r/$m-old.sh"
  fi
done
python3 tools/study_table.py "$r" 6 > "$out/summary.txt" 2>&1
tar czf "$out/results.tgz" -C /tmp r
cat "$out/summary.txt"
echo "total $(elapsed)"
