"""`autotune report`: files from small simulated studies, Pareto fronts, errors, the dashboard."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.cli import main
from autotune.errors import ConfigError
from autotune.report.importance import tokens_importances
from autotune.report.load import load_study, resolve_study
from autotune.report.pareto import fold_ties, pareto_front, scaling_points
from autotune.search import SearchConfig, run_search
from autotune.search.backends import SimulateBackend
from autotune.search.space import space_from_mapping
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.presets import load_model
from autotune.trials.trial import TrialMetrics, TrialSpec

pd = pytest.importorskip("pandas")
pytest.importorskip("matplotlib")
pytest.importorskip("plotly")

MODEL = load_model("gpt2")
SPACE = space_from_mapping({"tp": [1, 2], "mbs": [1, 2, 4], "recompute": ["none", "selective"],
                            "impl": ["local", "te"]}, "test")
CSV_COLUMNS = {"trial", "state", "status", "layout", "tp", "pp", "dp", "cp", "ep", "vpp", "mbs",
               "gbs", "sequence_parallel", "recompute", "distributed_optimizer", "impl",
               "predicted", "tokens_per_s", "tokens_per_s_per_gpu", "step_time_s", "mfu",
               "peak_memory_gib", "predicted_tokens_per_s", "predicted_peak_memory_gib",
               "tokens_error_pct", "memory_error_pct"}


def cluster(gpus: int) -> ClusterSpec:
    return ClusterSpec(num_gpus=gpus, gpus_per_node=min(8, gpus), gpu=gpu_spec("h100-80gb"))


@dataclass(frozen=True, slots=True)
class MeasuredBackend:
    """The analytical figures passed off as measurements, 10 % slower and 10 % heavier, so the
    report has a known prediction error to show."""

    cluster: ClusterSpec
    name: str = "worker"
    predicted: bool = False

    def close(self) -> None:
        pass

    def run(self, spec: TrialSpec, trial_dir: Path, timeout_s: float) -> TrialMetrics:
        m = SimulateBackend(self.cluster).run(spec, trial_dir, timeout_s)
        trial_dir.mkdir(parents=True, exist_ok=True)
        spec.write(trial_dir / "trial.json")  # as the runner does before a real launch
        assert m.tokens_per_s and m.step_time_s and m.peak_reserved_bytes
        return replace(m, predicted=False, tokens_per_s=0.9 * m.tokens_per_s,
                       step_time_s=m.step_time_s / 0.9,
                       peak_reserved_bytes=int(1.1 * m.peak_reserved_bytes))


def make_study(root: Path, gpus: int, *, backend: Any = None, name: str | None = None,
               **kwargs: Any) -> str:
    c = cluster(gpus)
    cfg = SearchConfig(model=MODEL, cluster=c, space=SPACE, backend=backend or
                       SimulateBackend(c), results_dir=root, study_name=name, sampler="grid",
                       **kwargs)
    return run_search(cfg).study_name


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("results")
    make_study(root, 1)
    return root, make_study(root, 2)  # the newest


def report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["report", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_report_writes_every_file(simulated: tuple[Path, str],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    root, name = simulated
    code, out, err = report(capsys, "--results-dir", str(root))
    assert code == 0, err
    assert f"report on study {name}" in err  # chose the newest and said so
    folder = root / name
    for file in ("trials.csv", "pareto.html", "pareto.png", "report.md", "gpu_scaling.html",
                 "gpu_scaling.png"):
        assert (folder / file).is_file(), file
        assert f"wrote {folder / file}" in out
    assert (folder / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (folder / "gpu_scaling.png").read_bytes()[:4] == b"\x89PNG"
    html = (folder / "pareto.html").read_text()
    assert "plotly" in html and "Pareto front" in html and "tp2 pp1 dp1" in html  # hover text

    loaded = load_study(resolve_study(name, root, None))
    frame = pd.read_csv(folder / "trials.csv")
    assert len(frame) == len(loaded.trials)
    assert set(frame.columns) >= CSV_COLUMNS
    assert frame["predicted"].all()

    best = loaded.complete_rows()[0]
    md = (folder / "report.md").read_text()
    assert f"## Winner: trial {best['trial']}" in md
    assert f"`{best['layout']}`" in md
    assert "**Predictions.**" in md
    assert "activations" in md and "optimizer" in md  # the memory breakdown
    assert "## Pareto front" in md and "## Parameter importances" in md
    assert "## Scaling" in md and "| 1 |" in md and "| 2 |" in md
    assert "Pareto front" in out and "top" in out  # the terminal tables


def test_pareto_rows_are_the_front(simulated: tuple[Path, str]) -> None:
    loaded = load_study(resolve_study(simulated[1], simulated[0], None))
    rows = [r for r in loaded.complete_rows() if r["duplicate_of"] is None]
    front = [rows[i] for i in pareto_front([r["tokens_per_s"] for r in rows],
                                           [r["peak_memory_gib"] for r in rows])]
    assert front
    for f in front:  # nothing is faster and at most as heavy
        assert not any(r["tokens_per_s"] > f["tokens_per_s"]
                       and r["peak_memory_gib"] <= f["peak_memory_gib"] for r in rows)


@pytest.mark.parametrize(("tokens", "memory", "expected"), [
    ([], [], []),
    ([5.0], [1.0], [0]),
    # 1 is dominated by 0 (slower, heavier); 3 by 2; the front runs light-and-slow to fast.
    ([10.0, 8.0, 20.0, 15.0, 30.0], [1.0, 2.0, 3.0, 3.0, 8.0], [0, 2, 4]),
    # Equal speed: only the lighter one. Equal memory: only the faster one.
    ([10.0, 10.0, 12.0], [2.0, 3.0, 2.0], [2]),
    # Identical points are twins, both on the front.
    ([10.0, 10.0, 4.0], [2.0, 2.0, 1.0], [2, 0, 1]),
])
def test_pareto_front_on_hand_built_tables(tokens: list[float], memory: list[float],
                                           expected: list[int]) -> None:
    assert pareto_front(tokens, memory) == expected


def test_fold_ties_and_scaling_points() -> None:
    rows = [{"trial": i, "tokens_per_s": t, "peak_memory_gib": 1.0} for i, t in
            enumerate([5.0, 5.0, 5.0, 4.0])]
    folded = fold_ties(rows)
    assert [r["trial"] for r in folded] == [0, 3]
    assert folded[0]["ties"] == "+2: #1 #2" and folded[1]["ties"] == ""
    best = {"trial": 0, "layout": "x", "tokens_per_s": 0.0}
    points = scaling_points([(1, "a", {**best, "tokens_per_s": 100.0}),
                             (2, "b", {**best, "tokens_per_s": 150.0}),
                             (4, "c", {**best, "tokens_per_s": 140.0}),  # slower than 2 GPUs
                             (8, "d", None)])
    assert [(p["gpus"], p["tokens_per_s_per_gpu"], p["pareto"]) for p in points] == [
        (1, 100.0, True), (2, 75.0, True), (4, 35.0, False)]


def test_measured_study_compares_with_predictions(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # Four trials, no finalists' repeats (tests/test_finalists.py): one row per layout.
    name = make_study(tmp_path, 2, backend=MeasuredBackend(cluster(2)), name="measured",
                      n_trials=4, finalists=0)
    code, _, err = report(capsys, "--results-dir", str(tmp_path), "--study", name)
    assert code == 0, err
    frame = pd.read_csv(tmp_path / name / "trials.csv")
    ok = frame[frame["status"] == "OK"]
    assert len(ok) == 4 and not ok["predicted"].any()
    assert ok["tokens_error_pct"].round(6).eq(-10.0).all()
    assert ok["memory_error_pct"].round(1).eq(10.0).all()
    md = (tmp_path / name / "report.md").read_text()
    assert "## Predicted against measured" in md and "tokens/s 10.0 %" in md
    assert "**Predictions.**" not in md
    # The model came from the study itself (the search records it), not from the study name.
    assert "from study attributes" in md


def test_custom_study_name_needs_model(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    make_study(tmp_path, 1, name="custom")
    code, _, err = report(capsys, "--results-dir", str(tmp_path))
    assert code == 0, err  # the search records its model in the study
    assert "Memory of the busiest GPU" in (tmp_path / "custom" / "report.md").read_text()
    # A study without that record (an older autotune, or another tool's) needs --model.
    url = f"sqlite:///{tmp_path / 'custom' / 'study.db'}"
    optuna.load_study(study_name="custom", storage=url).set_user_attr("model", None)
    code, out, _ = report(capsys, "--results-dir", str(tmp_path))
    assert code == 0 and "pass --model" in out
    assert "Memory of the busiest GPU" not in (tmp_path / "custom" / "report.md").read_text()
    code, _, err = report(capsys, "--results-dir", str(tmp_path), "--model", "gpt2")
    assert code == 0, err
    assert "Memory of the busiest GPU" in (tmp_path / "custom" / "report.md").read_text()


def test_importances_need_trials(tmp_path: Path) -> None:
    make_study(tmp_path, 1, name="two", n_trials=2)
    loaded = load_study(resolve_study("two", tmp_path, None))
    assert "Too few COMPLETE trials" in str(tokens_importances(loaded.study))


@pytest.mark.parametrize("args", [[], ["--study", "nope"]])
def test_errors_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    args: list[str]) -> None:
    if args:
        make_study(tmp_path, 1, name="real", n_trials=1)
    code, _, err = report(capsys, "--results-dir", str(tmp_path), *args)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("autotune: error:")


def test_storage_password_never_shown() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_study(None, Path("results"), "postgresql://me:hunter2@127.0.0.1:1/studies")
    assert "hunter2" not in str(info.value) and "me:***@" in str(info.value)


def test_report_with_storage_url(simulated: tuple[Path, str], tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    root, name = simulated
    url = f"sqlite:///{(root / name / 'study.db').resolve()}"
    code, _, err = report(capsys, "--storage", url, "--results-dir", str(tmp_path))
    assert code == 0, err
    assert (tmp_path / name / "report.md").is_file()


def test_help_does_not_import_report_libraries() -> None:
    code = ("import sys\nfrom autotune.cli import main\nmain(['--help'])\n"
            "print('HEAVY', sorted(m for m in ('pandas', 'matplotlib', 'plotly') "
            "if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert "HEAVY []" in proc.stdout, proc.stderr


def test_optuna_dashboard_reads_the_study(simulated: tuple[Path, str]) -> None:
    dashboard = pytest.importorskip("optuna_dashboard")
    from wsgiref.util import setup_testing_defaults

    root, name = simulated
    app = dashboard.wsgi(f"sqlite:///{(root / name / 'study.db').resolve()}")

    def get(path: str) -> tuple[str, Any]:
        environ: dict[str, Any] = {"PATH_INFO": path}
        setup_testing_defaults(environ)
        status: list[str] = []
        body = b"".join(app(environ, lambda s, h, *_: status.append(s)))  # type: ignore[arg-type]
        return status[0], json.loads(body)

    status, studies = get("/api/studies")
    assert status.startswith("200")
    # The key is "study_summaries" in optuna-dashboard 0.x (its TODO renames it "studies").
    listed = studies.get("study_summaries", studies.get("studies", []))
    [summary] = [s for s in listed if s["study_name"] == name]
    status, detail = get(f"/api/studies/{summary['study_id']}")
    assert status.startswith("200")
    assert detail["trials"] and detail["best_trials"]
