"""`--from-megatron`: the launch the shell runs, found with a parser; the export is the user's file
with only the changed flag values edited (issue 27, item 1).

The canaries run the user's script and tuned.sh with bash, torchrun a stub on PATH: a file the
canary would create proves that something else ran. Hostile scripts are one line and exit 2.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
import stat
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.errors import ConfigError
from autotune.layouts.layout import Layout
from autotune.levers.allocator import ALLOC_CONF_ENV
from autotune.megatron.megatron_args import FLAG_TABLE, Part
from autotune.megatron.megatron_command import (
    layout_changes,
    megatron_layout,
    read_megatron_command,
)
from autotune.megatron.megatron_versions import V0_16, V0_19, MegatronVersion, spell_args
from autotune.megatron.script_patch import patch_script, respellings

LAUNCH = ("torchrun --nproc-per-node 2 pretrain_gpt.py \\\n"
          "    --num-layers 4 --hidden-size 256 --num-attention-heads 8 \\\n"
          "    --seq-length 512 --max-position-embeddings 512 \\\n"
          "    --global-batch-size 16 --micro-batch-size 1 \\\n"
          "    --tokenizer-type NullTokenizer --vocab-size 1000 \\\n"
          "    --tensor-model-parallel-size 1 \\\n"
          "    --save ~/ckpt --data-path /data/*_text_document --log-dir {a,b}\n")
"""The user's launch: expansions (~, a glob, a brace) bash does in their script and in ours."""

STUB = """#!/bin/sh
# Records how it was called: one JSON list per call, appended.
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$CALLS"
"""

LAYOUT_FLAGS = {f.name for row in FLAG_TABLE if row.part == Part.LAYOUT for f in row.flags}


def _canary(tmp_path: Path) -> Path:
    return tmp_path / "CANARY"


CANARIES = {
    # A quoted here-doc: text written to a file, never run by this script.
    "here-doc": "cat > notes.txt <<'EOF'\ntouch {canary}\n" + LAUNCH.replace("\\\n", "")
                + "EOF\n",
    # A branch the shell never takes.
    "dead branch": "if false; then\n  touch {canary}\n  " + LAUNCH.replace("\\\n", "")
                   + "fi\n",
    # A function the script never calls.
    "uncalled function": "launch() {\n  touch {canary}\n  " + LAUNCH.replace("\\\n", "")
                         + "}\n",
}


def _script(tmp_path: Path, decoy: str) -> tuple[Path, int]:
    """A script with the decoy before the real launch, and the real launch's line."""
    text = ("#!/bin/bash\nset -e\ncd \"$(dirname \"$0\")\" && source ./env.sh\n"
            + decoy.replace("{canary}", str(_canary(tmp_path))) + LAUNCH)
    script = tmp_path / "train.sh"
    script.write_text(text)
    (tmp_path / "env.sh").write_text("export FROM_ENV_SH=1\n")
    return script, text[:text.index(LAUNCH)].count("\n") + 1


def _run(script: Path, tmp_path: Path, **env: str) -> list[list[str]]:
    """bash runs `script` with torchrun a stub; the stub's calls."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name in ("torchrun", "pretrain_gpt.py"):
        stub = bindir / name
        stub.write_text(STUB)
        stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    calls = tmp_path / "calls.jsonl"
    calls.unlink(missing_ok=True)
    subprocess.run(["bash", str(script)], check=True, cwd=tmp_path, timeout=60,
                   env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}",
                        "CALLS": str(calls), "HOME": str(tmp_path), **env})
    return [json.loads(line) for line in calls.read_text().splitlines()]


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulated study of LAUNCH's model on its 2 GPUs, searched from a script with a
    decoy and --line (the search takes --line too)."""
    tmp = tmp_path_factory.mktemp("study")
    script, line = _script(tmp, CANARIES["dead branch"])
    results = tmp / "r"
    assert main(["--from-megatron", str(script), "--line", str(line), "--backend",
                 "simulate", "--results-dir", str(results), "--study", "s"]) == 0
    return results


