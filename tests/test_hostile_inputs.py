"""Hostile input of every kind (issue 27, item 2): model YAML, config.json, space YAML,
calibration, layout JSON, trial results read back, and a tampered study. Each ends as one line
on stderr and exit 2 through the CLI: never a traceback, a hang, or a silently wrong figure."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from autotune.cli import main
from autotune.layouts.layout import Layout
from autotune.predict.cost import CostParams
from autotune.predict.memory import MemoryParams
from autotune.specs.presets import load_model
from autotune.trials.trial import TrialSpec

MODEL = {"name": "tiny", "num_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
         "vocab_size": 1000, "seq_length": 128, "global_batch_size": 8}
HF = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4,
      "num_hidden_layers": 2, "intermediate_size": 512, "vocab_size": 1000,
      "max_position_embeddings": 128}
BOMB = "a: &a [x, x]\nb: &b [*a, *a]\nc: &c [*b, *b]\nd: [*c, *c]\n"
DEEP_YAML = "name: " + "[" * 200 + "]" * 200 + "\n"
DEEP_JSON = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"


def yaml_model(**changes: Any) -> str:
    return "".join(f"{k}: {json.dumps(v)}\n" for k, v in {**MODEL, **changes}.items())


def raw(text: str) -> Callable[[], str]:
    return lambda: text


def calibration(part: str, key: str, value: Any) -> str:
    data: dict[str, Any] = {"cost": {"values": vars_of(CostParams())},
                            "memory": {"values": vars_of(MemoryParams())}}
    data[part]["values"][key] = value
    return json.dumps(data)


def vars_of(obj: Any) -> dict[str, Any]:
    return {f: getattr(obj, f) for f in obj.__dataclass_fields__}


# (id, file name, file text (None: a special file), argv with {f} for the file, fragment)
CASES: list[tuple[str, str, str | None, list[str], str]] = [
    # model YAML
    ("model-string", "m.yaml", yaml_model(num_layers="12"), ["estimate", "{f}"],
     "num_layers must be an integer, got '12'"),
    ("model-bool-string", "m.yaml", yaml_model(tied_embeddings="false"), ["estimate", "{f}"],
     "tied_embeddings must be true or false, got 'false'"),
    ("model-nan", "m.yaml", yaml_model() + "hidden_dropout: .nan\n", ["estimate", "{f}"],
     "hidden_dropout must be a finite number"),
    ("model-infinity", "m.yaml", yaml_model() + "ffn_hidden_size: .inf\n", ["estimate", "{f}"],
     "ffn_hidden_size must be an integer"),
    ("model-1e300", "m.yaml", yaml_model().replace("hidden_size: 256", "hidden_size: 1.0e+300"),
     ["estimate", "{f}"],
     "hidden_size must be an integer, got 1e+300"),
    ("model-huge-int", "m.yaml", yaml_model(vocab_size=10**30), ["estimate", "{f}"],
     "vocab_size must be at most"),
    ("model-negative", "m.yaml", yaml_model(ffn_hidden_size=-1024), ["estimate", "{f}"],
     "ffn_hidden_size must be a positive integer, got -1024"),
    ("model-zero", "m.yaml", yaml_model(make_vocab_size_divisible_by=0), ["estimate", "{f}"],
     "make_vocab_size_divisible_by must be a positive integer, got 0"),
    ("model-dropout-range", "m.yaml", yaml_model(attention_dropout=5), ["estimate", "{f}"],
     "attention_dropout must be at most 1"),
    ("model-nesting", "m.yaml", DEEP_YAML, ["estimate", "{f}"], "nested deeper than 32"),
    ("model-anchor-bomb", "m.yaml", BOMB, ["estimate", "{f}"], "aliases are not accepted"),
    ("model-dev-zero", "/dev/zero", None, ["estimate", "{f}"], "is a character device"),
    ("model-fifo", "m.yaml", None, ["estimate", "{f}"], "is a FIFO"),
    ("model-control", "m.yaml", yaml_model(name="\x1b[31mred\x1b]0;title\x07"),
     ["estimate", "{f}"], "must be one line"),
    ("model-duplicate-key", "m.yaml", yaml_model() + "num_layers: 4\n", ["estimate", "{f}"],
     "key 'num_layers' is given twice"),
    ("model-unknown", "m.yaml", yaml_model(bogus=1), ["estimate", "{f}"],
     "unknown model field(s) bogus"),
    # Hugging Face config.json
    ("hf-bool-string", "config.json", json.dumps({**HF, "tie_word_embeddings": "false"}),
     ["estimate", "{f}"], "tie_word_embeddings must be true or false, got 'false'"),
    ("hf-nan", "config.json", json.dumps(HF)[:-1] + ', "rope_theta": NaN}',
     ["estimate", "{f}"], "NaN is not a number"),
    ("hf-infinity", "config.json", json.dumps(HF)[:-1] + ', "rope_theta": Infinity}',
     ["estimate", "{f}"], "Infinity is not a number"),
    ("hf-overflow", "config.json", json.dumps(HF)[:-1] + ', "rope_theta": 1e999}',
     ["estimate", "{f}"], "1e999 overflows a float"),
    ("hf-negative", "config.json", json.dumps({**HF, "intermediate_size": -1024}),
     ["estimate", "{f}"], "intermediate_size must be a positive integer, got -1024"),
    ("hf-zero", "config.json", json.dumps({**HF, "num_hidden_layers": 0}),
     ["estimate", "{f}"], "num_hidden_layers must be a positive integer, got 0"),
    ("hf-string-window", "config.json", json.dumps({**HF, "sliding_window": "4096"}),
     ["estimate", "{f}"], "sliding_window must be a positive integer, got '4096'"),
    ("hf-rope-string", "config.json", json.dumps({**HF, "rope_theta": "1e4"}),
     ["estimate", "{f}"], "rope_theta must be a finite number"),
    ("hf-nesting", "config.json", DEEP_JSON, ["estimate", "{f}"], "nested deeper than 32"),
    ("hf-fifo", "config.json", None, ["estimate", "{f}"], "is a FIFO"),
    ("hf-control", "config.json", json.dumps({**HF, "model_type": "\x1b[2Jllama\n"}),
     ["estimate", "{f}"], "is not an architecture autotune maps"),
    # search space YAML
    ("space-string", "s.yaml", "tp: ['2']\n", ["gpt2", "--space", "{f}", "--dry-run"],
     "tp candidates must be positive integers, got '2'"),
    ("space-nan", "s.yaml", "mbs: [.nan]\n", ["gpt2", "--space", "{f}", "--dry-run"],
     "mbs candidates must be positive integers"),
    ("space-1e300", "s.yaml", "mbs: [1e300]\n", ["gpt2", "--space", "{f}", "--dry-run"],
     "mbs candidates must be positive integers"),
    ("space-negative", "s.yaml", "tp: [-2]\n", ["gpt2", "--space", "{f}", "--dry-run"],
     "tp candidates must be positive integers, got -2"),
    ("space-zero", "s.yaml", "mbs: [0]\n", ["gpt2", "--space", "{f}", "--dry-run"],
     "mbs candidates must be positive integers, got 0"),
    # YAML 1.1 reads a bare `on`/`yes` as true: the choices are named, not "strings".
    ("space-yaml-on", "s.yaml", "fp8: [on]\n", ["gpt2", "--space", "{f}", "--dry-run"],
     "fp8 candidates must be one of off, hybrid, e4m3, got true (YAML reads a bare on/off"),
    ("space-yaml-yes", "s.yaml", "recompute: [yes]\n", ["gpt2", "--space", "{f}", "--dry-run"],
     "recompute candidates must be one of none, selective, full, got true"),
    ("space-too-many", "s.yaml", f"mbs: {list(range(1, 200))}\n",
     ["gpt2", "--space", "{f}", "--dry-run"], "mbs lists 199 candidates; at most 64"),
    ("space-nesting", "s.yaml", "tp: " + "[" * 200 + "]" * 200 + "\n",
     ["gpt2", "--space", "{f}", "--dry-run"], "nested deeper than 32"),
    ("space-anchor-bomb", "s.yaml", BOMB, ["gpt2", "--space", "{f}", "--dry-run"],
     "aliases are not accepted"),
    ("space-dev-zero", "/dev/zero", None, ["gpt2", "--space", "{f}", "--dry-run"],
     "is a character device"),
    ("space-fifo", "s.yaml", None, ["gpt2", "--space", "{f}", "--dry-run"], "is a FIFO"),
    ("space-control", "s.yaml", "\x1b[31mtp: [1]\n", ["gpt2", "--space", "{f}", "--dry-run"],
     "malformed YAML"),
    # calibration files
    ("calibration-negative", "c.json", calibration("memory", "fragmentation", -5),
     ["estimate", "gpt2", "--calibration", "{f}"],
     "memory.fragmentation must be positive and at most"),
    ("calibration-zero", "c.json", calibration("cost", "gemm_efficiency_max", 0),
     ["estimate", "gpt2", "--calibration", "{f}"], "cost.gemm_efficiency_max must be positive"),
    ("calibration-string", "c.json", calibration("cost", "step_overhead_s", "0.05"),
     ["estimate", "gpt2", "--calibration", "{f}"], "cost.step_overhead_s must be a number"),
    ("calibration-nan", "c.json", calibration("cost", "step_overhead_s", 1.0).replace(
        '"step_overhead_s": 1.0', '"step_overhead_s": NaN'),
     ["estimate", "gpt2", "--calibration", "{f}"], "NaN is not a number"),
    ("calibration-huge", "c.json", calibration("memory", "cuda_context_bytes", 1e300),
     ["estimate", "gpt2", "--calibration", "{f}"], "cuda_context_bytes must be positive"),
    ("calibration-efficiency", "c.json", calibration("cost", "hbm_efficiency", 3.0),
     ["estimate", "gpt2", "--calibration", "{f}"], "hbm_efficiency must be positive and at "
                                                   "most 1"),
    ("calibration-nesting", "c.json", DEEP_JSON, ["estimate", "gpt2", "--calibration", "{f}"],
     "nested deeper than 32"),
    ("calibration-dev-zero", "/dev/zero", None, ["estimate", "gpt2", "--calibration", "{f}"],
     "is a character device"),
    ("calibration-fifo", "c.json", None, ["estimate", "gpt2", "--calibration", "{f}"],
     "is a FIFO"),
    # layout JSON and estimate's options
    ("layout-string", "l.json", '{"mbs": "4"}', ["estimate", "gpt2", "--layout", "{f}"],
     "mbs must be int, got '4'"),
    ("layout-zero", "l.json", '{"mbs": 0}', ["estimate", "gpt2", "--layout", "{f}"],
     "--mbs takes positive integers, got 0"),
    ("layout-negative", "l.json", '{"pp": 2, "first_stage_layers": -3}',
     ["estimate", "gpt2", "--gpus", "2", "--layout", "{f}"],
     "--first-stage-layers takes integers >= 0, got -3"),
    ("layout-nan", "l.json", '{"mbs": NaN}', ["estimate", "gpt2", "--layout", "{f}"],
     "NaN is not a number"),
    ("layout-nesting", "l.json", DEEP_JSON, ["estimate", "gpt2", "--layout", "{f}"],
     "nested deeper than 32"),
    ("layout-fifo", "l.json", None, ["estimate", "gpt2", "--layout", "{f}"], "is a FIFO"),
    ("layout-dev-zero", "/dev/zero", None, ["estimate", "gpt2", "--layout", "{f}"],
     "is a character device"),
    ("option-negative", "-", "", ["estimate", "gpt2", "--gpus", "2", "--pp", "2",
                                  "--first-stage-layers", "-3"],
     "--first-stage-layers takes integers >= 0, got -3"),
]


@pytest.mark.parametrize(("name", "text", "args", "fragment"),
                         [pytest.param(n, t, a, f, id=i) for i, n, t, a, f in CASES])
def test_hostile_file_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch, name: str,
                                         text: str | None, args: list[str],
                                         fragment: str) -> None:
    monkeypatch.chdir(tmp_path)
    if name.startswith("/"):
        path = Path(name)
    else:
        path = tmp_path / name
        if text is None:
            os.mkfifo(path)  # no writer: reading it would block forever
        else:
            path.write_text(text)
    argv = [a.replace("{f}", str(path)) for a in args]
    if "--gpus" not in argv:
        argv += ["--gpus", "1"]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, err
    assert err.startswith("autotune: error: ") and err.endswith("\n")
    assert len(err.splitlines()) == 1, err
    assert fragment in err
    assert "Traceback" not in err and "\x1b" not in err and "\x07" not in err
    assert out == ""


# -- results read back from disk: a trial's result.json and trial.json ------------------------


def _trial_folder(root: Path, result: str) -> None:
    folder = root / "trials" / "0"
    folder.mkdir(parents=True)
    spec = TrialSpec(model=load_model("gpt2"), layout=Layout(mbs=1, gbs=64), gpu_name="h100-80gb")
    (folder / "trial.json").write_text(spec.to_json())
    (folder / "result.json").write_text(result)


GOOD_RESULT = {"status": "OK", "step_time_s": 0.5, "tokens_per_s": 1000.0,
               "device_used_bytes": 2**34}


@pytest.mark.parametrize(("result", "fragment"), [
    (json.dumps({**GOOD_RESULT, "step_time_s": "0.5"}), "step_time_s must be a number"),
    (json.dumps(GOOD_RESULT)[:-1] + ', "tokens_per_s": NaN}', "NaN is not a number"),
    (json.dumps({**GOOD_RESULT, "device_used_bytes": -1}), "device_used_bytes must be at least 0"),
    (json.dumps({**GOOD_RESULT, "step_time_s": 1e300}), "step_time_s must be at most"),
    (json.dumps({**GOOD_RESULT, "status": "GREAT"}), "status must be one of"),
    (json.dumps({**GOOD_RESULT, "ranks": [{"rank": "0"}]}), "ranks.0"),
    ('{"status": ' + "[" * 50_000, "nested deeper than 32"),
], ids=["string", "nan", "negative", "huge", "status", "rank", "nesting"])
def test_hostile_result_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         result: str, fragment: str) -> None:
    _trial_folder(tmp_path, result)
    code = main(["calibrate", "--results-dir", str(tmp_path), "-o", str(tmp_path / "c.json")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.splitlines()) == 1 and fragment in err and "Traceback" not in err
    assert not (tmp_path / "c.json").exists()


# -- a tampered study ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("results")
    assert main(["gpt2", "--gpus", "1", "--backend", "simulate", "--trials", "3",
                 "--results-dir", str(root), "--study", "s"]) == 0
    return root


def _tamper(root: Path, tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    copy = tmp_path / "results"
    shutil.copytree(root, copy)
    db = sqlite3.connect(copy / "s" / "study.db")
    with db:
        rows = db.execute("SELECT trial_user_attribute_id, value_json FROM "
                          "trial_user_attributes WHERE key = 'record'").fetchall()
        ident, value = rows[0]
        record = json.loads(value)
        change(record)
        db.execute("UPDATE trial_user_attributes SET value_json = ? WHERE "
                   "trial_user_attribute_id = ?", (json.dumps(record), ident))
    db.close()
    return copy


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(record: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = record
        for p in parents:
            node = node[p]
        node[last] = value
    return change


@pytest.mark.parametrize(("change", "fragment"), [
    (_set("metrics.tokens_per_s", "fast"), "tokens_per_s must be a number, got 'fast'"),
    (_set("metrics.tokens_per_s", float("nan")), "tokens_per_s must be a finite number"),
    (_set("metrics.peak_reserved_bytes", -5), "peak_reserved_bytes must be at least 0"),
    (_set("metrics.tokens_per_s", 1e300), "tokens_per_s must be at most"),
    (_set("layout.tp", -1), "layout.tp must be positive integers, got -1"),
    (_set("layout.mbs", "4"), "layout.mbs must be positive integers, got '4'"),
    (_set("predicted_peak_bytes", float("inf")), "predicted_peak_bytes must be a finite"),
    (_set("metrics", "OK"), "expected a mapping of result fields"),
], ids=["string", "nan", "negative", "huge", "layout-negative", "layout-string", "inf",
        "metrics-not-a-mapping"])
@pytest.mark.parametrize("command", [["export", "--format", "json"], ["report"]],
                         ids=["export", "report"])
def test_tampered_study_is_one_line(planned: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str],
                                    change: Callable[[dict[str, Any]], None], fragment: str,
                                    command: list[str]) -> None:
    copy = _tamper(planned, tmp_path, change)
    code = main([*command, "--results-dir", str(copy), "--study", "s"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "is not one autotune wrote" in err and fragment in err
    assert not (copy / "s" / "report.md").exists()


# -- untrusted text on its way out --------------------------------------------------------------


def test_html_and_markdown_in_a_model_name_are_escaped(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    pytest.importorskip("pandas")
    pytest.importorskip("plotly")
    pytest.importorskip("matplotlib")
    name = "<script>alert(1)</script> *bold* [x](http://e) $x^$"
    model = tmp_path / "evil.yaml"
    model.write_text(yaml_model(name=name))
    root = tmp_path / "r"
    assert main([str(model), "--gpus", "1", "--backend", "simulate", "--trials", "3",
                 "--results-dir", str(root), "--study", "evil"]) == 0
    assert main(["report", "--results-dir", str(root), "--study", "evil"]) == 0, \
        capsys.readouterr().err
    report = (root / "evil" / "report.md").read_text()
    assert "<script>" not in report and "&lt;script&gt;" in report
    assert r"\*bold\*" in report and r"\[x\]\(http://e\)" in report
    page = (root / "evil" / "pareto.html").read_text()
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page
    assert (root / "evil" / "pareto.png").stat().st_size > 0  # `$x^$` is no mathtext error


@pytest.mark.parametrize(("text", "shown"), [
    ("plain", "plain"),
    ("\x1b[31mred\x1b[0m", "red"),
    ("title\x1b]0;pwned\x07!", "title!"),
    ("two\nlines", "two\\nlines"),
    ("back\rspace\x08", "back\\rspace\\x08"),
    ("bidi\u202egnp.exe", "bidi\\u202egnp.exe"),
])
def test_terminal_text_is_one_harmless_line(text: str, shown: str) -> None:
    from autotune.inputs.untrusted import for_terminal

    assert for_terminal(text) == shown
