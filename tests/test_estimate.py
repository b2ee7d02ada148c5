"""`autotune estimate`: one layout's memory per stage, speed, JSON, layout files, errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.specs.hardware import gpu_spec

ESTIMATE = ["estimate", "gpt2-xl", "--gpus", "8", "--pp", "2", "--mbs", "4"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_has_memory_speed_and_breakdown(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, *ESTIMATE, "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    for key in ("peak_memory_gib", "fits", "step_time_s", "tokens_per_s", "tflops_per_gpu",
                "mfu", "memory_breakdown_gib"):
        assert key in data, key
    assert (data["layout"]["pp"],
            data["layout"]["dp"]) == (2, 4)
    assert data["fits"] is (data["peak_memory_gib"] <= data["capacity_gib"])
    assert data["tokens_per_s"] > 0 and 0 < data["mfu"] < 1 and data["step_time_s"] > 0
    assert len(data["stages_gib"]) == 2
    assert data["peak_memory_gib"] == pytest.approx(max(s["total"] for s in data["stages_gib"]))
    assert data["predicted"] is True


@pytest.mark.parametrize(("args", "message"), [
    (["--gpus", "8", "--tp", "2"], "tp=2 must divide num_attention_heads=25"),
    (["--gpus", "5", "--pp", "5"], "pp=5 must divide num_layers=48"),
    (["--gpus", "8", "--pp", "3"], "tp=1 x pp=3 x cp=1 = 3 must divide the 8 GPUs"),
    (["--gpus", "8", "--sp"], "sequence_parallel needs tp >= 2, got tp=1"),
])
def test_invalid_layout_is_one_line_with_megatrons_reason(
        capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, out, err = run(capsys, "estimate", "gpt2-xl", *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("autotune: error: ")
    assert message in err


def test_layout_file_round_trips(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = [*ESTIMATE, "--recompute", "selective", "--distributed-optimizer", "--impl", "sdpa"]
    _, first, _ = run(capsys, *args, "--json")
    layout = tmp_path / "layout.json"
    layout.write_text(first)  # the estimate's own JSON carries "layout"
    code, second, _ = run(capsys, "estimate", "gpt2-xl", "--gpus", "8", "--layout", str(layout),
                          "--json")
    assert code == 0
    # The note on estimate's defaults names the options the command line left out: the file
    # sets them all.
    assert json.loads(first).pop("defaults_note") and json.loads(second).pop("defaults_note") \
        is None
    assert {k: v for k, v in json.loads(second).items() if k != "defaults_note"} == \
        {k: v for k, v in json.loads(first).items() if k != "defaults_note"}
    # A bare layout object works too; the options it leaves out fill it in, and one it sets
    # otherwise is refused (it used to be dropped in silence).
    layout.write_text(json.dumps({"pp": 4, "mbs": 2}))
    _, third, _ = run(capsys, "estimate", "gpt2-xl", "--gpus", "8", "--impl", "sdpa",
                      "--layout", str(layout), "--json")
    assert (json.loads(third)["layout"]["pp"], json.loads(third)["layout"]["mbs"]) == (4, 2)
    assert json.loads(third)["layout"]["impl"] == "sdpa"
    code, _, err = run(capsys, *ESTIMATE, "--layout", str(layout), "--json")
    assert code == 2 and "sets pp 4, mbs 2; the options say --pp 2, --mbs 4" in err


@pytest.mark.parametrize(("text", "message"), [
    (None, "does not exist"),
    ("{not json", "malformed JSON"),
    ("[1, 2]", "expected a JSON object"),
])
def test_bad_layout_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                     text: str | None, message: str) -> None:
    layout = tmp_path / "layout.json"
    if text is not None:
        layout.write_text(text)
    code, out, err = run(capsys, *ESTIMATE, "--layout", str(layout))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


@pytest.mark.parametrize(("pp", "stages"), [
    (1, [0]),
    (2, [0, 1]),
    (4, [0, 1, 3]),  # first, busiest middle and last stage (memory.estimate_memory)
])
def test_text_has_one_row_per_stage_and_marks_the_peak(capsys: pytest.CaptureFixture[str],
                                                       pp: int, stages: list[int]) -> None:
    code, out, _ = run(capsys, "estimate", "gpt2-xl", "--gpus", "8", "--pp", str(pp))
    assert code == 0
    rows = [line for line in out.splitlines() if re.match(r"^\s+\d+\s+\d", line)]
    assert [int(r.split()[0]) for r in rows] == stages
    peaks = [r for r in rows if r.endswith("<- peak")]
    assert len(peaks) == 1
    stage = int(peaks[0].split()[0])
    assert f"on stage {stage}: fits" in out
    assert "tokens/s" in out and "MFU" in out and "(predicted)" in out


@pytest.mark.parametrize(("content", "message"), [
    ({"mbs": "x"}, "mbs must be int, got 'x'"),
    ({"gbs": "64"}, "gbs must be int, got '64'"),
    ({"tp": None}, "tp must be int, got None"),
    ({"sequence_parallel": "no"}, "sequence_parallel must be bool, got 'no'"),
    ({"distributed_optimizer": 1}, "distributed_optimizer must be bool, got 1"),
    ({"pp": True}, "pp must be int, got True"),
    ({"model": "gpt2", "mbs": 1}, "is a layout of gpt2, not of gpt2-xl"),
    ({"gpus": 4, "mbs": 1}, "is for 4 GPUs; --gpus says 8"),
    ({"gpu": 7, "mbs": 1}, "gpu must be str, got 7"),
])
def test_layout_values_of_the_wrong_type_or_job_are_one_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, content: dict[str, object],
        message: str) -> None:
    layout = tmp_path / "layout.json"
    layout.write_text(json.dumps(content))
    code, out, err = run(capsys, *ESTIMATE, "--layout", str(layout))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_exported_layout_brings_its_machine_and_sequence(capsys: pytest.CaptureFixture[str],
                                                        tmp_path: Path) -> None:
    # A plan for A100-40GB, seq 2048, 2 GPUs per node: the JSON export, read back by estimate
    # without those flags, must give the study's own predicted figures.
    results = tmp_path / "r"
    code, _, err = run(capsys, "gpt2-large", "--gpus", "4", "--gpus-per-node", "2", "--gpu",
                       "a100-40gb", "--seq-len", "2048", "--global-batch-size", "32",
                       "--backend", "simulate", "--results-dir", str(results),
                       "--study", "plan", "--trials", "5")
    assert code == 0, err
    layout = tmp_path / "best.json"
    code, _, err = run(capsys, "export", "--results-dir", str(results), "--study", "plan",
                       "--format", "json", "-o", str(layout))
    assert code == 0, err
    exported = json.loads(layout.read_text())
    assert (exported["gpu"], exported["seq_length"], exported["gpus_per_node"]) == (
        "a100-40gb", 2048, 2)
    code, out, _ = run(capsys, "estimate", "gpt2-large", "--gpus", "4", "--layout",
                       str(layout), "--json")
    assert code == 0
    estimate = json.loads(out)
    assert estimate["gpu"] == "a100-40gb"
    assert estimate["tokens_per_s"] == pytest.approx(exported["tokens_per_s"], rel=1e-9)


def test_step_terms_add_up_to_the_step(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "gpt2-xl", "--gpus", "8", "--pp", "2", "--mbs", "4")
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("step "))
    step = float(re.match(r"step ([\d.]+) ms", line).group(1))  # type: ignore[union-attr]
    terms = [float(v) for v in re.findall(r" ([\d.]+)(?=,| ms$)", line.split(":", 1)[1])]
    assert sum(terms) == pytest.approx(step, abs=0.1 * len(terms))


@pytest.mark.parametrize(("extra", "fp8_share"), [
    ([], None),  # bf16: MFU against the bf16 peak alone
    (["--fp8", "hybrid"], True),
])
def test_fp8_mfu_is_also_given_against_the_fp8_peak(capsys: pytest.CaptureFixture[str],
                                                    extra: list[str],
                                                    fp8_share: bool | None) -> None:
    # gpt-1t at mbs 64 on one H100 (memory aside): FP8's large GEMMs run faster than the bf16
    # peak, so MFU against it passes 100%; its share of the FP8 peak says how close it runs.
    args = ["estimate", "gpt-1t", "--gpus", "1", "--gpu", "h100-80gb", "--impl", "te",
            "--mbs", "64", *extra]
    code, out, _ = run(capsys, *args)
    assert code == 0
    assert ("of the FP8 peak" in out) == bool(fp8_share)
    code, out, _ = run(capsys, *args, "--json")
    data = json.loads(out)
    if fp8_share:
        gpu = gpu_spec("h100-80gb")
        assert data["mfu"] > 1 > data["mfu_fp8"]
        assert gpu.peak_fp8_flops is not None
        assert data["mfu_fp8"] == pytest.approx(
            data["mfu"] * gpu.peak_bf16_flops / gpu.peak_fp8_flops)
    else:
        assert data["mfu_fp8"] is None and data["mfu"] < 1


@pytest.mark.parametrize(("model_arg", "refused"), [
    (None, "is a layout of 'my-model', which is not a preset: give its model YAML or "
           "config.json as MODEL"),
    ("FILE", None),
])
def test_layout_of_a_model_file_names_what_to_pass(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, model_arg: str | None,
        refused: str | None) -> None:
    # A study of a model YAML or config.json exports its layout with the model's name, not a
    # preset: without MODEL, `estimate --layout` says to pass the file rather than calling the
    # name (which the user never typed) an unknown model.
    model = tmp_path / "model.yaml"
    model.write_text("name: my-model\nnum_layers: 2\nhidden_size: 256\nnum_attention_heads: 4\n"
                     "vocab_size: 1000\nseq_length: 128\nglobal_batch_size: 8\n")
    layout = tmp_path / "layout.json"
    layout.write_text(json.dumps({"model": "my-model", "gpus": 2, "mbs": 1}))
    args = [str(model)] if model_arg else []
    code, out, err = run(capsys, "estimate", *args, "--layout", str(layout), "--json")
    if refused:
        assert code == 2 and out == ""
        assert len(err.strip().splitlines()) == 1 and refused in err, err
    else:
        assert code == 0, err
        assert json.loads(out)["model"] == "my-model"


def test_the_sequence_is_shown(capsys: pytest.CaptureFixture[str]) -> None:
    # A config.json's sequence is derived (max_position_embeddings up to 8192, a sliding
    # window): the estimate says which one it priced, in text and JSON.
    code, out, _ = run(capsys, "estimate", "llama3-8b", "--gpus", "8", "--seq-len", "2048")
    assert code == 0 and "gbs 512, seq 2048," in out.splitlines()[0]
    code, out, _ = run(capsys, "estimate", "llama3-8b", "--gpus", "8", "--json")
    assert code == 0 and json.loads(out)["seq_length"] == 8192
