#!/usr/bin/env bash
# Issue 26 on one H100 (about 9 minutes; timeouts bound each part): bf16 against every FP8
# recipe Transformer Engine 2.11 runs on Hopper, on gpt2-xl and on Llama-3.2-3B with its memory
# levers, as grids in the warm pool (fixed steps, no stop rule), then a default search with TE.
#
#   bash tools/device_issue26.sh      (carry .whl .whl-search .whl-te)
#
# .whl-te: the TE wheel tools/te_build.sh built (2.11.0, sm_90) and pydantic, pydantic_core,
# annotated_types, typing_inspection, typing_extensions, importlib_metadata, zipp (cp312).
# Parts (PARTS, default all): xl (tools/spaces/fp8-gpt2xl.yaml), llama (fp8-llama3b-base.yaml
# and fp8-llama3b.yaml), search (`autotune gpt2-xl --gpus 1`, default flags, SEARCH_BUDGET_S).
# Every trial records its per-step losses (the FP8 guard's input) and NVML clocks.
# $OUT: summary.txt (tools/study_table.py), losses.txt, clocks.csv, versions.txt, results.tgz.
CLOCKS=1 source tools/device_te_prelude.sh
parts=" ${PARTS:-xl llama search} "
python3 -c "from transformer_engine.pytorch.quantization import check_fp8_support  # TE >= 2.9
ok, why = check_fp8_support()
print('fp8 support', ok, why)" 2>&1 | grep -v -i warn | tee -a "$out/versions.txt"

grid=(--gpus 1 --sampler grid --stop-rule none --stable-cv 0 --warmup-steps 3)
llama=tests/data/hf/llama-3.2-3b.json
export STUDY_TIMEOUT_S
if [[ $parts == *" xl "* ]]; then
  STUDY_TIMEOUT_S=${XL_TIMEOUT_S:-220} bash tools/device_search.sh fp8-xl -- gpt2-xl "${grid[@]}" --steps 8 \
      --space tools/spaces/fp8-gpt2xl.yaml > /dev/null
  echo "xl done at $(elapsed)"; tail -2 /tmp/r/fp8-xl.err
fi
if [[ $parts == *" llama "* ]]; then
  STUDY_TIMEOUT_S=${LLAMA_BASE_TIMEOUT_S:-80} bash tools/device_search.sh fp8-llama-base -- "$llama" "${grid[@]}" \
      --steps 6 --seq-len 4096 --gbs 8 --space tools/spaces/fp8-llama3b-base.yaml > /dev/null
  STUDY_TIMEOUT_S=${LLAMA_TIMEOUT_S:-200} bash tools/device_search.sh fp8-llama -- "$llama" "${grid[@]}" \
      --steps 6 --seq-len 4096 --gbs 8 --space tools/spaces/fp8-llama3b.yaml > /dev/null
  echo "llama done at $(elapsed)"; tail -2 /tmp/r/fp8-llama.err
fi
if [[ $parts == *" search "* ]]; then
  left=$(( ${CALL_LIMIT_S:-570} - $(date +%s) + start - 20 ))
  if (( left > 60 )); then
    STUDY_TIMEOUT_S=$left bash tools/device_search.sh fp8-default -- gpt2-xl --gpus 1 \
        --time-budget $(( left - 25 )) > /dev/null
    echo "search done at $(elapsed)"; tail -3 /tmp/r/fp8-default.err
  else
    echo "search skipped: ${left}s left"
  fi
fi
python3 tools/study_table.py /tmp/r 8 > "$out/summary.txt" 2>&1
python3 tools/trial_losses.py /tmp/r > "$out/losses.txt" 2>&1
tar czf "$out/results.tgz" -C /tmp r
cat "$out/summary.txt"; cat "$out/losses.txt"
echo "total $(elapsed)"
