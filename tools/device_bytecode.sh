# Sourced by the tools/device_*.sh scripts: bytecode as a normal install has it.
#   source tools/device_bytecode.sh [FOLDER...]   (folders beside the image's site-packages)
# pip compiles .py to .pyc when it installs; the device image's Python packages came without it
# and the image sets PYTHONDONTWRITEBYTECODE=1, so every process that imported torch compiled its
# source again (py-spy, results/benchmarks/2026-11-28-h100-host-profile.md: ~8 s of a worker's
# start-up). BYTECODE=0 keeps the image as it is. The compiled files go to a cache folder of their
# own (PYTHONPYCACHEPREFIX), so a read-only site-packages works too.
if [[ ${BYTECODE:-1} == 1 ]]; then
  export PYTHONPYCACHEPREFIX=/tmp/pycache
  unset PYTHONDONTWRITEBYTECODE
  if [[ ! -f /tmp/pycache/.done ]]; then
    _bc_t0=$(date +%s)
    { python3 -c "import sys, os, site; print(*sorted({p for p in sys.path + site.getsitepackages() if p.endswith(('site-packages', 'dist-packages')) and os.path.isdir(p)}), sep=chr(10))"
      for _bc_dir in "$@"; do [[ -d $_bc_dir ]] && echo "$_bc_dir"; done
    } | xargs python3 -m compileall -q -j 0 > /dev/null 2>&1
    mkdir -p /tmp/pycache && touch /tmp/pycache/.done
    echo "bytecode compiled in $(( $(date +%s) - _bc_t0 )) s" >&2
  fi
fi
