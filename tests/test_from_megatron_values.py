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
    ("--tokenizer-type 'Null\nTokenizer'", "--tokenizer-type takes one of"),  # one line still
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


IF = 'if [ -n "$WANDB_API_KEY" ]; then\n'


@pytest.mark.parametrize(("before", "append", "named"), [
    ("ARGS=(--log-interval 1)\n", "    ARGS+=(--wandb-project p --wandb-exp-name x)\n",
     "ARGS += --wandb-project, --wandb-exp-name"),
    ("ARGS=(--log-interval 1)\n", '    ARGS=("${ARGS[@]}" --wandb-project p)\n',
     "ARGS += --wandb-project"),  # Megatron-LM's megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh
    ("ARGS=(--log-interval 1)\n", '    ARGS+=(--wandb-project "$PROJECT")\n',
     "ARGS += --wandb-project"),  # a value autotune cannot tell, of a flag it does not read
])
def test_a_conditional_append_of_flags_autotune_does_not_read_is_one_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], before: str, append: str,
        named: str) -> None:
    script = tmp_path / "train.sh"
    script.write_text(f"{before}{IF}{append}fi\nALL=(\"${{ARGS[@]}}\")\n"
                      f"{BASE} \"${{ALL[@]}}\"\n")
    code = main(["--from-megatron", str(script), "--backend", "simulate", "--trials", "2",
                 "--results-dir", str(tmp_path / "r"), "--study", "s"])
    err = capsys.readouterr().err
    assert code == 0, err
    warned = [line for line in err.splitlines() if "inside an if/for/case block" in line]
    assert len(warned) == 1 and named in warned[0] and "line 3" in warned[0], err
    out = tmp_path / "tuned.sh"
    assert main(["export", "--from-megatron", str(script), "--study", "s", "--results-dir",
                 str(tmp_path / "r"), "-o", str(out)]) == 0
    # The block stays the user's, byte for byte, and the export reads back.
    assert f"{IF}{append}fi\n" in out.read_text()
    read_megatron_command(str(out))


@pytest.mark.parametrize("append", [
    "    ARGS+=(--fp8-format hybrid)\n",  # a flag autotune reads
    "    ARGS+=(--tp-comm-overlap)\n",  # one that changes speed, which autotune names
    "    ARGS+=(--micro-batch-size 4)\n",
    "    ARGS+=($EXTRA)\n",  # words autotune cannot tell
    "    ARGS=(--wandb-project p)\n",  # not an append: the array is another one
])
def test_a_conditional_append_that_matters_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], append: str) -> None:
    script = tmp_path / "train.sh"
    script.write_text(f"ARGS=(--log-interval 1)\n{IF}{append}fi\n{BASE} \"${{ARGS[@]}}\"\n")
    code = main(["--from-megatron", str(script), "--backend", "simulate", "--results-dir",
                 str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "$ARGS is set inside an if/for/case block" in err, err


@pytest.mark.parametrize(("text", "message"), [
    # eval of a string with a part autotune cannot tell: the part stays that unknown word.
    ('TS=$(date +%s)\ncmd="{base} --tensorboard-dir out/$TS/tb"\neval $cmd\n', None),
    ('MBS=$((16 / 8))\ncmd="{base} --micro-batch-size $MBS"\neval $cmd\n',
     r"--micro-batch-size \$\(\(16 / 8\)\): arithmetic"),
    ('if [ "$Z" = 1 ]; then DP_ARGS=(--use-distributed-optimizer); fi\n'
     'cmd="{base} ${{DP_ARGS[@]}}"\neval $cmd\n', r"\$DP_ARGS stands where flags go"),
    # after a flag autotune does not read, an unknown word is its value only right after it
    ('if [ "$Z" = 1 ]; then DP_ARGS=(--use-distributed-optimizer); fi\n'
     '{base} --lr-decay-iters 430000 ${{DP_ARGS[@]}}\n', r"\$DP_ARGS stands where flags go"),
    ('if [ "$Z" = 1 ]; then X=(--use-distributed-optimizer); fi\n'
     '{base} --use-flash-attn ${{X[@]}}\n', r"\$X stands where flags go"),
    ('{base} --tensorboard-dir $TB\n', None),
    # `+=` onto a value set in an if stays unknown (Megatron-LM tutorials' SP=0/1 scripts)
    ('if [ "$SP" -eq 1 ]; then P="--sequence-parallel "; else P=""; fi\n'
     'P+=(--tensor-model-parallel-size 2)\n{base} ${{P[@]}}\n', r"\$P stands where flags go"),
    # ${1:?"a: b"}: the message names the expansion whole
    ('TP=${{1:?"Error: give TP"}}\n{base} --tensor-model-parallel-size $TP\n',
     r'\$\{1:\?"Error: give TP"\}: the script runs without arguments; autotune needs'),
])
def test_unknown_words_are_refused_where_they_matter(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     text: str, message: str | None) -> None:
    script = tmp_path / "train.sh"
    script.write_text(text.format(base=BASE))
    code = main(["--from-megatron", str(script), "--backend", "simulate", "--trials", "1",
                 "--results-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    if message is None:
        assert code == 0, err
        return
    assert code == 2 and err.count("\n") == 1, err
    assert re.search(message, err), err
