# Shell functions shared by the scripts that use one multi-GPU host as lanes side by side, each
# on its own GPUs and CPU cores (tools/device_lanes.sh, tools/device_issue30_lanes.sh): sourced,
# it defines functions and runs nothing. They read the caller's globals: root (the run's folder,
# /tmp/bg/NAME), start (`date +%s` when the run began) and gpu (gpu_kind's answer); lane also
# hands a lane te_job where the caller has one (device_lanes.sh's TE build, for its wait_te).
# shellcheck disable=SC2154  # root, start, gpu: the caller's (above)

# at WORDS...: a line stamped with the seconds since the start
at() { echo "[$(( $(date +%s) - start ))s] $*"; }
# pin_self CORES: this shell (and what it starts) on those cores, if the cores exist
pin_self() { taskset -cp "$1" "$BASHPID" > /dev/null 2>&1 || true; }

# install_wheels DIR WHEEL...: offline, into DIR (a PYTHONPATH entry)
install_wheels() {
  local target=$1; shift
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$target" "$@"
}

# gpu_kind: GPU 0 by the name of autotune's GPU preset (h200, else h100-80gb)
gpu_kind() {
  case $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) in
    *H200*) echo h200 ;; *) echo h100-80gb ;; esac
}
# host_facts: the GPUs (driver, memory, clocks, power), their topology, the cores
host_facts() {
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm,power.limit \
      --format=csv,noheader
  nvidia-smi topo -m
  echo "cores $(nproc); gpu=$gpu"
}
# log_clocks FILE: every GPU's clocks, power and throttle reasons each second into FILE, in the
# background: $! is nvidia-smi's pid
log_clocks() {
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active \
      --format=csv -l 1 > "$1" 2>&1 &
}

# search LANE NAME TIMEOUT -- ARGS: one study through tools/device_search.sh in the lane's dir
search() {
  local lane=$1 name=$2 limit=$3; shift 3; [[ $1 == -- ]] && shift
  RESULTS=$root/$lane/r OUT=$root/$lane STUDY_TIMEOUT_S=$limit \
      bash tools/device_search.sh "$name" -- "$@" > "$root/$lane/$name.search.txt" 2>&1
  at "$lane: $name: $(grep "$name rc=" "$root/$lane/r/commands.txt" | tail -1)"
}

# lane NAME GPUS CORES PYTHONPATH FUNCTION...: the functions one after the other, in a process
# group of its own (so that finish_by can stop it), on its GPUs, pinned to its cores (children
# inherit the affinity), its output in $root/lane-NAME.log; prints its pid.
lane() {
  local name=$1 gpus=$2 cores=$3 path=$4; shift 4
  setsid bash -c "$(declare -f); root=$root gpu=$gpu start=$start ${te_job:+te_job=$te_job}; \
      export CUDA_VISIBLE_DEVICES=$gpus PYTHONPATH=$path; pin_self $cores; \
      for f in $*; do \$f; done" > "$root/lane-$name.log" 2>&1 &
  echo $!
}
# finish_by DEADLINE PID...: wait for the lanes; those still running DEADLINE seconds after the
# start are stopped (what they wrote so far stays)
finish_by() {
  local deadline=$1; shift
  while (( $(date +%s) - start < deadline )); do
    local alive=0
    for pid in "$@"; do kill -0 "$pid" 2> /dev/null && alive=1; done
    (( alive )) || return 0
    sleep 5
  done
  for pid in "$@"; do
    kill -0 "$pid" 2> /dev/null && { at "deadline: stopping lane $pid"; kill -TERM -- -"$pid"; }
  done
  sleep 10
}
