"""Where a worker rank's host time goes, from `py-spy record --subprocesses --threads --format
raw` (tools/device_host_profile.sh): per thread, and on the training thread the frames that
hold the most samples, inclusive and by themselves.

    python tools/host_profile.py PROFILE.txt [--top 25] [--under FRAME]

A sample is one stack py-spy saw while a thread was not idle. The worker's rank is the process
whose command line runs `autotune.worker` (--process: another piece of it, e.g. `pretrain_gpt`
for Megatron-LM's ranks; never torchrun's own process). --under keeps the
samples whose stack holds a frame containing FRAME (e.g. `timed_steps`, the timed loop),
so that start-up, build and warm-up are left out.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

__all__ = ["Sample", "main", "read_samples"]

_COUNT = re.compile(r" (\d+)$")
_PROCESS = re.compile(r'^process (\d+):"(.*)"$', re.S)
_THREAD = re.compile(r"^thread \((\d+)\)(?::\s*(.*))?$")

Sample = tuple[str, str, tuple[str, ...], int]
"""(process command line, thread label, frames outermost first, count)."""


def read_samples(text: str) -> list[Sample]:
    """Every raw record; a command line may hold newlines, so a record ends at ` COUNT`."""
    out: list[Sample] = []
    record = ""
    for line in text.splitlines():
        record = f"{record}\n{line}" if record else line
        m = _COUNT.search(record)
        if m is None:
            continue
        stack, count = record[:m.start()], int(m.group(1))
        record = ""
        process, thread, frames = "", "", []
        for frame in _split(stack):
            if (p := _PROCESS.match(frame)) is not None:
                process = p.group(2)
            elif (t := _THREAD.match(frame)) is not None:
                thread = t.group(2) or t.group(1)
            else:
                frames.append(frame)
        out.append((process, thread, tuple(frames), count))
    return out


def _split(stack: str) -> list[str]:
    # Frames are `;`-separated; a quoted command line may hold `;` itself.
    parts: list[str] = []
    cur: list[str] = []
    quoted = False
    for ch in stack:
        if ch == '"':
            quoted = not quoted
        if ch == ";" and not quoted:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _rank(samples: list[Sample], process: str) -> list[Sample]:
    return [s for s in samples if process in s[0]
            and "torch.distributed.run" not in s[0] and "torchrun" not in s[0]]


def _short(frame: str) -> str:
    # `fn (path/to/file.py:123)` -> `fn (file.py:123)`
    return re.sub(r"\((?:[^()]*/)?([^/()]+)\)$", r"(\1)", frame)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--under", default=None)
    ap.add_argument("--process", default="autotune.worker",
                    help="a piece of the rank's command line (pretrain_gpt: Megatron-LM's)")
    args = ap.parse_args(argv)
    samples = _rank(read_samples(args.profile.read_text(errors="replace")), args.process)
    if not samples:
        print(f"no samples of a process running {args.process}", file=sys.stderr)
        return 1
    threads = Counter[str]()
    for _, thread, _, n in samples:
        threads[thread] += n
    print("samples per thread:", ", ".join(f"{t} {n}" for t, n in threads.most_common(8)))
    main_thread = threads.most_common(1)[0][0]
    picked = [s for s in samples if s[1] == main_thread
              and (args.under is None or any(args.under in f for f in s[2]))]
    total = sum(n for *_, n in picked)
    print(f"thread {main_thread}: {total} samples"
          + (f" under frames containing {args.under!r}" if args.under else ""))
    inclusive, own = Counter[str](), Counter[str]()
    for _, _, frames, n in picked:
        for f in {_short(f) for f in frames}:
            inclusive[f] += n
        if frames:
            own[_short(frames[-1])] += n
    for title, table in (("inclusive", inclusive), ("self", own)):
        print(f"\n| {title} | share | frame |\n|---|---|---|")
        for f, n in table.most_common(args.top):
            print(f"| {n} | {n / total:.1%} | {f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
