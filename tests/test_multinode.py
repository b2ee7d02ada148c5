"""Multi-node trials: the srun / torchrun argv, the CLI's checks, and a run through a fake srun."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

import autotune.commands.search as search_command
from autotune.cli import main
from autotune.errors import ConfigError, LaunchError
from autotune.layouts.layout import Layout
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model
from autotune.trials.launchers import (
    OTHER_NODES_NAME,
    TORCHRUN,
    MultiNode,
    multinode_argv,
    split_srun_argv,
)
from autotune.trials.metrics import metrics_from_run
from autotune.trials.ports import free_port
from autotune.trials.protocol import WORKER
from autotune.trials.runner import run_multinode_trial, slurm_first_node
from autotune.trials.trial import TrialSpec, TrialStatus
from tests.conftest import cluster

DOUBLES = Path(__file__).parent / "doubles"
HAS_TORCH = importlib.util.find_spec("torch") is not None
MODEL = ModelSpec(name="tiny", num_layers=4, hidden_size=64, num_attention_heads=4,
                  vocab_size=1000, seq_length=128, global_batch_size=8)
SPEC = TrialSpec(model=MODEL, layout=Layout(tp=2, dp=8, gbs=8))  # world 16


def _tail(trial_dir: Path) -> list[str]:
    return [*WORKER, "--spec", str(trial_dir.resolve() / "trial.json"),
            "--out-dir", str(trial_dir.resolve())]


def test_slurm_argv(tmp_path: Path) -> None:
    multi = MultiNode(launcher="slurm", nodes=2, gpus_per_node=8)
    argv = multinode_argv(SPEC, tmp_path, multi, "gpu01:29500", "rid",
                          launcher=("torchrun",))
    assert argv == ["srun", "--nodes", "2", "--ntasks-per-node", "1", "--gpus-per-node", "8",
                    "--kill-on-bad-exit=1",
                    "torchrun", "--nnodes", "2", "--nproc-per-node", "8",
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", "gpu01:29500",
                    "--rdzv-id", "rid", *_tail(tmp_path)]


def test_torchrun_argv(tmp_path: Path) -> None:
    multi = MultiNode(launcher="torchrun", nodes=4, gpus_per_node=4,
                      rdzv_endpoint="10.0.0.1:29400")
    argv = multinode_argv(SPEC, tmp_path, multi, "10.0.0.1:29400", "rid")
    assert argv == [*TORCHRUN, "--nnodes", "4", "--nproc-per-node", "4",
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29400",
                    "--rdzv-id", "rid", *_tail(tmp_path)]


def test_argv_needs_world_size_of_the_nodes(tmp_path: Path) -> None:
    multi = MultiNode(launcher="slurm", nodes=2, gpus_per_node=4)
    with pytest.raises(ConfigError, match="world size 8: dp x tp x pp x cp = 16"):
        multinode_argv(SPEC, tmp_path, multi, "h:1", "rid")


@pytest.mark.parametrize(("fields", "message"), [
    ({"launcher": "pbs", "nodes": 2, "gpus_per_node": 8}, "choose slurm or torchrun"),
    ({"launcher": "torchrun", "nodes": 2, "gpus_per_node": 8}, "needs --rdzv-endpoint"),
    ({"launcher": "slurm", "nodes": 2, "gpus_per_node": 8, "rdzv_endpoint": "gpu01"},
     "must be HOST:PORT"),
    ({"launcher": "slurm", "nodes": 0, "gpus_per_node": 8}, "must be positive"),
])
def test_multinode_rejects(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MultiNode(**fields)  # type: ignore[arg-type]


def _fake_command(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_slurm_first_node_expands_the_nodelist(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_command(tmp_path / "bin", "scontrol",
                  'test "$1 $2 $3" = "show hostnames gpu[07-08]" && printf "gpu07\\ngpu08\\n"')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[07-08]")
    assert slurm_first_node() == "gpu07"


def test_slurm_first_node_outside_an_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    with pytest.raises(LaunchError, match="inside an allocation"):
        slurm_first_node()


# --- the command line -------------------------------------------------------------------------


def _one_line_error(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("autotune: error: ") and message in err, err


@pytest.mark.parametrize(("args", "message"), [
    (["--gpus", "16", "--nodes", "2", "--gpus-per-node", "4", "--launcher", "slurm"],
     "--gpus 16 must equal --nodes 2 x --gpus-per-node 4 = 8"),
    (["--gpus", "15", "--nodes", "2", "--launcher", "slurm"],
     "--gpus 15 is not a multiple of --nodes 2"),
    (["--gpus", "16", "--nodes", "2"], "--nodes 2 needs --launcher slurm or torchrun"),
    (["--gpus", "16", "--nodes", "2", "--launcher", "torchrun"], "needs --rdzv-endpoint"),
    (["--gpus", "8", "--launcher", "slurm"], "need --nodes M"),
    (["--gpus", "16", "--nodes", "2", "--launcher", "mpirun"], "choose slurm or torchrun"),
])
def test_cli_rejects(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    _one_line_error(capsys, ["gpt2-xl", *args], message)


def test_nodes_without_launcher_plan_with_simulate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpt2-xl", "--gpus", "16", "--nodes", "2", "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpus_per_node"] == 8


def test_backend_choice_allows_more_gpus_than_local(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_command, "local_gpu_count", lambda: 8)
    multi = MultiNode(launcher="slurm", nodes=2, gpus_per_node=8)
    assert search_command._choose_backend("auto", cluster(16, 8), multi) == "worker"
    with pytest.raises(ConfigError, match="--nodes M with --launcher"):
        search_command._choose_backend("auto", cluster(16, 8))
    with pytest.raises(ConfigError, match="megatron-lm runs on one node"):
        search_command._choose_backend("megatron-lm", cluster(16, 8), multi)


# --- a trial through a fake srun (one node standing in for two) -------------------------------


@pytest.fixture
def fake_srun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "srun.jsonl"
    monkeypatch.setenv("FAKE_SRUN_LOG", str(log))
    return log


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch for torchrun")
@pytest.mark.parametrize(("double", "status"), [("ok", TrialStatus.OK),
                                                ("oom", TrialStatus.OOM)])
def test_trial_through_fake_srun(tmp_path: Path, fake_srun: Path, double: str,
                                 status: TrialStatus) -> None:
    spec = TrialSpec(model=MODEL, layout=Layout(dp=4, gbs=8))  # 2 nodes x 2 GPUs
    endpoint = f"127.0.0.1:{free_port()}"
    multi = MultiNode(launcher="slurm", nodes=2, gpus_per_node=2, rdzv_endpoint=endpoint)
    trial_dir = tmp_path / "trials" / "0"
    output = run_multinode_trial(spec, trial_dir, multi, timeout_s=30, grace_s=1,
                                 srun=(sys.executable, str(DOUBLES / "fake_srun.py")),
                                 worker=(str(DOUBLES / f"{double}.py"),))
    recorded = json.loads(fake_srun.read_text().splitlines()[0])[1:]
    assert recorded[:8] == ["--nodes", "2", "--ntasks-per-node", "1", "--gpus-per-node", "2",
                            "--kill-on-bad-exit=1", TORCHRUN[0]]
    assert recorded[recorded.index("--rdzv-endpoint") + 1] == endpoint
    metrics = metrics_from_run(output)
    assert metrics.status is status, (metrics.error, output.log_path.read_text())
    assert not output.timed_out


def test_torchrun_launcher_writes_the_other_nodes_command(tmp_path: Path) -> None:
    # The "torchrun" here exits at once: only the script for the other nodes is under test.
    spec = TrialSpec(model=MODEL, layout=Layout(dp=4, gbs=8))
    multi = MultiNode(launcher="torchrun", nodes=2, gpus_per_node=2,
                      rdzv_endpoint="10.0.0.1:29400")
    output = run_multinode_trial(spec, tmp_path / "3", multi, timeout_s=10, grace_s=1,
                                 launcher=(sys.executable, "-c", "pass"))
    script = (tmp_path / "3" / OTHER_NODES_NAME).read_text()
    assert "--rdzv-endpoint 10.0.0.1:29400" in script and "--nnodes 2" in script
    assert output.returncode == 0


def test_srun_and_torchrun_from_the_environment(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # Trials in a container, autotune outside it: srun with pyxis flags, the container's python.
    monkeypatch.setenv("AUTOTUNE_SRUN", f"{sys.executable} {DOUBLES / 'fake_srun.py'} "
                                        "--container-image=img.sqsh")
    monkeypatch.setenv("AUTOTUNE_TORCHRUN", f"{sys.executable} -c pass")
    log = tmp_path / "srun.jsonl"
    monkeypatch.setenv("FAKE_SRUN_LOG", str(log))
    spec = TrialSpec(model=MODEL, layout=Layout(dp=4, gbs=8))
    multi = MultiNode(launcher="slurm", nodes=2, gpus_per_node=2, rdzv_endpoint="h:1")
    output = run_multinode_trial(spec, tmp_path / "1", multi, timeout_s=10, grace_s=1)
    recorded = json.loads(log.read_text())[1:]
    assert recorded[:2] == ["--container-image=img.sqsh", "--nodes"]
    assert recorded[recorded.index("--kill-on-bad-exit=1") + 1:][:3] == [sys.executable, "-c",
                                                                         "pass"]
    assert output.returncode == 0


@pytest.mark.parametrize(("argv", "options", "command"), [
    (["--nodes", "2", "--kill-on-bad-exit=1", "torchrun", "--nnodes", "2"],
     ["--nodes", "2", "--kill-on-bad-exit=1"], ["torchrun", "--nnodes", "2"]),
    (["python", "-m", "x"], [], ["python", "-m", "x"]),
    (["--nodes", "2"], ["--nodes", "2"], []),
    ([], [], []),
])
def test_split_srun_argv(argv: list[str], options: list[str], command: list[str]) -> None:
    assert split_srun_argv(argv) == (options, command)


def test_split_srun_argv_reads_what_multinode_argv_writes(tmp_path: Path) -> None:
    multi = MultiNode(nodes=2, gpus_per_node=4, launcher="slurm")
    spec = TrialSpec(model=load_model("gpt2"), layout=Layout(dp=8, mbs=1, gbs=64))
    argv = multinode_argv(spec, tmp_path, multi, "node0:29500", "rid", srun=("srun",),
                          launcher=("torchrun",))
    options, command = split_srun_argv(argv[1:])
    assert command[0] == "torchrun" and "--kill-on-bad-exit=1" in options
