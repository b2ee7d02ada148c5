"""autotune's command line in a child process (tests/doubles/cli_driver.py), for the tests
that interrupt, kill or race it: start it with hooks, wait for the point it pauses at, read
its study."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().parent / "cli_driver.py"
SMALL_SPACE = """\
tp: [1, 2]
pp: [1, 2]
mbs: [1, 2, 4, 8, 16]
sequence_parallel: [false, true]
distributed_optimizer: [false, true]
overlap_grad_reduce: [true]
overlap_param_gather: [false, true]
recompute: [none]
impl: [sdpa]
"""
"""The fake backend's test space (doubles.fake_backend.SMALL_SPACE) as a file: gpt2-xl on
4 x A100-40GB plans 30 distinct runs of it, 11 predicted not to fit (told PRUNED)."""


@dataclass
class Finished:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.err.strip().splitlines()


class Driven:
    """One `autotune ARGS` process (see cli_driver for the hooks)."""

    def __init__(self, args: list[str], *, pause: str | None = None, sigint: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        extra = dict(env or {})
        if pause is not None:
            extra["AUTOTUNE_TEST_PAUSE"] = pause
        if sigint is not None:
            extra["AUTOTUNE_TEST_SIGINT"] = sigint
        self.marker = Path(pause.split(":", 2)[2]) if pause else None
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, str(DRIVER), *args], cwd=REPO, text=True,
            env={**os.environ, "PYTHONPATH": path, **extra},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def paused(self, timeout_s: float = 120) -> None:
        """Wait until the process pauses at its hook."""
        assert self.marker is not None
        deadline = time.monotonic() + timeout_s
        while not self.marker.exists():
            if self.proc.poll() is not None:
                _, err = self.proc.communicate()
                raise AssertionError(f"exited {self.proc.returncode} before pausing: {err}")
            assert time.monotonic() < deadline, "never paused"
            time.sleep(0.02)

    def resume(self) -> None:
        """Let a paused process go on."""
        assert self.marker is not None
        self.marker.with_name(self.marker.name + ".go").write_text("")

    def finish(self, timeout_s: float = 180) -> Finished:
        try:
            out, err = self.proc.communicate(timeout=timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.communicate()
        return Finished(self.proc.returncode, out, err)


def run(args: list[str], **hooks: str) -> Finished:
    return Driven(args, **hooks).finish()


def stored(results: Path, study: str) -> list[FrozenTrial]:
    url = f"sqlite:///{(results / study / 'study.db').resolve()}"
    return optuna.load_study(study_name=study, storage=url).get_trials(deepcopy=False)


def space_file(folder: Path) -> str:
    path = folder / "space.yaml"
    path.write_text(SMALL_SPACE)
    return str(path)


def search_args(results: Path, space: str, *extra: str, model: str = "gpt2-medium",
                backend: str = "worker") -> list[str]:
    """`autotune MODEL --gpus 4` on A100-40GB over the small space, into study `s`; the
    driver's --backend worker is the fake backend."""
    return [model, "--gpus", "4", "--gpu", "a100-40gb", "--space", space, "--backend", backend,
            "--results-dir", str(results), "--study", "s", *extra]


def consistent(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """`trials`, checked: every one finished (none RUNNING or WAITING), numbered without a gap,
    and no layout finished (COMPLETE or PRUNED) twice but as a finalist's repeat (its record's
    repeat_of, autotune.search.finalists)."""
    assert all(t.state.is_finished() for t in trials), Counter(t.state.name for t in trials)
    assert [t.number for t in trials] == list(range(len(trials)))
    done = [tuple(sorted(t.params.items())) for t in trials
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            and (t.user_attrs.get("record") or {}).get("repeat_of") is None]
    assert len(done) == len(set(done)), "a layout finished twice"
    return trials
