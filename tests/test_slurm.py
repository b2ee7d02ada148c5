"""Slurm's task count for `srun python pretrain_gpt.py` launches (autotune.megatron.slurm)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.commands.from_megatron import read_user_job
from autotune.errors import ConfigError
from autotune.megatron.slurm import sbatch_options, srun_processes

TRAIN = ("python pretrain_gpt.py --num-layers 24 --hidden-size 2048 --num-attention-heads 16 "
         "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 "
         "--global-batch-size 64 --bf16 --tokenizer-type NullTokenizer --vocab-size 32000")


@pytest.mark.parametrize(("header", "expected"), [
    ("#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=8\n",
     {"nodes": "2", "ntasks_per_node": "8"}),
    ("#SBATCH -N 4 --ntasks-per-node 8 --gpus-per-node=8\n",
     {"nodes": "4", "ntasks_per_node": "8"}),
    ("#SBATCH -N2\n#SBATCH -n 16\n", {"nodes": "2", "ntasks": "16"}),
    ("#SBATCH --nodes=1\n#SBATCH --nodes=3\n", {"nodes": "3"}),  # the later line wins
    # sbatch stops reading #SBATCH lines at the first command.
    ("#SBATCH --nodes=2\necho hi\n#SBATCH --nodes=9\n", {"nodes": "2"}),
    ("# a comment\n\n#SBATCH --account=abc -p batch --nodes 2\n", {"nodes": "2"}),
    ("#SBATCH --job-name 'x y\n", {}),  # an unbalanced quote: not read
])
def test_sbatch_lines_are_read_as_sbatch_reads_them(header: str,
                                                    expected: dict[str, str]) -> None:
    assert sbatch_options("#!/bin/bash\n" + header + "srun python x.py\n") == expected


@pytest.mark.parametrize(("words", "sbatch", "per_node", "nodes", "source", "why"), [
    (["python"], {"nodes": "2", "ntasks_per_node": "8"}, 8, 2, "#SBATCH", None),
    (["-N", "4", "--ntasks-per-node=8", "python"], {"nodes": "2"}, 8, 4, "srun", None),
    (["--ntasks", "16", "-N2", "python"], {}, 8, 2, "srun", None),
    (["-n", "8", "python"], {}, 8, 1, "srun", None),
    (["--ntasks-per-node=8", "python"], {}, None, None, None, "no node count"),
    (["--container-image", "img.sqsh", "--mpi=pmix", "python"],
     {"nodes": "2", "ntasks_per_node": "4"}, 4, 2, "#SBATCH", None),
    # srun's own option wins over the #SBATCH line.
    (["--ntasks-per-node", "4", "python"], {"nodes": "2", "ntasks_per_node": "8"}, 4, 2, "srun",
     None),
    (["python"], {"nodes": "2"}, None, None, None, "no --ntasks-per-node or --ntasks"),
    (["-N", None, "python"], {}, None, None, None, "srun -N is not set in the script"),
    ([None, "--ntasks-per-node=4", "-N", "2", "python"], {}, 4, 2, "srun", None),
    (["python"], {"nodes": "2-4", "ntasks_per_node": "8"}, None, None, None,
     "nodes '2-4' is not a count"),
    (["-n", "12", "-N", "8", "python"], {}, None, None, None, "12 tasks do not fill 8 nodes"),
])
def test_srun_task_counts(words: list[str | None], sbatch: dict[str, str],
                          per_node: int | None, nodes: int | None, source: str | None,
                          why: str | None) -> None:
    # An unresolved word is written `--output=${DIR}/log` here (another option's).
    count = srun_processes(words, sbatch,
                           [w if w is not None else "--output=${DIR}/log" for w in words])
    assert (count.per_node, count.nodes) == (per_node, nodes)
    if why is None:
        assert count.why is None and count.source == source
    else:
        assert count.why is not None and why in count.why


def _script(tmp_path: Path, text: str) -> str:
    path = tmp_path / "train.sbatch"
    path.write_text(text)
    return str(path)


def test_an_srun_launch_takes_its_gpus_from_sbatch_lines(tmp_path: Path) -> None:
    path = _script(tmp_path, "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=8\n"
                             f"srun {TRAIN}\n")
    job = read_user_job(path, gpus=None, gpus_per_node=None, gpu="h100-80gb")
    assert job.cluster.num_gpus == 16 and job.cluster.gpus_per_node == 8
    assert job.layout.dp == 16
    assert any("#SBATCH options: 8 per node x 2 nodes" in w for w in job.warnings)


def test_gpus_overrides_the_sbatch_lines(tmp_path: Path) -> None:
    """`sbatch -N 4 train.sbatch` overrides the file's #SBATCH lines when submitted: --gpus
    says what the job will have."""
    path = _script(tmp_path, "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=8\n"
                             f"srun {TRAIN}\n")
    job = read_user_job(path, gpus=32, gpus_per_node=None, gpu="h100-80gb")
    assert job.cluster.num_gpus == 32
    assert any("taking --gpus 32" in w for w in job.warnings)


def test_an_srun_launch_without_a_task_count_asks_for_gpus(tmp_path: Path) -> None:
    path = _script(tmp_path, f"#!/bin/bash\n#SBATCH --nodes=2\nsrun {TRAIN}\n")
    with pytest.raises(ConfigError, match=r"no --ntasks-per-node or --ntasks.*give --gpus N"):
        read_user_job(path, gpus=None, gpus_per_node=None, gpu="h100-80gb")


TORCHRUN = TRAIN.replace("python pretrain_gpt.py", "pretrain_gpt.py")


@pytest.mark.parametrize(("text", "gpus", "said"), [
    # torchrun's --nnodes is Slurm's node count: what #SBATCH --nodes gives it.
    ("#SBATCH --nodes=2\nsrun torchrun --nnodes ${SLURM_NNODES:-1} --nproc-per-node 8 {t}\n",
     16, "#SBATCH --nodes 2"),
    ("#SBATCH -N 4\nNN=${SLURM_JOB_NUM_NODES:-1}\n"
     "srun torchrun --nnodes=$NN --nproc-per-node 4 {t}\n", 16, "#SBATCH --nodes 4"),
    # Inside a double-quoted -c string, as NVIDIA's Slurm recipes write it.
    ('#SBATCH -N 2\nsrun bash -c "torchrun --nnodes \\${SLURM_NNODES:-1} --nproc-per-node 8 '
     '{t}"\n', 16, "#SBATCH --nodes 2"),
    # Unescaped: this script expands it inside the allocation, to the same count.
    ('#SBATCH -N 2\nsrun bash -c "torchrun --nnodes ${SLURM_NNODES:-1} --nproc-per-node 8 '
     '{t}"\n', 16, "#SBATCH --nodes 2"),
    ('#SBATCH -N 2\nsrun sh -c "cd /w && torchrun --nnodes=${SLURM_JOB_NUM_NODES:-1} '
     '--nproc-per-node 4 {t} 2>&1 | tee log"\n', 8, "#SBATCH --nodes 2"),
    # No #SBATCH line: the script's default, said, never silent.
    ("srun torchrun --nnodes ${SLURM_NNODES:-1} --nproc-per-node 8 {t}\n", 8,
     "by the script's default for $SLURM_NNODES"),
    ('srun bash -c "torchrun --nnodes ${SLURM_NNODES:-1} --nproc-per-node 8 {t}"\n', 8,
     "by the script's default for $SLURM_NNODES"),
    # Another variable: the script's default, said.
    ("#SBATCH -N 2\ntorchrun --nnodes ${NNODES:-1} --nproc-per-node 8 {t}\n", 8,
     "by the script's default for $NNODES"),
])
def test_torchrun_node_count_from_slurm(tmp_path: Path, text: str, gpus: int,
                                        said: str) -> None:
    path = _script(tmp_path, "#!/bin/bash\n" + text.replace("{t}", TORCHRUN))
    job = read_user_job(path, gpus=None, gpus_per_node=None, gpu="h100-80gb")
    assert job.cluster.num_gpus == gpus
    assert [w for w in job.warnings if said in w], job.warnings
    # --gpus says what the job will have (sbatch -N on its command line overrides the file).
    assert read_user_job(path, gpus=32, gpus_per_node=None,
                         gpu="h100-80gb").cluster.num_gpus == 32
