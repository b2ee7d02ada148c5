"""The command line a Megatron user expects: Megatron-LM's flag names, pinned dimensions,
did-you-mean, export's default format, summaries that count every trial, tables that group
what is one answer, and --json with everything the text says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.commands import search as search_command
from autotune.commands.aliases import megatron_flags
from autotune.commands.counts import count_trials
from autotune.layouts.layout import Layout
from autotune.megatron.megatron_args import known_flags
from autotune.report.similar import similar_groups
from autotune.search.records import Source, TrialRecord
from autotune.trials.trial import StopReason, TrialMetrics, TrialStatus

SPACE = "pp: [1, 2]\nmbs: [1, 2, 4]\nimpl: [local, sdpa]\ndistributed_optimizer: [false, true]\n"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def space(tmp_path: Path) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(SPACE)
    return str(path)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_command, "local_gpu_count", lambda: 0)


# -- Megatron-LM's flag names --------------------------------------------------------------


@pytest.mark.parametrize(("field", "flag"), [
    ("tp", "--tensor-model-parallel-size"), ("pp", "--pipeline-model-parallel-size"),
    ("cp", "--context-parallel-size"), ("ep", "--expert-model-parallel-size"),
    ("vpp", "--num-virtual-stages-per-pipeline-rank"), ("mbs", "--micro-batch-size"),
    ("sequence_parallel", "--sequence-parallel"),
    ("distributed_optimizer", "--use-distributed-optimizer"),
    ("recompute", "--recompute-granularity"),
    ("offload_layers", "--cpu-offloading-num-layers"),
    ("seq_length", "--seq-length"), ("global_batch_size", "--global-batch-size"),
    # Spelled otherwise in Megatron-LM (transformer_engine for te; modules as a list): none.
    ("impl", None), ("recompute_modules", None),
])
def test_megatron_flags_come_from_the_flag_table(field: str, flag: str | None) -> None:
    assert megatron_flags().get(field) == flag
    assert set(megatron_flags().values()) <= set(known_flags())


ESTIMATE = ["estimate", "gpt2-xl", "--gpus", "8", "--json"]


@pytest.mark.parametrize(("ours", "megatrons"), [
    (["--tp", "1", "--pp", "2", "--mbs", "4"],
     ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "2",
      "--micro-batch-size", "4"]),
    (["--seq-len", "2048", "--gbs", "128", "--distributed-optimizer"],
     ["--seq-length", "2048", "--global-batch-size", "128", "--use-distributed-optimizer"]),
    (["--recompute", "full", "--recompute-num-layers", "2", "--offload-layers", "0"],
     ["--recompute-granularity", "full", "--recompute-num-layers", "2",
      "--cpu-offloading-num-layers", "0"]),
])
def test_megatron_spellings_estimate_the_same_layout(
        capsys: pytest.CaptureFixture[str], ours: list[str], megatrons: list[str]) -> None:
    code, expected, err = run(capsys, *ESTIMATE, *ours)
    assert code == 0, err
    code, got, err = run(capsys, *ESTIMATE, *megatrons)
    assert code == 0, err
    assert json.loads(got) == json.loads(expected)


# -- pins --------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "pinned"), [
    (["--tp", "1"], {"tp": [1]}),
    (["--pp", "1,2"], {"pp": [1, 2]}),
    (["--pipeline-model-parallel-size", "2", "--micro-batch-size", "4,8"],
     {"pp": [2], "mbs": [4, 8]}),
    (["--fix", "recompute=none,full", "--fix", "micro-batch-size=8"],
     {"recompute": ["full", "none"], "mbs": [8]}),
    (["--no-distributed-optimizer", "--fix", "impl=sdpa"],
     {"distributed_optimizer": [False], "impl": ["sdpa"]}),
    (["--use-distributed-optimizer"], {"distributed_optimizer": [True]}),
])
def test_pins_restrict_the_space(capsys: pytest.CaptureFixture[str], args: list[str],
                                 pinned: dict[str, list[object]]) -> None:
    code, out, err = run(capsys, "gpt2-xl", "--gpus", "8", "--dry-run", "--json", *args)
    assert code == 0, err
    data = json.loads(out)
    for dim, values in pinned.items():
        assert data["valid_values"][dim] == values
    assert "+ " in data["space"]  # the space says it is pinned


@pytest.mark.parametrize(("args", "message"), [
    (["--tp", "3"], "no layout of gpt2-xl on 8 GPUs takes the pins tp=3 in space "
                    "default.yaml (tp=3 x pp=1 x cp=1 = 3 must divide the 8 GPUs)"),
    (["--tp", "0"], "--tp 0: tp values must be positive integers, got '0'"),
    (["--tp", "1,"], "--tp 1,: give one value or a comma-separated list"),
    (["--recompute", "fulll"], "--recompute fulll: recompute='fulll' must be among none, "
                               "selective, full"),
    (["--fix", "tp"], "--fix tp: expected DIM=VALUES"),
    (["--fix", "nope=1"], "--fix nope=1: unknown dimension 'nope'; known: tp, pp,"),
    (["--fix", "dp=2"], "--fix dp=2: dp is not searched, it follows from the GPUs"),
    (["--tp", "1", "--fix", "tensor-model-parallel-size=1"],
     "--fix tensor-model-parallel-size=1: tp is pinned twice"),
])
def test_bad_pins_are_one_line(capsys: pytest.CaptureFixture[str], args: list[str],
                               message: str) -> None:
    code, out, err = run(capsys, "gpt2-xl", "--gpus", "8", "--dry-run", *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"autotune: error: {message}")


def test_a_pinned_search_is_a_study_of_its_own(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path, space: str) -> None:
    common = ["gpt2", "--gpus", "2", "--backend", "simulate", "--space", space,
              "--results-dir", str(tmp_path), "--json"]
    code, out, err = run(capsys, *common)
    assert code == 0, err
    free = json.loads(out)
    code, out, err = run(capsys, *common, "--pp", "2")
    assert code == 0, err
    pinned = json.loads(out)
    assert pinned["study"] != free["study"]
    assert pinned["best"] and all(row["pp"] == 2 for row in pinned["best"])
    assert any(row["pp"] == 1 for row in free["best"])


# -- did you mean, export's default -------------------------------------------------------


@pytest.mark.parametrize(("word", "command"), [
    ("estimat", "estimate"), ("reprot", "report"), ("exprt", "export"), ("model", "models"),
    ("calibrat", "calibrate"), ("serch", "search"),
])
def test_a_mistyped_command_says_which_was_meant(capsys: pytest.CaptureFixture[str],
                                                 word: str, command: str) -> None:
    code, out, err = run(capsys, word, "gpt2", "--gpus", "1")
    assert code == 2 and out == ""
    assert err == f"autotune: error: unknown command {word!r}; did you mean {command!r}?\n"


def test_a_mistyped_model_is_still_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "gpt2-xll", "--gpus", "1", "--dry-run")
    assert code == 2 and "unknown model 'gpt2-xll'" in err


def test_export_without_format_writes_the_launch_script(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, space: str, no_gpu: None) -> None:
    code, _, err = run(capsys, "gpt2", "--gpus", "2", "--space", space, "--results-dir",
                       str(tmp_path))
    assert code == 0, err
    code, plain, err = run(capsys, "export", "--results-dir", str(tmp_path))
    assert code == 0, err
    assert "as --format megatron-lm" in err
    code, explicit, _ = run(capsys, "export", "--results-dir", str(tmp_path), "--format",
                            "megatron-lm")
    assert code == 0 and plain == explicit and "pretrain_gpt.py" in plain


# -- what the summary and the JSON say ---------------------------------------------------


def _record(number: int, status: TrialStatus, tokens: float | None = None, *,
            duplicate_of: int | None = None, slow: bool = False,
            layout: Layout | None = None, peak: int = 2**30) -> TrialRecord:
    metrics = None if tokens is None and status not in (TrialStatus.OOM,) else TrialMetrics(
        status=status, tokens_per_s=tokens, peak_reserved_bytes=peak,
        stop_reason=StopReason.SLOW if slow else None)
    return TrialRecord(number=number, layout=layout or Layout(), status=status,
                       source=Source.SAMPLER, metrics=metrics, duplicate_of=duplicate_of)


def test_every_trial_is_counted_once() -> None:
    records = [_record(0, TrialStatus.OK, 100.0), _record(1, TrialStatus.OK, 90.0),
               _record(2, TrialStatus.OK, 80.0, slow=True), _record(3, TrialStatus.OOM),
               _record(4, TrialStatus.PREDICTED_OOM), _record(5, TrialStatus.PREDICTED_OOM),
               _record(6, TrialStatus.PREDICTED_SLOW), _record(7, TrialStatus.INVALID),
               _record(8, TrialStatus.OK, 100.0, duplicate_of=0)]
    counts = count_trials(records, stored={0})
    assert (counts.in_study, counts.ran, counts.read, counts.ranked) == (9, 3, 1, 2)
    assert counts.unranked == {"pruned slow": 1, "OOM": 1}
    assert counts.not_run == {"predicted out of memory": 2, "predicted slow": 1,
                              "invalid": 1}
    assert counts.repeats == 1
    total = (counts.ranked + sum(counts.unranked.values()) + sum(counts.not_run.values())
             + counts.repeats)
    assert total == counts.in_study
    assert counts.breakdown("launched") == (
        "2 ranked, 1 pruned slow and 1 OOM left unranked, 2 predicted out of memory, "
        "1 predicted slow and 1 invalid (not launched), 1 repeating an earlier trial's run")


def test_search_summary_and_json_say_the_same(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path, space: str) -> None:
    common = ["gpt2", "--gpus", "2", "--backend", "simulate", "--space", space,
              "--gpu", "a100-40gb", "--seq-len", "8192", "--gbs", "8"]
    code, out, err = run(capsys, *common, "--json", "--results-dir", str(tmp_path / "a"))
    assert code == 0, err
    data = json.loads(out)
    trials = data["trials"]
    assert sum(trials["not_run"].values()) > 0  # some layouts are predicted not to fit
    assert trials["ranked"] + sum(trials["unranked"].values()) + \
        sum(trials["not_run"].values()) + trials["repeats"] == trials["in_study"]
    for key in ("storage", "model", "gpus", "gpu", "space", "valid_layouts", "table"):
        assert key in data
    assert data["table"][0]["trial"] == data["best"][0]["trial"]
    code, text, err = run(capsys, *common, "--results-dir", str(tmp_path / "b"))
    assert code == 0, err
    assert " ".join(data["summary"].split()) in " ".join(text.split())
    assert "predicted out of memory (not simulated)" in data["summary"]


def test_estimate_json_has_what_the_text_says(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "estimate", "gpt3-175b", "--gpus", "8", "--tp", "8", "--sp",
                         "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["fits"] is False and data["does_not_fit"]
    assert data["label"] == "tp8 pp1 dp1 mbs1 sp local" and data["gpus_per_node"] == 8
    stage = data["stages_gib"][0]
    assert {"weights", "activations", "total", "saved"} <= set(stage)
    assert data["defaults_note"].startswith("estimate's defaults:")


# -- tables: one row per answer ------------------------------------------------------------


def _item(number: int, tokens: float, peak: float, **fields: object) -> tuple[int, Layout,
                                                                              float, float]:
    return number, Layout(**fields), tokens, peak  # type: ignore[arg-type]


@pytest.mark.parametrize(("items", "groups"), [
    # Overlap flags and the optimizer within 2%: one row.
    ([_item(0, 100.0, 10.0, overlap_grad_reduce=True), _item(1, 99.0, 10.1),
      _item(2, 98.5, 10.0, distributed_optimizer=True)], [[0, 1, 2]]),
    # The same options but another micro-batch: not noise, two rows.
    ([_item(0, 100.0, 10.0), _item(1, 99.5, 10.0, mbs=2)], [[0], [1]]),
    # Noise-level options, figures apart (5% tokens/s, or 10% memory): two rows.
    ([_item(0, 100.0, 10.0), _item(1, 95.0, 10.0, overlap_grad_reduce=True)], [[0], [1]]),
    ([_item(0, 100.0, 10.0), _item(1, 100.0, 11.0, overlap_grad_reduce=True)], [[0], [1]]),
    # Compared with a group's first row only: no chaining past the tolerance.
    ([_item(0, 100.0, 10.0), _item(1, 98.5, 10.0, impl="sdpa"),
      _item(2, 97.0, 10.0, impl="te")], [[0, 1], [2]]),
])
def test_similar_layouts_share_a_row(items: list[tuple[int, Layout, float, float]],
                                     groups: list[list[int]]) -> None:
    grouped = similar_groups(items, layout=lambda i: i[1], figures=lambda i: (i[2], i[3]))
    assert [[i[0] for i in g] for g in grouped] == groups


def test_layouts_megatron_runs_alike_share_a_row() -> None:
    items = [_item(0, 100.0, 10.0), _item(1, 50.0, 20.0, mbs=2), _item(2, 40.0, 30.0, pp=2)]
    # A run key that calls the first two the same run, whatever their figures.
    grouped = similar_groups(items, layout=lambda i: i[1], figures=lambda i: (i[2], i[3]),
                             run_key=lambda s: s.pp)
    assert [[i[0] for i in g] for g in grouped] == [[0, 1], [2]]


def test_limit_keeps_the_first_groups() -> None:
    items = [_item(n, 100.0 - 10 * n, 10.0, mbs=n + 1) for n in range(6)]
    grouped = similar_groups(items, layout=lambda i: i[1], figures=lambda i: (i[2], i[3]),
                             limit=3)
    assert [[i[0] for i in g] for g in grouped] == [[0], [1], [2]]
