"""The `autotune` console script: a Ctrl-C while the CLI is still being imported ends like any
other (one line, exit 130) instead of a traceback.

Importing autotune.cli takes a few tenths of a second (typer, rich, the analytical models);
this module imports nothing heavy itself, so the console script reaches its handler at once.
"""

from __future__ import annotations

import sys

from autotune.errors import INTERRUPTED_EXIT

__all__ = ["main"]


def main() -> int:
    try:
        from autotune.cli import main as cli_main
    except KeyboardInterrupt:
        print("autotune: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT
    return cli_main()
