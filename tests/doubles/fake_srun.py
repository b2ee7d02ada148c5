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

argv = sys.argv[1:]
if log := os.environ.get("FAKE_SRUN_LOG"):
    with open(log, "a") as f:
        f.write(json.dumps(sys.argv) + "\n")

# srun's own options come first; `--opt=value` is one word, `--opt value` two. The first word
# that is not an option starts the task command.
i = 0
while i < len(argv) and argv[i].startswith("-"):
    i += 1 if "=" in argv[i] else 2
command = argv[i:]
if not command:
    sys.exit("fake_srun: no command")
if "--nnodes" in command:
    command[command.index("--nnodes") + 1] = "1"
os.execvp(command[0], command)
