"""`autotune export`: the scripts run unchanged (under fake torchrun/srun), carry every flag of
megatron_lm_args with the right values, and the JSON layout round-trips into `estimate`."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.cli import main
from autotune.layouts.layout import Layout
from autotune.megatron.megatron_args import megatron_lm_args
from autotune.report.load import load_study, resolve_study
from autotune.search import SearchConfig, run_search
from autotune.search.backends import SimulateBackend
from autotune.search.space import space_from_mapping
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.presets import load_model
from autotune.trials.trial import TrialSpec

MODEL = load_model("gpt2")
CLUSTER = ClusterSpec(num_gpus=2, gpus_per_node=2, gpu=gpu_spec("h100-80gb"))
SPACE = space_from_mapping({"tp": [1, 2], "sequence_parallel": [False, True], "mbs": [1, 2],
                            "recompute": ["none", "full"], "distributed_optimizer": [True],
                            "overlap_grad_reduce": [True], "overlap_param_gather": [True],
                            "impl": ["sdpa", "local"]}, "test")
FAKE = """#!/bin/sh
# Records its name and arguments, one JSON list per call, instead of launching anything.
python3 -c 'import json, os, sys; print(json.dumps([os.path.basename(sys.argv[1])] + \
sys.argv[2:]))' "$0" "$@" >> "$CALLS"
"""


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("results")
    cfg = SearchConfig(model=MODEL, cluster=CLUSTER, space=SPACE,
                       backend=SimulateBackend(CLUSTER), results_dir=root, sampler="grid")
    return root, run_search(cfg).study_name


def export(capsys: pytest.CaptureFixture[str], study: tuple[Path, str],
           *args: str) -> tuple[int, str, str]:
    code = main(["export", "--results-dir", str(study[0]), "--study", study[1], *args])
    out, err = capsys.readouterr()
    return code, out, err


def run_script(script: Path, tmp_path: Path, *, fakes: tuple[str, ...] = ("torchrun",),
               env: dict[str, str] | None = None) -> list[list[str]]:
    """Run the exported script with fake launchers first on PATH; their recorded argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in fakes:
        fake = bin_dir / name
        fake.write_text(FAKE)
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    calls = tmp_path / "calls.jsonl"
    full_env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls),
                **(env or {})}
    subprocess.run(["bash", str(script)], check=True, cwd=tmp_path, env=full_env, timeout=30)
    return [json.loads(line) for line in calls.read_text().splitlines()]


def winner(study: tuple[Path, str]) -> tuple[int, Layout]:
    row = load_study(resolve_study(study[1], study[0], None)).complete_rows()[0]
    return row["trial"], Layout(**{k: row[k] for k in Layout.__dataclass_fields__})


def expected_args(layout: Layout) -> list[str]:
    te = replace(layout, impl="te") if layout.impl == "sdpa" else layout
    return megatron_lm_args(MODEL, te, train_iters=100, mock_data=True)


def test_megatron_lm_script_runs_with_every_flag(study: tuple[Path, str], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    checkout = tmp_path / "my megatron"  # a space: the path must survive quoting
    script = tmp_path / "launch.sh"
    code, out, err = export(capsys, study, "--format", "megatron-lm", "-o", str(script),
                            "--megatron-lm", str(checkout))
    assert code == 0, err
    assert out == "" and f"wrote {script}" in err
    number, layout = winner(study)
    assert f"exporting trial {number}" in err
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and os.access(script, os.X_OK)
    [call] = run_script(script, tmp_path)
    launcher = ["torchrun", "--standalone", "--nproc-per-node", "2"]
    assert call == [*launcher, f"{checkout}/pretrain_gpt.py", *expected_args(layout)]
    for flag in ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length",
                 "--ffn-hidden-size", "--max-position-embeddings", "--tensor-model-parallel-size",
                 "--pipeline-model-parallel-size", "--micro-batch-size", "--global-batch-size",
                 "--transformer-impl"):
        assert flag in call
    assert call[call.index("--tensor-model-parallel-size") + 1] == str(layout.tp)
    assert call[call.index("--micro-batch-size") + 1] == str(layout.mbs)
    assert call[call.index("--global-batch-size") + 1] == str(MODEL.global_batch_size)
    assert call[call.index("--num-layers") + 1] == str(MODEL.num_layers)
    # Every line of the command but the last continues; each argument is quoted.
    lines = text[text.index("torchrun "):].rstrip("\n").splitlines()
    assert all(line.endswith(" \\") for line in lines[:-1])
    assert shlex.quote(f"{checkout}/pretrain_gpt.py") in text
    assert "--data-path" in text  # where real data goes


