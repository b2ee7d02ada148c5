"""tools/local_srun.py: the srun stand-in that runs a multi-node step on one machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SRUN = Path(__file__).resolve().parents[1] / "tools" / "local_srun.py"

# One write per task (print writes the newline separately, and two tasks share the pipe).
_SHOW_ENV = ("import json, os; os.write(1, (json.dumps({k: os.environ.get(k) for k in "
             "('SLURM_NODEID', 'SLURM_NNODES', 'CUDA_VISIBLE_DEVICES', 'NCCL_P2P_DISABLE')})"
             " + '\\n').encode())")


def _srun(*args: str, env: dict[str, str] | None = None,
          timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SRUN), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, check=False)


@pytest.mark.parametrize(("nodes", "gpus_per_node", "visible", "expected"), [
    (2, 1, "0,1", ["0", "1"]),
    (2, 2, "0,1,2,3", ["0,1", "2,3"]),
    (3, 1, "4,5,6", ["4", "5", "6"]),
])
def test_each_node_sees_its_own_gpus(nodes: int, gpus_per_node: int, visible: str,
                                     expected: list[str]) -> None:
    done = _srun("--nodes", str(nodes), "--ntasks-per-node", "1", "--gpus-per-node",
                 str(gpus_per_node), "--kill-on-bad-exit=1", sys.executable, "-c", _SHOW_ENV,
                 env={"CUDA_VISIBLE_DEVICES": visible, "LOCAL_SRUN_NET": "1"})
    assert done.returncode == 0, done.stderr
    rows = sorted((json.loads(line) for line in done.stdout.splitlines()),
                  key=lambda r: int(r["SLURM_NODEID"]))
    assert [r["CUDA_VISIBLE_DEVICES"] for r in rows] == expected
    assert {r["SLURM_NNODES"] for r in rows} == {str(nodes)}
    assert {r["NCCL_P2P_DISABLE"] for r in rows} == {"1"}


def test_a_failing_node_ends_the_step_with_its_code() -> None:
    script = ("import os, sys, time\n"
              "if os.environ['SLURM_NODEID'] == '1': sys.exit(3)\n"
              "time.sleep(60)\n")
    start = time.monotonic()
    done = _srun("--nodes", "2", "--gpus-per-node", "1", "--kill-on-bad-exit=1",
                 sys.executable, "-c", script, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert done.returncode == 3
    assert time.monotonic() - start < 20


def test_too_few_gpus_is_one_line() -> None:
    done = _srun("--nodes", "2", "--gpus-per-node", "2", "true",
                 env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert done.returncode != 0
    assert "need 4 GPUs" in done.stderr and "Traceback" not in done.stderr


def test_no_gpus_needed_without_gpus_per_node() -> None:
    done = _srun("--nodes", "2", sys.executable, "-c", _SHOW_ENV,
                 env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/nonexistent:/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 2


def test_sigterm_during_start_up_leaves_no_task(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    script = (f"import pathlib, time\npathlib.Path({str(marker)!r}).open('a').write('x')\n"
              "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, str(SRUN), "--nodes", "16", sys.executable, "-c",
                             script], env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
                            start_new_session=True)
    # The first task has started (so local_srun's handlers are in place: a signal before the
    # interpreter ran them would test Python, not local_srun) while the other 15 still start.
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    time.sleep(0.5)
    # Every task that started is gone with the step: the process group is empty but for none.
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)


def test_runs_on_a_python_without_autotune() -> None:
    # Documented as `python3 tools/local_srun.py`: any interpreter, autotune installed or not
    # (-S: no site-packages, so autotune cannot be imported).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-S", str(SRUN), "--nodes", "2", sys.executable,
                           # One write each: a pipe keeps a write under PIPE_BUF whole, where
                           # print's text and newline may interleave with the other task's.
                           "-c", "import os; os.write(1, b'task\\n')"], capture_output=True,
                          text=True, timeout=30,
                          env={**env, "CUDA_VISIBLE_DEVICES": ""}, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["task", "task"]
