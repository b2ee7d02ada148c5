"""A user's Megatron-LM command, read (never run) and patched in place (issues 17 and 27).

The round trip: every preset x a sample of valid layouts, exported with `--format megatron-lm`
and read back with --from-megatron, gives the same model and layout. Bad input is one line and
exit 2; nothing in the file ever runs. tests/test_from_megatron_patch.py holds the in-place
export (canaries, the diff, hostile scripts).
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import random
import re
import stat
import subprocess
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.errors import ConfigError, MissingFlagError
from autotune.layouts.layout import Layout, check, derive_dp
from autotune.levers.allocator import ALLOC_CONF_ENV, EXPANDABLE
from autotune.megatron.identity import run_key
from autotune.megatron.megatron_args import FLAG_TABLE, Part, megatron_lm_args
from autotune.megatron.megatron_command import (
    RowChange,
    exported_layout,
    layout_changes,
    megatron_layout,
    read_megatron_command,
    script_arguments_warning,
)
from autotune.megatron.script_patch import patch_script
from autotune.report.scripts import megatron_lm_script
from autotune.search.derive import DERIVABLE, DERIVE, DIVISORS, divisor_values
from autotune.search.space import load_space
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.params import count_parameters
from autotune.specs.presets import list_presets, load_model

SEED = Path(__file__).parent / "data" / "megatron" / "seed-tutorial.sh"
SAMPLE = 8
"""Valid layouts per preset and GPU count in the round trip."""


SPACE = load_space(None)


def _derived(dim: str, model: ModelSpec, rng: random.Random) -> int | bool:
    """Any value a derived lever can take: a count, or a switch (embedding_loss_split)."""
    if isinstance(DERIVABLE[dim].off, bool):
        return rng.choice((False, True))
    return rng.randint(1, model.num_layers)


def _sample(model_name: str, gpus: int) -> list[Layout]:
    """SAMPLE valid layouts of the default space, drawn at random (seeded) and kept when
    Megatron's rules accept them: enumerating the whole space per preset would take minutes."""
    model = load_model(model_name)
    cluster = ClusterSpec.make(gpus, min(8, gpus), None)
    rng = random.Random(f"{model_name}-{gpus}")
    found: list[Layout] = []
    for _ in range(50_000):
        values = {d: rng.choice(c) for d, c in SPACE.candidates.items()}
        dp = derive_dp(gpus, tp=values.get("tp", 1), pp=values.get("pp", 1),
                       cp=values.get("cp", 1))
        # The space's markers stand for values of the layout: any count a derived lever can
        # take, any divisor a `divisors` dimension offers.
        values = {d: _derived(d, model, rng) if v == DERIVE else v for d, v in values.items()}
        partial = Layout(dp=dp, gbs=model.global_batch_size,
                         **{d: v for d, v in values.items() if v != DIVISORS})
        values = {d: rng.choice(divisor_values(d, partial, model) or (1,)) if v == DIVISORS
                  else v for d, v in values.items()}
        layout = Layout(dp=dp, gbs=model.global_batch_size, **values)
        if not check(layout, model, cluster):
            found.append(layout)
            if len(found) == SAMPLE:
                break
    return found


