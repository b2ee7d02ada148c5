"""The loss and gradient NaN checks as a lever (autotune.levers.nan_checks,
--no-check-for-nan-in-loss-and-grad): the flag both ways and from a user's script without a
warning, megatron-core's DDP config, the worker's loss check, the label, and what the loss guard
and the memory model make of it."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.layouts.layout import Layout
from autotune.levers.nan_checks import FLAG
from autotune.megatron.core_config import core_config
from autotune.megatron.megatron_args import UNMODELED_FLAGS, megatron_lm_args
from autotune.megatron.megatron_command import megatron_layout, read_megatron_command
from autotune.predict.memory import memory_key
from autotune.search.loss_guard import SAME_ARITHMETIC
from autotune.specs.presets import load_model

ON = Layout(dp=2, mbs=4, gbs=64, distributed_optimizer=True, overlap_grad_reduce=True)


@pytest.mark.parametrize("checks", [True, False])
def test_the_flag_both_ways(tmp_path: Path, checks: bool) -> None:
    m = load_model("gpt2-xl")
    args = megatron_lm_args(m, replace(ON, nan_checks=checks))
    assert (FLAG in args) is (not checks)  # Megatron-LM checks unless told not to
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc-per-node 2 pretrain_gpt.py " + " ".join(args) + "\n")
    command = read_megatron_command(str(script))
    assert megatron_layout(command, 2).nan_checks is checks
    assert FLAG not in command.unmodeled  # read, so no warning line


def test_the_flag_is_modelled_not_warned_about() -> None:
    assert FLAG not in UNMODELED_FLAGS


@pytest.mark.parametrize("checks", [True, False])
def test_megatron_cores_ddp_config_takes_it(checks: bool) -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.distributed import DistributedDataParallelConfig

    ddp = dict(core_config(load_model("gpt2-xl"), replace(ON, nan_checks=checks)).ddp)
    assert ddp["check_for_nan_in_grad"] is checks
    assert DistributedDataParallelConfig(**ddp).check_for_nan_in_grad is checks


@pytest.mark.parametrize(("checks", "raises"), [(True, True), (False, False)])
def test_the_workers_loss_check(monkeypatch: pytest.MonkeyPatch, checks: bool,
                                raises: bool) -> None:
    """A NaN loss stops a checked trial, as pretrain_gpt.py's loss_func does, and passes an
    unchecked one."""
    pytest.importorskip("megatron.core")
    torch = pytest.importorskip("torch")
    from autotune.worker import train

    # The rejection's message names the CUDA device; these tests run without one.
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    output = torch.tensor([[1.0, float("nan")]])
    mask = torch.ones(1, 2)
    if raises:
        with pytest.raises(RuntimeError, match="NaN in local forward loss"):
            train._loss_func(mask, output, nan_checks=checks)
    else:
        loss, tokens, _ = train._loss_func(mask, output, nan_checks=checks)
        assert math.isnan(float(loss)) and int(tokens) == 2


def test_the_label_says_when_they_are_off() -> None:
    assert "nonan" not in ON.describe().split()
    assert "nonan" in replace(ON, nan_checks=False).describe().split()


def test_they_change_neither_the_losses_nor_the_memory() -> None:
    # An FP8 trial's bf16 twin may differ here (autotune.search.loss_guard); one memory
    # estimate answers both (the checks keep scalars).
    assert "nan_checks" in SAME_ARITHMETIC
    assert memory_key(ON) == memory_key(replace(ON, nan_checks=False))


@pytest.mark.parametrize(("flags", "checks"), [([], True), (["--no-nan-checks"], False),
                                              (["--nan-checks"], True)])
def test_estimate_takes_them_both_ways(capsys: pytest.CaptureFixture[str], flags: list[str],
                                       checks: bool) -> None:
    """On by default, so estimate's switch also takes `--no-nan-checks`."""
    import json

    from autotune.cli import main

    assert main(["estimate", "gpt2-xl", "--gpus", "2", "--mbs", "8", "--json", *flags]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layout"]["nan_checks"] is checks
    assert ("nonan" in out["label"].split()) is (not checks)
