"""The README's "Using it" commands, in order, as a new user types them: on a fresh folder, on a
machine without GPUs (the search plans with the simulate backend, as `--backend auto` says).
Only what needs GPUs or measured trials may stop, with its one line."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.commands import search as search_command
from autotune.specs import hardware

README = Path(__file__).resolve().parents[1] / "README.md"

EXPECTED_FAILURES = {
    # Calibration fits measured trials; a machine without GPUs has only predictions.
    "calibrate": (2, "calibration needs at least 3 measured trials, found 0 under results"),
}


def using_it() -> list[str]:
    """The command lines of the "Using it" block, comments dropped."""
    section = README.read_text().split("\n## Using it\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README's Using it section has no bash block"
    return [line.split("#", 1)[0].strip() for line in block[1].splitlines()
            if line.split("#", 1)[0].strip()]


def test_report_extras_are_installed_before_the_report() -> None:
    lines = using_it()
    report = next(i for i, line in enumerate(lines) if line.startswith("autotune report"))
    assert any("pip install" in line and ".[report]" in line for line in lines[:report])


@pytest.mark.slow
def test_using_it_runs_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(hardware, "_nvml_names", lambda: [])
    monkeypatch.setattr(search_command, "local_gpu_count", lambda: 0)
    ran = []
    for line in using_it():
        argv = shlex.split(line)
        if argv[:2] == ["pip", "install"]:
            # The extras are installed in the test environment; check they import.
            extras = re.search(r"\[(.*)\]", line)
            assert extras and extras[1] == "report"
            for module in ("pandas", "matplotlib", "plotly"):
                assert importlib.util.find_spec(module), module
            continue
        assert argv[0] == "autotune", line
        code = main(argv[1:])
        _, err = capsys.readouterr()
        expected = EXPECTED_FAILURES.get(argv[1], (0, None))
        assert code == expected[0], f"{line}: exit {code}\n{err}"
        if expected[1]:
            assert err.strip() == f"autotune: error: {expected[1]}", line
        ran.append(argv[1])
    assert ran[:3] == ["models", "gpt2-xl", "gpt2-xl"] and "report" in ran and "export" in ran
    assert list(Path("results").glob("*/report.md")) and list(Path("results").glob("*/pareto.png"))