EXTRA = [
    # Dimensions the default space leaves at their defaults, round-tripped too.
    Layout(pp=2, dp=4, first_stage_layers=14, gbs=512),
    Layout(pp=4, dp=2, first_stage_layers=7, last_stage_layers=7, gbs=512),
    Layout(dp=8, recompute="selective", recompute_modules="core_attn+mlp", gbs=512),
    Layout(dp=8, offload_layers=2, impl="te", gbs=512),
    Layout(pp=2, dp=4, recompute="full", recompute_method="block", recompute_num_layers=3,
           cross_entropy_fusion=True, gbs=512),
    Layout(tp=2, pp=2, vpp=2, dp=2, sequence_parallel=True, distributed_optimizer=True,
           overlap_grad_reduce=True, overlap_param_gather=True, impl="te", gbs=512),
    Layout(dp=8, distributed_optimizer=True, precision_aware_optimizer=True, impl="te",
           gbs=512),
    Layout(dp=8, distributed_optimizer=True, precision_aware_optimizer=True, impl="te",
           optimizer_offload_percent=50, gbs=512),
    Layout(dp=8, distributed_optimizer=True, impl="te", fp8="hybrid", fp8_recipe="tensorwise",
           fp8_param_gather=True, gbs=512),
    Layout(tp=2, dp=4, sequence_parallel=True, impl="te", fp8="e4m3", fp8_recipe="blockwise",
           gbs=512),
    Layout(pp=2, dp=4, embedding_loss_split=True, gbs=512),  # 34 slots over 2 stages
    Layout(dp=8, distributed_optimizer=True, grad_reduce_bf16=True, impl="te", gbs=512),
    Layout(dp=8, distributed_optimizer=True, overlap_grad_reduce=True, nan_checks=False,
           gbs=512),
]
CASES = [(name, gpus, layout) for name in list_presets() for gpus in (8, 16)
         for layout in _sample(name, gpus)] + [("llama3-8b", 8, s) for s in EXTRA]


def test_the_round_trip_covers_every_searched_dimension() -> None:
    # A new dimension needs a case here (EXTRA) until the default space searches it.
    from autotune.layouts.layout import SEARCHED

    uncovered = [name for name, dim in SEARCHED.items()
                 if all(getattr(s, name) == dim.default for _, _, s in CASES)]
    assert uncovered == []


@pytest.mark.parametrize(("name", "gpus", "layout"), CASES,
                         ids=[f"{n}-{g}gpu-{s.describe()}" for n, g, s in CASES])
def test_round_trip_every_preset(tmp_path: Path, name: str, gpus: int, layout: Layout) -> None:
    model = load_model(name)
    nodes = gpus // 8
    script = tmp_path / "run.sh"
    script.write_text(megatron_lm_script(model, layout, title=["round trip"], nodes=nodes))
    command = read_megatron_command(str(script))
    assert (command.gpus, command.nodes) == (gpus, nodes)
    back = megatron_layout(command, gpus)
    expected = exported_layout(layout)  # impl sdpa exports as te (autotune.report.scripts)
    # The same layout, or one Megatron runs alike: recompute_method/num_layers mean nothing
    # without full recompute, recompute_modules nothing without selective
    # (autotune.megatron.identity).
    assert back == expected or run_key(model, back) == run_key(model, expected)
    # The same model as Megatron-LM sees it: the same flags, parameters, batch and sequence.
    assert megatron_lm_args(command.model, back) == megatron_lm_args(model, expected)
    assert count_parameters(command.model) == count_parameters(model)
    assert (command.model.global_batch_size, command.model.seq_length) == (
        layout.gbs, model.seq_length)


def test_every_layout_flag_of_the_table_is_read_back() -> None:
    # A row that writes layout flags but reads nothing back would drop a user's choice.
    silent = [row.name for row in FLAG_TABLE if row.part == Part.LAYOUT and row.read is None]
    assert silent == ["moe_token_dispatcher"]  # follows from ep (megatron_args)


def test_the_seed_tutorial_command() -> None:
    command = read_megatron_command(str(SEED))
    m = command.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.vocab_size, m.seq_length,
            m.ffn_size) == (48, 1600, 25, 50257, 1024, 6400)
    layout = megatron_layout(command, 1)
    assert (layout.tp, layout.pp, layout.dp, layout.mbs, layout.gbs, layout.impl) == (
        1, 1, 1, 15, 15, "te")
    assert command.gpus == 1
    assert dict(command.exported) and command.exported[0][0] == "CUDA_DEVICE_MAX_CONNECTIONS"
    # The tutorial's model is gpt2-xl: the same parameters and Megatron-LM model flags.
    gpt2_xl = load_model("gpt2-xl").with_overrides(global_batch_size=15)
    assert count_parameters(m) == count_parameters(gpt2_xl)
    assert megatron_lm_args(m, layout) == megatron_lm_args(gpt2_xl, layout)


