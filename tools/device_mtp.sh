#!/usr/bin/env bash
# Session 24's last H200 minutes (about 2 minutes): Multi-Token Prediction on a GPU for the first
# time. llama-1b and llama-1b-mtp (the same with --mtp-num-layers 1) at one layout through
# autotune's runner and worker (tools/device_layouts.py, cold, ungated): what the MTP layer adds
# to memory and step time, measured against predicted.
#
#   bash tools/device_mtp.sh      (carry .whl .whl-search .whl-te)
#
# $OUT: rows.jsonl, table.txt, versions.txt, logs.tgz.
source tools/device_te_prelude.sh
mkdir -p /tmp/mtp
for m in llama-1b llama-1b-mtp; do
  timeout 100 python3 tools/device_layouts.py "tools/shapes/$m.yaml" 1 h200 "/tmp/mtp/$m" \
      mbs=2,gbs=8,impl=te,expandable_segments=1 > "/tmp/mtp/$m.txt" 2> "/tmp/mtp/$m.err"
  echo "$m rc=$? at $(elapsed)"
  head -1 "/tmp/mtp/$m.txt" >> "$out/rows.jsonl"
  tail -1 "/tmp/mtp/$m.txt" | tee -a "$out/table.txt"
  tail -2 "/tmp/mtp/$m.err"
done
tar czf "$out/logs.tgz" -C /tmp mtp
echo "total $(elapsed)"
