"""A launch inside the job script of `sbatch <<EOF` (a wrapper that submits its job script as a
here-document): read as sbatch runs it, its #SBATCH lines and sbatch's own options counted, with
one line saying where it is; never edited (the export refuses in one line where flags change).
Every other here-document (`cat > job.sh <<EOF`, `bash <<EOF`) stays text, as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.cli import main
from autotune.commands.from_megatron import read_user_job
from autotune.errors import ConfigError
from autotune.layouts.layout import Impl, Layout
from autotune.megatron.megatron_command import (
    job_script_warning,
    layout_changes,
    megatron_layout,
    read_megatron_command,
)
from autotune.megatron.script_patch import patch_script
from autotune.megatron.shell_script import HereDoc, read_script_commands

MODEL = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
         "--max-position-embeddings 512 --tokenizer-type NullTokenizer --vocab-size 1000 "
         "--micro-batch-size 1 --global-batch-size 16 --bf16")

READS = [
    # (name, script, GPUs, tp, the launch's line, a line among the warnings)
    ("unquoted: \\${SLURM_NNODES} left for the job, #SBATCH --nodes counts",
     "#!/bin/bash\nsbatch <<EOF\n#!/bin/bash\n#SBATCH --nodes=2\n"
     "srun torchrun --nnodes \\${SLURM_NNODES:-1} --nproc-per-node 8 pretrain_gpt.py "
     f"{MODEL} --tensor-model-parallel-size 2\nEOF\n",
     16, 2, 5, "#SBATCH --nodes 2"),
    ("quoted: the text as written",
     "#!/bin/bash\nsbatch <<'EOF'\n#!/bin/bash\n#SBATCH -N 4\n"
     "srun torchrun --nnodes ${SLURM_NNODES:-1} --nproc-per-node 8 pretrain_gpt.py "
     f"{MODEL} --tensor-model-parallel-size 2\nEOF\n",
     32, 2, 5, "#SBATCH --nodes 4"),
    ("<<-: tabs stripped; this script's $TP expanded into it; an array over lines",
     "#!/bin/bash\nTP=4\nsbatch <<-EOF\n\t#!/bin/bash\n\t#SBATCH --nodes=2\n"
     "\t#SBATCH --ntasks-per-node=8\n\tARGS=(\n\t  " + MODEL + "\n\t)\n"
     "\tsrun python pretrain_gpt.py \"\\${ARGS[@]}\" \\\n"
     "\t  --tensor-model-parallel-size $TP\n\tEOF\n",
     16, 4, 10, "one per task of srun"),
    ("sbatch's own -N over the job script's #SBATCH --nodes",
     "#!/bin/bash\nsbatch -N 4 --parsable <<'EOF'\n#!/bin/bash\n#SBATCH --nodes=2\n"
     "#SBATCH --ntasks-per-node=8\n"
     f"srun python pretrain_gpt.py {MODEL} --tensor-model-parallel-size 2\nEOF\n",
     32, 2, 6, "(sbatch command-line and #SBATCH options: 8 per node x 4 nodes)"),
    ("sbatch's own --nodes over the job script's, for torchrun's --nnodes",
     "#!/bin/bash\nsbatch --nodes=2 <<'EOF'\n#!/bin/bash\n#SBATCH -N 4\n"
     "srun torchrun --nnodes ${SLURM_NNODES:-1} --nproc-per-node 8 pretrain_gpt.py "
     f"{MODEL}\nEOF\n",
     16, 1, 5, "which Slurm sets from sbatch's command line --nodes 2"),
    ("an exported variable reaches a quoted job script; sbatch by its path, after cd &&",
     "#!/bin/bash\nexport TP=2\ncd /work && /usr/bin/sbatch <<'EOF'\n#!/bin/bash\n"
     f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} --tensor-model-parallel-size $TP\n"
     "EOF\n",
     8, 2, 5, "the launch is in the here-document fed to sbatch"),
    ("a line continuation in an unquoted job script keeps the launch's first line",
     "#!/bin/bash\nsbatch <<EOF\ntorchrun --nproc-per-node 8 \\\n  pretrain_gpt.py \\\n"
     f"  {MODEL} \\\n  --tensor-model-parallel-size 2\necho done\nEOF\n",
     8, 2, 3, "the launch is in the here-document fed to sbatch"),
]

CAPTURED = [
    # `JOBID=$(sbatch --parsable <<EOF ... EOF)`: the job id captured to chain jobs; the
    # here-document is the job script all the same. (name, script, GPUs, tp, line, warning)
    ("--parsable, unquoted <<EOF, #SBATCH --nodes counts",
     "#!/bin/bash\nJOBID=$(sbatch --parsable <<EOF\n#!/bin/bash\n#SBATCH --nodes=2\n"
     "srun torchrun --nnodes \\${SLURM_NNODES:-1} --nproc-per-node 8 pretrain_gpt.py "
     f"{MODEL} --tensor-model-parallel-size 2\nEOF\n)\necho \"submitted $JOBID\"\n",
     16, 2, 5, "#SBATCH --nodes 2"),
    ("without --parsable, quoted <<'EOF'",
     "#!/bin/bash\nJOBID=$(sbatch <<'EOF'\n#!/bin/bash\n#SBATCH -N 4\n"
     "srun torchrun --nnodes ${SLURM_NNODES:-1} --nproc-per-node 8 pretrain_gpt.py "
     f"{MODEL} --tensor-model-parallel-size 2\nEOF\n)\n",
     32, 2, 5, "#SBATCH --nodes 4"),
    ('"$(...)" quoted; sbatch\'s own -N over the job script\'s #SBATCH --nodes',
     "#!/bin/bash\nJOBID=\"$(sbatch --parsable -N 2 <<'EOF'\n#!/bin/bash\n#SBATCH --nodes=4\n"
     "#SBATCH --ntasks-per-node=8\n"
     f"srun python pretrain_gpt.py {MODEL} --tensor-model-parallel-size 4\nEOF\n)\"\n",
     16, 4, 6, "(sbatch command-line and #SBATCH options: 8 per node x 2 nodes)"),
    ("the sbatch on the line after $(; export; the job id chains the next job",
     "#!/bin/bash\nexport TP=2\nexport JOBID=$(\n  sbatch --parsable <<'EOF'\n"
     f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} --tensor-model-parallel-size $TP\n"
     "EOF\n)\nsbatch --dependency=afterok:$JOBID eval.sh\n",
     8, 2, 5, "the launch is in the here-document fed to sbatch"),
]


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "submit.sh"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(("name", "text", "gpus", "tp", "line", "said"), READS + CAPTURED,
                         ids=[r[0] for r in READS + CAPTURED])
def test_a_launch_in_an_sbatch_heredoc_is_read(tmp_path: Path, name: str, text: str,
                                               gpus: int, tp: int, line: int,
                                               said: str) -> None:
    path = _write(tmp_path, text)
    job = read_user_job(path, gpus=None, gpus_per_node=None, gpu="h100-80gb")
    assert job.cluster.num_gpus == gpus and job.layout.tp == tp
    assert job.command.line == line and job.command.job_script
    assert job.model.num_layers == 4 and job.model.hidden_size == 256
    assert [w for w in job.warnings if said in w], job.warnings
    note = job_script_warning(job.command) or ""
    assert f"line {line}: the launch is in the here-document fed to sbatch" in note
    assert "\n" not in note


REFUSED = [
    # (name, script, extra --line, the one line)
    ("a variable the job script's shell does not have",
     "#!/bin/bash\nTP=2\nsbatch <<'EOF'\n"
     f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} --tensor-model-parallel-size $TP\n"
     "EOF\n", None,
     r"\$TP is set in the script but not exported, so the sbatch job script does not have it"),
    ("a launch inside an if of the job script",
     "#!/bin/bash\nsbatch <<'EOF'\nif [ -n \"$X\" ]; then\n"
     f"  torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL}\nfi\nEOF\n", None,
     r"line 4 \(inside an if/for/case block or a function of the sbatch job script\)"
     r".*--line N"),
    ("the sbatch inside an if",
     "#!/bin/bash\nif true; then\nsbatch <<'EOF'\n"
     f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL}\nEOF\nfi\n", None,
     r"line 4 \(inside an if\)"),
    ("two job scripts",
     "#!/bin/bash\n" + 2 * ("sbatch <<'EOF'\n"
                            f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL}\nEOF\n"),
     None, r"several places may launch pretrain_gpt\.py \(line 3, line 6\)"),
    # Any other here-document is text: `cat > job.sh <<EOF` writes a file; pass that file.
    ("a job script written by cat",
     "#!/bin/bash\ncat > job.sh <<EOF\n#!/bin/bash\n"
     f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL}\nEOF\nsbatch job.sh\n", None,
     r"line 3 \(in here-document text\)"),
    ("--line in cat's here-document",
     "#!/bin/bash\ncat > job.sh <<EOF\n"
     f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL}\nEOF\nsbatch job.sh\n", 3,
     r"line 3 is here-document text"),
]

_LAUNCH = f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL}\n"
CAPTURED_REFUSED = [
    # A $(...) that is more than one sbatch fed a here-document is not read as its job
    # script: what the substitution captures or runs there is not sbatch's alone.
    ("$(sbatch ... | cut)",
     "#!/bin/bash\nJOBID=$(sbatch --parsable <<'EOF' | cut -d';' -f1\n" + _LAUNCH + "EOF\n)\n",
     None, r"lines 3-4: the launch is in a here-document fed to sbatch, a job script written "
           r"when this one runs; save that job script as a file"),
    ("$(cd DIR && sbatch ...)",
     "#!/bin/bash\nJOBID=$(cd /work && sbatch <<'EOF'\n" + _LAUNCH + "EOF\n)\n", None,
     r"lines 3-4: the launch is in a here-document fed to sbatch"),
    ("backticks", "#!/bin/bash\nJOBID=`sbatch --parsable <<'EOF'\n" + _LAUNCH + "EOF\n`\n",
     None, r"lines 3-4: the launch is in a here-document fed to sbatch"),
    ("$(bash <<EOF)", "#!/bin/bash\nOUT=$(bash <<'EOF'\n" + _LAUNCH + "EOF\n)\n", None,
     r"lines 3-4: the launch is in a here-document fed to bash"),
    ("$(cat <<EOF)", "#!/bin/bash\nTEXT=$(cat <<EOF\n" + _LAUNCH + "EOF\n)\n", None,
     r"line 3 \(in here-document text\)"),
    ("$(sbatch FILE) where a flag's value goes",
     "#!/bin/bash\nTP=$(sbatch --parsable job.sh)\n" + _LAUNCH.strip()
     + " --tensor-model-parallel-size $TP\n", None,
     r"--tensor-model-parallel-size \$\(sbatch --parsable job\.sh\): command substitution, "
     r"which autotune never runs"),
    ("a captured sbatch inside an if",
     "#!/bin/bash\nif true; then\n  JOBID=$(sbatch <<'EOF'\n" + _LAUNCH + "EOF\n)\nfi\n", None,
     r"line 4 \(inside an if\)"),
    ("a captured job script and the one it chains",
     "#!/bin/bash\nA=$(sbatch --parsable <<'EOF'\n" + _LAUNCH + "EOF\n)\n"
     "sbatch --dependency=afterok:$A <<'EOF'\n" + _LAUNCH + "EOF\n", None,
     r"several places may launch pretrain_gpt\.py \(line 3, line 7\)"),
]


@pytest.mark.parametrize(("name", "text", "line", "message"), REFUSED + CAPTURED_REFUSED,
                         ids=[r[0] for r in REFUSED + CAPTURED_REFUSED])
def test_what_cannot_be_read_is_one_line(tmp_path: Path, name: str, text: str,
                                         line: int | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        read_megatron_command(_write(tmp_path, text), line)
    assert "\n" not in str(raised.value)


def test_slurms_node_count_expanded_at_submission_is_said(tmp_path: Path) -> None:
    """`${SLURM_NNODES:-1}` unescaped in an unquoted `<<EOF`: the submitting shell expands it
    (to 1 outside an allocation), and the job runs that: read so, and said in the line."""
    path = _write(tmp_path, READS[0][1].replace("\\${", "${"))
    job = read_user_job(path, gpus=None, gpus_per_node=None, gpu="h100-80gb")
    assert job.cluster.num_gpus == 8
    note = job_script_warning(job.command) or ""
    assert "${SLURM_NNODES:-...} is expanded when the job is submitted" in note
    assert "\\${SLURM_NNODES:-...} for the job's own count" in note and "\n" not in note
    # Escaped (the READS case), no such clause.
    escaped = read_megatron_command(_write(tmp_path, READS[0][1]))
    assert "submitted" not in (job_script_warning(escaped) or "")


def test_line_names_a_launch_in_a_block_of_the_job_script(tmp_path: Path) -> None:
    path = _write(tmp_path, REFUSED[1][1])
    command = read_megatron_command(path, 4)
    assert command.line == 4 and command.job_script and command.gpus == 8


PLAIN = ("#!/bin/bash\nsbatch <<EOF\n#!/bin/bash\n#SBATCH --nodes=1\n"
         f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} --tensor-model-parallel-size 2\n"
         "EOF\n")

# The same job script submitted with its job id captured (launch on the same line 5).
CAPTURED_PLAIN = PLAIN.replace("sbatch <<EOF", "JOBID=$(sbatch --parsable <<EOF") \
    + ')\nsbatch --dependency="afterok:$JOBID" eval.sh\n'


@pytest.mark.parametrize("text", [PLAIN, CAPTURED_PLAIN], ids=["plain", "captured"])
@pytest.mark.parametrize(("new", "refused"), [
    (Layout(tp=4, dp=2, mbs=1, gbs=16, impl=Impl.TE), r"--tensor-model-parallel-size 2 -> 4"),
    (Layout(tp=2, dp=4, mbs=1, gbs=16, impl=Impl.TE), None),  # the user's own: nothing to edit
])
def test_the_export_does_not_edit_a_job_script(tmp_path: Path, new: Layout,
                                               refused: str | None, text: str) -> None:
    path = _write(tmp_path, text)
    command = read_megatron_command(path)
    changes = layout_changes(command, megatron_layout(command, 8), new)
    if refused is None:
        assert patch_script(command, new, changes) == text
        return
    with pytest.raises(ConfigError, match=r"line 5: the launch is in the here-document fed to "
                                          r"sbatch, which autotune reads but does not edit; "
                                          r"change it by hand: " + refused) as raised:
        patch_script(command, new, changes)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("text", [PLAIN, CAPTURED_PLAIN], ids=["plain", "captured"])
def test_the_search_reads_a_job_script(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       text: str) -> None:
    path = _write(tmp_path, text)
    assert main(["--from-megatron", path, "--backend", "simulate", "--trials", "2",
                 "--results-dir", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "line 5: the launch is in the here-document fed to sbatch" in err


def test_only_the_files_own_substitution_is_a_job_script() -> None:
    """The job scripts are keyed by the file's line of their sbatch: a `$(sbatch ...)` in text
    lexed again (an eval's string, here on line 1 of its own) is not the one on that line."""
    doc = HereDoc(_LAUNCH, 2, expands=False)
    commands, _ = read_script_commands("eval 'J=$(sbatch --parsable)'\n", "t.sh", None,
                                       {1: doc})
    assert not [c for c in commands if c.job is not None]
    commands, _ = read_script_commands("J=$(sbatch --parsable)\n", "t.sh", None, {1: doc})
    assert [c.line for c in commands if c.job is not None] == [2]
