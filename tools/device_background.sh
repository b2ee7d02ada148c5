#!/usr/bin/env bash
# Run a command on the device machine in a session of its own, so that it outlives one call of
# the device tool (10 minutes at most) while the machine stays warm; every call waits for it up
# to WAIT seconds and copies what it wrote so far into $OUT.
#
#   tools/device_background.sh start NAME WAIT -- COMMAND...   (start, then wait like `wait`)
#   tools/device_background.sh wait NAME WAIT                  (a later call: wait some more)
#
# The job's output is /tmp/bg/NAME.log; it is done when /tmp/bg/NAME.rc holds its exit status.
# Files it leaves under /tmp/bg/NAME/ come back as NAME.tgz.
set -u
mode=$1 name=$2 wait_s=$3; shift 3
mkdir -p /tmp/bg "${OUT:-/tmp/out}"
if [[ $mode == start ]]; then
  [[ ${1:-} == -- ]] && shift
  setsid bash -c '"$@" > "/tmp/bg/$0.log" 2>&1; echo $? > "/tmp/bg/$0.rc"' "$name" "$@" \
      < /dev/null &
fi
if [[ $mode == wait && ! -f /tmp/bg/$name.log ]]; then
  # A fresh machine: the one that ran the job went back (its idle release outlasted the pause
  # between calls). Waiting would only spend device time on nothing (session 17 lost 266 s so).
  echo "$name: no such job on this machine (a fresh one: the job's machine went back)"; exit 3
fi
end=$(( $(date +%s) + wait_s ))
while [[ ! -f /tmp/bg/$name.rc && $(date +%s) -lt $end ]]; do sleep 5; done
out=${OUT:-/tmp/out}
grep -v "Warning\|warnings.warn" "/tmp/bg/$name.log" | tail -60 > "$out/$name.log"
[[ -d /tmp/bg/$name ]] && tar czf "$out/$name.tgz" -C /tmp/bg "$name"
if [[ -f /tmp/bg/$name.rc ]]; then echo "$name done rc=$(cat /tmp/bg/$name.rc)"; else echo "$name still running"; fi
tail -30 "$out/$name.log"
