"""Ctrl-C anywhere in `autotune MODEL --gpus N` ends with one line `autotune: interrupted ...`
and exit status 130, the study consistent: no RUNNING trial left, a plan written whole or not
at all, and `--resume` continues it.

The search runs in a child process (tests/doubles/cli_driver.py) that gets a real SIGINT at an
exact moment: the test sends it once the child pauses at a hook, or the child sends it to
itself at a point (AUTOTUNE_TEST_SIGINT), so nothing depends on timing.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest
from doubles.driven import Driven, consistent, run, space_file, stored
from doubles.driven import search_args as search
from optuna.trial import TrialState

from autotune.search.interrupts import deferred_interrupts

GRID_RUNS = 30
"""Distinct runs of gpt2-xl on 4 x A100-40GB in SMALL_SPACE: the grid plans each once."""


@pytest.fixture
def space(tmp_path: Path) -> str:
    return space_file(tmp_path)


def interrupted_line(err: str) -> str:
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("autotune: interrupted"), err
    return last


@pytest.mark.parametrize("where", ["enumerate", "open"])
def test_ctrl_c_before_the_search_starts(tmp_path: Path, space: str, where: str) -> None:
    """While the space is enumerated (the first seconds of a large job), or while the study
    is being opened: nothing is written, and the same command runs afterwards."""
    results = tmp_path / "results"
    marker = tmp_path / "marker"
    child = Driven(search(results, space, "--trials", "2"), pause=f"{where}:1:{marker}")
    child.paused()
    os.kill(child.proc.pid, signal.SIGINT)
    done = child.finish()
    assert done.code == 130, done.err
    assert interrupted_line(done.err) == "autotune: interrupted"
    assert not (results / "s" / "study.db").exists()

    again = run(search(results, space, "--trials", "2"))
    assert again.code == 0, again.err
    consistent(stored(results, "s"))


def test_ctrl_c_during_a_real_trial_then_resume(tmp_path: Path, space: str) -> None:
    results = tmp_path / "results"
    marker = tmp_path / "marker"
    child = Driven(search(results, space, "--trials", "4", "--sampler", "grid"),
                   pause=f"run:3:{marker}")
    child.paused()
    os.kill(child.proc.pid, signal.SIGINT)
    done = child.finish()
    assert done.code == 130, done.err
    assert interrupted_line(done.err) == ("autotune: interrupted: study s is consistent; "
                                          "--resume continues it")
    trials = stored(results, "s")
    consistent(trials)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2 + [TrialState.FAIL]
    assert trials[-1].user_attrs["record"]["status"] == "INTERRUPTED"

    resumed = run(search(results, space, "--trials", "4", "--sampler", "grid", "--resume"))
    assert resumed.code == 0, resumed.err
    after = stored(results, "s")
    consistent(after)
    # --trials counts the search's own trials; finalists' repeats (autotune.search.finalists)
    # measure some of them again.
    complete = [t for t in after if t.state is TrialState.COMPLETE
                and t.user_attrs["record"].get("repeat_of") is None]
    assert len(complete) == 4
    # The interrupted layout is run again: it never gave a result.
    assert trials[-1].params in [t.params for t in complete]


@pytest.mark.parametrize("sigint", [
    "run:5",  # while a layout is predicted
    "pruned:3",  # right after a tell (once: ValueError: Cannot tell a PRUNED trial)
    "insert:1",  # while the finished plan is written: it is written whole
])
def test_ctrl_c_during_a_grid_plan_then_resume(tmp_path: Path, space: str, sigint: str) -> None:
    results = tmp_path / "results"
    args = search(results, space, "--sampler", "grid", model="gpt2-xl", backend="simulate")
    done = run(args, sigint=sigint)
    assert done.code == 130, done.err
    assert interrupted_line(done.err) == ("autotune: interrupted: study s is consistent; "
                                          "--resume continues it")
    trials = stored(results, "s")
    consistent(trials)
    finished = [t for t in trials if t.state is not TrialState.FAIL]
    if sigint.startswith("insert"):
        assert len(finished) == GRID_RUNS  # the whole plan, though Ctrl-C came mid-write
    else:
        assert 0 < len(finished) < GRID_RUNS

    resumed = run([*args, "--resume"])
    assert resumed.code == 0, resumed.err
    after = stored(results, "s")
    consistent(after)
    assert len([t for t in after if t.state is not TrialState.FAIL]) == GRID_RUNS


# -- deferred_interrupts, in this process --------------------------------------------------


def test_a_sigint_inside_the_block_is_delivered_when_it_ends() -> None:
    reached: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupts():
            with deferred_interrupts():  # nested: held by the outer block too
                os.kill(os.getpid(), signal.SIGINT)
                reached.append("inner")
            reached.append("outer")
        reached.append("after")  # never: the Ctrl-C comes as the block ends
    assert reached == ["inner", "outer"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_a_sigint_the_block_runs_as_usual() -> None:
    with deferred_interrupts():
        value = 1
    assert value == 1 and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_outside_the_main_thread_it_does_nothing() -> None:
    errors: list[BaseException] = []

    def body() -> None:
        try:
            with deferred_interrupts():  # signal.signal would raise ValueError here
                pass
        except BaseException as exc:  # pragma: no cover - the failure being tested
            errors.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert errors == []


def test_ctrl_c_while_the_cli_is_imported_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The console script (autotune.entry) reaches its handler before the heavy CLI import:
    a Ctrl-C landing there ends with the line and 130, not a traceback."""
    import types

    from autotune import entry

    importing = types.ModuleType("autotune.cli")

    def interrupted(name: str) -> object:
        raise KeyboardInterrupt

    importing.__getattr__ = interrupted  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "autotune.cli", importing)
    assert entry.main() == 130
    assert capsys.readouterr().err == "autotune: interrupted\n"
