"""Which implementations a search ranks (autotune.search.impls): what the export writes, what is
installed, what the user asked for (issue 25 item 4)."""

from __future__ import annotations

import pytest

from autotune.commands.pins import pin_space
from autotune.dimensions import Impl
from autotune.errors import ConfigError
from autotune.search.backends import BackendName
from autotune.search.impls import practice_impl, rankable_impls
from autotune.search.space import load_space

L, S, T = Impl.LOCAL, Impl.SDPA, Impl.TE
SIM, WORKER, MLM = BackendName.SIMULATE, BackendName.WORKER, BackendName.MEGATRON_LM


@pytest.mark.parametrize(("impls", "backend", "te", "asked", "kept", "left"), [
    # A plan ranks what the export writes: sdpa becomes te, whether or not TE is installed.
    ((L, S, T), SIM, False, False, (L, T), {S}),
    ((L, S, T), SIM, True, False, (L, T), {S}),
    ((S,), SIM, False, False, (T,), {S}),
    ((L,), SIM, False, False, (L,), set()),
    # ... unless the user asked for sdpa (their own space, a pin).
    ((L, S, T), SIM, False, True, (L, S, T), set()),
    ((S,), SIM, False, True, (S,), set()),
    # Real trials: with TE, te is measured in sdpa's place; without it sdpa stands in.
    ((L, S, T), WORKER, True, False, (L, T), {S}),
    ((S,), WORKER, True, True, (T,), {S}),
    ((L, S, T), WORKER, False, False, (L, S), {T}),
    # pretrain_gpt.py has no sdpa, and runs te only where TE is installed.
    ((L, S, T), MLM, True, True, (L, T), {S}),
    ((L, S, T), MLM, False, False, (L,), {S, T}),
])
def test_rankable_impls(impls: tuple[Impl, ...], backend: BackendName, te: bool, asked: bool,
                        kept: tuple[Impl, ...], left: set[Impl]) -> None:
    choice = rankable_impls(impls, backend, te_installed=te, asked=asked)
    assert choice.kept == kept
    assert set(choice.left_out) == left
    # A plan over a shipped space says nothing of its default (every plan would say it).
    quiet = not left or (backend == SIM and not asked)
    assert (choice.note() is None) == quiet


def test_nothing_left_is_one_line() -> None:
    with pytest.raises(ConfigError, match="impl candidates sdpa cannot run here"):
        rankable_impls((S,), MLM, te_installed=False, asked=True)


def test_plan_left_out_says_how_to_ask() -> None:
    choice = rankable_impls((L, S, T), SIM, te_installed=False, asked=False)
    assert "pin it" in choice.left_out[S]


@pytest.mark.parametrize(("backend", "te", "impl"), [
    (SIM, False, T), (SIM, True, T), (WORKER, True, T), (WORKER, False, S)])
def test_practice_impl(backend: BackendName, te: bool, impl: Impl) -> None:
    assert practice_impl(backend, te_installed=te) == impl


def test_shipped_spaces_choose_nothing_user_files_and_pins_do(tmp_path) -> None:
    from autotune.commands.search import space_path

    assert load_space(None).chosen == frozenset()
    assert load_space(space_path("one-node")).chosen == frozenset()
    mine = tmp_path / "mine.yaml"
    mine.write_text("tp: [1, 2]\nimpl: [sdpa]\n")
    assert load_space(str(mine)).chosen == {"tp", "impl"}
    assert "impl" in pin_space(load_space(None), {"impl": (S,)}).chosen


@pytest.mark.parametrize(("args", "gpus_here", "te", "impls"), [
    # A plan ranks te in sdpa's place (what the export writes), with or without TE here.
    (["--backend", "simulate"], 8, True, "local, te"),
    (["--backend", "simulate"], 0, False, "local, te"),
    ([], 0, False, "local, te"),  # auto without GPUs plans
    # ... unless sdpa is asked for.
    (["--backend", "simulate", "--impl", "sdpa,te"], 0, False, "sdpa, te"),
    # Real trials: te measured for sdpa with TE; without it sdpa stands in and te cannot run.
    ([], 8, True, "local, te"),
    (["--backend", "worker"], 8, False, "local, sdpa"),
    # A dry run needs no GPU, even for a backend that will.
    (["--backend", "worker"], 0, False, "local, sdpa"),
])
def test_dry_run_lists_the_impls_the_search_ranks(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str],
        gpus_here: int, te: bool, impls: str) -> None:
    from autotune.cli import main
    from autotune.commands import search as search_command

    monkeypatch.setattr(search_command, "local_gpu_count", lambda: gpus_here)
    monkeypatch.setattr(search_command, "te_available", lambda: te)
    assert main(["gpt2", "--gpus", "2", "--space", "one-node", "--dry-run", *args]) == 0
    out = capsys.readouterr().out
    listed = next(line for line in out.splitlines() if line.strip().startswith("impl "))
    assert listed.split(None, 1)[1] == impls


def test_dry_run_refuses_an_unknown_backend(capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.cli import main

    assert main(["gpt2", "--gpus", "2", "--dry-run", "--backend", "gpu"]) == 2
    assert "unknown backend 'gpu'" in capsys.readouterr().err