@pytest.mark.parametrize("impl", ["sdpa", "local"])
def test_sdpa_maps_to_transformer_engine_with_a_comment(study: tuple[Path, str], impl: str,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    trials = load_study(resolve_study(study[1], study[0], None)).complete_rows()
    number = next(r["trial"] for r in trials if r["impl"] == impl)
    code, out, err = export(capsys, study, "--format", "megatron-lm", "--trial", str(number))
    assert code == 0, err
    words = shlex.split(out, comments=True)
    value = words[words.index("--transformer-impl") + 1]
    assert value == ("transformer_engine" if impl == "sdpa" else "local")
    assert ("# impl sdpa" in out) == (impl == "sdpa")


def test_slurm_script(study: tuple[Path, str], tmp_path: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "job.sbatch"
    code, _, err = export(capsys, study, "--format", "slurm", "--nodes", "2", "-o", str(script))
    assert code == 0, err
    text = script.read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --gpus-per-node=1"):
        assert f"\n{line}\n" in text
    assert "scontrol show hostnames" in text and "NCCL_NVLS_ENABLE" not in text
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.parent.mkdir()
    scontrol.write_text("#!/bin/sh\nprintf 'node-a\\nnode-b\\n'\n")
    scontrol.chmod(0o755)
    env = {"SLURM_NNODES": "2", "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node-[a-b]",
           "MEGATRON_LM": "/opt/Megatron-LM"}
    [call] = run_script(script, tmp_path, fakes=("srun",), env=env)
    _, layout = winner(study)
    assert call == ["srun", "torchrun", "--nnodes", "2", "--nproc-per-node", "1",
                    "--rdzv-id", "77", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                    "node-a:29500", "/opt/Megatron-LM/pretrain_gpt.py",
                    *expected_args(layout)]


def test_torchrun_script_writes_its_trial_json(study: tuple[Path, str], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "run.sh"
    code, _, err = export(capsys, study, "--format", "torchrun", "-o", str(script))
    assert code == 0, err
    [call] = run_script(script, tmp_path)
    assert call == ["torchrun", "--standalone", "--nproc-per-node", "2", "-m",
                    "autotune.worker", "--spec", "trial.json", "--out-dir", "."]
    spec = TrialSpec.from_json((tmp_path / "trial.json").read_text())
    assert spec.model == MODEL and spec.layout == winner(study)[1]


def test_json_round_trips_into_estimate(study: tuple[Path, str], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "layout.json"
    code, _, err = export(capsys, study, "--format", "json", "-o", str(path))
    assert code == 0, err
    exported = json.loads(path.read_text())
    _, layout = winner(study)
    assert {k: exported[k] for k in ("tp", "pp", "dp", "mbs", "gbs", "impl", "recompute")} == {
        k: getattr(layout, k) for k in ("tp", "pp", "dp", "mbs", "gbs", "impl", "recompute")}
    assert (exported["model"], exported["gpus"], exported["predicted"]) == ("gpt2", 2, True)
    assert main(["estimate", "gpt2", "--gpus", "2", "--layout", str(path), "--json"]) == 0
    estimate = json.loads(capsys.readouterr().out)
    for key in ("tp", "pp", "dp", "cp", "mbs", "gbs", "sequence_parallel", "recompute",
                "distributed_optimizer", "overlap_param_gather", "impl"):
        assert estimate["layout"][key] == exported[key], key
    assert estimate["tokens_per_s"] == pytest.approx(exported["tokens_per_s"], rel=1e-9)


def test_errors_are_one_line_exit_2(study: tuple[Path, str], tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    storage = f"sqlite:///{(study[0] / study[1] / 'study.db').resolve()}"
    frozen = optuna.load_study(study_name=study[1], storage=storage)
    frozen.add_trial(optuna.trial.create_trial(
        state=TrialState.PRUNED, user_attrs={"record": {
            "status": "PREDICTED_OOM", "reason": "needs 99 GiB", "layout": {}}}))
    pruned = len(frozen.trials) - 1
    cases = [
        (["--trial", str(pruned), "--format", "json"], "PREDICTED_OOM: needs 99 GiB"),
        (["--trial", "100000", "--format", "json"], "has no trial 100000"),
        (["--format", "yaml"], "unknown --format"),
        (["--format", "slurm", "--nodes", "3"], "--nodes 3"),
    ]
    for args, message in cases:
        code, _, err = export(capsys, study, *args)
        assert code == 2 and message in err and err.count("\n") <= 2, (args, err)
    assert main(["export", "--results-dir", str(tmp_path), "--format", "json"]) == 2
    assert "no studies under" in capsys.readouterr().err


def test_parallel_and_recompute_flags_follow_the_trial(study: tuple[Path, str],
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    rows = load_study(resolve_study(study[1], study[0], None)).complete_rows()
    row = next(r for r in rows if r["tp"] == 2 and r["sequence_parallel"]
               and r["recompute"] == "full")
    code, out, err = export(capsys, study, "--format", "megatron-lm", "--trial",
                            str(row["trial"]))
    assert code == 0, err
    words = shlex.split(out, comments=True)
    assert words[words.index("--tensor-model-parallel-size") + 1] == "2"
    assert "--sequence-parallel" in words
    assert words[words.index("--recompute-granularity") + 1] == "full"
    assert words[words.index("--micro-batch-size") + 1] == str(row["mbs"])
    for do in (False, True):  # tp2 uses every GPU here: the optimizer flag from a dp2 trial
        other = next(r for r in rows if bool(r["distributed_optimizer"]) is do)
        code, out, err = export(capsys, study, "--format", "megatron-lm", "--trial",
                                str(other["trial"]))
        assert code == 0, err
        assert ("--use-distributed-optimizer" in shlex.split(out, comments=True)) is do


@pytest.mark.parametrize(("given", "iters", "launched"), [
    ("site/run_pretrain_gpt.py", "7", "site/run_pretrain_gpt.py"),  # a wrapper script
    ("Megatron-LM", "12", "Megatron-LM/pretrain_gpt.py"),             # a checkout
])
def test_train_iters_and_script_path(study: tuple[Path, str], tmp_path: Path, given: str,
                                     iters: str, launched: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "launch.sh"
    code, _, err = export(capsys, study, "--format", "megatron-lm", "-o", str(script),
                          "--megatron-lm", given, "--train-iters", iters)
    assert code == 0, err
    [call] = run_script(script, tmp_path)
    assert call[4] == launched
    assert call[call.index("--train-iters") + 1] == iters


def test_train_iters_must_be_positive(study: tuple[Path, str],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = export(capsys, study, "--format", "megatron-lm", "--train-iters", "0")
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1].endswith("--train-iters must be a positive integer, got 0")


@pytest.mark.parametrize("fmt", ["megatron-lm", "slurm"])
def test_nodes_may_not_split_tensor_parallelism(study: tuple[Path, str], fmt: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    trials = load_study(resolve_study(study[1], study[0], None)).complete_rows()
    number = next(r["trial"] for r in trials if r["tp"] == 2)
    code, out, err = export(capsys, study, "--format", fmt, "--trial", str(number),
                            "--nodes", "2")
    assert code == 2 and out == ""
    assert "fewer than the layout's tp=2: tensor parallelism must stay inside a node" in err


@pytest.mark.parametrize(("version", "tag"), [("0.19.2", "core_v0.19.0"), ("0.19", "core_v0.19.0"),
                                              ("0.16.1", "core_v0.16.1")])
def test_megatron_version_names_the_release_written_for(
        study: tuple[Path, str], version: str, tag: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = export(capsys, study, "--format", "megatron-lm", "--megatron-version", version)
    assert code == 0 and f"(Megatron-LM {tag})" in out


@pytest.mark.parametrize("version", ["0.15.3", "latest"])
def test_megatron_version_outside_the_table_is_one_line_exit_2(
        study: tuple[Path, str], version: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = export(capsys, study, "--format", "megatron-lm", "--megatron-version", version)
    assert code == 2 and "megatron-core" in err and err.count("\n") <= 2, err