ARRAYS = r"""#!/bin/bash
# Megatron-LM's own examples build the command from arrays.
set -e
TP=${TP:-2}
GPUS_PER_NODE=8
DATA_PATH=/data/my-corpus_text_document   # a comment
MODEL_ARGS=(
    --num-layers 24 --hidden-size 2048   # inline comment
    --num-attention-heads 16
    --seq-length 2048 --max-position-embeddings 2048
)
PARALLEL="--tensor-model-parallel-size $TP --sequence-parallel"
TRAIN_ARGS=(--micro-batch-size 4 --global-batch-size 256 --lr 3e-4)
TRAIN_ARGS+=(--use-distributed-optimizer)
LAUNCH="torchrun --nproc_per_node=$GPUS_PER_NODE --nnodes=2"
echo "running pretrain_gpt.py"
$LAUNCH pretrain_gpt.py "${MODEL_ARGS[@]}" $PARALLEL "${TRAIN_ARGS[@]}" \
    --data-path "$DATA_PATH" --tokenizer-type GPT2BPETokenizer \
    --vocab-file "$VOCAB" --merge-file "${MERGES}" \
    --save "$CKPT/run 1" --my-unknown-flag 'a b' --another 1 2 \
    2>&1 | tee log.txt
"""


def test_arrays_eval_defaults_and_environment(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(ARRAYS)
    command = read_megatron_command(str(script))
    assert (command.gpus_per_node, command.nodes) == (8, 2)
    layout = megatron_layout(command, 16)
    assert (layout.tp, layout.dp, layout.mbs, layout.gbs, layout.sequence_parallel,
            layout.distributed_optimizer) == (2, 8, 4, 256, True, True)
    assert command.model.vocab_size == 50257  # GPT2BPETokenizer
    flags = [g.flag for g in command.groups]
    assert "--my-unknown-flag" in flags and "--save" in flags


def test_eval_of_a_command_string(tmp_path: Path) -> None:
    # The tutorial's scripts: cmd="torchrun ... ${ARGS[@]}"; eval $cmd. bash's eval joins its
    # words and reads them again, so "$CKPT/run 1" ends as two words, as bash runs it.
    script = tmp_path / "train.sh"
    script.write_text('ARGS=(--micro-batch-size 2 --global-batch-size 8)\n'
                      'cmd="torchrun --nproc-per-node 4 pretrain_gpt.py --num-layers 4 '
                      '--hidden-size 256 --num-attention-heads 8 --seq-length 512 '
                      '--max-position-embeddings 512 --vocab-size 99 ${ARGS[@]}"\n'
                      'eval $cmd --save "$CKPT/run 1" 2>&1 | tee log\n')
    command = read_megatron_command(str(script))
    assert command.gpus == 4 and megatron_layout(command, 4).mbs == 2
    assert [w.shown() for w in command.groups[-1].words] == ["--save", "$CKPT/run", "1"]


def test_the_patch_edits_arrays_strings_and_the_command_line(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(ARRAYS)
    command = read_megatron_command(str(script))
    old = megatron_layout(command, 16)
    new = Layout(tp=4, dp=4, sequence_parallel=True, mbs=2, gbs=256, impl="te",
                 distributed_optimizer=True, overlap_grad_reduce=True)
    text = patch_script(command, new, layout_changes(command, old, new))
    # $TP is replaced where the string uses it, not in TP=${TP:-2}: the value the launch
    # passes changes, nothing else that reads TP does.
    assert 'PARALLEL="--tensor-model-parallel-size 4 --sequence-parallel"' in text
    assert "TP=${TP:-2}\n" in text
    assert "TRAIN_ARGS=(--micro-batch-size 2 --global-batch-size 256 --lr 3e-4)" in text
    # An added flag goes onto the launch command, on a line of its own before its last.
    assert "\n    --overlap-grad-reduce \\\n    --save " in text
    # Read back, the patched file is the user's command with the new layout.
    out = tmp_path / "tuned.sh"
    out.write_text(text)
    again = read_megatron_command(str(out))
    assert megatron_layout(again, 16) == new
    kept = {g.flag: [w.shown() for w in g.words] for g in again.groups
            if g.flag in ("--my-unknown-flag", "--another", "--data-path", "--save")}
    assert kept == {"--my-unknown-flag": ["--my-unknown-flag", "a b"],
                    "--another": ["--another", "1", "2"],
                    "--data-path": ["--data-path", "/data/my-corpus_text_document"],
                    "--save": ["--save", "$CKPT/run 1"]}


def test_removed_flags_leave_no_gap(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(ARRAYS)
    command = read_megatron_command(str(script))
    new = Layout(tp=1, dp=16, mbs=4, gbs=256, impl="te")
    text = patch_script(command, new, layout_changes(command, megatron_layout(command, 16), new))
    assert 'PARALLEL="--tensor-model-parallel-size 1"' in text
    assert "TRAIN_ARGS+=()" in text
    out = tmp_path / "tuned.sh"
    out.write_text(text)
    assert megatron_layout(read_megatron_command(str(out)), 16) == new


def test_only_the_changed_flags_change() -> None:
    command = read_megatron_command(str(SEED))
    old = megatron_layout(command, 1)
    changes = layout_changes(command, old, Layout(mbs=5, gbs=15, impl="te",
                                                  recompute="selective"))
    assert [c.row for c in changes] == ["batch", "recompute"]
    assert changes[0].describe() == "--micro-batch-size 15 -> 5"


@pytest.mark.parametrize(("before", "after", "shown"), [
    # a row's flag that keeps its value is not a change
    (("--micro-batch-size", "1", "--global-batch-size", "256"),
     ("--micro-batch-size", "8", "--global-batch-size", "256"), "--micro-batch-size 1 -> 8"),
    (("--micro-batch-size", "1", "--global-batch-size", "256"),
     ("--micro-batch-size", "2", "--global-batch-size", "512"),
     "--micro-batch-size 1 -> 2; --global-batch-size 256 -> 512"),
    # flags the new layout adds, and those it drops
    ((), ("--use-distributed-optimizer",), "(none) -> --use-distributed-optimizer"),
    (("--recompute-granularity", "selective"), (),
     "--recompute-granularity selective -> (removed)"),
    (("--recompute-granularity", "selective"),
     ("--recompute-granularity", "full", "--recompute-method", "block",
      "--recompute-num-layers", "2"),
     "--recompute-granularity selective -> full; (none) -> --recompute-method block "
     "--recompute-num-layers 2"),
    (("--transformer-impl", "local", "--no-masked-softmax-fusion", "--no-persist-layer-norm",
      "--no-gradient-accumulation-fusion"),
     ("--transformer-impl", "transformer_engine", "--no-gradient-accumulation-fusion"),
     "--transformer-impl local -> transformer_engine; --no-masked-softmax-fusion "
     "--no-persist-layer-norm -> (removed)"),
])
def test_a_change_shows_only_the_flags_that_change(before: tuple[str, ...],
                                                   after: tuple[str, ...], shown: str) -> None:
    assert RowChange("row", before, after).describe() == shown
    assert "256 -> 256" not in shown


FAKE_TORCHRUN = """#!/bin/sh
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" > "$CALLS"
"""


def test_the_exported_command_runs_nothing_the_user_typed(tmp_path: Path) -> None:
    mark = tmp_path / "PWNED"
    script = tmp_path / "train.sh"
    # Single-quoted: literal text to bash too; it must stay one literal argument.
    script.write_text(f"A='$(touch {mark})'\n"
                      f"torchrun --nproc-per-node 1 pretrain_gpt.py --num-layers 2 "
                      f"--hidden-size 64 --num-attention-heads 4 --seq-length 128 "
                      f"--max-position-embeddings 128 --global-batch-size 8 --vocab-size 999 "
                      f"--tokenizer-type NullTokenizer "
                      f"--note \"$A\" --other '`touch {mark}`;' \n")
    command = read_megatron_command(str(script))
    assert not mark.exists()
    new = Layout(mbs=2, gbs=8, impl="te")
    text = patch_script(command, new, layout_changes(command, megatron_layout(command, 1), new))
    out = tmp_path / "tuned.sh"
    out.write_text(text)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "torchrun"
    fake.write_text(FAKE_TORCHRUN)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    calls = tmp_path / "calls.json"
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "CALLS": str(calls)}
    subprocess.run(["bash", str(out)], check=True, env=env, cwd=tmp_path)
    argv = json.loads(calls.read_text())
    assert not mark.exists()
    assert argv[argv.index("--note") + 1] == f"$(touch {mark})"
    assert argv[argv.index("--other") + 1] == f"`touch {mark}`;"
    assert argv[argv.index("--micro-batch-size") + 1] == "2"


def test_a_command_substitution_stays_the_users(tmp_path: Path) -> None:
    # The user's script runs $(date +%s) itself; the patched file keeps it, byte for byte.
    script = tmp_path / "train.sh"
    script.write_text("torchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                      "--num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
                      "--global-batch-size 8 --vocab-size 999 --run-name $(date +%s)\n")
    command = read_megatron_command(str(script))
    new = Layout(mbs=2, gbs=8, impl="te")
    text = patch_script(command, new, layout_changes(command, megatron_layout(command, 1), new))
    assert text == script.read_text().replace("$(date +%s)\n",
                                              "$(date +%s) --micro-batch-size 2\n")


BASE = ("torchrun --nproc-per-node 2 pretrain_gpt.py --num-layers 4 --hidden-size 256 "
        "--num-attention-heads 8 --seq-length 512 --max-position-embeddings 512 "
        "--global-batch-size 16 --tokenizer-type NullTokenizer --vocab-size 1000")


@pytest.mark.parametrize(("text", "message"), [
    ("echo hello\nls -l\n", "holds no pretrain_gpt.py command"),
    ("python train.py --num-layers 4\n", "holds no pretrain_gpt.py command"),
    (BASE + " --micro-batch-size\n", "--micro-batch-size has no value"),
    (BASE + " --micro-batch-size --bf16\n", "--micro-batch-size has no value"),
    (BASE + " --tensor-model-parallel-size $TP\n",
     r"--tensor-model-parallel-size \$TP: not set in the script"),
    ("if [ -n \"$X\" ]; then TP=2; fi\n" + BASE + " --tensor-model-parallel-size $TP\n",
     "set inside an if/for/case block"),
    (BASE + " --pipeline-model-parallel-size $(nproc)\n", "command substitution"),
    (BASE + " $EXTRA_ARGS\n", r"\$EXTRA_ARGS stands where flags go"),
    (BASE.replace("--num-layers 4 ", "") + "\n", "the command has no --num-layers"),
    (BASE.replace(" --global-batch-size 16", "") + "\n", "no --global-batch-size"),
    (BASE + " --recompute-granularity full\n", "needs --recompute-method"),
    (BASE + " --micro-batch-size four\n", "--micro-batch-size 'four' is not an integer"),
    (BASE + " --normalization ScaleNorm\n", "--normalization ScaleNorm is not one"),
    (BASE.replace("--tokenizer-type NullTokenizer --vocab-size 1000",
                  "--tokenizer-type HuggingFaceTokenizer --tokenizer-model x") + "\n",
     "cannot tell the vocabulary size"),
    (BASE + " --note 'unclosed\n", "bash syntax autotune's parser"),
    ("srun " + BASE.replace("torchrun --nproc-per-node 2 ", "") + "\n",
     "cannot tell how many GPUs"),
    (BASE + " --tensor-model-parallel-size 3\n", "tp=3 x pp=1 x cp=1 = 3 must divide the 2 GPUs"),
])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      text: str, message: str) -> None:
    script = tmp_path / "train.sh"
    script.write_text(text)
    code = main(["--from-megatron", str(script), "--backend", "simulate", "--results-dir",
                 str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("autotune: error: "), err
    assert re.search(message, err), err


def test_search_starts_from_the_users_layout(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "r"
    code = main(["--from-megatron", str(SEED), "--backend", "simulate", "--gpu", "a100-40gb",
                 "--results-dir", str(results), "--study", "seed"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    # The user's layout is predicted not to fit: no up-front line on stderr; the conclusion
    # says so after the table (autotune.commands.from_megatron).
    assert "yours (" not in captured.err
    assert "yours: tp1 pp1 dp1 mbs15 te: PREDICTED_OOM" in captured.out
    assert "best found: " in captured.out and "flags that change: " in captured.out
    changes = next(line for line in captured.out.splitlines()
                   if line.startswith("flags that change: "))
    assert not re.search(r"--[\w-]+ (\S+) -> \1(;|$)", changes), changes  # no 15 -> 15
    from autotune.report.load import load_study, resolve_study

    loaded = load_study(resolve_study("seed", results, None))
    first = loaded.records[min(loaded.records)]
    assert first.source == "user" and first.layout.mbs == 15
    out = tmp_path / "tuned.sh"
    assert main(["export", "--from-megatron", str(SEED), "--study", "seed", "--results-dir",
                 str(results), "-o", str(out)]) == 0
    text = out.read_text()
    subprocess.run(["bash", "-n", str(out)], check=True)
    # The user's file, with the changed flags only (and the allocator's export line, which
    # the search's layout runs with: autotune.levers.allocator): its variables stay variables.
    added = [line for line in text.splitlines()
             if "--recompute-" in line or line == f"export {ALLOC_CONF_ENV}={EXPANDABLE}"]
    assert added and [line for line in text.splitlines() if line not in added] == \
        SEED.read_text().splitlines()
    assert "--data-path $DSDIR/openwebtext-10k_text_document" in text
    assert "--recompute-granularity" in text


def test_export_refuses_another_models_command(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "r"
    assert main(["--from-megatron", str(SEED), "--backend", "simulate", "--results-dir",
                 str(results), "--study", "seed"]) == 0
    other = tmp_path / "other.sh"
    other.write_text(SEED.read_text().replace("--num-layers 48", "--num-layers 24"))
    capsys.readouterr()
    code = main(["export", "--from-megatron", str(other), "--study", "seed", "--results-dir",
                 str(results)])
    err = capsys.readouterr().err
    assert code == 2 and "not the model of" in err and err.count("\n") == 1  # the refusal alone


@pytest.mark.parametrize(("arguments", "shown"), [
    (' "$@"', "${@}"), (" $@", "${@}"), (' "${@}"', "${@}"), (" $*", "${*}"),
    (' "$@" --seed 7', "${@}"),           # flags after it: read as written
])
def test_the_scripts_own_arguments_are_read_around_and_named(tmp_path: Path, arguments: str,
                                                             shown: str) -> None:
    """A launch that passes on the script's own arguments ("$@") is read without them (what
    the script holds), and one line says so; anything else in their place is still refused."""
    script = tmp_path / "train.sh"
    script.write_text(BASE + arguments + "\n")
    command = read_megatron_command(str(script))
    assert megatron_layout(command, 2) == megatron_layout(
        read_megatron_command(_write(tmp_path / "plain.sh", BASE + "\n")), 2)
    warning = script_arguments_warning(command) or ""
    assert shown in warning and "\n" not in warning and "cannot see" in warning


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_a_script_without_its_own_arguments_gets_no_such_line(tmp_path: Path) -> None:
    assert script_arguments_warning(read_megatron_command(_write(tmp_path / "t.sh",
                                                                  BASE + "\n"))) is None


# -- if blocks whose condition compares strings the script sets --------------------------------

COND_BASE = BASE + " ${ARGS[@]}\n"
CONDITIONS = [
    # (script before the launch, the layout fields read)
    ('DTYPE="fp8"\nARGS=()\nif [[ "$DTYPE" == "fp8" ]]; then\n  ARGS+=(--fp8-format hybrid)\n'
     "fi\n", {"fp8": "hybrid"}),
    ('DTYPE="bf16"\nARGS=()\nif [[ "$DTYPE" == "fp8" ]]; then\n  ARGS+=(--fp8-format hybrid)\n'
     "fi\n", {"fp8": "off"}),
    # else, elif, [ = ], test, !=, -z / -n
    ("X=b\nif [ \"$X\" = a ]; then ARGS=(--tensor-model-parallel-size 2); "
     "else ARGS=(--micro-batch-size 2); fi\n", {"tp": 1, "mbs": 2}),
    ("X=c\nif [ \"$X\" = a ]; then ARGS=(--micro-batch-size 2)\n"
     "elif test \"$X\" != b; then ARGS=(--micro-batch-size 4)\n"
     "else ARGS=(--micro-batch-size 8); fi\n", {"mbs": 4}),
    ("X=\nif [ -z \"$X\" ]; then ARGS=(--micro-batch-size 2); fi\n", {"mbs": 2}),
    ("X=\nif ! [ -n \"$X\" ]; then ARGS=(--micro-batch-size 2); fi\n", {"mbs": 2}),
    # Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh: a positional default and ||.
    ('TOK=${3:-"MOCK"}\nARGS=()\n'
     'if [[ "$TOK" == "MOCK" ]] || [[ -z "$TOK" ]]; then\n  ARGS+=(--micro-batch-size 2)\n'
     "else\n  ARGS+=(--micro-batch-size 4)\nfi\n", {"mbs": 2}),
    ("A=x\nB=y\nARGS=()\nif [ \"$A\" = x ] && [ \"$B\" = z ]; then ARGS+=(--micro-batch-size 2); "
     "fi\n", {"mbs": 1}),
    # A block inside a branch that does not run changes nothing, and closes as it opens.
    ("X=a\nARGS=(--micro-batch-size 2)\nif [ \"$X\" = b ]; then\n  for i in 1; do\n"
     "    ARGS=(--micro-batch-size 8)\n  done\n  if [ 1 = 1 ]; then ARGS=(); fi\nfi\n",
     {"mbs": 2}),
]


@pytest.mark.parametrize(("before", "fields"), CONDITIONS)
def test_a_condition_on_strings_the_script_sets_is_decided(tmp_path: Path, before: str,
                                                           fields: dict[str, object]) -> None:
    """Megatron-LM's own example scripts set flags inside `if [[ "$DTYPE" == "fp8" ]]` blocks on
    strings they set themselves: compared (never run), the branch that runs is read."""
    script = tmp_path / "train.sh"
    script.write_text(before + COND_BASE)
    layout = megatron_layout(read_megatron_command(str(script)), 2)
    for name, value in fields.items():
        assert getattr(layout, name) == value, name


@pytest.mark.parametrize(("before", "message"), [
    # The environment's value: not known.
    ("ARGS=()\nif [[ \"$MODE\" == fp8 ]]; then ARGS+=(--micro-batch-size 2); fi\n",
     "set inside an if/for/case block"),
    # A glob pattern on the right of == in [[ ]]: not decided.
    ("D=fp8\nARGS=()\nif [[ $D == fp* ]]; then ARGS+=(--micro-batch-size 2); fi\n",
     "set inside an if/for/case block"),
    # A command's status is never run, nor a command substitution in a test.
    ("ARGS=()\nif grep -q x /etc/hostname; then ARGS+=(--micro-batch-size 2); fi\n",
     "set inside an if/for/case block"),
    ('ARGS=()\nif [ "$(touch CANARY)" = "" ]; then ARGS+=(--micro-batch-size 2); fi\n',
     "set inside an if/for/case block"),
])
def test_a_condition_autotune_cannot_decide_is_refused_as_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: str, message: str) -> None:
    script = tmp_path / "train.sh"
    script.write_text(before + COND_BASE)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        read_megatron_command(str(script))
    assert not (tmp_path / "CANARY").exists()


@pytest.mark.parametrize("text", [
    # In an array the command expands, or in a -c string's command.
    'ARGS=(' + BASE.split("pretrain_gpt.py ")[1] + ' "$@")\n'
    'torchrun --nproc-per-node 2 pretrain_gpt.py "${ARGS[@]}"\n',
    "export A=1\nsrun bash -c '" + BASE + " \"$@\"' bash \"$@\"\n",
])
def test_the_scripts_own_arguments_anywhere_in_the_command(tmp_path: Path, text: str) -> None:
    command = read_megatron_command(_write(tmp_path / "t.sh", text))
    assert command.layout_fields.get("tp", 1) == 1 and command.model.num_layers == 4
    assert "cannot see" in (script_arguments_warning(command) or "")


@pytest.mark.parametrize(("text", "missing"), [
    ('torchrun --nproc-per-node 2 pretrain_gpt.py "$@"\n', "--num-layers"),
    ('torchrun --nproc-per-node 2 pretrain_gpt.py --num-layers 4 $*\n', "--hidden-size"),
])
def test_a_flag_only_the_scripts_own_arguments_may_give_is_asked_for(tmp_path: Path, text: str,
                                                                    missing: str) -> None:
    """Not a guess at what the script is called with: one line saying the flag may be among
    them, and where to write it."""
    with pytest.raises(ConfigError, match=rf"the command has no {missing}\b.*the script's own "
                                          r"arguments \(\$\{[@*]\}\), which autotune cannot "
                                          r"see, may give it: write it in the script") as raised:
        read_megatron_command(_write(tmp_path / "t.sh", text))
    assert "\n" not in str(raised.value)


_ARGS = ' "$@"\n'


@pytest.mark.parametrize(("text", "missing"), [
    # A flag the command lacks, with the script's own arguments passed on: they may give it.
    (BASE.replace("--num-layers 4 ", "") + _ARGS, "--num-layers"),
    (BASE.replace("--max-position-embeddings 512 ", "") + _ARGS, "--max-position-embeddings"),
    (BASE.replace(" --global-batch-size 16", "") + _ARGS, "--global-batch-size"),
    # The same flags lacking without "$@": nothing else can give them, so no such hint.
    (BASE.replace("--num-layers 4 ", "") + "\n", None),
    (BASE.replace(" --global-batch-size 16", "") + "\n", None),
    # A value the command gives wrong is wrong whatever "$@" holds: no hint either.
    (BASE + " --micro-batch-size four" + _ARGS, None),
    (BASE + " --normalization ScaleNorm" + _ARGS, None),
    (BASE.replace("--max-position-embeddings 512", "--max-position-embeddings 256") + _ARGS,
     None),
    (BASE + " --recompute-granularity full" + _ARGS, None),
])
def test_only_a_missing_flag_is_said_to_maybe_come_from_the_scripts_arguments(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
        missing: str | None) -> None:
    """The hint goes by the error's kind (a flag the command lacks), not by its words: one
    line, exit 2, the flag named, and the hint only where "$@" is passed on and a flag lacks."""
    script = _write(tmp_path / "train.sh", text)
    with pytest.raises(ConfigError) as raised:
        read_megatron_command(script)
    hinted = "the script's own arguments" in str(raised.value)
    assert hinted == (missing is not None), raised.value
    if missing is not None:
        assert isinstance(raised.value, MissingFlagError) and raised.value.flag == missing
        assert f"the command has no {missing}" in str(raised.value)
    code = main(["--from-megatron", script, "--backend", "simulate", "--results-dir",
                 str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("autotune: error: "), err
    assert ("may give it: write it in the script" in err) == (missing is not None), err


def test_a_missing_flag_error_copies_with_its_flag() -> None:
    """copy and pickle rebuild an exception from its reduce; the flag must survive it."""
    exc = MissingFlagError("t.sh: the command has no --num-layers", "--num-layers")
    for again in (copy.copy(exc), pickle.loads(pickle.dumps(exc))):
        assert isinstance(again, MissingFlagError) and again.flag == "--num-layers"
        assert str(again) == str(exc)
