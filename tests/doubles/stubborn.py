"""Test double that ignores SIGTERM and leaves a grandchild behind.

Writes the grandchild's pid to <out-dir>/grandchild-<RANK>.pid and its own to <out-dir>/
child-<RANK>.pid. With --detach the grandchild starts its own session, as torchrun starts its
workers, so killing this process's group alone would miss it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--spec")
parser.add_argument("--out-dir", required=True)
parser.add_argument("--detach", action="store_true")
args = parser.parse_args()

signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited through exec by the grandchild too
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"],
                              start_new_session=args.detach)
rank = os.environ.get("RANK", "0")
Path(args.out_dir, f"grandchild-{rank}.pid").write_text(str(grandchild.pid))
Path(args.out_dir, f"child-{rank}.pid").write_text(str(os.getpid()))
print("ignoring SIGTERM", flush=True)
while True:
    time.sleep(3600)
