"""autotune's own rules for docker/Dockerfile, beyond hadolint's general ones.

    python tools/check_dockerfile.py [docker/Dockerfile]

Prints one line per broken rule and exits 1, or exits 0. No dependencies: Dockerfile syntax is
simple enough here (instructions, `\\` continuations, `#` comments).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent.parent / "docker" / "Dockerfile"
BASE = "nvcr.io/nvidia/pytorch:"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuations joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # a comment inside a continued RUN does not end it
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    if pending:
        word, _, rest = pending.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def check(text: str) -> list[str]:
    """The broken rules, as sentences."""
    ins = instructions(text)
    names = [name for name, _ in ins]
    args = {name: value.split("=", 1)[1] for kind, value in ins if kind == "ARG" and "=" in value
            for name in [value.split("=", 1)[0]]}
    problems = []
    froms = [value for name, value in ins if name == "FROM"]
    if not froms:
        return ["no FROM"]
    image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], ""),
                   froms[-1].split()[0])
    if not image.startswith(BASE):
        problems.append(f"FROM {froms[-1]}: the base must be an NGC PyTorch image ({BASE}...)")
    tag = image[len(BASE):] if image.startswith(BASE) else ""
    if not re.fullmatch(r"\d\d\.\d\d-py3", tag):
        problems.append(f"FROM {froms[-1]}: pin a dated tag like 25.12-py3, not {tag!r}")
    runs = [value for name, value in ins if name == "RUN"]
    installs = [cmd for run in runs for cmd in re.split(r"&&|;", run) if "pip install" in cmd]
    for cmd in installs:
        if "--no-cache-dir" not in cmd:
            problems.append(f"pip install without --no-cache-dir: {cmd.strip()}")
        words = cmd.split()
        if any(re.fullmatch(r"[\"']?torch([=<>~!\[].*)?[\"']?", w) for w in words):
            problems.append(f"installs torch over the image's build: {cmd.strip()}")
        if "megatron-core" in cmd and "--no-deps" not in cmd:
            problems.append(f"megatron-core without --no-deps would pull torch: {cmd.strip()}")
    if not any("megatron-core" in cmd for cmd in installs):
        problems.append("megatron-core is not installed (the worker needs it)")
    if not any(re.search(r"install .*(--constraint|-c) \S+.* \.(\[\w[\w,]*\])?$", cmd.strip())
               for cmd in installs):
        problems.append("no `pip install ... --constraint PIN .` line installing autotune "
                        "with torch pinned")
    if "WORKDIR" not in names:
        problems.append("no WORKDIR")
    if "ENTRYPOINT" not in names and "CMD" not in names:
        problems.append("no ENTRYPOINT or CMD")
    users = [value for name, value in ins if name == "USER"]
    if (not users or users[-1] in ("root", "0")) and not re.search(r"#.*\b[Rr]oot\b", text):
        problems.append("runs as root without a comment saying why")
    return problems


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DEFAULT
    problems = check(path.read_text())
    for problem in problems:
        print(f"{path}: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
