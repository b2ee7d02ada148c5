"""--from-megatron's GPU count where torchrun's options come from the environment when the script
runs (`--nnodes ${SLURM_NNODES:-1}`): the script's default is only what it says without Slurm,
so --gpus decides, with a note; a count the script itself sets still contradicts --gpus."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.commands.from_megatron import read_user_job
from autotune.errors import ConfigError

FLAGS = ("pretrain_gpt.py --num-layers 24 --hidden-size 2048 --num-attention-heads 16 "
         "--seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 1 "
         "--global-batch-size 64 --vocab-size 50304")


@pytest.mark.parametrize(("launch", "gpus", "world", "per_node", "note"), [
    # Slurm's node count, defaulted in the script: --gpus 64 is 8 nodes of 8.
    ("torchrun --nproc-per-node 8 --nnodes ${SLURM_NNODES:-1}", 64, 64, 8, "$SLURM_NNODES"),
    ("torchrun --nproc_per_node=8 --nnodes=${NNODES:-2}", 32, 32, 8, "$NNODES"),
    # Without --gpus the script's default stands, said by nothing.
    ("torchrun --nproc-per-node 8 --nnodes ${SLURM_NNODES:-2}", None, 16, 8, None),
    # --gpus agreeing with the default: nothing to say.
    ("torchrun --nproc-per-node 8 --nnodes ${SLURM_NNODES:-1}", 8, 8, None, None),
    # Both counts from the environment.
    ("torchrun --nproc-per-node ${GPUS:-8} --nnodes ${NN:-1}", 16, 16, 8, "$GPUS, $NN"),
    # The script sets the variable: its value, not the environment's.
    ("NN=2\ntorchrun --nproc-per-node 8 --nnodes ${NN:-1}", None, 16, 8, None),
])
def test_a_count_from_the_environment_gives_way_to_gpus(
        tmp_path: Path, launch: str, gpus: int | None, world: int, per_node: int | None,
        note: str | None) -> None:
    script = tmp_path / "train.sh"
    script.write_text(f"{launch} {FLAGS}\n")
    job = read_user_job(str(script), gpus=gpus, gpus_per_node=None, gpu=None)
    assert job.cluster.num_gpus == world
    if per_node is not None:
        assert job.cluster.gpus_per_node == per_node
    said = [w for w in job.warnings if "set when the script runs" in w]
    if note is None:
        assert said == []
    else:
        assert len(said) == 1 and note in said[0] and f"taking --gpus {gpus}" in said[0]


@pytest.mark.parametrize("launch", [
    "torchrun --nproc-per-node 8 --nnodes 1",
    "NN=1\ntorchrun --nproc-per-node 8 --nnodes ${NN:-1}",
])
def test_a_count_the_script_sets_still_contradicts_gpus(tmp_path: Path, launch: str) -> None:
    script = tmp_path / "train.sh"
    script.write_text(f"{launch} {FLAGS}\n")
    with pytest.raises(ConfigError, match=r"runs on 8 GPUs .*--gpus says 64"):
        read_user_job(str(script), gpus=64, gpus_per_node=None, gpu=None)
