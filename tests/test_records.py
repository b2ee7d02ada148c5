"""The typed trial record: one writer, one reader, and studies written by earlier versions.

tests/data/old-studies/study.db holds two studies written by autotune before the typed record
(commit dac948f; tests/data/old-studies/make.py says how): `old-plan`, a simulate grid of gpt2 on
2 GPUs, and `old-measured`, real-run storage from the scripted FakeBackend with every kind of
record that version wrote, among them the raw DUPLICATE and INTERRUPTED dicts without a layout.
Report, export and resume must read both.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from doubles.fake_backend import FakeBackend, small_cluster, small_model
from optuna.trial import TrialState

from autotune.cli import main
from autotune.errors import ConfigError
from autotune.layouts.layout import Layout
from autotune.report.load import load_study, read_records, resolve_study, trial_row
from autotune.search import SearchConfig, run_search
from autotune.search.backends import SimulateBackend
from autotune.search.records import TrialRecord, read_record, record_attrs
from autotune.search.space import load_space
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.presets import load_model
from autotune.trials.trial import TrialMetrics, TrialStatus

OLD = Path(__file__).resolve().parent / "data" / "old-studies"
LAYOUT = Layout(tp=2, pp=1, dp=2, mbs=4, gbs=64, sequence_parallel=True,
                distributed_optimizer=True, overlap_grad_reduce=True, impl="sdpa")


@pytest.fixture
def old_url(tmp_path: Path) -> str:
    """A copy of the stored studies (a resume writes to it)."""
    shutil.copy(OLD / "study.db", tmp_path / "old.db")
    return f"sqlite:///{tmp_path / 'old.db'}"


def stored(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)


# -- the record alone ------------------------------------------------------------------------


def test_peak_is_reserved_else_allocated() -> None:
    both = TrialMetrics(status=TrialStatus.OK, peak_allocated_bytes=5, peak_reserved_bytes=7)
    assert both.peak_bytes == 7
    assert replace(both, peak_reserved_bytes=None).peak_bytes == 5
    assert TrialMetrics(status=TrialStatus.CRASH).peak_bytes is None
    record = TrialRecord(number=0, layout=LAYOUT, status=TrialStatus.OK, source="x",
                         metrics=both)
    assert record.peak_bytes == 7


def test_the_stored_form_reads_back_as_the_same_record() -> None:
    metrics = TrialMetrics(status=TrialStatus.OK, tokens_per_s=1e5, step_time_s=0.6,
                           peak_allocated_bytes=2**33, peak_reserved_bytes=2**34, mfu=0.4)
    for record in (
            TrialRecord(number=3, layout=LAYOUT, status=TrialStatus.OK, source="alpa",
                        metrics=metrics, predicted_peak_bytes=1.5e10,
                        predicted_tokens_per_s=1.1e5),
            TrialRecord(number=4, layout=LAYOUT, status=TrialStatus.DUPLICATE,
                        source="sampler", duplicate_of=3, reason="running in trial 3"),
            TrialRecord(number=5, layout=LAYOUT, status=TrialStatus.INTERRUPTED,
                        source="grid", predicted=True)):
        attrs = json.loads(json.dumps(record_attrs(record)))  # as the storage keeps it
        assert read_record(record.number, attrs) == record


@pytest.mark.parametrize(("status", "value", "reads"), [
    # A layout that broke a rule before its derived value was resolved is stored with the
    # space's placeholder (seen: export of a TE search on H200 failed on such a record).
    (TrialStatus.INVALID, "derive", True),
    (TrialStatus.INVALID, "divisors", True),
    # Where the layout was resolved, a placeholder is not something autotune writes.
    (TrialStatus.OK, "derive", False),
    (TrialStatus.PREDICTED_OOM, "derive", False),
    (TrialStatus.INVALID, "twelve", False),
])
def test_an_unresolved_placeholder_reads_back_only_in_an_invalid_record(
        status: TrialStatus, value: str, reads: bool) -> None:
    attrs = json.loads(json.dumps(record_attrs(TrialRecord(
        number=1, layout=LAYOUT, status=status, source="sampler"))))
    attrs["layout"]["recompute_num_layers"] = value
    if reads:
        record = read_record(1, attrs)
        assert record is not None and record.status is status
        assert record.layout.recompute_num_layers == value
    else:
        with pytest.raises(ConfigError, match="recompute_num_layers"):
            read_record(1, attrs)


def test_the_reader_takes_what_earlier_versions_wrote() -> None:
    attrs = record_attrs(TrialRecord(number=1, layout=LAYOUT, status=TrialStatus.PREDICTED_OOM,
                                     source="alpa", predicted_peak_bytes=9e10))
    # A layout field added later (cross_entropy_fusion) ran at its default.
    older = {**attrs, "layout": {k: v for k, v in attrs["layout"].items()
                                 if k != "cross_entropy_fusion"}}
    assert read_record(1, older) == read_record(1, attrs)
    # Keys that were added later, or never written for this kind of trial.
    bare = {"status": "OOM", "layout": attrs["layout"]}
    record = read_record(2, bare)
    assert record is not None and (record.source, record.reason, record.metrics,
                                   record.predicted, record.duplicate_of) == (
        "sampler", "", None, False, None)
    # The raw dicts of DUPLICATE and INTERRUPTED trials had no layout: the caller gives it.
    raw = {"status": "INTERRUPTED", "source": "sampler", "strategy": LAYOUT.describe()}
    assert read_record(7, raw) is None
    interrupted = read_record(7, raw, LAYOUT)
    assert interrupted is not None and interrupted.status is TrialStatus.INTERRUPTED
    assert interrupted.layout == LAYOUT and not interrupted.launched
    # Nothing to read.
    for nothing in (None, {}, "OK", {"status": "SOMETHING_NEW", "layout": attrs["layout"]}):
        assert read_record(0, nothing, LAYOUT) is None


def test_a_trial_without_a_record_is_a_row_of_its_state() -> None:
    running = optuna.trial.create_trial(state=TrialState.FAIL)
    row = trial_row(running)
    assert (row["status"], row["layout"], row["tp"], row["tokens_per_s"]) == (
        "FAIL", "", None, None)
    assert set(row) == set(trial_row(optuna.trial.create_trial(
        state=TrialState.PRUNED, user_attrs={"record": record_attrs(TrialRecord(
            number=0, layout=LAYOUT, status=TrialStatus.INVALID, source="sampler"))})))


# -- studies written before the typed record ------------------------------------------------


@pytest.mark.parametrize("name", ["old-plan", "old-measured"])
def test_every_old_record_is_read_with_its_layout(old_url: str, name: str) -> None:
    trials = stored(old_url, name)
    records = read_records(trials)
    assert set(records) == {t.number for t in trials}
    for t in trials:
        attrs, record = t.user_attrs["record"], records[t.number]
        assert record.status == attrs["status"]
        assert record.label == attrs["strategy"]  # the layout the old version ran or meant
        assert record.duplicate_of == attrs.get("duplicate_of")
        if "layout" not in attrs:  # rebuilt from the trial's parameters
            assert record.status in (TrialStatus.DUPLICATE, TrialStatus.INTERRUPTED)
    kinds = {r.status for r in records.values()}
    if name == "old-measured":
        assert {TrialStatus.OK, TrialStatus.OOM, TrialStatus.PREDICTED_OOM, TrialStatus.INVALID,
                TrialStatus.DUPLICATE, TrialStatus.INTERRUPTED} <= kinds
    else:
        assert all(r.predicted for r in records.values())


def test_report_reads_the_old_studies(old_url: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("old-plan", "old-measured"):
        code = main(["report", "--storage", old_url, "--study", name,
                     "--results-dir", str(tmp_path)])
        _, err = capsys.readouterr()
        assert code == 0, err
        loaded = load_study(resolve_study(name, tmp_path, old_url))
        md = (tmp_path / name / "report.md").read_text()
        best = loaded.complete_rows()[0]
        assert f"## Winner: trial {best['trial']}" in md
        assert ("**Predictions.**" in md) == (name == "old-plan")
        csv = (tmp_path / name / "trials.csv").read_text().splitlines()
        assert len(csv) == len(loaded.trials) + 1
    statuses = {r["status"] for r in loaded.rows}
    assert {"DUPLICATE", "INTERRUPTED", "OOM", "INVALID"} <= statuses
    assert all(r["layout"] and r["tp"] is not None for r in loaded.rows)


def test_export_reads_the_old_studies(old_url: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("old-plan", "old-measured"):
        loaded = load_study(resolve_study(name, tmp_path, old_url))
        best = loaded.complete_rows()[0]
        code = main(["export", "--storage", old_url, "--study", name, "--format", "json"])
        out, err = capsys.readouterr()
        assert code == 0, err
        exported = json.loads(out)
        assert exported["trial"] == best["trial"]
        assert exported["tokens_per_s"] == pytest.approx(best["tokens_per_s"])
        assert exported["predicted"] is (name == "old-plan")
        assert exported["tp"] == best["tp"] and exported["mbs"] == best["mbs"]
        code = main(["export", "--storage", old_url, "--study", name, "--format",
                     "megatron-lm"])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert f"--micro-batch-size {best['mbs']}" in out


def test_a_real_run_study_of_the_old_format_resumes(old_url: str, tmp_path: Path) -> None:
    before = read_records(stored(old_url, "old-measured"))
    ran = {r.layout for r in before.values() if r.launched}
    backend = FakeBackend(small_cluster())
    cfg = SearchConfig(model=small_model(), cluster=small_cluster(),
                       space=load_space(str(OLD / "measured-space.yaml")), backend=backend,
                       results_dir=tmp_path, storage=old_url, study_name="old-measured",
                       sampler="tpe", resume=True, n_trials=len(ran) + 3, finalists=0)
    result = run_search(cfg)
    assert len(backend.calls) == 3 and not ran & set(backend.calls)
    assert result.stop_reason == f"reached --trials {len(ran) + 3}"
    # The replayed records are the old ones (the FAIL trials, DUPLICATE and INTERRUPTED, are
    # not replayed: they measured nothing).
    replayed = {r.number: r for r in result.records if r.number in before}
    assert replayed and all(r == before[n] for n, r in replayed.items())
    assert {t.number for t in stored(old_url, "old-measured")} >= set(before)


def test_a_planning_study_of_the_old_format_shows_again(old_url: str, tmp_path: Path) -> None:
    cluster = ClusterSpec(num_gpus=2, gpus_per_node=2, gpu=gpu_spec("h100-80gb"))
    cfg = SearchConfig(model=load_model("gpt2"), cluster=cluster,
                       space=load_space(str(OLD / "plan-space.yaml")),
                       backend=SimulateBackend(cluster), results_dir=tmp_path, storage=old_url,
                       study_name="old-plan", resume=True)
    before = read_records(stored(old_url, "old-plan"))
    result = run_search(cfg)
    assert len(stored(old_url, "old-plan")) == len(before)  # nothing new to simulate
    assert [r.number for r in result.records] == sorted(before)
    assert result.best(1)[0] == max(before.values(), key=lambda r: r.tokens_per_s or 0.0)
