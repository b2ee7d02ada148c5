"""Nothing a user typed executes in a script autotune writes (issue 14, item 1).

Hostile values (newlines, `$(...)`, backticks, quotes, `;`, Unicode line separators) go through
every export format, both straight into autotune.report.scripts (as a study or model name that an
older version or a library caller could have stored) and end to end through the CLI. Each script
must pass `bash -n`, run under fake launchers without running the payload, hand the hostile path to
the launcher as one intact argument, and carry the payload only where bash reads no code: in
comments, single-quoted words and the quoted here-document.
"""

from __future__ import annotations

import copy
import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.layouts.layout import Layout
from autotune.report.scripts import megatron_lm_script, slurm_script, torchrun_script
from autotune.specs.presets import load_model
from autotune.trials.trial import TrialSpec
from tests.test_hardening_inputs import MODEL_YAML

MARK = "PWNED"
PAYLOADS = [
    f"a\ntouch {MARK}",
    f"a\r\ntouch {MARK}",
    f"$(touch {MARK})",
    f"`touch {MARK}`",
    f"'; touch {MARK}; '",
    f'"; touch {MARK}; "',
    f"; touch {MARK} #",
    f"a\u2028touch {MARK}",
    f"a\\\ntouch {MARK}",
    f"x && touch {MARK} || touch {MARK}",
    f"#SBATCH --wrap='touch {MARK}'\ntouch {MARK}",
    f"${{IFS}}touch${{IFS}}{MARK}",
]
"""Free text: study names, model names, titles. They reach comment lines."""
PATHS = [
    f"/opt/M $(touch {MARK})",
    f"/opt/`touch {MARK}`",
    f"/opt/it's; touch {MARK}; '",
    f'/opt/"; touch {MARK}; "',
    f"/opt/a b;touch {MARK}&",
    f"/opt/${{HOME}}/{MARK}",
]
"""Printable --megatron-lm paths (a path may hold any of these); they are shell-quoted."""
FAKE = """#!/bin/sh
# Records its name and arguments, one JSON list per call, instead of launching anything.
python3 -c 'import json, os, sys; print(json.dumps([os.path.basename(sys.argv[1])] + \
sys.argv[2:]))' "$0" "$@" >> "$CALLS"
"""
SCONTROL = "#!/bin/sh\necho node1\n"


def lex(script: str) -> list[str]:
    """How bash reads each character: "code", "double" (quoted, but $ and ` expand),
    "single" (literal), "comment", "heredoc" (a quoted here-document: literal) or
    "heredoc-expanding". Enough of bash's grammar for the scripts autotune writes."""
    kinds = ["code"] * len(script)
    i, state, word_start = 0, "code", True
    pending: tuple[str, bool] | None = None
    while i < len(script):
        c = script[i]
        if state == "code":
            if c == "'":
                state = "single"
            elif c == '"':
                state = "double"
            elif c == "\\":
                i += 2
                word_start = False
                continue
            elif c == "#" and word_start:
                state = "comment"
                kinds[i] = "comment"
            elif script.startswith("<<", i):
                m = re.match(r"<<-?\s*(['\"]?)(\w+)\1", script[i:])
                assert m is not None, script[i:i + 40]
                pending = (m[2], bool(m[1]))
                i += m.end()
                continue
            elif c == "\n" and pending is not None:
                end, quoted = pending
                pending = None
                j = i + 1
                while True:
                    nl = script.find("\n", j)
                    line = script[j:] if nl < 0 else script[j:nl]
                    if line == end:
                        i = j + len(line)
                        break
                    for k in range(j, j + len(line) + 1):
                        if k < len(kinds):
                            kinds[k] = "heredoc" if quoted else "heredoc-expanding"
                    assert nl >= 0, "unterminated here-document"
                    j = nl + 1
                continue
            word_start = c in " \t\n;&|()"
        elif state == "single":
            kinds[i] = "single"
            if c == "'":
                state, kinds[i] = "code", "code"
        elif state == "double":
            kinds[i] = "double"
            if c == "\\":
                kinds[i + 1] = "double"
                i += 2
                continue
            if c == '"':
                state, kinds[i] = "code", "code"
        elif state == "comment":
            if c == "\n":
                state, word_start = "code", True
            else:
                kinds[i] = "comment"
        i += 1
    assert state in ("code", "comment"), f"script ends inside {state}"
    return kinds


SAFE = {"single", "comment", "heredoc"}


def assert_inert(script: str) -> None:
    """bash -n accepts it and every occurrence of MARK lies where bash reads no code."""
    check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert check.returncode == 0, check.stderr
    kinds = lex(script)
    for m in re.finditer(MARK, script):
        seen = {kinds[k] for k in range(m.start(), m.end())}
        line = script.count("\n", 0, m.start()) + 1
        assert seen <= SAFE, f"line {line} carries {MARK} as {seen}: " \
                             f"{script.splitlines()[line - 1]!r}"
    for line in script.split("\n"):  # a comment is one line: nothing after a line break
        assert "\r" not in line and "\u2028" not in line


