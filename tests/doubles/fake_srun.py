#!/usr/bin/env python3
"""Test double of Slurm's srun on one machine: records its argv, then runs the task command
here as the only node (`--nnodes M` becomes `--nnodes 1`), in place of srun (exec), so the
runner's process-group kill reaches it as it would reach srun.

FAKE_SRUN_LOG: a file to which the argv is appended as one JSON line.
"""

from __future__ import annotations

import json
import os
import sys

from autotune.trials.launchers import split_srun_argv

argv = sys.argv[1:]
if log := os.environ.get("FAKE_SRUN_LOG"):
    with open(log, "a") as f:
        f.write(json.dumps(sys.argv) + "\n")

_, command = split_srun_argv(argv)
if not command:
    sys.exit("fake_srun: no command")
if "--nnodes" in command:
    command[command.index("--nnodes") + 1] = "1"
os.execvp(command[0], command)
