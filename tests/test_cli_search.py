"""`autotune MODEL --gpus N` end to end on CPU: the simulate backend, backend choice, errors."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import optuna
import pytest

import autotune.commands.search as search_command
from autotune.cli import main
from tests.conftest import heavy_imports_of

ROW_KEYS = {"tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "gbs", "recompute", "sequence_parallel",
            "distributed_optimizer", "tokens_per_s", "peak_memory_gib"}
SMALL_SPACE = """\
tp: [1, 2]
pp: [1, 2]
mbs: [1, 2, 4]
distributed_optimizer: [false, true]
overlap_grad_reduce: [true]
impl: [sdpa]
"""


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str, message: str) -> None:
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("autotune: error: ") and message in err


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_command, "local_gpu_count", lambda: 0)


@pytest.fixture
def space(tmp_path: Path) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(SMALL_SPACE)
    return str(path)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    """One simulate search of gpt2 on 2 GPUs over the default space (shared: it takes seconds)."""
    results = tmp_path_factory.mktemp("results")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["gpt2", "--gpus", "2", "--backend", "simulate", "--results-dir",
                     str(results), "--json"])
    assert code == 0
    return results, json.loads(out.getvalue())


def stored_trials(results: Path, study: str) -> int:
    url = f"sqlite:///{results / study / 'study.db'}"
    return len(optuna.load_study(study_name=study, storage=url).trials)


def test_simulate_search_prints_the_best_layouts_first(
        simulated: tuple[Path, dict[str, object]]) -> None:
    _, data = simulated
    best = data["best"]
    assert isinstance(best, list) and len(best) == 10
    assert all(set(row) >= ROW_KEYS for row in best)
    tokens = [row["tokens_per_s"] for row in best]
    assert tokens == sorted(tokens, reverse=True) and tokens[0] > 0
    assert all(row["tp"] * row["pp"] * row["dp"] * row["cp"] == 2 for row in best)
    assert all(row["predicted"] for row in best) and data["predicted"] is True
    assert data["stop_reason"] == "every layout of the grid was tried"


def test_a_plan_over_the_default_space_ranks_what_the_export_writes(
        simulated: tuple[Path, dict[str, object]]) -> None:
    """Issue 25 item 4: Megatron-LM has no sdpa; a plan ranks the te the export writes for it,
    so the table's figure is the exported command's (autotune.search.impls)."""
    _, data = simulated
    best = data["best"]
    assert isinstance(best, list) and best
    assert {row["impl"] for row in best} <= {"local", "te"}
    assert any(row["impl"] == "te" for row in best)


def test_a_plan_ranks_sdpa_where_the_users_own_space_asks_for_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, space: str) -> None:
    code, out, err = run(capsys, "gpt2", "--gpus", "2", "--backend", "simulate", "--space",
                         space, "--results-dir", str(tmp_path), "--json")
    assert code == 0, err
    assert {row["impl"] for row in json.loads(out)["best"]} == {"sdpa"}


def test_second_planning_run_shows_the_stored_study_and_adds_nothing(
        capsys: pytest.CaptureFixture[str], simulated: tuple[Path, dict[str, object]]) -> None:
    results, data = simulated
    study = str(data["study"])
    before = stored_trials(results, study)
    assert before > 0
    code, out, err = run(capsys, "gpt2", "--gpus", "2", "--backend", "simulate",
                         "--results-dir", str(results), "--json")
    assert code == 0, err
    again = json.loads(out)
    assert again["study"] == study and again["best"] == data["best"]
    assert stored_trials(results, study) == before


def test_resume_of_a_finished_simulate_study_adds_nothing(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, space: str) -> None:
    args = ["gpt2", "--gpus", "2", "--backend", "simulate", "--space", space,
            "--results-dir", str(tmp_path), "--json"]
    code, out, _ = run(capsys, *args)
    first = json.loads(out)
    count = stored_trials(tmp_path, first["study"])
    code, out, _ = run(capsys, *args, "--resume")
    assert code == 0
    assert json.loads(out)["best"] == first["best"]
    assert stored_trials(tmp_path, first["study"]) == count


def test_resume_without_a_study_is_refused(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path, space: str) -> None:
    code, out, err = run(capsys, "gpt2", "--gpus", "2", "--backend", "simulate", "--space",
                         space, "--results-dir", str(tmp_path), "--resume")
    assert code == 2 and out == ""
    one_line_error(err, "--resume: no study")


def test_auto_backend_without_gpus_says_so_and_simulates(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, space: str, no_gpu: None) -> None:
    code, out, err = run(capsys, "gpt2", "--gpus", "2", "--space", space, "--results-dir",
                         str(tmp_path), "--json")
    assert code == 0
    assert err.strip().splitlines() == [
        "autotune: no GPU on this machine; planning with the analytical models "
        "(--backend simulate): every figure is a prediction"]
    data = json.loads(out)
    assert data["predicted"] is True and "-simulate-" in data["study"]
    assert data["best"] and all(set(row) >= ROW_KEYS for row in data["best"])


def test_text_output_labels_predictions(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                        space: str, no_gpu: None) -> None:
    code, out, _ = run(capsys, "gpt2", "--gpus", "2", "--space", space, "--results-dir",
                       str(tmp_path))
    assert code == 0
    assert "(predicted)" in out and "trials simulated" in out


@pytest.mark.parametrize(("backend", "code", "message"), [
    # Bad input, as the README says: exit 2.
    ("worker", 2, "--backend worker needs NVIDIA GPUs; none found"),
    ("megatron-lm", 2, "--backend megatron-lm needs NVIDIA GPUs; none found"),
    ("warp", 2, "unknown backend 'warp'"),
])
def test_backend_errors_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                     space: str, no_gpu: None, backend: str, code: int,
                                     message: str) -> None:
    results = tmp_path / "results"
    rc, out, err = run(capsys, "gpt2", "--gpus", "2", "--space", space, "--backend", backend,
                       "--results-dir", str(results))
    assert rc == code and out == ""
    one_line_error(err, message)
    assert not results.exists()  # refused before any study is created


def test_simulate_search_never_imports_torch(tmp_path: Path, space: str) -> None:
    args = ["gpt2", "--gpus", "2", "--backend", "simulate", "--space", space,
            "--results-dir", str(tmp_path), "--json"]
    code, heavy, err = heavy_imports_of(args, cwd=Path(__file__).resolve().parents[1])
    assert code == 0, err
    assert heavy == "HEAVY []"


@pytest.mark.parametrize("other", [
    ["gpt2-medium", "--gpus", "2"],                      # another model
    ["gpt2", "--gpus", "2", "--gpu", "h200"],             # another GPU
    ["gpt2", "--gpus", "2", "--seq-len", "512"],          # another sequence length
])
def test_a_study_name_of_another_job_is_refused_and_left_intact(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, other: list[str]) -> None:
    common = ["--backend", "simulate", "--results-dir", str(tmp_path), "--study", "mine",
              "--trials", "4"]
    code, _, err = run(capsys, "gpt2", "--gpus", "2", *common)
    assert code == 0, err
    url = f"sqlite:///{tmp_path / 'mine' / 'study.db'}"
    before = len(optuna.load_study(study_name="mine", storage=url).trials)
    code, out, err = run(capsys, *other, *common)
    assert code == 2 and out == ""
    one_line_error(err, "study mine holds gpt2 (seq 1024, gbs 64) on 2 x h100-80gb")
    study = optuna.load_study(study_name="mine", storage=url)
    assert len(study.trials) == before and study.user_attrs["model"]["name"] == "gpt2"
    assert run(capsys, "gpt2", "--gpus", "2", *common)[0] == 0  # the same job still resumes


def test_a_plan_with_another_sampler_is_another_study(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path) -> None:
    base = ["gpt2", "--gpus", "2", "--backend", "simulate", "--results-dir", str(tmp_path),
            "--trials", "6", "--json"]
    names = set()
    for sampler in ("tpe", "ranked", "tpe"):
        code, out, err = run(capsys, *base, "--sampler", sampler)
        assert code == 0, err
        names.add(json.loads(out)["study"])
    assert len(names) == 2  # tpe twice reuses its plan; ranked gets its own
    assert len([p for p in tmp_path.iterdir() if (p / "study.db").exists()]) == 2


@pytest.mark.parametrize("budget", ["0", "-1", "nan"])
def test_time_budget_must_be_positive(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                      budget: str) -> None:
    code, out, err = run(capsys, "gpt2", "--gpus", "2", "--backend", "simulate",
                         "--results-dir", str(tmp_path), "--time-budget", budget)
    assert code == 2 and out == ""
    one_line_error(err, "--time-budget must be a positive number of seconds")
    assert not any(tmp_path.iterdir())  # nothing recorded


@pytest.mark.parametrize("output", [(), ("--json",)], ids=["text", "json"])
def test_a_plan_where_nothing_fits_says_so(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path, output: tuple[str, ...]) -> None:
    # A model too large for the GPUs is the input's problem, as a GPU count no layout can
    # use: one line and exit 2 (autotune.errors.ConfigError), no empty table or JSON.
    code, out, err = run(capsys, "gpt-1t", "--gpus", "1", "--backend", "simulate",
                         "--results-dir", str(tmp_path), *output)
    assert code == 2 and out == ""
    one_line_error(err, "no layout is predicted to fit: the smallest peak")
    assert err.startswith("autotune: error: no layout is predicted to fit: the smallest peak")
    assert "GiB per GPU" in err and "against 79.6 GiB on h100-80gb" in err


# -- a GPU count whose odd factor no tp, pp or cp takes: the batch is the cause ------------------

@pytest.mark.parametrize(("args", "dps", "factor", "batches"), [
    # 24 and 48 GPUs are no longer such counts for a model of 32 layers: pp 3 takes their factor
    # 3 with the derived pipeline split (11 + 11 + 10 layers); no pp the space offers takes 7
    # or 11.
    (["tests/data/hf/llama-3-8b.json", "--gpus", "56"], "7, 14, 28 or 56", 7, (448, 896)),
    (["mixtral-8x7b", "--gpus", "56"], "7, 14, 28 or 56", 7, (448, 896)),
    (["llama3-8b", "--gpus", "88"], "11, 22, 44 or 88", 11, (352, 704)),
    # gpt-1t on 40 GPUs is no longer one: pp 5 takes its factor 5 with the embedding/loss
    # split (128 layers + 2), which the default space derives.
    (["gpt-1t", "--gpus", "56"], "7, 14, 28 or 56", 7, (2688, 5376)),
    (["gpt2-xl", "--gpus", "7"], "7", 7, (56, 112)),
], ids=["llama-3-8b.json-56", "mixtral-56", "llama3-8b-88", "gpt-1t-56", "gpt2-xl-7"])
@pytest.mark.parametrize("mode", [["--dry-run"], ["--backend", "simulate"]],
                         ids=["dry-run", "plan"])
def test_a_batch_no_data_parallel_size_divides_names_the_factor(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], dps: str,
        factor: int, batches: tuple[int, int], mode: list[str]) -> None:
    """The rule of the global batch rules out every layout: the line names every layout's
    data-parallel size, the factor the batch lacks and batches that one of them divides (not
    one layout's `mbs=1 x dp=24 = 24 must divide global_batch_size=512`)."""
    code, out, err = run(capsys, *args, *mode, "--results-dir", str(tmp_path))
    assert code == 2 and out == ""
    one_line_error(err, f"every layout's dp ({dps}: the GPUs over the tp, pp and cp")
    assert f"(the smallest: {factor}); give --gbs a multiple of {factor} (e.g. " \
        f"{batches[0]} or {batches[1]}) or a GPU count without the factor {factor}" in err
    assert "must divide global_batch_size" not in err  # one layout's numbers, not the cause
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("gbs", ["384", "768"])
def test_the_batches_named_have_layouts(capsys: pytest.CaptureFixture[str], gbs: str) -> None:
    code, out, err = run(capsys, "tests/data/hf/llama-3-8b.json", "--gpus", "24", "--gbs", gbs,
                         "--dry-run")
    assert code == 0, err
    assert f"global batch {gbs}" in out


def test_a_plan_enumerates_its_space_once(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's check stops at the first valid layout (any_valid); the search enumerates the
    space it searches (sdpa planned as te: autotune.search.impls), once."""
    from autotune.search import space as space_module

    whole: list[tuple[object, ...]] = []
    real = space_module._enumerate

    def counted(space: Any, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("first"):
            whole.append(space.candidates["impl"])
        return real(space, *args, **kwargs)

    monkeypatch.setattr(space_module, "_enumerate", counted)
    monkeypatch.setattr(space_module, "_LAST", [])  # no answer remembered from another test
    code, out, err = run(capsys, "gpt2", "--gpus", "2", "--backend", "simulate",
                         "--results-dir", str(tmp_path), "--json")
    assert code == 0, err
    assert json.loads(out)["valid_layouts"] > 0
    assert whole == [("local", "te")]
