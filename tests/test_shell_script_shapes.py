"""Two launch shapes of published launch scripts, read and exported by patching (session 19):

- `srun ... sh -c "${CMD}"` / `bash -c '...'`: the command is a string a new shell runs
  (Megatron-LM's examples/academic_paper_scripts/sc21/SRUN.sh, its older Slurm examples'
  `run_cmd`, NeMo-style `srun --container-image ... bash -c "cd /opt/megatron && torchrun"`);
- arrays grown with `+=` (Megatron-LM's examples/llama, mixtral: `ARGS=( ... )` then
  `ARGS+=( ... )`, some inside an `if`; `ARGS+=(${OTHER[@]})`).

Reading gives the layout, GPUs and flags as for the plain command; the export edits only the
flags that change, where they are written (inside the string, or the variable holding it), and
the patched script reads back as the exported layout. A shape autotune cannot patch safely is
refused in one line, exit 2. Nothing from a test script is run but under bash with stubs.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.errors import ConfigError
from autotune.layouts.layout import Impl, Layout
from autotune.levers.allocator import ALLOC_CONF_ENV
from autotune.megatron import script_patch
from autotune.megatron.megatron_command import (
    layout_changes,
    megatron_layout,
    read_megatron_command,
)
from autotune.megatron.script_patch import patch_script

MODEL = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
         "--max-position-embeddings 512 --tokenizer-type NullTokenizer --vocab-size 1000")
BATCH = "--micro-batch-size 1 --global-batch-size 16"

# ---- the scripts ---------------------------------------------------------------------------

SC21 = f"""#!/bin/bash
#SBATCH -t 0:30:00 --exclusive --mem=0 --overcommit --ntasks-per-node=8
THIS_DIR=`pwd`
DATETIME=`date +'date_%y-%m-%d_time_%H-%M-%S'`
mkdir -p ${{THIS_DIR}}/logs
MEGATRON_PARAMS="{MODEL} {BATCH} --tensor-model-parallel-size 2 --bf16"
CMD="python -u ${{MEGATRON_CODE_DIR}}/pretrain_gpt.py ${{MEGATRON_PARAMS}}"

srun -l \\
     --container-image "nvcr.io#nvidia/pytorch:20.12-py3" \\
     --container-mounts "${{THIS_DIR}}:${{THIS_DIR}},${{MEGATRON_CODE_DIR}}:/code" \\
     --output=${{THIS_DIR}}/logs/%x_%j_$DATETIME.log sh -c "${{CMD}}"
"""
"""Megatron-LM's sc21/SRUN.sh with MEGATRON_PARAMS set in the script (CONFIG.sh's job)."""

RUN_CMD = f"""#!/bin/bash
DIR=`pwd`
TP=2
options=" \\
    {MODEL} \\
    --tensor-model-parallel-size ${{TP}} \\
    --pipeline-model-parallel-size 1 \\
    {BATCH} \\
    --bf16"
run_cmd="cd /opt/megatron && torchrun --nproc-per-node 8 pretrain_gpt.py ${{options}}"
srun -l --container-image=nvcr.io/nvidia/pytorch:24.01-py3 --container-mounts=$DIR:$DIR \\
    --output=$DIR/logs/%x_%j.log sh -c "${{run_cmd}}"
"""
"""Megatron-LM's older Slurm examples: `options` then `run_cmd`, run by `srun ... sh -c`;
here torchrun inside the string (one node of 8)."""

INLINE = f"""#!/bin/bash
export CUDA_DEVICE_MAX_CONNECTIONS=1
srun --container-image=nvcr.io/nvidia/nemo:24.07 bash -c "cd /opt/megatron && \\
  torchrun --nproc-per-node 8 pretrain_gpt.py \\
    {MODEL} \\
    --tensor-model-parallel-size 2 \\
    {BATCH} \\
    --bf16 2>&1 | tee train.log"
"""
"""A NeMo-style recipe: the launch written inside a double-quoted, multi-line string."""

SINGLE = f"""#!/bin/bash
export TP=2
srun -l bash -lc 'torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} {BATCH} \\
    --tensor-model-parallel-size $TP --bf16'