def run_script(script: str, tmp_path: Path) -> list[list[str]]:
    """Run it with fake torchrun/srun/scontrol first on PATH: their recorded argv. The payload
    would create MARK in the working folder."""
    work = tmp_path / "work"
    bin_dir = tmp_path / "bin"
    for folder in (work, bin_dir):
        folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("torchrun", FAKE), ("srun", FAKE), ("scontrol", SCONTROL)):
        fake = bin_dir / name
        fake.write_text(text)
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    path = tmp_path / "script.sh"
    path.write_text(script)
    calls = tmp_path / "calls.jsonl"
    calls.unlink(missing_ok=True)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls),
           "MASTER_ADDR": "node1", "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1",
           "SLURM_JOB_ID": "7", "HOME": str(tmp_path)}
    subprocess.run(["bash", str(path)], check=True, cwd=work, env=env, timeout=30,
                   capture_output=True)
    assert not (work / MARK).exists() and not (tmp_path / MARK).exists()
    assert not list(work.rglob(MARK))
    return [json.loads(line) for line in calls.read_text().splitlines()]


def hostile_model(name: str) -> object:
    """gpt2 with `name`, as a stored study could hold it (ModelSpec refuses control
    characters on load; the scripts must not rely on that)."""
    model = copy.copy(load_model("gpt2"))
    object.__setattr__(model, "name", name)
    return model


LAYOUT = Layout(dp=2, gbs=8)


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("fmt", ["megatron-lm", "megatron-lm-2-nodes", "slurm", "torchrun"])
def test_free_text_lands_only_in_comments(tmp_path: Path, fmt: str, payload: str) -> None:
    model = hostile_model(payload)
    title = [f"study {payload}", f"model {payload}", payload]
    if fmt.startswith("megatron-lm"):
        script = megatron_lm_script(model, LAYOUT, title=title,  # type: ignore[arg-type]
                                    nodes=2 if fmt.endswith("nodes") else 1)
    elif fmt == "slurm":
        script = slurm_script(model, LAYOUT, title=title, nodes=1,  # type: ignore[arg-type]
                              job_name=f"autotune-{payload}")
        job = next(x for x in script.splitlines() if x.startswith("#SBATCH --job-name="))
        assert re.fullmatch(r"#SBATCH --job-name=[A-Za-z0-9._-]+", job), job
    else:
        script = torchrun_script(TrialSpec(model=model, layout=LAYOUT),  # type: ignore[arg-type]
                                 title=title)
    assert_inert(script)
    calls = run_script(script, tmp_path)
    assert calls and calls[0][0] in ("torchrun", "srun")
    if fmt == "torchrun":
        spec = json.loads((tmp_path / "work" / "trial.json").read_text())
        assert spec["model"]["name"] == payload  # the heredoc carries it intact, as data


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", ["megatron-lm", "slurm"])
def test_megatron_lm_path_is_one_quoted_argument(tmp_path: Path, fmt: str, path: str) -> None:
    model = load_model("gpt2")
    if fmt == "slurm":
        script = slurm_script(model, LAYOUT, title=["t"], nodes=1, megatron_lm=path)
    else:
        script = megatron_lm_script(model, LAYOUT, title=["t"], megatron_lm=path)
    assert_inert(script)
    (call,) = run_script(script, tmp_path)
    assert f"{path}/pretrain_gpt.py" in call  # one argument, exactly as given


def test_end_to_end_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A model file whose name is hostile (printable: the loader refuses control characters),
    searched, then exported in every format with a hostile --megatron-lm."""
    name = f"x$(touch {MARK}); `touch {MARK}` 'q\\\" | && touch {MARK} %j"
    model = tmp_path / "evil.yaml"
    model.write_text(MODEL_YAML.replace("name: tiny", f'name: "{name}"'))
    root = tmp_path / "results"
    assert main([str(model), "--gpus", "2", "--backend", "simulate", "--results-dir", str(root),
                 "--trials", "3"]) == 0
    capsys.readouterr()
    hostile_path = f"/opt/M $(touch {MARK})`touch {MARK}`'"
    for fmt in ("megatron-lm", "torchrun", "slurm", "json"):
        out = tmp_path / f"out.{fmt}"
        code = main(["export", "--results-dir", str(root), "--format", fmt, "-o", str(out),
                     *(["--megatron-lm", hostile_path] if fmt in ("megatron-lm", "slurm")
                       else [])])
        assert code == 0, capsys.readouterr().err
        text = out.read_text()
        if fmt == "json":
            assert json.loads(text)["model"] == name.replace('\\"', '"')
            continue
        assert_inert(text)
        calls = run_script(text, tmp_path / fmt)
        if fmt != "torchrun":
            assert f"{hostile_path}/pretrain_gpt.py" in calls[0]
    assert not list(tmp_path.rglob(MARK))


@pytest.mark.parametrize("script", [
    f"#!/usr/bin/env bash\n# title a\ntouch {MARK}\n",
    f'#!/usr/bin/env bash\necho "$(touch {MARK})"\n',
    f"#!/usr/bin/env bash\necho x; touch {MARK}\n",
    f"#!/usr/bin/env bash\ncat <<EOF\n$(touch {MARK})\nEOF\n",
])
def test_the_checker_sees_a_payload_that_would_run(script: str) -> None:
    with pytest.raises(AssertionError, match=f"carries {MARK}"):
        assert_inert(script)
