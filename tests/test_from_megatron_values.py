"""--from-megatron refuses a value Megatron-LM's own parser would refuse (issue: flags carried
as written, even `--eval-iters 1.5` or a choice Megatron-LM does not have): one line, exit 2,
against autotune/megatron/flag_values.json (each release's arguments.py and config
dataclasses, read by tools/megatron_values.py). A value the parser takes, or one autotune cannot
tell ($VAR), is carried as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.errors import ConfigError
from autotune.megatron.megatron_command import _accepted_values, read_megatron_command

BASE = ("torchrun --nproc-per-node 2 pretrain_gpt.py --num-layers 4 --hidden-size 256 "
        "--num-attention-heads 8 --seq-length 512 --max-position-embeddings 512 "
        "--global-batch-size 16 --tokenizer-type NullTokenizer --vocab-size 1000")
VERSIONS = Path(__file__).parent / "data" / "megatron_versions"


@pytest.mark.parametrize(("extra", "message"), [
    ("--eval-iters 1.5", "--eval-iters takes an integer, got '1.5'"),
    ("--eval-iters=ten", "--eval-iters takes an integer, got 'ten'"),
    ("--weight-decay big", "--weight-decay takes a number, got 'big'"),
    ("--lr-decay-style cosin", "--lr-decay-style takes one of constant, linear, cosine"),
    ("--attention-backend 'auto;touch x'", "--attention-backend takes one of flash"),
    ("--fp8-margin high", "--fp8-margin takes an integer"),
    ("--log-throughput yes", "--log-throughput takes no value, got 'yes'"),
    ("--tp-comm-overlap=1", "--tp-comm-overlap takes no value, got '1'"),
    ("--moe-router-load-balancing-type banana", "takes one of aux_loss"),
])
def test_a_value_megatron_refuses_is_one_line(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str],
                                              extra: str, message: str) -> None:
    script = tmp_path / "train.sh"
    script.write_text(f"{BASE} {extra}\n")
    code = main(["--from-megatron", str(script), "--backend", "simulate", "--results-dir",
                 str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("autotune: error: "), err
    assert message in err and "Megatron-LM's arguments.py" in err, err


@pytest.mark.parametrize("extra", [
    "--eval-iters 10",
    "--eval-iters -1",
    "--weight-decay 1e-1",
    "--lr-decay-style WSD",
    "--attention-backend flash",
    "--log-throughput",
    "--eval-iters $ITERS",  # not set: autotune cannot tell it, and carries it as written
    "--moe-router-load-balancing-type quantile_balancing",  # 0.19's choice, not 0.16's
    "--some-fork-flag anything",  # no release declares it: nothing to check it against
])
def test_a_value_megatron_takes_is_carried(tmp_path: Path, extra: str) -> None:
    script = tmp_path / "train.sh"
    script.write_text(f"{BASE} {extra}\n")
    command = read_megatron_command(str(script))
    flag = extra.split()[0]
    assert any(g.flag == flag for g in command.groups)


def test_a_value_from_a_variable_is_checked_too(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(f"ARGS=(--lr-decay-style cosin)\n{BASE} \"${{ARGS[@]}}\"\n")
    with pytest.raises(ConfigError, match=re.escape("--lr-decay-style takes one of")):
        read_megatron_command(str(script))


def test_the_recorded_values_are_the_recorded_parsers_flags() -> None:
    for release, flags in _accepted_values().items():
        declared = set(json.loads((VERSIONS / f"{release}.json").read_text())["flags"])
        assert flags and set(flags) <= declared, release
        for record in flags.values():
            assert set(record) <= {"type", "choices", "takes_value"}, record