"""
"""Single quotes: the new shell expands $TP, which the script exported."""

APPENDS = f"""#!/bin/bash
GPT_MODEL_ARGS=({MODEL})
TRAINING_ARGS=()
TRAINING_ARGS+=(--micro-batch-size 1)
TRAINING_ARGS+=(--global-batch-size 16 --bf16)
MODEL_PARALLEL_ARGS=()
MODEL_PARALLEL_ARGS+=(--tensor-model-parallel-size 2)
MODEL_PARALLEL_ARGS+=(--pipeline-model-parallel-size 1)
LOGGING_ARGS=(--log-interval 1)
if [ -n "${{WANDB_API_KEY}}" ]; then
    LOGGING_ARGS+=(
        --wandb-project ${{WANDB_PROJECT:-"Mixtral"}}
        --wandb-exp-name ${{WANDB_NAME:-"Mixtral_8x7B"}}
    )
fi
ALL_ARGS=()
ALL_ARGS+=(${{GPT_MODEL_ARGS[@]}})
ALL_ARGS+=("${{TRAINING_ARGS[@]}}" "${{MODEL_PARALLEL_ARGS[@]}}")
torchrun --nproc-per-node 8 pretrain_gpt.py \\
    "${{ALL_ARGS[@]}}" \\
    ${{LOGGING_ARGS[@]}}
"""
"""Megatron-LM's mixtral example's shape, its arrays grown by `+=` (one inside an if)."""

SELF_APPEND = f"""#!/bin/bash
declare -a ARGS=({MODEL})
ARGS=("${{ARGS[@]}}" --tensor-model-parallel-size 2)
ARGS=("${{ARGS[@]}}" {BATCH})
EXTRA="--bf16"
EXTRA+=" --log-interval 1"
torchrun --nproc-per-node 8 pretrain_gpt.py "${{ARGS[@]}}" $EXTRA
"""
"""`NAME=( "${NAME[@]}" ... )`, and a string grown with `+=" ..."`."""

TWICE = f"""#!/bin/bash
BATCH_ARGS=({BATCH})
ARGS=({MODEL} --tensor-model-parallel-size 2 --bf16)
ARGS+=(${{BATCH_ARGS[@]}})
torchrun --nproc-per-node 8 pretrain_gpt.py "${{ARGS[@]}}" "${{BATCH_ARGS[@]}}"
"""
"""An array expanded twice (Megatron-LM reads the last --micro-batch-size): one edit."""

TUTORIAL = f"""#!/bin/bash
GBS=${{1:-16}}
TP=2
DISTRIBUTED_ARGS=(
    --nproc_per_node 8
    --nnodes 1
)
GPT_MODEL_ARGS=({MODEL})
MBS=1
TRAINING_ARGS=(
    --micro-batch-size $MBS
    --global-batch-size $GBS
    --bf16
)
MODEL_PARALLEL_ARGS+=(
\t--tensor-model-parallel-size $TP
\t--pipeline-model-parallel-size 1
)
cmd="torchrun ${{DISTRIBUTED_ARGS[@]}} $MLMROOT/pretrain_gpt.py \\
    ${{GPT_MODEL_ARGS[@]}} \\
    ${{TRAINING_ARGS[@]}} \\
    ${{MODEL_PARALLEL_ARGS[@]}}"
eval $cmd 2>&1 | tee logs.txt
"""
"""vuiseng9/megatron-tutorials' scripts/2-8 shape (its SP `if` left out): an array made by
`+=` alone, and a string of arrays only, continued over lines, run by eval."""

SUBSTITUTION = f"""#!/bin/bash
mkdir -p logs && srun --container-image=nvcr.io/nvidia/nemo:24.07 bash -c "cd /opt/megatron && \\
  torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} {BATCH} \\
    --tensor-model-parallel-size 2 \\
    --bf16 --save $(pwd)/ckpt 2>&1 | tee train.log" && mv train.log logs/
