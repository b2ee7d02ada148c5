"""Issue 14, item 8: the smaller rough edges. Impossible model sizes, bad input that exits 2,
twins folded in the search's tables, a re-run that says it read its trials, presets by size, and
the Makefile's CPU torch index."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from autotune.cli import main
from autotune.commands import search as search_command
from autotune.layouts.layout import Layout
from autotune.predict.cost import CostParams
from autotune.predict.memory import estimate_memory
from autotune.report.progress import LiveProgress, best_table
from autotune.search import SearchConfig, run_search
from autotune.search.backends import SimulateBackend
from autotune.search.space import space_from_mapping
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.params import count_parameters
from autotune.specs.presets import list_presets, load_model

ROOT = Path(__file__).resolve().parents[1]
TWIN_SPACE = "tp: [1]\npp: [1, 2]\nmbs: [1, 2, 4]\nimpl: [sdpa, te]\n"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_command, "local_gpu_count", lambda: 0)


# -- one line, exit 2, nothing written ------------------------------------------------------------


@pytest.mark.parametrize(("args", "message"), [
    (["gpt2", "--gpus", "1", "--backend", "worker"],
     "--backend worker needs NVIDIA GPUs; none found"),
    (["gpt2", "--gpus", "8", "--gpus-per-node", "16", "--dry-run"],
     "--gpus-per-node 16 is more than --gpus 8"),
    (["gpt2", "--gpus", "8", "--gpus-per-node", "16"], "--gpus-per-node 16 is more than --gpus 8"),
    (["estimate", "gpt2", "--gpus", "8", "--gpus-per-node", "16"],
     "--gpus-per-node 16 is more than --gpus 8"),
    (["estimate", "{folder}", "--gpus", "8"], "{folder} is a folder; give a preset name"),
    (["{folder}", "--gpus", "8", "--dry-run"], "{folder} is a folder; give a preset name"),
])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                          no_gpu: None, args: list[str], message: str) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    results = tmp_path / "results"
    args = [a.format(folder=folder) for a in args]
    code, out, err = run(capsys, *args, *(["--results-dir", str(results)]
                                          if args[0] != "estimate" and "--dry-run" not in args
                                          else []))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("autotune: error: ")
    assert message.format(folder=folder) in err
    assert not list(results.rglob("study.db"))


def test_a_folder_named_like_a_preset_does_not_hide_it(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2").mkdir()
    code, out, _ = run(capsys, "estimate", "gpt2", "--gpus", "1")
    assert code == 0 and out.startswith("gpt2 on 1 x")


# -- a model no layout fits: the smallest peak, whatever the sampler ------------------------------


@pytest.mark.parametrize("sampler", ["ranked", "grid", "auto"])
def test_impossible_model_size_names_the_smallest_peak(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path, sampler: str) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("tp: [1, 2, 4, 8]\npp: [1, 2, 4, 8]\nmbs: [1]\nrecompute: [none, full]\n"
                     "distributed_optimizer: [false, true]\n")
    code, out, err = run(capsys, "gpt-1t", "--gpus", "8", "--backend", "simulate",
                         "--sampler", sampler, "--space", str(space),
                         "--results-dir", str(tmp_path / "results"))
    assert code == 2 and out == ""  # the input's problem (autotune.errors.ConfigError)
    assert err.count("\n") == 1
    assert "no layout is predicted to fit: the smallest peak is" in err
    # The memory model's own figure for that layout (not a number copied here, which every
    # change of the model would break).
    smallest = Layout(tp=8, dp=1, mbs=1, recompute="full", impl="local",
                      gbs=load_model("gpt-1t").global_batch_size)
    peak = estimate_memory(load_model("gpt-1t"), smallest,
                           ClusterSpec.make(8, gpu="h100-80gb")).peak_bytes / 2**30
    assert f"{peak:,.1f} GiB per GPU (tp8 pp1 dp1 mbs1 rc=full local) against 79.6 GiB on " \
        "h100-80gb" in err
    assert "no layout was tried" not in err and "every ranked layout was tried" not in err


# -- sdpa/te twins: one row with `same figures`, as in the report ----------------------------


def _twins_result(tmp_path: Path):  # type: ignore[no-untyped-def]
    cluster = ClusterSpec(num_gpus=2, gpus_per_node=2, gpu=gpu_spec("h100-80gb"))
    space = space_from_mapping({"pp": [1, 2], "mbs": [1, 2, 4], "impl": ["sdpa", "te"]}, "t")
    cfg = SearchConfig(model=load_model("gpt2"), cluster=cluster, space=space,
                       # Without TE's host term, sdpa and te get the same figures: twins.
                       backend=SimulateBackend(cluster, CostParams(te_layer_launch_s=0.0)),
                       results_dir=tmp_path, sampler="grid")
    return run_search(cfg)


def _column(table, title: str) -> list[str]:  # type: ignore[no-untyped-def]
    column = next(c for c in table.columns if c.header == title)
    return [str(cell) for cell in column._cells]


def test_best_table_folds_twins(tmp_path: Path) -> None:
    result = _twins_result(tmp_path)
    figures = {}
    for r in result.best(len(result.records)):
        figures.setdefault((r.tokens_per_s, r.peak_bytes), []).append(r.number)
    assert any(len(numbers) > 1 for numbers in figures.values()), "no twins to fold"
    table = best_table(result, k=100)
    shown = [int(n) for n in _column(table, "#")]
    assert len(shown) == len(figures)  # one row per distinct figures
    same = dict(zip(shown, _column(table, "same figures"), strict=True))
    for numbers in figures.values():
        first, *twins = numbers
        assert first in shown
        assert same[first] == (f"+{len(twins)}: " + " ".join(f"#{n}" for n in twins)
                               if twins else "")


def test_live_table_folds_twins_too(tmp_path: Path) -> None:
    result = _twins_result(tmp_path)
    progress = LiveProgress(None, Console(file=io.StringIO()), recent=len(result.records))
    for record in result.records:
        progress.recent.append(record)
    table = progress.render(result).renderables[1]
    figures = {(r.tokens_per_s, r.peak_bytes) for r in result.records
               if r.tokens_per_s is not None}
    alone = [r for r in result.records if r.tokens_per_s is None]
    assert len(_column(table, "#")) == len(figures) + len(alone)
    assert any(text.startswith("+1: #") for text in _column(table, "same figures"))


def test_best_table_caption_explains_its_labels(tmp_path: Path) -> None:
    result = _twins_result(tmp_path)
    out = io.StringIO()
    Console(file=out, width=200).print(best_table(result))
    text = out.getvalue()
    assert "Labels: tpN = Tensor parallel size" in text and "mbsN = Micro-batch size" in text
    assert "ogr =" not in text  # no label of this table has it


# -- a stored plan shown again says it read its trials ---------------------------------------


def test_rerun_of_a_stored_plan_says_it_read_the_trials(capsys: pytest.CaptureFixture[str],
                                                        tmp_path: Path) -> None:
    space = tmp_path / "twins.yaml"
    space.write_text(TWIN_SPACE)
    args = ("gpt2", "--gpus", "2", "--backend", "simulate", "--space", str(space),
            "--results-dir", str(tmp_path / "results"))
    code, first, _ = run(capsys, *args)
    assert code == 0
    simulated = int(re.search(r"(\d+) trials simulated, ", first)[1])  # type: ignore[index]
    assert simulated > 0
    code, again, _ = run(capsys, *args)
    assert code == 0
    assert f"read {simulated} trials from the stored study (nothing new to simulate)" in again
    assert "trials simulated" not in again


# -- presets by size ----------------------------------------------------------------------------


def test_models_are_listed_smallest_first(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "models")
    names = [line.split()[0] for line in out.splitlines()[1:]]
    assert code == 0 and sorted(names) == sorted(list_presets())
    sizes = [count_parameters(load_model(n)) for n in names]
    assert sizes == sorted(sizes)
    assert names.index("gpt-3.6b") < names.index("gpt-18b")


# -- the Makefile's torch index ----------------------------------------------------------------


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize(("pip_config", "override", "expected"), [
    # An ordinary machine: pip knows only PyPI, whose Linux torch is the CUDA build.
    ("", None, "--extra-index-url https://download.pytorch.org/whl/cpu"),
    # A machine whose pip has its own index or wheels (a mirror, this one): trusted as it is.
    ("[global]\nfind-links = /opt/wheels\n", None, ""),
    ("[global]\nindex-url = https://mirror.example/simple\n", None, ""),
    ("", "https://mirror.example/torch-cpu", "--extra-index-url https://mirror.example/torch-cpu"),
    ("", "", ""),
])
def test_make_test_installs_the_cpu_torch(tmp_path: Path, pip_config: str,
                                          override: str | None, expected: str) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    config = tmp_path / "pip.conf"
    config.write_text(pip_config)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = str(config)
    argv = ["make", "-n", "-C", str(ROOT), "test", f"VENV={venv}"]
    if override is not None:
        argv.append(f"TORCH_INDEX_URL={override}")
    plan = subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout
    install = next(line for line in plan.splitlines() if '"torch==' in line)
    assert re.sub(r"\s+", " ", install).count("--extra-index-url") == (1 if expected else 0)
    assert expected in install
