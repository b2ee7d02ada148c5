"""A number in scientific notation reads alike in every input file (session 17's sweep): YAML
1.1 read `1e3` as the string '1e3' (a count refused as "must be a number, got '1e3'"), JSON
read it as the real 1000.0 ("tp must be int"). Now both read a whole number with an exponent as
that integer (gbs: 1e3 is 1000), one that is not whole as a real, refused by name where a
count is needed, and one past a float as one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.cli import main
from autotune.inputs.documents import parse_json, parse_yaml

MODEL = Path(__file__).parent.parent / "search_spaces" / "models" / "gpt2.yaml"
CLUSTER = "gpu: h100-80gb\ngpus_per_node: {n}\nnvlink_gb_per_s: {bw}\ninter_node_gbit_per_s: 4e2\n"


@pytest.mark.parametrize(("text", "value"), [
    ("1e3", 1000), ("1.5e3", 1500), ("-2e0", -2), ("1.0e+3", 1000), ("1_000e0", 1000),
    (".5e1", 5), ("1e-3", 0.001), ("1.5e0", 1.5), ("8.0", 8.0), ("1e20", 1e20),
    ("'1e3'", "1e3"), ("1e", "1e"), ("e3", "e3"),
])
def test_yaml_and_json_read_exponents_alike(text: str, value: object) -> None:
    got = parse_yaml(f"a: {text}", "x")["a"]
    assert got == value and type(got) is type(value)
    if not text.startswith(("'", "e", ".")) and "_" not in text and text != "1e":
        from_json = parse_json(f'{{"a": {text}}}', "x")["a"]
        assert from_json == value and type(from_json) is type(value)


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _model(**fields: str) -> str:
    text = MODEL.read_text()
    for key, value in fields.items():
        text = "\n".join(f"{key}: {value}" if line.startswith(f"{key}:") else line
                         for line in text.splitlines()) + "\n"
    return text


@pytest.mark.parametrize(("name", "text", "args"), [
    ("m.yaml", _model(global_batch_size="1.28e2", seq_length="1.024e3"),
     ["estimate", "{f}", "--gpus", "8"]),
    ("s.yaml", "tp: [1e0, 2e0]\nmbs: [1e0, 8e0]\n", ["gpt2", "--gpus", "8", "--space", "{f}",
                                                     "--dry-run", "--backend", "simulate"]),
    ("c.yaml", CLUSTER.format(n="8e0", bw="4.5e2"), ["estimate", "gpt2", "--gpus", "8",
                                                     "--cluster", "{f}"]),
    ("l.json", '{"tp": 2e0, "pp": 1, "mbs": 4e0, "gbs": 6.4e1}',
     ["estimate", "gpt2", "--gpus", "8", "--layout", "{f}"]),
])
def test_whole_numbers_with_an_exponent_are_counts(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str], name: str,
                                                   text: str, args: list[str]) -> None:
    file = _write(tmp_path, name, text)
    code = main([a.replace("{f}", file) for a in args])
    assert code == 0, capsys.readouterr().err


@pytest.mark.parametrize(("name", "text", "args", "says"), [
    ("m.yaml", _model(global_batch_size="1.5e0"), ["estimate", "{f}", "--gpus", "8"],
     "global_batch_size must be an integer, got 1.5"),
    ("m.yaml", _model(num_layers="1e400"), ["estimate", "{f}", "--gpus", "8"],
     "1e400 overflows a float (line"),
    ("m.yaml", _model(num_layers="-1e1"), ["estimate", "{f}", "--gpus", "8"],
     "num_layers must be a positive integer, got -10"),
    ("s.yaml", "mbs: [2.5e0]\n", ["gpt2", "--gpus", "8", "--space", "{f}", "--dry-run"],
     "mbs candidates must be positive integers, got 2.5"),
    ("s.yaml", "fp8: [1e3]\n", ["gpt2", "--gpus", "8", "--space", "{f}", "--dry-run"],
     "fp8 candidates must be strings among off, hybrid, e4m3, got 1000"),
    ("s.yaml", "mbs: [1e999]\n", ["gpt2", "--gpus", "8", "--space", "{f}", "--dry-run"],
     "1e999 overflows a float (line 1)"),
    ("c.yaml", CLUSTER.format(n="7.5e0", bw="450"), ["estimate", "gpt2", "--gpus", "8",
                                                     "--cluster", "{f}"],
     "gpus_per_node must be an integer, got 7.5"),
    ("c.yaml", CLUSTER.format(n="8", bw="1e300"), ["estimate", "gpt2", "--gpus", "8",
                                                   "--cluster", "{f}"],
     "nvlink_gb_per_s must be at most 1e+18"),
    ("l.json", '{"tp": 2.5e0}', ["estimate", "gpt2", "--gpus", "8", "--layout", "{f}"],
     "tp must be int, got 2.5"),
    ("l.json", '{"tp": 1e999}', ["estimate", "gpt2", "--gpus", "8", "--layout", "{f}"],
     "1e999 overflows a float"),
])
def test_exponents_that_are_no_count_are_one_line(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str], name: str,
                                                  text: str, args: list[str], says: str) -> None:
    file = _write(tmp_path, name, text)
    code = main([a.replace("{f}", file) for a in args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("autotune: error: ") and says in err[0], err[0]
