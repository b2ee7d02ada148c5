"""A search's own options, checked before anything is read, enumerated or recorded (session
17's sweep): `--time-budget inf` ran as no limit and `--megatron-lm /nonexistent` was ignored
without a word by every backend but megatron-lm."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.cli import main

SEARCH = ["gpt2", "--gpus", "1", "--backend", "simulate", "--space", "single-gpu",
          "--trials", "1"]


def _run(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str, list[str]]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


@pytest.mark.parametrize(("extra", "says"), [
    (["--time-budget", "inf"],
     "--time-budget must be a positive number of seconds (leave it out for no limit), got inf"),
    (["--time-budget", "-inf"], "--time-budget must be a positive number of seconds, got -inf"),
    (["--time-budget", "nan"], "--time-budget must be a positive number of seconds, got nan"),
    (["--time-budget", "0"], "--time-budget must be a positive number of seconds, got 0"),
    (["--time-budget", "-5"], "--time-budget must be a positive number of seconds, got -5"),
    (["--time-budget", "1e400"], "got inf"),
    (["--time-budget", "1e12"], "--time-budget must be at most 1e+09 seconds, got 1e+12"),
    (["--trial-timeout", "inf"], "--trial-timeout must be a positive number of seconds (leave "
                                 "it out for a timeout from the predicted step time), got inf"),
    (["--trial-timeout", "1e300"], "--trial-timeout must be at most 1e+09 seconds"),
    (["--megatron-lm", "/nonexistent"], "--megatron-lm '/nonexistent' does not exist (give a "
                                        "Megatron-LM checkout or the .py script to launch)"),
    (["--megatron-lm", "/nonexistent", "--backend", "worker"], "'/nonexistent' does not exist"),
    (["--megatron-lm", "/nonexistent", "--backend", "megatron-lm"], "does not exist"),
    (["--megatron-lm", "/nonexistent", "--dry-run"], "does not exist"),
    (["--megatron-lm", "/tmp"], "--megatron-lm '/tmp': no '/tmp/pretrain_gpt.py'"),
    (["--megatron-lm", "/nonexistent/train.py"], "'/nonexistent/train.py' does not exist"),
    (["--megatron-lm", ""], "--megatron-lm '' is not a usable path"),
    (["--megatron-lm", "a\nb"], "is not a usable path"),
])
def test_search_options_out_of_range_are_one_line(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path, extra: list[str],
                                                  says: str) -> None:
    results = tmp_path / "results"
    code, out, err = _run(capsys, [*SEARCH, "--results-dir", str(results), *extra])
    assert code == 2 and out == "" and len(err) == 1, err
    assert err[0] == f"autotune: error: {says}" or says in err[0], err[0]
    assert not results.exists()  # refused before a study is opened


def test_a_bad_option_keeps_what_was_recorded(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    args = [*SEARCH, "--results-dir", str(tmp_path), "--json"]
    assert _run(capsys, args)[0] == 0
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    code, _, err = _run(capsys, [*args, "--resume", "--time-budget", "inf"])
    assert code == 2 and len(err) == 1
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before


@pytest.mark.parametrize("backend", ["simulate", "auto"])
def test_a_checkout_another_backend_ignores_is_noted(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path, backend: str) -> None:
    checkout = tmp_path / "Megatron-LM"
    checkout.mkdir()
    (checkout / "pretrain_gpt.py").write_text("")
    args = [*SEARCH, "--results-dir", str(tmp_path / "r"), "--megatron-lm", str(checkout),
            "--json", "--backend", backend]
    code, _, err = _run(capsys, args)
    assert code == 0, err
    assert (f"autotune: --megatron-lm is read by --backend megatron-lm only; this search "
            f"(--backend {backend}) does not use it") in err