@pytest.mark.parametrize("case", sorted(CANARIES))
def test_canaries_run_nothing(tmp_path: Path, study: Path, case: str,
                              capsys: pytest.CaptureFixture[str]) -> None:
    script, line = _script(tmp_path, CANARIES[case])
    # Without --line the launch is ambiguous: one line naming both candidates.
    capsys.readouterr()
    code = main(["export", "--from-megatron", str(script), "--study", "s", "--results-dir",
                 str(study)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("autotune: error:") == 1, err
    assert f"line {line}" in err and "--line N" in err, err
    tuned = tmp_path / "tuned.sh"
    assert main(["export", "--from-megatron", str(script), "--line", str(line), "--study",
                 "s", "--results-dir", str(study), "-o", str(tuned)]) == 0
    theirs, ours = _run(script, tmp_path), _run(tuned, tmp_path)
    assert not _canary(tmp_path).exists()
    assert len(theirs) == len(ours) == 1
    # bash expanded ~, the glob and the brace in both, alike.
    for argv in (theirs[0], ours[0]):
        assert argv[argv.index("--save") + 1] == f"{tmp_path}/ckpt"
        assert argv[argv.index("--data-path") + 1] == "/data/*_text_document"
        assert argv[argv.index("--log-dir") + 1:argv.index("--log-dir") + 3] == ["a", "b"]
    _assert_only_layout_flags_differ(script.read_text(), tuned.read_text())


def _assert_only_layout_flags_differ(before: str, after: str) -> None:
    """Every line difflib finds changed holds a layout flag, on both sides, or is an added
    export of the run's environment (the allocator's); lines without one are the user's,
    byte for byte."""
    changed = [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(),
                                                     lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert changed, "the study's best layout differs from the user's"
    for line in changed:
        if re.fullmatch(rf"\+\s*export {ALLOC_CONF_ENV}=\S+", line):
            continue
        assert set(re.findall(r"--[a-z0-9-]+", line)) & LAYOUT_FLAGS, line


def test_the_export_is_the_file_with_the_flag_values_changed(tmp_path: Path) -> None:
    script, _ = _script(tmp_path, "")
    command = read_megatron_command(str(script))
    new = Layout(tp=2, dp=1, mbs=4, gbs=16, sequence_parallel=True, impl="te")
    text = patch_script(command, new, layout_changes(command, megatron_layout(command, 2), new))
    diff = [line for line in difflib.unified_diff(script.read_text().splitlines(),
                                                  text.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert diff == ["-    --global-batch-size 16 --micro-batch-size 1 \\",
                    "+    --global-batch-size 16 --micro-batch-size 4 \\",
                    "-    --tensor-model-parallel-size 1 \\",
                    "+    --tensor-model-parallel-size 2 \\",
                    "+    --sequence-parallel \\"]


def test_selective_modules_left_behind_by_full_recompute_read_back(tmp_path: Path) -> None:
    """A user's selective recompute modules, kept in the search's layout when it moves to full
    recompute (Megatron ignores them there), are not written and read back as the default:
    the same run, exported (was: refused as reading back "X, not X")."""
    script = tmp_path / "train.sh"
    script.write_text(LAUNCH.replace("--micro-batch-size 1",
                                     "--micro-batch-size 1 --recompute-granularity selective "
                                     "--recompute-modules core_attn mlp"))
    command = read_megatron_command(str(script))
    assert command.layout_fields["recompute_modules"] == "core_attn+mlp"
    new = replace(megatron_layout(command, 2), recompute="full", recompute_method="uniform",
                  recompute_num_layers=1)
    text = patch_script(command, new, layout_changes(command, megatron_layout(command, 2), new))
    assert "--recompute-granularity full" in text and "--recompute-modules" not in text


MULTI_NODE = """#!/bin/bash
if [ -n "$SLURM_JOB_ID" ]; then
  export NCCL_DEBUG=WARN
fi
TP=2
torchrun --nnodes 2 --nproc_per_node 8 --node_rank ${NODE_RANK:-0} \\
    --master_addr ${MASTER_ADDR:-localhost} --master_port 6000 \\
    pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 8 \\
    --seq-length 512 --max-position-embeddings 512 --global-batch-size 64 --micro-batch-size 2 \\
    --tokenizer-type NullTokenizer --vocab-size 1000 \\
    --tensor-model-parallel-size $TP --save ckpt-tp$TP
"""


def test_a_multi_node_script_keeps_its_defaults(tmp_path: Path) -> None:
    script = tmp_path / "multi.sh"
    script.write_text(MULTI_NODE)
    command = read_megatron_command(str(script))
    assert command.gpus == 16
    new = Layout(tp=4, dp=4, mbs=2, gbs=64, impl="te")
    text = patch_script(command, new, layout_changes(command, megatron_layout(command, 16), new))
    # The value the launch takes from $TP is replaced in the launch; TP=2 and the checkpoint
    # folder named after it are the user's (autotune.megatron.script_patch).
    assert text == MULTI_NODE.replace("--tensor-model-parallel-size $TP",
                                      "--tensor-model-parallel-size 4")
    tuned = tmp_path / "tuned.sh"
    tuned.write_text(text)
    argv = _run(tuned, tmp_path, NODE_RANK="1", MASTER_ADDR="node0")[0]
    assert argv[argv.index("--node_rank") + 1] == "1"
    assert argv[argv.index("--master_addr") + 1] == "node0"
    assert argv[argv.index("--tensor-model-parallel-size") + 1] == "4"
    assert argv[argv.index("--save") + 1] == "ckpt-tp2"


def test_a_flag_from_a_variable_autotune_does_not_follow_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text('P="--micro-batch-size 1"\nP="$P --bf16"\n'
                      + LAUNCH.replace("--micro-batch-size 1", "$P"))
    command = read_megatron_command(str(script))
    new = Layout(mbs=2, dp=2, gbs=16, impl="te")
    with pytest.raises(ConfigError, match="--micro-batch-size comes from a variable autotune "
                                          "does not follow"):
        patch_script(command, new, layout_changes(command, megatron_layout(command, 2), new))


def test_the_printed_export_line_is_quoted(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    mark = tmp_path / "X"  # what the name runs when pasted unquoted (in tmp_path)
    script = tmp_path / "c$(touch X).sh"
    script.write_text(LAUNCH)
    assert main(["--from-megatron", str(script), "--backend", "simulate", "--results-dir",
                 str(tmp_path / "r"), "--study", "q"]) == 0
    out = capsys.readouterr().out
    line = next(n for n in out.splitlines() if n.startswith("autotune export "))
    pasted = line.split("   ")[0]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    stub = bindir / "autotune"
    stub.write_text(STUB)
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    calls = tmp_path / "calls.jsonl"
    subprocess.run(["bash", "-c", pasted], check=True, cwd=tmp_path, timeout=60,
                   env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}",
                        "CALLS": str(calls)})
    assert not mark.exists()
    argv = json.loads(calls.read_text())
    assert argv[argv.index("--from-megatron") + 1] == str(script)
    assert shlex.split(pasted)[1:] == argv


def test_json_holds_the_comparison(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.sh"
    script.write_text(LAUNCH)
    assert main(["--from-megatron", str(script), "--backend", "simulate", "--results-dir",
                 str(tmp_path / "r"), "--study", "j", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    comparison = data["comparison"]
    assert comparison["yours"]["layout"].startswith("tp1 pp1 dp2 mbs1")
    assert comparison["best"]["tokens_per_s"] == data["best"][0]["tokens_per_s"]
    assert comparison["changes"] and all(c["before"] != c["after"]
                                         for c in comparison["changes"])
    assert comparison["export"].startswith("autotune export --from-megatron ")


def _fifo(tmp_path: Path) -> str:
    path = tmp_path / "fifo.sh"
    os.mkfifo(path)
    return str(path)


def _file(text: str | bytes) -> object:
    def make(tmp_path: Path) -> str:
        path = tmp_path / "hostile.sh"
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
        return str(path)
    return make


ONE = LAUNCH.replace("\\\n", "")
HOSTILE = [
    ("two launches", _file(ONE + ONE), [], r"several places may launch .*\(line 1, line 2\)"),
    ("in an if", _file("if true; then\n" + ONE + "fi\n"), [], r"line 2 \(inside an if\)"),
    ("in a case", _file("case $1 in\n  a) " + ONE + ";;\nesac\n"), [], r"inside a case"),
    ("in a loop", _file("for i in 1; do\n" + ONE + "done\n"), [], r"inside a loop"),
    ("in a function", _file("f() {\n" + ONE + "}\nf\n"), [], r"inside a function"),
    ("after ||", _file("false || " + ONE), [], r"after \|\|"),
    ("here-doc only", _file("cat <<'EOF'\n" + ONE + "EOF\n"), [], r"in here-document text"),
    ("--line in a here-doc", _file("cat <<'EOF'\n" + ONE + "EOF\n"), ["--line", "2"],
     r"line 2 is here-document text"),
    # `bash <<EOF`, or sbatch's inside a $(...) that runs more than that sbatch: the launch
    # runs, in a script this one writes: saved as a file, it can be read and edited.
    # (`sbatch <<EOF` itself is read: tests/test_sbatch_heredoc.py.)
    ("bash here-doc", _file("bash <<EOF\n#!/bin/bash\n" + ONE + "EOF\n"), [],
     r"lines 2-4: the launch is in a here-document fed to bash.*`sbatch FILE`"),
    # (`JOB=$(sbatch --parsable <<EOF ...)` alone is read too, as that form.)
    ("sbatch here-doc in a $(... | ...)",
     _file("JOB=$(sbatch --parsable <<EOF | cut -d';' -f1\n#!/bin/bash\n" + ONE + "EOF\n)\n"),
     [], r"here-document fed to sbatch.*`sbatch FILE`"),
    ("--line in a bash here-doc", _file("bash -l <<'EOF'\n" + ONE + "EOF\n"),
     ["--line", "2"], r"here-document fed to bash"),
    ("--line elsewhere", _file("echo hi\n" + ONE), ["--line", "1"],
     r"--line 1 holds no pretrain_gpt.py launch \(candidates: line 2\)"),
    ("--line 0", _file(ONE), ["--line", "0"], r"--line must be a positive line number"),
    ("syntax error", _file(ONE + "if then fi (\n"), [], r"bash syntax autotune's parser"),
    ("too large", _file("#" * (300 * 1024) + "\n" + ONE), [], r"larger than 256 KiB"),
    ("not UTF-8", _file(b"\xff\xfe" + ONE.encode()), [], r"not UTF-8 text"),
    ("a FIFO", _fifo, [], r"not a regular file"),
    ("/dev/zero", lambda _: "/dev/zero", [], r"not a regular file"),
    ("a folder", lambda p: str(p), [], r"is a folder"),
    ("missing", lambda p: str(p / "nope.sh"), [], r"does not exist"),
    ("deep nesting", _file("A=" + "${A:-" * 5000 + "x" + "}" * 5000 + "\n" + ONE), [],
     r"nests deeper than 200 levels"),
    ("nested defaults", _file("A=" + "${A:-" * 70 + "x" + "}" * 70 + "\n" + ONE), [],
     r"nested deeper than 50 levels"),
    ("a doubled variable", _file("A=x\n" + 'A="$A$A"\n' * 34 + ONE), [],
     r"expand to more than 4 MiB"),
    ("doubled array", _file('A=("")\n' + 'A+=("${A[@]}")\n' * 34 + ONE), [],
     r"expand to more than 4 MiB"),
]


@pytest.mark.parametrize(("name", "make", "extra", "message"), HOSTILE,
                         ids=[h[0] for h in HOSTILE])
def test_hostile_scripts_are_one_line_exit_2(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str], name: str,
                                             make: object, extra: list[str],
                                             message: str) -> None:
    assert callable(make)
    path = make(tmp_path)
    code = main(["--from-megatron", path, *extra, "--backend", "simulate", "--results-dir",
                 str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("autotune: error: "), err
    assert re.search(message, err), err


@pytest.mark.parametrize("cap", ["PARSE_SECONDS", "READ_SECONDS"])
def test_the_time_caps_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str], cap: str) -> None:
    import autotune.megatron.launch_site
    import autotune.megatron.shell_script

    module = (autotune.megatron.launch_site if cap == "PARSE_SECONDS"
              else autotune.megatron.shell_script)
    monkeypatch.setattr(module, cap, 0.0)
    path = tmp_path / "slow.sh"
    path.write_text("echo hi\n" * 20000 + ONE)
    code = main(["--from-megatron", str(path), "--backend", "simulate"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "took longer than 0 s" in err, err


def test_line_needs_from_megatron(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["gpt2-xl", "--gpus", "8", "--line", "3", "--backend", "simulate"])
    err = capsys.readouterr().err
    assert code == 2 and "--line names the launch in a --from-megatron FILE" in err


_MODEL = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
          "--max-position-embeddings 512 --vocab-size 99")
PATCHES = [
    # (name, script, gpus, new layout, the diff's -/+ lines)
    ("eval of a string with an array",
     "ARGS=(--micro-batch-size 2 --global-batch-size 8)\n"
     f'cmd="torchrun --nproc-per-node 4 pretrain_gpt.py {_MODEL} ${{ARGS[@]}}"\n'
     'eval $cmd --save "$CKPT/run 1" 2>&1 | tee log\n',
     4, Layout(tp=2, dp=2, mbs=4, gbs=8, impl="te"),
     ["-ARGS=(--micro-batch-size 2 --global-batch-size 8)",
      "+ARGS=(--micro-batch-size 4 --global-batch-size 8)",
      '-eval $cmd --save "$CKPT/run 1" 2>&1 | tee log',
      '+eval $cmd --save "$CKPT/run 1" --tensor-model-parallel-size 2 2>&1 | tee log']),
    ("a variable element of an array, and --flag=value",
     "TP=1\nPAR=(\n  --tensor-model-parallel-size $TP\n  --sequence-parallel\n)\n"
     f"torchrun --nproc-per-node 4 pretrain_gpt.py {_MODEL} --global-batch-size=8 "
     '"${PAR[@]}"\n',
     4, Layout(tp=2, dp=2, mbs=1, gbs=8, impl="te", sequence_parallel=False),
     ["-  --tensor-model-parallel-size $TP", "-  --sequence-parallel",
      "+  --tensor-model-parallel-size 2"]),
    ("a --flag=value replaced in one word",
     f"torchrun --nproc-per-node 4 pretrain_gpt.py {_MODEL} --global-batch-size=8 "
     "--micro-batch-size=1\n",
     4, Layout(dp=4, mbs=2, gbs=8, impl="te"),
     [f"-torchrun --nproc-per-node 4 pretrain_gpt.py {_MODEL} --global-batch-size=8 "
      "--micro-batch-size=1",
      f"+torchrun --nproc-per-node 4 pretrain_gpt.py {_MODEL} --global-batch-size=8 "
      "--micro-batch-size=2"]),
    # The script's own arguments stay last: a flag given when it runs still overrides.
    ('the script\'s own arguments ("$@") stay last',
     f'torchrun --nproc-per-node 4 pretrain_gpt.py {_MODEL} --global-batch-size 8 "$@"\n',
     4, Layout(tp=2, dp=2, mbs=1, gbs=8, impl="te"),
     [f'-torchrun --nproc-per-node 4 pretrain_gpt.py {_MODEL} --global-batch-size 8 "$@"',
      f"+torchrun --nproc-per-node 4 pretrain_gpt.py {_MODEL} --global-batch-size 8 "
      '--tensor-model-parallel-size 2 "$@"']),
    ('"$@" last in an array the launch ends with: the flags go before it, in the array',
     f'ARGS=({_MODEL} --global-batch-size 8 "$@")\n'
     "torchrun --nproc-per-node 4 pretrain_gpt.py ${ARGS[@]}\n",
     4, Layout(tp=2, dp=2, mbs=1, gbs=8, impl="te"),
     [f'-ARGS=({_MODEL} --global-batch-size 8 "$@")',
      f'+ARGS=({_MODEL} --global-batch-size 8 --tensor-model-parallel-size 2 "$@")']),
    ("$* on a line of its own",
     f"torchrun --nproc-per-node 4 pretrain_gpt.py {_MODEL} \\\n"
     "    --global-batch-size 8 \\\n    $*\n",
     4, Layout(tp=2, dp=2, mbs=1, gbs=8, impl="te"),
     ["-    $*", "+    --tensor-model-parallel-size 2 $*"]),
]


@pytest.mark.parametrize(("name", "text", "gpus", "new", "diff"), PATCHES,
                         ids=[p[0] for p in PATCHES])
def test_patches(tmp_path: Path, name: str, text: str, gpus: int, new: Layout,
                 diff: list[str]) -> None:
    script = tmp_path / "train.sh"
    script.write_text(text)
    command = read_megatron_command(str(script))
    patched = patch_script(command, new,
                           layout_changes(command, megatron_layout(command, gpus), new))
    got = [line for line in difflib.unified_diff(text.splitlines(), patched.splitlines(),
                                                 lineterm="", n=0)
           if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert got == diff
    again = tmp_path / "tuned.sh"
    again.write_text(patched)
    assert megatron_layout(read_megatron_command(str(again)), gpus) == new


# -- export --megatron-version: the user's other flags in that release's spelling -------------

_OLD_FLAGS = ("ARGS=(\n  --moe-deepep-num-sms 20\n  --tokenizer-hf-use-fast\n)\n"
              f"torchrun --nproc-per-node 4 pretrain_gpt.py {_MODEL} --global-batch-size 8 "
              '--micro-batch-size 1 --no-async-tensor-model-parallel-allreduce "${ARGS[@]}" \\\n'
              "    --muon-use-nesterov --inference-max-batch-size=8 --save ckpt\n")
"""A script in megatron-core 0.16's spelling: flags that 0.19 renamed (in an array, inline,
as --flag=value), deprecated, and removed (with a value-less flag before the array)."""


_RESPELLED_TO = Layout(dp=4, mbs=2, gbs=8, impl="te")


def _patched(tmp_path: Path, text: str, version: MegatronVersion | None,
             new: Layout = _RESPELLED_TO) -> tuple[str, list[str]]:
    script = tmp_path / "train.sh"
    script.write_text(text)
    command = read_megatron_command(str(script))
    patched = patch_script(command, new, layout_changes(command, megatron_layout(command, 4),
                                                        new), version)
    diff = [line for line in difflib.unified_diff(text.splitlines(), patched.splitlines(),
                                                  lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    return patched, diff


def test_megatron_version_respells_the_users_flags_in_place(tmp_path: Path) -> None:
    patched, diff = _patched(tmp_path, _OLD_FLAGS, V0_19)
    assert diff == [
        "-  --moe-deepep-num-sms 20", "-  --tokenizer-hf-use-fast",
        "+  --moe-flex-dispatcher-num-sms 20",
        f"-torchrun --nproc-per-node 4 pretrain_gpt.py {_MODEL} --global-batch-size 8 "
        '--micro-batch-size 1 --no-async-tensor-model-parallel-allreduce "${ARGS[@]}" \\',
        "-    --muon-use-nesterov --inference-max-batch-size=8 --save ckpt",
        f"+torchrun --nproc-per-node 4 pretrain_gpt.py {_MODEL} --global-batch-size 8 "
        '--micro-batch-size 2 "${ARGS[@]}" \\',
        "+    --muon-nesterov --inference-max-requests=8 --save ckpt"]
    # Read back: every flag is 0.19's, the layout the new one, and nothing else moved.
    again = tmp_path / "tuned.sh"
    again.write_text(patched)
    command = read_megatron_command(str(again))
    flags = [g.flag for g in command.groups if g.flag is not None]
    assert spell_args(flags, V0_19) == flags
    assert megatron_layout(command, 4) == _RESPELLED_TO


def test_without_megatron_version_the_users_spelling_is_kept(tmp_path: Path) -> None:
    _, diff = _patched(tmp_path, _OLD_FLAGS, None)
    assert diff == [  # the layout's flag alone
        f"-torchrun --nproc-per-node 4 pretrain_gpt.py {_MODEL} --global-batch-size 8 "
        '--micro-batch-size 1 --no-async-tensor-model-parallel-allreduce "${ARGS[@]}" \\',
        f"+torchrun --nproc-per-node 4 pretrain_gpt.py {_MODEL} --global-batch-size 8 "
        '--micro-batch-size 2 --no-async-tensor-model-parallel-allreduce "${ARGS[@]}" \\']
    # The release the script is written for: nothing to respell either.
    assert _patched(tmp_path, _OLD_FLAGS, V0_16)[1] == diff


def test_megatron_version_respells_a_newer_script_for_an_older_release(tmp_path: Path) -> None:
    text = f"torchrun --nproc-per-node 4 pretrain_gpt.py {_MODEL} --global-batch-size 8 " \
           "--muon-nesterov --cuda-graph-modules=attn\n"
    _, diff = _patched(tmp_path, text, V0_16)
    assert diff == [f"-{text.rstrip()}",
                    f"+torchrun --nproc-per-node 4 pretrain_gpt.py {_MODEL} "
                    "--global-batch-size 8 --muon-use-nesterov --cuda-graph-scope=attn "
                    "--micro-batch-size 2"]


@pytest.mark.parametrize(("flags", "message"), [
    ("--fused-residual-rmsnorm", "--fused-residual-rmsnorm needs megatron-core >= 0.19.2; "
                                 "the command is for 0.16.1"),
    ("--moe-flex-dispatcher-num-sms 20", "--moe-deepep-num-sms or --moe-hybridep-num-sms"),
], ids=["added-in-0.19", "merged-in-0.19"])
def test_a_flag_the_release_lacks_is_refused(tmp_path: Path, flags: str, message: str) -> None:
    text = f"torchrun --nproc-per-node 4 pretrain_gpt.py {_MODEL} --global-batch-size 8 {flags}\n"
    with pytest.raises(ConfigError, match=re.escape(message)):
        _patched(tmp_path, text, V0_16)


def test_a_flag_to_respell_in_a_variable_autotune_does_not_follow_is_refused(
        tmp_path: Path) -> None:
    text = ('if [ -n "$X" ]; then EXTRA="--muon-use-nesterov"; fi\n'
            f"torchrun --nproc-per-node 4 pretrain_gpt.py {_MODEL} --global-batch-size 8 "
            "$EXTRA\n")
    script = tmp_path / "train.sh"
    script.write_text(text)
    try:
        command = read_megatron_command(str(script))
    except ConfigError as exc:  # the reader may refuse the unknown words first: one line too
        assert len(str(exc).splitlines()) == 1
        return
    with pytest.raises(ConfigError, match="--muon-use-nesterov comes from a variable"):
        respellings(command, V0_19)


def test_export_megatron_version_respells_and_says_so(
        tmp_path: Path, study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script, line = _script(tmp_path, "")
    text = script.read_text().replace("--log-dir {a,b}\n",
                                      "--log-dir {a,b} --tokenizer-hf-use-fast \\\n"
                                      "    --muon-use-nesterov\n")
    script.write_text(text)
    tuned = tmp_path / "tuned.sh"
    capsys.readouterr()
    assert main(["export", "--from-megatron", str(script), "--line", str(line), "--study", "s",
                 "--results-dir", str(study), "--megatron-version", "0.19.2",
                 "-o", str(tuned)]) == 0
    err = capsys.readouterr().err
    assert (f"line {line}: flags respelled for megatron-core 0.19.2: --tokenizer-hf-use-fast "
            "(removed); --muon-use-nesterov -> --muon-nesterov") in err
    after = tuned.read_text()
    # The removed flag went with its line's blank; the renamed one stands where it stood.
    assert "--log-dir {a,b} \\\n" in after and after.endswith("\n    --muon-nesterov\n")
    assert "--tokenizer-hf-use-fast" not in after and "--muon-use-nesterov" not in after
    # Without the option, the same export keeps the user's spelling.
    assert main(["export", "--from-megatron", str(script), "--line", str(line), "--study", "s",
                 "--results-dir", str(study), "-o", str(tuned)]) == 0
    assert "flags respelled" not in capsys.readouterr().err
    kept = tuned.read_text()
    assert "--log-dir {a,b} --tokenizer-hf-use-fast \\\n" in kept
    assert kept.endswith("\n    --muon-use-nesterov\n")
