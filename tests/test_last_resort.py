"""The memory levers of last resort (autotune/search/last_resort.py) and the optimizer offload's
derived percent (autotune/levers/optimizer_offload.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.layouts.layout import Layout, with_fields
from autotune.predict.memory import estimate_memory
from autotune.search.derive import resolve, safe_limit_bytes
from autotune.search.last_resort import LAST_RESORT, LAST_RESORT_SUFFIX, widened_for_memory
from autotune.search.space import SearchSpace, load_space
from autotune.specs.hardware import ClusterSpec
from autotune.specs.presets import load_model

L8B = "tests/data/hf/llama-3.1-8b.json"
MODEL = load_model(L8B).with_overrides(seq_length=4096, global_batch_size=8)
H200 = ClusterSpec.make(1, gpu="h200")
DEFAULT = load_space(None)


def test_the_default_space_gains_the_offload_beside_its_own_candidates() -> None:
    wider = widened_for_memory(DEFAULT)
    assert wider is not None and "CPU offload" in wider.source
    for dim, extra in LAST_RESORT.items():
        assert set(extra) <= set(wider.candidates[dim])
        assert set(DEFAULT.candidates.get(dim, ())) <= set(wider.candidates[dim])
    # Widened once: the widened space has nothing more to gain.
    assert widened_for_memory(wider) is None


@pytest.mark.parametrize("space", [
    # The user chose a dimension of the offload's: theirs, never widened.
    replace(DEFAULT, chosen=frozenset({"precision_aware_optimizer"})),
    replace(DEFAULT, chosen=frozenset({"optimizer_offload_percent"})),
    # No Transformer Engine layer: the precision-aware optimizer needs TE's FusedAdam.
    replace(DEFAULT, candidates={**DEFAULT.candidates, "impl": ("local", "sdpa")}),
    # Offered already.
    replace(DEFAULT, candidates={**DEFAULT.candidates, **LAST_RESORT}),
], ids=["chosen-pao", "chosen-offload", "no-te", "offered"])
def test_what_is_not_widened(space: SearchSpace) -> None:
    assert widened_for_memory(space) is None


@pytest.mark.parametrize("mbs", [1, 2])
def test_the_offloaded_percent_is_the_fewest_that_fits(mbs: int) -> None:
    s = Layout(dp=1, gbs=8, mbs=mbs, impl="te", distributed_optimizer=True,
               precision_aware_optimizer=True, expandable_segments=True)
    limit = safe_limit_bytes(H200, expandable=True)
    resolved = resolve(s, ("optimizer_offload_percent",), MODEL, H200, limit_bytes=limit)
    percent = resolved.optimizer_offload_percent

    def peak(p: int) -> float:
        return estimate_memory(MODEL, with_fields(s, optimizer_offload_percent=p),
                               H200).peak_bytes

    assert 0 < percent < 100
    assert peak(percent) <= limit < peak(percent - 1)


def test_without_the_precision_aware_optimizer_nothing_is_offloaded() -> None:
    s = Layout(dp=1, gbs=8, mbs=1, impl="te", distributed_optimizer=True)
    resolved = resolve(s, ("optimizer_offload_percent",), MODEL, H200,
                       limit_bytes=safe_limit_bytes(H200))
    assert resolved.optimizer_offload_percent == 0


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


PLAN = (L8B, "--gpus", "1", "--gpu", "h200", "--seq-len", "4096", "--gbs", "8",
        "--backend", "simulate", "--json")


@pytest.mark.parametrize("study", [None, "mine"])
def test_an_8b_model_on_one_gpu_is_planned_with_the_offload(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, study: str | None) -> None:
    """Measured on one H200 (results/benchmarks/2026-11-29-h200-offload-8b-s25.md): nothing in
    the default space fits; the widened search ran 1% offloaded at 6,555 tokens/s."""
    named = () if study is None else ("--study", study)
    code, out, err = _run(capsys, *PLAN, "--results-dir", str(tmp_path), *named)
    assert code == 0, err
    assert "no layout is predicted to fit" in err and "searching again with the optimizer's " \
        "CPU offload" in err
    result = json.loads(out)
    assert "CPU offload" in result["space"]
    best = result["best"][0]
    assert best["precision_aware_optimizer"] and 0 < best["optimizer_offload_percent"] < 100
    if study is not None:
        assert result["study"] == study + LAST_RESORT_SUFFIX
    # The same command with --resume continues the widened study.
    code, again, err = _run(capsys, *PLAN, "--results-dir", str(tmp_path), *named, "--resume")
    assert code == 0, err
    assert json.loads(again)["study"] == result["study"]
    assert json.loads(again)["best"][0]["trial"] == result["best"][0]["trial"]


def test_where_the_offload_does_not_help_either_one_line_says_so(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = _run(capsys, "gpt-1t", "--gpus", "1", "--backend", "simulate",
                          "--results-dir", str(tmp_path))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "searching again" not in err
