"""A user's Megatron-LM command: what in it changes nothing is named in one warning line
(autotune.megatron.megatron_command.ignored_warning), never passed over in silence."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.megatron.megatron_command import (
    ignored_warning,
    megatron_layout,
    read_megatron_command,
)

BASE = ("torchrun --nproc-per-node 1 pretrain_gpt.py --num-layers 4 --hidden-size 256 "
        "--num-attention-heads 8 --seq-length 512 --max-position-embeddings 512 "
        "--micro-batch-size 2 --global-batch-size 16 --bf16 --tokenizer-type NullTokenizer "
        "--vocab-size 1000")


@pytest.mark.parametrize(("extra", "says"), [
    ("", None),
    ("--fp8-recipe tensorwise",
     "--fp8-recipe has no effect (Megatron-LM reads --fp8-recipe only with --fp8-format)"),
    ("--fp8-format hybrid --fp8-recipe tensorwise", None),
    ("--recompute-method block --recompute-num-layers 2",
     "--recompute-method has no effect (megatron-core reads it only with full recompute); "
     "--recompute-num-layers has no effect"),
    ("--recompute-granularity full --recompute-method block --recompute-num-layers 2", None),
    ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
     "--recompute-modules mlp", "--recompute-modules has no effect"),
    ("--micro-batch-size 4",
     "--micro-batch-size is given 2 times: only the last (4) counts, as in Megatron-LM"),
    ("--bf16", "--bf16 is given 2 times: only the last counts"),
    # A value Megatron-LM takes (--tokenizer-type 'Null\nTokenizer' is not one of its
    # choices now: refused in test_from_megatron_values).
    ("--vocab-file v.json --vocab-file 'v\n.json'",
     "--vocab-file is given 2 times: only the last (v\\n.json) counts"),
])
def test_what_changes_nothing_is_named(tmp_path: Path, extra: str, says: str | None) -> None:
    script = tmp_path / "train.sh"
    script.write_text(f"{BASE} {extra}\n")
    command = read_megatron_command(str(script))
    warning = ignored_warning(command, megatron_layout(command, 1))
    if says is None:
        assert warning is None
    else:
        assert warning is not None and warning.startswith(f"{script}: line 1: ")
        assert says in warning
        assert "\n" not in warning  # one line, whatever the script's values hold


def test_the_seed_tutorial_s_two_train_iters_are_named() -> None:
    """The tutorial the product started from gives --train-iters twice (500000, then 100)."""
    seed = Path(__file__).parent / "data" / "megatron" / "seed-tutorial.sh"
    command = read_megatron_command(str(seed))
    warning = ignored_warning(command, megatron_layout(command, 1))
    assert warning is not None
    assert "--train-iters is given 2 times: only the last (100) counts" in warning