"""
"""A `$(...)` inside the string (a command of its own on the launch's line) and commands
before and after the srun on that line."""

# ---- reading -------------------------------------------------------------------------------

READS = [
    # (name, script, tp, pp, mbs, gbs, GPUs per node x nodes (None: unknown), launcher[0])
    ("sc21 srun sh -c \"${CMD}\"", SC21, 2, 1, 1, 16, None, "srun"),
    ("run_cmd with torchrun", RUN_CMD, 2, 1, 1, 16, 8, "srun"),
    ("multi-line bash -c string", INLINE, 2, 1, 1, 16, 8, "srun"),
    ("single-quoted bash -lc", SINGLE, 2, 1, 1, 16, 8, "srun"),
    ("arrays grown by +=", APPENDS, 2, 1, 1, 16, 8, "torchrun"),
    ("self-appends and a string +=", SELF_APPEND, 2, 1, 1, 16, 8, "torchrun"),
    ("an array expanded twice", TWICE, 2, 1, 1, 16, 8, "torchrun"),
    ("eval of a string of arrays", TUTORIAL, 2, 1, 1, 16, 8, "torchrun"),
    ("a $(...) in the string", SUBSTITUTION, 2, 1, 1, 16, 8, "srun"),
]


@pytest.mark.parametrize(("name", "text", "tp", "pp", "mbs", "gbs", "gpus", "first"), READS,
                         ids=[r[0] for r in READS])
def test_reading(tmp_path: Path, name: str, text: str, tp: int, pp: int, mbs: int, gbs: int,
                 gpus: int | None, first: str) -> None:
    script = tmp_path / "train.sh"
    script.write_text(text)
    command = read_megatron_command(str(script))
    fields = command.layout_fields
    assert (fields["tp"], fields["pp"], fields["mbs"], fields["gbs"]) == (tp, pp, mbs, gbs)
    assert command.gpus == gpus
    if gpus is None:  # srun launches python, 8 tasks per node (#SBATCH), on nodes sbatch's
        # command line gives (autotune.megatron.slurm)
        assert command.gpus_unknown is not None and "no node count" in command.gpus_unknown
    assert command.launcher[0].text == first
    assert command.model.num_layers == 4 and command.model.hidden_size == 256
    assert "--bf16" in {g.flag for g in command.groups}


def test_the_string_shell_sees_only_exported_variables(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(SINGLE.replace("export TP=2", "TP=2"))
    with pytest.raises(ConfigError, match=r"\$TP is set in the script but not exported"):
        read_megatron_command(str(script))


def test_an_echoed_launch_in_a_string_is_not_one(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(f"bash -c 'echo torchrun pretrain_gpt.py {MODEL}'\n")
    with pytest.raises(ConfigError, match=r"holds no pretrain_gpt\.py command"):
        read_megatron_command(str(script))


# ---- export --------------------------------------------------------------------------------

NEW = Layout(tp=4, dp=2, mbs=2, gbs=16, impl=Impl.TE)
"""tp 2 -> 4 and mbs 1 -> 2 on 8 GPUs: values edited where they stand."""
ADDED = Layout(tp=2, pp=2, dp=2, mbs=1, gbs=16, impl=Impl.TE, distributed_optimizer=True)
"""pp 2 and the distributed optimizer: flags added."""

NNODES = f"""#!/bin/bash
#SBATCH -N 1
srun bash -c "torchrun --nnodes ${{SLURM_NNODES:-1}} --nproc-per-node 8 pretrain_gpt.py \\
    {MODEL} {BATCH} --tensor-model-parallel-size 2 --bf16"
"""
"""NVIDIA's Slurm recipes: torchrun's node count from Slurm, inside a double-quoted -c string."""

PATCHES = [
    # (name, script, new layout, the diff's -/+ lines)
    ("sc21: values in the variable the string expands", SC21, NEW,
     [f'-MEGATRON_PARAMS="{MODEL} {BATCH} --tensor-model-parallel-size 2 --bf16"',
      f'+MEGATRON_PARAMS="{MODEL} --micro-batch-size 2 --global-batch-size 16 '
      '--tensor-model-parallel-size 4 --bf16"']),
    ("sc21: flags added inside the string's variable", SC21, ADDED,
     [f'-MEGATRON_PARAMS="{MODEL} {BATCH} --tensor-model-parallel-size 2 --bf16"',
      f'+MEGATRON_PARAMS="{MODEL} {BATCH} --tensor-model-parallel-size 2 --bf16 '
      '--pipeline-model-parallel-size 2 --use-distributed-optimizer"']),
    ("run_cmd: $TP replaced in the string, not in TP=", RUN_CMD, NEW,
     ["-    --tensor-model-parallel-size ${TP} \\",
      "+    --tensor-model-parallel-size 4 \\",
      f"-    {BATCH} \\", "+    --micro-batch-size 2 --global-batch-size 16 \\"]),
    ("run_cmd: a value edited, a flag added", RUN_CMD, ADDED,
     ["-    --pipeline-model-parallel-size 1 \\", "+    --pipeline-model-parallel-size 2 \\",
      '-    --bf16"', '+    --bf16 --use-distributed-optimizer"']),
    ("inline string: flags added before `2>&1 | tee`", INLINE, ADDED,
     ["-    --bf16 2>&1 | tee train.log\"",
      "+    --bf16 --pipeline-model-parallel-size 2 --use-distributed-optimizer "
      "2>&1 | tee train.log\""]),
    ("single quotes: $TP replaced inside them", SINGLE, NEW,
     [f"-srun -l bash -lc 'torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} {BATCH} \\",
      "-    --tensor-model-parallel-size $TP --bf16'",
      f"+srun -l bash -lc 'torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} "
      "--micro-batch-size 2 --global-batch-size 16 \\",
      "+    --tensor-model-parallel-size 4 --bf16'"]),
    ("appends: edited where appended, the if's block kept", APPENDS, NEW,
     ["-TRAINING_ARGS+=(--micro-batch-size 1)", "+TRAINING_ARGS+=(--micro-batch-size 2)",
      "-MODEL_PARALLEL_ARGS+=(--tensor-model-parallel-size 2)",
      "+MODEL_PARALLEL_ARGS+=(--tensor-model-parallel-size 4)"]),
    ("appends: a flag added on the launch", APPENDS, ADDED,
     ["-MODEL_PARALLEL_ARGS+=(--pipeline-model-parallel-size 1)",
      "+MODEL_PARALLEL_ARGS+=(--pipeline-model-parallel-size 2)",
      "+    --use-distributed-optimizer \\"]),
    ("self-appends", SELF_APPEND, NEW,
     ['-ARGS=("${ARGS[@]}" --tensor-model-parallel-size 2)',
      f'-ARGS=("${{ARGS[@]}}" {BATCH})',
      '+ARGS=("${ARGS[@]}" --tensor-model-parallel-size 4)',
      '+ARGS=("${ARGS[@]}" --micro-batch-size 2 --global-batch-size 16)']),
    ("eval of a string of arrays: $TP and $MBS replaced in the arrays", TUTORIAL, NEW,
     ["-    --micro-batch-size $MBS", "+    --micro-batch-size 2",
      "-\t--tensor-model-parallel-size $TP", "+\t--tensor-model-parallel-size 4"]),
    ("eval of a string of arrays: a flag added to the eval", TUTORIAL, ADDED,
     ["-\t--pipeline-model-parallel-size 1", "+\t--pipeline-model-parallel-size 2",
      "-eval $cmd 2>&1 | tee logs.txt",
      "+eval $cmd --use-distributed-optimizer 2>&1 | tee logs.txt"]),
    ("a $(...) in the string: the srun command is the launch, not the substitution",
     SUBSTITUTION, ADDED,
     ["-    --bf16 --save $(pwd)/ckpt 2>&1 | tee train.log\" && mv train.log logs/",
      "+    --bf16 --save $(pwd)/ckpt --pipeline-model-parallel-size 2 "
      "--use-distributed-optimizer 2>&1 | tee train.log\" && mv train.log logs/"]),
    ("-c string with ${SLURM_NNODES:-1}: flags added inside it", NNODES, ADDED,
     [f'-    {MODEL} {BATCH} --tensor-model-parallel-size 2 --bf16"',
      f'+    {MODEL} {BATCH} --tensor-model-parallel-size 2 --bf16 '
      '--pipeline-model-parallel-size 2 --use-distributed-optimizer"']),
    ("-c string with \\${SLURM_NNODES:-1}: its value edited", NNODES.replace("${", "\\${"),
     NEW, [f'-    {MODEL} {BATCH} --tensor-model-parallel-size 2 --bf16"',
           f'+    {MODEL} --micro-batch-size 2 --global-batch-size 16 '
           '--tensor-model-parallel-size 4 --bf16"']),
    ("an array expanded twice: one edit", TWICE, NEW,
     [f"-BATCH_ARGS=({BATCH})", f"-ARGS=({MODEL} --tensor-model-parallel-size 2 --bf16)",
      "+BATCH_ARGS=(--micro-batch-size 2 --global-batch-size 16)",
      f"+ARGS=({MODEL} --tensor-model-parallel-size 4 --bf16)"]),
]


def _diff(before: str, after: str) -> list[str]:
    return [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(),
                                                  lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def _patch(tmp_path: Path, text: str, new: Layout) -> str:
    script = tmp_path / "train.sh"
    script.write_text(text)
    command = read_megatron_command(str(script))
    return patch_script(command, new, layout_changes(command, megatron_layout(command, 8), new))


@pytest.mark.parametrize(("name", "text", "new", "diff"), PATCHES, ids=[p[0] for p in PATCHES])
def test_export_patches_only_what_it_must(tmp_path: Path, name: str, text: str, new: Layout,
                                          diff: list[str]) -> None:
    patched = _patch(tmp_path, text, new)
    assert _diff(text, patched) == diff
    again = tmp_path / "tuned.sh"
    again.write_text(patched)
    assert megatron_layout(read_megatron_command(str(again)), 8) == new
    assert subprocess.run(["bash", "-n", str(again)], check=False).returncode == 0


# ---- refusals: one line, exit 2 ------------------------------------------------------------

REFUSALS = [
    # (name, script, new layout, the one line's text)
    ("escaped quotes inside the string",
     f'srun bash -c "torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} {BATCH} '
     '--tensor-model-parallel-size 2 --data-path \\"$DATA\\""\n', NEW,
     r"line 1: the sh -c string holds quotes or backslashes, which its shell lexes again"),
    ("the string's variable set in an if",
     f'CMD="torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} {BATCH} '
     '--tensor-model-parallel-size 2"\nif [ -n "$X" ]; then CMD="$CMD --bf16"; fi\n'
     'srun sh -c "$CMD"\n', NEW, r"stands where flags go|set inside an if"),
    ("a string from the environment (sc21 as published)",
     'CMD="python -u ${MEGATRON_CODE_DIR}/pretrain_gpt.py ${MEGATRON_PARAMS}"\n'
     'srun -l sh -c "${CMD}"\n', NEW,
     r"\$MEGATRON_PARAMS stands where flags go"),
    ("a whole string from the environment",
     'srun -l sh -c "${RUN_CMD}"\n', NEW,
     r"line 1: sh -c \$RUN_CMD: not set in the script .*cannot tell whether it runs "
     r"pretrain_gpt.py"),
    ("a layout flag appended inside an if",
     f"ARGS=({MODEL} {BATCH})\nif [ \"$TP\" = 2 ]; then\n  ARGS+=(--tensor-model-parallel-size 2)"
     "\nfi\ntorchrun --nproc-per-node 8 pretrain_gpt.py \"${ARGS[@]}\"\n", NEW,
     r"\$ARGS stands where flags go .*set inside an if"),
    ("a flag set twice in an array, once in an if",
     f"ARGS=({MODEL} {BATCH} --tensor-model-parallel-size 2)\nif [ -n \"$X\" ]; then\n"
     "  ARGS=(--tensor-model-parallel-size 1)\nfi\n"
     "torchrun --nproc-per-node 8 pretrain_gpt.py \"${ARGS[@]}\"\n", NEW,
     r"\$ARGS stands where flags go"),
]


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulated study of the scripts' model on 8 GPUs."""
    tmp = tmp_path_factory.mktemp("study")
    script = tmp / "plain.sh"
    script.write_text(f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} {BATCH} --bf16\n")
    assert main(["--from-megatron", str(script), "--backend", "simulate", "--trials", "4",
                 "--results-dir", str(tmp / "r"), "--study", "s"]) == 0
    return tmp / "r"


def _one_line(err: str) -> None:
    assert err.count("\n") == 1 and err.startswith("autotune: error: "), err


@pytest.mark.parametrize(("name", "text", "new", "message"), REFUSALS,
                         ids=[r[0] for r in REFUSALS])
def test_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
                               text: str, new: Layout, message: str) -> None:
    script = tmp_path / "train.sh"
    script.write_text(text)
    try:
        command = read_megatron_command(str(script))
        patch_script(command, new, layout_changes(command, megatron_layout(command, 8), new))
    except ConfigError as exc:
        assert re.search(message, str(exc)), exc
        assert "\n" not in str(exc)
    else:
        pytest.fail("not refused")
    # And through the CLI: one line on stderr, exit 2.
    capsys.readouterr()
    code = main(["--from-megatron", str(script), "--gpus", "8", "--backend", "simulate",
                 "--trials", "1", "--results-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    if code == 0:  # read: the refusal is the export's, where the best layout changes the flag
        code = main(["export", "--from-megatron", str(script), "--results-dir",
                     str(tmp_path / "r"), "-o", str(tmp_path / "tuned.sh")])
        err = capsys.readouterr().err
        if code == 0:
            return  # the search kept the user's layout: nothing to patch, nothing refused
        assert not (tmp_path / "tuned.sh").exists()
    assert code == 2, err
    _one_line(err)


def test_a_patch_that_does_not_read_back_is_refused(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-back check: an edit that missed (here: none made) is one line, not a file
    that runs the old layout."""
    monkeypatch.setattr(script_patch, "_apply", lambda script, edits: script.text)
    with pytest.raises(ConfigError, match=r"the patched script would read back as tp2 .* not "
                                          r"tp4 .*change them by hand: "):
        _patch(tmp_path, RUN_CMD, NEW)


# ---- end to end: the export run by bash, srun and torchrun stubs ---------------------------

STUBS = {
    # srun: drops its options (all written --opt=value or alone here) and runs the rest.
    "srun": '#!/bin/bash\nwhile [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n',
    # torchrun and python: record their arguments, one JSON list per call.
    "torchrun": "#!/bin/sh\npython3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "
                '"$@" >> "$CALLS"\n',
}


def _run(script: Path, tmp_path: Path) -> list[list[str]]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name, text in STUBS.items():
        stub = bindir / name
        stub.write_text(text)
        stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    calls = tmp_path / "calls.jsonl"
    calls.unlink(missing_ok=True)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "CALLS": str(calls)}
    subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, check=True,
                   capture_output=True)
    return [json.loads(line) for line in calls.read_text().splitlines()]


E2E = f"""#!/bin/bash
TP=2
options="{MODEL} {BATCH} --tensor-model-parallel-size ${{TP}} --bf16"
run_cmd="cd $PWD && torchrun --nproc-per-node 8 pretrain_gpt.py ${{options}}"
srun -l --container-image=nvcr.io/nvidia/pytorch:24.01-py3 sh -c "${{run_cmd}}"
"""


def test_the_exported_script_runs_the_exported_layout(tmp_path: Path, study: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    script = tmp_path / "train.sh"
    script.write_text(E2E)
    tuned = tmp_path / "tuned.sh"
    code = main(["export", "--from-megatron", str(script), "--study", "s", "--results-dir",
                 str(study), "-o", str(tuned)])
    err = capsys.readouterr().err
    assert code == 0, err
    ours = _run(tuned, tmp_path)
    assert len(ours) == 1 and ours[0][:3] == ["--nproc-per-node", "8", "pretrain_gpt.py"]
    exported = megatron_layout(read_megatron_command(str(tuned)), 8)
    argv = ours[0]
    assert argv[argv.index("--tensor-model-parallel-size") + 1] == str(exported.tp)
    assert argv[argv.index("--micro-batch-size") + 1] == str(exported.mbs)
    assert ("--use-distributed-optimizer" in argv) == exported.distributed_optimizer
    # Only the options line may differ (and TP=2 stays: other commands may read it), besides
    # the allocator's export line the search's layout runs with (autotune.levers.allocator).
    changed = {line[1:].split("=")[0] for line in _diff(script.read_text(),
                                                        tuned.read_text())}
    assert changed <= {"options", f"export {ALLOC_CONF_ENV}"}, changed
