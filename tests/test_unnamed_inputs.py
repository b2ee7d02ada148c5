"""Cases no issue named, found by trying autotune as a new Megatron user on a CPU machine would:
GPU counts, models and inputs beyond the presets' (simulate, estimate, export, report). Each
table holds the inputs of one defect and the answer autotune owes them."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.errors import ConfigError
from autotune.megatron.megatron_args import UNMODELED_FLAGS, UNREPRESENTED_FLAGS
from autotune.megatron.megatron_command import (
    layout_changes,
    megatron_layout,
    read_megatron_command,
    unmodeled_warning,
)
from autotune.megatron.script_patch import patch_script

DATA = Path(__file__).parent / "data"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# -- a Megatron-LM command whose model autotune's models do not have -----------------------------

COMMAND = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 24 --hidden-size 2048 "
           "--num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 "
           "--micro-batch-size 1 --global-batch-size 64 --bf16 "
           "--tokenizer-type NullTokenizer --vocab-size 32000")
MOE = " --num-experts 8 --moe-router-topk 2"


@pytest.mark.parametrize(("extra", "refused"), [
    # A head dimension of its own (2048 / 32 heads is 64) is read (test_kv_channels_...);
    # one the command does not tell is refused.
    (" --kv-channels $KV", r"--kv-channels \$KV: not set in the script .*needs its value"),
    (" --kv-channels 64", None),
    (" --kv-channels 128", None),
    (" --window-size 1024,0", "sliding-window attention"),
    (" --window-size -1,0", None),
    (" --window-size 4096,0", None),
    (" --window-size 1024,0 --window-attn-skip-freq 2", "sliding-window attention"),
    # MLA is read (test_mla_flags_both_ways); megatron-core's MLA rules refuse in one line.
    (" --multi-latent-attention --q-lora-rank 1536", "position_embedding must be rope"),
    (" --multi-latent-attention --position-embedding-type rope --group-query-attention "
     "--num-query-groups 8", "multi_latent_attention has no query groups"),
    # --kv-channels beside MLA sizes nothing (megatron-core's MLA never reads it; NVIDIA's
    # DeepSeek-V3 script passes it): read as unset, test_mla_flags_both_ways.
    (" --multi-latent-attention --position-embedding-type rope --kv-channels 128", None),
    (" --multi-latent-attention --position-embedding-type rope --rope-type rope",
     "another RoPE type"),
    (" --position-embedding-type rope --rope-type yarn", "another RoPE type"),
    (" --multi-latent-attention --position-embedding-type rope --rope-type yarn", None),
    (" --position-embedding-type rope --rope-type rope", None),
    # megatron-core's shared expert asserts add_bias_linear off (shared_experts.py).
    (MOE + " --moe-shared-expert-intermediate-size 4096", "shared expert has no biases"),
    (MOE + " --moe-shared-expert-intermediate-size 4096 --disable-bias-linear", None),
    (" --moe-shared-expert-intermediate-size 4096 --disable-bias-linear",
     "a shared expert .* needs num_experts"),
    (MOE + " --moe-shared-expert-intermediate-size 0", None),
    # Dense layers among the MoE layers are read (test_moe_layer_freq_both_ways); a pattern
    # is parsed, never evaluated, and refused in one line where it is not one.
    (MOE + " --moe-layer-freq '([0]*3+[1]*21)'", None),
    (MOE + " --moe-layer-freq 1", None),
    (MOE + " --moe-layer-freq '__import__(\"os\")'", "--moe-layer-freq"),
    (MOE + " --moe-layer-freq '[0]*3+[1]*20'", "moe_layer_freq must give 0 \\(dense\\) or 1"),
    # Grouped GEMMs are TE's TEGroupedMLP, as the worker builds them; with the local spec they
    # are megatron-core's legacy GroupedMLP (the grouped_gemm package), not modelled.
    (MOE + " --moe-grouped-gemm", None),
    (MOE + " --transformer-impl local --moe-grouped-gemm", "legacy GroupedMLP"),
    (" --transformer-impl local --moe-grouped-gemm", None),  # no experts: Megatron ignores it
    # Multi-Token Prediction is read (test_mtp.py); Megatron-LM's own rule refuses it with
    # learned positions (arguments.py validate_args), in one line.
    (" --mtp-num-layers 1", "Multi-Token Prediction .* needs position_embedding rope"),
    (" --position-embedding-type rope --mtp-num-layers 1", None),
    (" --position-embedding-type rope --mtp-num-layers 17", "between 0 and 16"),
    (" --position-embedding-type rope --mtp-num-layers 1 --mtp-loss-scaling-factor -1",
     "mtp_loss_scaling_factor must be a number between 0 and 100"),
    (" --mtp-num-layers 0", None),
    (" --mtp-loss-scaling-factor 0.3", None),  # no MTP layer: nothing it scales
    # A layout string is read where autotune's split says it (tests/test_pipeline_layout.py),
    # refused naming the stage where it does not.
    (" --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*12|t*12L'", None),
    (" --pipeline-model-parallel-size 3 --pipeline-model-parallel-layout 'Et*12|t*12|L'",
     "pipeline stage 2 holds no transformer layer"),
    (" --heterogeneous-layers-config-path layers.json", "layers of different shapes"),
    (" --experimental-attention-variant gated_delta_net", "an attention variant of its own"),
])
def test_a_shape_autotune_does_not_model_is_refused(tmp_path: Path, extra: str,
                                                    refused: str | None) -> None:
    """These flags were kept and passed on in silence: a --kv-channels 128 model was predicted
    as one with 64-wide heads, MLA as plain attention (shared experts, once refused, are read:
    test_shared_expert_flags_both_ways; MLA too: test_mla_flags_both_ways)."""
    script = tmp_path / "train.sh"
    script.write_text(COMMAND + extra + "\n")
    if refused is None:
        read_megatron_command(str(script))
        return
    with pytest.raises(ConfigError, match=refused):
        read_megatron_command(str(script))


def test_the_refusal_is_one_line_exit_2(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.sh"
    script.write_text(COMMAND + " --multi-latent-attention --q-lora-rank 1536\n")
    results = tmp_path / "results"
    code, out, err = run(capsys, "--from-megatron", str(script), "--backend", "simulate",
                         "--results-dir", str(results))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("autotune: error: "), err
    assert not results.exists()


@pytest.mark.parametrize(("extra", "named"), [
    (MOE + " --tensor-model-parallel-size 2 --sequence-parallel --expert-tensor-parallel-size 1",
     ["--expert-tensor-parallel-size"]),
    # megatron-core's default is the tensor-parallel size: what autotune runs.
    (MOE + " --tensor-model-parallel-size 2 --sequence-parallel --expert-tensor-parallel-size 2",
     []),
    (MOE + " --tensor-model-parallel-size 2 --sequence-parallel --expert-tensor-parallel-size=2",
     []),
    # --moe-grouped-gemm is what impl te runs (TEGroupedMLP): read, not named.
    (MOE + " --moe-grouped-gemm --moe-expert-capacity-factor 1.0 "
     "--moe-pad-expert-input-to-capacity --moe-layer-recompute",
     ["--moe-expert-capacity-factor", "--moe-pad-expert-input-to-capacity",
      "--moe-layer-recompute"]),
    (" --use-flash-attn --qk-layernorm --add-qkv-bias --fp32-residual-connection",
     ["--use-flash-attn", "--fp32-residual-connection"]),             # the model's, read
    (" --pipeline-model-parallel-size 2 --account-for-embedding-in-pipeline-split "
     "--account-for-loss-in-pipeline-split",
     ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]),
    (" --context-parallel-size 2 --cp-comm-type a2a", ["--cp-comm-type"]),
    (" --context-parallel-size 2 --cp-comm-type p2p", []),           # Megatron-LM's default
    (" --attention-backend=auto", []),                               # its default, with =
    (" --attention-backend=flash", ["--attention-backend"]),
    # The dispatcher autotune measures and exports is alltoall; flex (DeepEP, HybridEP, as
    # NVIDIA's DeepSeek-V3 script runs) and allgather are named, not replaced in silence.
    (MOE + " --moe-token-dispatcher-type flex", ["--moe-token-dispatcher-type"]),
    (MOE + " --moe-token-dispatcher-type allgather", ["--moe-token-dispatcher-type"]),
    (MOE + " --moe-token-dispatcher-type alltoall", []),
    # Megatron-LM's NaN checks off: read as a layout field (autotune.levers.nan_checks),
    # measured and exported as the user runs them, so no longer named.
    (" --no-check-for-nan-in-loss-and-grad", []),
])
def test_flags_that_change_speed_or_memory_are_named(tmp_path: Path, extra: str,
                                                     named: list[str]) -> None:
    """These were passed on without a word: the prediction ran without them, the user's command
    with them (expert weights unsharded over tp, FlashAttention, an fp32 residual, ...)."""
    script = tmp_path / "train.sh"
    script.write_text(COMMAND + extra + "\n")
    command = read_megatron_command(str(script))
    assert list(command.unmodeled) == named
    warning = unmodeled_warning(command)
    assert (warning is None) == (not named)
    assert warning is None or ("\n" not in warning and all(f in warning for f in named))


@pytest.mark.parametrize("version", ["0.16.1", "0.19.2"])
def test_the_refused_and_named_flags_are_megatron_lms(version: str) -> None:
    """Spelled as the supported releases' argparse declares them (tests/data/megatron_versions),
    so that a user's command cannot pass one autotune's tables misspell."""
    flags = set(json.loads((DATA / "megatron_versions" / f"{version}.json").read_text())["flags"])
    assert set(UNREPRESENTED_FLAGS) <= flags
    assert set(UNMODELED_FLAGS) <= flags


def test_refusals_name_their_flag() -> None:
    for flag, unrepresented in UNREPRESENTED_FLAGS.items():
        assert re.fullmatch(r"--[a-z0-9-]+", flag)
        assert unrepresented.what and "\n" not in unrepresented.what


# -- a GPU count that the default node size does not divide -------------------------------------


@pytest.mark.parametrize(("args", "message"), [
    (["gpt2", "--gpus", "12", "--dry-run"],
     "--gpus 12 does not fill nodes of 8 GPUs (the default --gpus-per-node): give "
     "--gpus-per-node 6, 4, 3, 2 or 1"),
    (["estimate", "gpt2", "--gpus", "12"], "give --gpus-per-node 6, 4, 3, 2 or 1"),
    (["gpt2", "--gpus", "13", "--dry-run"], "give --gpus-per-node 1, the GPUs that share"),
    (["gpt2", "--gpus", "20", "--cluster", "dgx-h100.yaml", "--dry-run"],
     "--gpus 20 does not fill nodes of 8 GPUs of cluster file"),
    # Typed by the user: ClusterSpec's own message names it as typed.
    (["gpt2", "--gpus", "12", "--gpus-per-node", "8", "--dry-run"],
     "--gpus=12 must be a multiple of --gpus-per-node=8"),
])
def test_a_default_node_size_that_does_not_divide_says_so(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, args: list[str],
        message: str) -> None:
    """`--gpus 12` used to end with "--gpus=12 must be a multiple of --gpus-per-node=8": an
    option the user never typed, and no word of what to type."""
    monkeypatch.chdir(Path(__file__).parents[1] / "search_spaces" / "clusters")
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize(("gpus", "per_node"), [(12, 4), (12, 6), (24, 8), (7, None),
                                                (1000, None), (3072, None)])
def test_counts_that_fill_their_nodes_still_plan(capsys: pytest.CaptureFixture[str],
                                                 gpus: int, per_node: int | None) -> None:
    extra = ["--gpus-per-node", str(per_node)] if per_node else []
    code, _, err = run(capsys, "estimate", "gpt2", "--gpus", str(gpus), *extra, "--gbs",
                       str(gpus * 2))
    assert code == 0, err


# -- options a real search hands its trials ---------------------------------------------------


@pytest.mark.parametrize(("extra", "message"), [
    (["--warmup-steps", "-1"], "--warmup-steps must be 0 or more, got -1"),
    (["--trial-timeout", "0"], "--trial-timeout must be a positive number of seconds, got 0"),
    (["--trial-timeout", "-5"], "got -5"),
    (["--trial-timeout", "nan"], "got nan"),
    (["--trial-timeout", "inf"], "got inf"),
])
def test_trial_options_out_of_range_are_one_line(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path, extra: list[str],
                                                 message: str) -> None:
    """Accepted before: a negative warm-up reached the worker's trial.json reader, which refuses
    it (every trial of a real search would crash); a timeout of 0 meant the default in silence,
    a negative one timed every trial out."""
    results = tmp_path / "results"
    code, out, err = run(capsys, "gpt2", "--gpus", "1", "--backend", "simulate",
                         "--results-dir", str(results), *extra)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err
    assert not results.exists()


@pytest.mark.parametrize("extra", [["--warmup-steps", "0"], ["--trial-timeout", "30"]])
def test_trial_options_in_range_still_run(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                          extra: list[str]) -> None:
    code, _, err = run(capsys, "gpt2", "--gpus", "1", "--backend", "simulate", "--space",
                       "single-gpu", "--trials", "2", "--results-dir", str(tmp_path), *extra)
    assert code == 0, err


# -- a plan where no layout fits leaves nothing behind -----------------------------------------


def test_a_plan_that_fits_nowhere_leaves_no_study(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    """`autotune gpt-145b --gpus 1` wrote a study of ruled-out trials: the newest under
    --results-dir, so a following `autotune export` refused ("no COMPLETE trial") instead of
    exporting the plan made before it."""
    results = str(tmp_path / "results")
    plan = ["--backend", "simulate", "--results-dir", results]
    code, _, err = run(capsys, "gpt2", "--gpus", "1", "--space", "single-gpu", "--trials", "3",
                       *plan)
    assert code == 0, err
    before = sorted(p.name for p in Path(results).iterdir())
    for args in (["gpt-145b", "--gpus", "1"], ["gpt-145b", "--gpus", "1", "--json"],
                 ["gpt3-175b", "--gpus", "2", "--sampler", "grid"]):
        code, out, err = run(capsys, *args, *plan)
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert "no layout is predicted to fit" in err
        assert sorted(p.name for p in Path(results).iterdir()) == before
    code, out, err = run(capsys, "export", "--results-dir", results, "--format", "json")
    assert code == 0 and "gpt2-1gpu" in err, err


BIG = ("torchrun --nproc-per-node 1 pretrain_gpt.py --num-layers 96 --hidden-size 12288 "
       "--num-attention-heads 96 --seq-length 1024 --max-position-embeddings 1024 "
       "--micro-batch-size 15 --global-batch-size 15 --bf16 --tokenizer-type NullTokenizer "
       "--vocab-size 32000")


@pytest.mark.parametrize("output", [[], ["--json"]], ids=["text", "json"])
def test_your_layout_that_fits_nowhere_comes_after_the_conclusion(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, output: list[str]) -> None:
    """--from-megatron with a layout no GPU holds, where no layout fits: one line, the
    conclusion first and the user's layout in it (the `yours: ... does NOT fit` line came
    before the error)."""
    script = tmp_path / "big.sh"
    script.write_text(BIG + "\n")
    code, out, err = run(capsys, "--from-megatron", str(script), "--backend", "simulate",
                         "--results-dir", str(tmp_path / "results"), *output)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("autotune: error: no layout is predicted to fit: the smallest peak")
    assert re.search(r"; yours \(tp1 pp1 dp1 mbs15 \w+\) is predicted at [\d,.]+ GiB$",
                     err.strip()), err
    assert "does NOT fit" not in err


def test_your_layout_that_fits_is_said_first(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    script = tmp_path / "small.sh"
    script.write_text(COMMAND + "\n")
    code, _, err = run(capsys, "--from-megatron", str(script), "--backend", "simulate",
                       "--trials", "2", "--results-dir", str(tmp_path / "results"))
    assert code == 0, err
    assert err.startswith("autotune: yours (") and "(fits)" in err.splitlines()[0]


def test_a_study_folder_holding_more_is_kept(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    folder = tmp_path / "results" / "mine"
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("mine\n")
    code, _, err = run(capsys, "gpt-145b", "--gpus", "1", "--backend", "simulate", "--study",
                       "mine", "--results-dir", str(tmp_path / "results"))
    assert code == 2 and "no layout is predicted to fit" in err
    assert (folder / "notes.txt").read_text() == "mine\n" and (folder / "study.db").exists()


# -- export: a refusal is its one line ---------------------------------------------------------


@pytest.fixture(scope="module")
def planned_on_four(tmp_path_factory: pytest.TempPathFactory) -> Path:
    results = tmp_path_factory.mktemp("plans")
    assert main(["gpt2", "--gpus", "4", "--backend", "simulate", "--space", "four-gpu",
                 "--trials", "3", "--results-dir", str(results)]) == 0
    return results


@pytest.mark.parametrize(("extra", "message"), [
    (["--nodes", "3"], "--nodes 3 must be a positive divisor of the layout's 4 GPUs"),
    (["--nodes", "8"], "--nodes 8 must be a positive divisor"),
    (["--nodes", "2", "--format", "torchrun"], "--format torchrun runs autotune's worker on one"),
    (["-o", "{root}/no/such/folder/x.sh"], "does not exist"),
])
def test_export_refusals_are_one_line(capsys: pytest.CaptureFixture[str], planned_on_four: Path,
                                      extra: list[str], message: str) -> None:
    """The "exporting trial N ..." line came before them: two lines for one refusal."""
    capsys.readouterr()
    extra = [a.format(root=planned_on_four) for a in extra]
    code, out, err = run(capsys, "export", "--results-dir", str(planned_on_four), *extra)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("autotune: error: ") and message in err, err


def test_export_still_says_what_it_exports(capsys: pytest.CaptureFixture[str],
                                           planned_on_four: Path, tmp_path: Path) -> None:
    capsys.readouterr()
    code, out, err = run(capsys, "export", "--results-dir", str(planned_on_four), "--nodes", "2")
    assert code == 0 and "pretrain_gpt.py" in out and "exporting trial" in err
    target = tmp_path / "run.sh"
    code, out, err = run(capsys, "export", "--results-dir", str(planned_on_four), "-o",
                         str(target))
    assert code == 0 and out == "" and target.exists()
    assert err.splitlines()[0].startswith("autotune: exporting trial")
    assert err.splitlines()[-1] == f"autotune: wrote {target}"


# -- the smallest peak is the space's, not the tried layouts' ------------------------------------


def test_the_smallest_peak_is_the_spaces_not_the_users(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """With --from-megatron the user's own layout is the one trial told PREDICTED_OOM, and the
    error named its peak as the smallest (414.6 GiB for a 175B model at tp 8 without recompute)
    although the space held a layout of 384.6 GiB (full recompute, distributed optimizer)."""
    script = tmp_path / "train.sh"
    script.write_text(
        "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 96 --hidden-size 12288 "
        "--num-attention-heads 96 --seq-length 2048 --max-position-embeddings 2048 "
        "--micro-batch-size 1 --global-batch-size 1536 --bf16 --vocab-size 50000 "
        "--tokenizer-type NullTokenizer --tensor-model-parallel-size 8\n")
    code, out, err = run(capsys, "--from-megatron", str(script), "--backend", "simulate",
                         "--results-dir", str(tmp_path / "results"))
    assert code == 2 and out == ""
    def gib(pattern: str) -> float:
        found = re.search(pattern + r" ([\d,.]+) GiB", err)
        assert found, err
        return float(found.group(1).replace(",", ""))

    yours, smallest = gib(r"yours \(tp8 pp1 dp1 mbs1 \w+\) is predicted at"), \
        gib("the smallest peak is")
    assert smallest < yours * 0.95, err
    assert err.count("\n") == 1, err  # the conclusion, your layout in the same line
    assert "rc=full" in err.splitlines()[-1]


@pytest.mark.parametrize(("extra", "args", "message"), [
    ("", ["--gpus", "16"], "runs on 8 GPUs (torchrun --nproc-per-node 8 x --nnodes 1); --gpus "
     "says 16"),
    (" --tensor-model-parallel-size 3", [], "tp=3 x pp=1 x cp=1 = 3 must divide the 8 GPUs"),
    (" --micro-batch-size 3", [], "mbs=3 x dp=8 = 24 must divide global_batch_size=64"),
])
def test_a_refused_command_with_unmodeled_flags_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, args: list[str],
        message: str) -> None:
    """The warning naming --tp-comm-overlap came before the refusal: two lines for bad input."""
    script = tmp_path / "train.sh"
    script.write_text(COMMAND + " --tp-comm-overlap" + extra + "\n")
    code, out, err = run(capsys, "--from-megatron", str(script), *args, "--backend", "simulate",
                         "--dry-run")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err


def test_a_usable_command_still_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.sh"
    script.write_text(COMMAND + " --tp-comm-overlap\n")
    code, _, err = run(capsys, "--from-megatron", str(script), "--backend", "simulate",
                       "--dry-run")
    assert code == 0 and "autotune does not model --tp-comm-overlap" in err.splitlines()[0]


# -- a launch script with Windows line endings -----------------------------------------------


@pytest.mark.parametrize(("text", "line"), [
    (COMMAND + "\r\n", 1),
    # A continuation: bash runs `torchrun ... pretrain_gpt.py --num-layers 24 $'\r'` alone.
    (COMMAND.replace(" --hidden-size", " \\\r\n  --hidden-size") + "\r\n", 1),
    ("#!/bin/bash\nset -e\r\n" + COMMAND + "\n", 2),
])
def test_windows_line_endings_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        text: str, line: int) -> None:
    """Read before as if the carriage returns were spaces: a command bash never runs (its last
    word `--bf16\\r`, or split at a `\\` + CR) was searched, or refused as having "no
    --hidden-size"."""
    script = tmp_path / "train.sh"
    script.write_bytes(text.encode())
    code, out, err = run(capsys, "--from-megatron", str(script), "--backend", "simulate",
                         "--dry-run")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert f"line {line} ends in a carriage return (Windows line endings)" in err
    assert "dos2unix" in err


def test_a_carriage_return_inside_a_line_is_left_to_bash(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_bytes((COMMAND + " --wandb-exp-name 'a\rb'\n").encode())
    read_megatron_command(str(script))


# -- a continuation backslash followed by a space --------------------------------------------


@pytest.mark.parametrize(("text", "line"), [
    (COMMAND.replace(" --seq-length", " \\ \n  --seq-length") + "\n", 1),
    (COMMAND.replace(" --seq-length", " \\\t\n\t--seq-length") + "\n", 1),
    ("#!/bin/bash\n" + COMMAND.replace(" --hidden-size", " \\\n  --hidden-size")
     .replace(" --seq-length", " \\  \n  --seq-length") + "\n", 3),
])
def test_a_backslash_then_a_space_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           text: str, line: int) -> None:
    """bash ends the command at `\\ ` (an escaped space) and runs the next line, flags only, as
    a command of its own: read as bash runs it, the error was "the command has no
    --seq-length" in a file that has one."""
    script = tmp_path / "train.sh"
    script.write_text(text)
    code, out, err = run(capsys, "--from-megatron", str(script), "--backend", "simulate",
                         "--dry-run")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert f"line {line} ends in a backslash and white space" in err


def test_an_escaped_space_inside_a_line_is_left_to_bash(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(COMMAND + " --wandb-exp-name a\\ b\n")
    read_megatron_command(str(script))


# -- recompute flags read as Megatron-LM runs them ------------------------------------------------


@pytest.mark.parametrize(("extra", "read"), [
    # validate_args: --recompute-activations sets selective over any --recompute-granularity.
    (" --recompute-activations --recompute-granularity full", "selective"),
    (" --recompute-granularity full --recompute-activations", "selective"),
    (" --recompute-activations", "selective"),
    (" --recompute-granularity selective --recompute-modules core_attn mlp", "selective"),
    (" --recompute-granularity full --recompute-method block --recompute-num-layers 3", "full"),
    (" --recompute-num-layers 3", "none"),       # read only with full (or refused: selective)
    ("", "none"),
])
def test_recompute_is_read_as_megatron_lm_runs_it(tmp_path: Path, extra: str, read: str) -> None:
    """`--recompute-activations --recompute-granularity full ...` was read as full recompute;
    Megatron-LM runs it selective (and fails with --recompute-num-layers)."""
    script = tmp_path / "train.sh"
    script.write_text(COMMAND + extra + "\n")
    assert read_megatron_command(str(script)).layout_fields["recompute"] == read


SELECTIVE = " --recompute-granularity selective --recompute-modules "
MLA = " --multi-latent-attention --position-embedding-type rope"
SHARED = " --moe-shared-expert-intermediate-size 1024 --disable-bias-linear"


@pytest.mark.parametrize(("extra", "read"), [
    (SELECTIVE + "core_attn mlp", ("selective", "core_attn+mlp")),
    # mlp acts on dense layers only, moe and moe_act on MoE layers only (transformer_layer.py):
    # what acts on no layer of the model is left out, as Megatron-LM runs it.
    (MOE + SELECTIVE + "mlp moe layernorm", ("selective", "layernorm+moe")),
    (SELECTIVE + "moe_act core_attn", ("selective", "core_attn")),
    (MOE + SELECTIVE + "mlp", ("none", None)),
    (SELECTIVE + "layernorm+mlp", ("selective", "layernorm+mlp")),
    # With dense layers among the MoE layers, mlp acts on the dense ones and moe on the MoE
    # ones: both kept (the read dropped mlp in silence before).
    (MOE + " --moe-layer-freq '([0]*3+[1]*21)'" + SELECTIVE + "mlp moe layernorm",
     ("selective", "layernorm+mlp+moe")),
    # NVIDIA's DeepSeek-V3 recipe's modules: MLA's up projections, the shared expert.
    (MLA + SELECTIVE + "mlp mla_up_proj layernorm", ("selective", "layernorm+mla_up_proj+mlp")),
    (MOE + SHARED + SELECTIVE + "shared_experts moe_act", ("selective",
                                                            "moe_act+shared_experts")),
    (MOE + " --moe-layer-freq '([0]*3+[1]*21)'" + MLA + SHARED + SELECTIVE
     + "mla_up_proj mlp shared_experts", ("selective", "mla_up_proj+mlp+shared_experts")),
    # shared_experts without a shared expert acts on nothing.
    (MOE + SELECTIVE + "shared_experts core_attn", ("selective", "core_attn")),
    (SELECTIVE + "shared_experts", ("none", None)),
])
def test_recompute_modules_read_as_they_act(tmp_path: Path, extra: str,
                                            read: tuple[str, str | None]) -> None:
    script = tmp_path / "train.sh"
    script.write_text(COMMAND + extra + "\n")
    fields = read_megatron_command(str(script)).layout_fields
    assert (fields["recompute"], fields.get("recompute_modules")) == read


@pytest.mark.parametrize(("extra", "message"), [
    # TransformerConfig.__post_init__ raises on mla_up_proj without MLA: Megatron-LM does not
    # start.
    (SELECTIVE + "mla_up_proj", "--recompute-modules mla_up_proj needs "
     "--multi-latent-attention"),
    # moe recomputes the layer moe_act and shared_experts are in: one of them is modelled.
    (MOE + SELECTIVE + "moe moe_act", "--recompute-modules moe with moe_act: moe recomputes"),
    (MOE + SHARED + SELECTIVE + "moe_act moe shared_experts",
     "--recompute-modules moe with moe_act and shared_experts: moe recomputes"),
    # A name megatron-core does not take stops Megatron-LM (TransformerConfig asserts it).
    (SELECTIVE + "core_atn", "--recompute-modules core_atn: megatron-core takes core_attn, "),
])
def test_recompute_modules_megatron_refuses_are_refused(tmp_path: Path, extra: str,
                                                        message: str) -> None:
    script = tmp_path / "train.sh"
    script.write_text(COMMAND + extra + "\n")
    with pytest.raises(ConfigError, match=re.escape(message)):
        read_megatron_command(str(script))


@pytest.mark.parametrize(("extra", "message"), [
    (" --recompute-activations --recompute-granularity full --recompute-method uniform "
     "--recompute-num-layers 1",
     "Megatron-LM refuses --recompute-method and --recompute-num-layers with selective "
     "recompute (--recompute-activations makes it selective over --recompute-granularity "
     "full)"),
    (" --recompute-granularity full --recompute-activations --recompute-method block",
     "Megatron-LM refuses --recompute-method with selective recompute (--recompute-"),
    (" --recompute-granularity selective --recompute-num-layers 2",
     "Megatron-LM refuses --recompute-num-layers with selective recompute: the command"),
    (" --recompute-granularity selective --recompute-method block",
     "Megatron-LM refuses --recompute-method with selective recompute: the command"),
])
def test_recompute_megatron_refuses_is_refused(tmp_path: Path, extra: str,
                                                    message: str) -> None:
    script = tmp_path / "train.sh"
    script.write_text(COMMAND + extra + "\n")
    with pytest.raises(ConfigError, match=re.escape(message)):
        read_megatron_command(str(script))


# -- --sequence-parallel at tp 1: Megatron-LM turns it off and runs -------------------------------


def test_sequence_parallel_at_tp_1_is_read_off(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before ("sequence_parallel needs tp >= 2"): validate_args turns it off at tp 1
    with a warning, and the command runs."""
    script = tmp_path / "train.sh"
    script.write_text(COMMAND + " --sequence-parallel\n")
    assert read_megatron_command(str(script)).layout_fields["sequence_parallel"] is False
    code, _, err = run(capsys, "--from-megatron", str(script), "--backend", "simulate",
                       "--dry-run")
    assert code == 0, err
    script.write_text(COMMAND + " --sequence-parallel --tensor-model-parallel-size 2\n")
    assert read_megatron_command(str(script)).layout_fields["sequence_parallel"] is True


@pytest.mark.parametrize(("tp", "sp", "kept"), [
    (2, False, False),   # would turn sequence parallelism on at tp 2: taken out
    (2, True, True),
    (1, False, True),    # still ignored at tp 1: the user's bytes stay
])
def test_the_export_takes_out_a_sequence_parallel_the_new_layout_lacks(
        tmp_path: Path, tp: int, sp: bool, kept: bool) -> None:
    script = tmp_path / "train.sh"
    script.write_text(COMMAND + " --sequence-parallel\n")
    command = read_megatron_command(str(script))
    old = megatron_layout(command, 8)
    new = replace(old, tp=tp, dp=8 // tp, sequence_parallel=sp)
    patched = patch_script(command, new, layout_changes(command, old, new))
    assert ("--sequence-parallel" in patched) == kept
    assert patched.count("--sequence-parallel") <= 1
    (tmp_path / "tuned.sh").write_text(patched)
    assert megatron_layout(read_megatron_command(str(tmp_path / "tuned.sh")), 8) == new


# -- --group-query-attention without --num-query-groups ------------------------------------------


@pytest.mark.parametrize(("extra", "groups"), [
    (" --group-query-attention", 1),                          # argparse's default: one group
    (" --group-query-attention --num-query-groups 4", 4),
    (" --num-query-groups 4", None),                          # unread without the switch
    ("", None),
])
def test_query_groups_are_read_as_megatron_lm_builds_them(tmp_path: Path, extra: str,
                                                          groups: int | None) -> None:
    """`--group-query-attention` alone was read as one group per head (MHA); Megatron-LM's
    --num-query-groups defaults to 1, so it builds multi-query attention."""
    script = tmp_path / "train.sh"
    script.write_text(COMMAND + extra + "\n")
    assert read_megatron_command(str(script)).model.num_query_groups == groups


# -- what Megatron-LM's validate_args refuses or reads otherwise ---------------------------------


@pytest.mark.parametrize(("text", "message"), [
    (COMMAND.replace("--max-position-embeddings 4096", "--max-position-embeddings 2048"),
     "--max-position-embeddings 2048 is below --seq-length 4096; Megatron-LM refuses it"),
    (COMMAND.replace(" --max-position-embeddings 4096", ""),
     "the command has no --max-position-embeddings, which Megatron-LM requires"),
    (COMMAND.replace(" --max-position-embeddings 4096", "") + " --position-embedding-type rope",
     "the command has no --max-position-embeddings"),
])
def test_positions_megatron_lm_refuses_are_refused(tmp_path: Path, text: str,
                                                   message: str) -> None:
    """Predicted before ("yours: ... fits") though validate_args stops the command: it requires
    --max-position-embeddings and asserts it is at least the sequence."""
    script = tmp_path / "train.sh"
    script.write_text(text + "\n")
    with pytest.raises(ConfigError, match=re.escape(message)):
        read_megatron_command(str(script))


def test_num_experts_0_is_a_dense_model(tmp_path: Path) -> None:
    """Refused before ("num_experts must be a positive integer, got 0"); validate_args reads
    --num-experts 0 as no experts."""
    script = tmp_path / "train.sh"
    script.write_text(COMMAND + " --num-experts 0\n")
    assert read_megatron_command(str(script)).model.num_experts is None


# -- a tensor-parallel group across two nodes -------------------------------------------------


@pytest.mark.parametrize(("gpus", "per_node", "tp", "refused"), [
    (12, 6, 4, True),     # ranks 4-7: two of node 0, two of node 1
    (24, 6, 4, True),
    (12, 4, 3, True),
    (12, 6, 3, False),
    (12, 6, 2, False),
    (12, 6, 6, False),
    (16, 8, 8, False),
    (6, 6, 2, False),     # one node: every group is inside it
    (4, 6, 4, False),     # --gpus-per-node 6 on 4 GPUs: one node of 4
])
def test_tp_must_divide_the_gpus_of_a_node_on_several_nodes(gpus: int, per_node: int, tp: int,
                                                            refused: bool) -> None:
    """tp 4 on nodes of 6 was accepted and priced at NVLink speed, though Megatron's tp groups
    (tp consecutive ranks) then straddle two nodes."""
    from autotune.layouts.layout import Layout, check
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.presets import load_model

    model = load_model("gpt-7.5b")  # 32 heads, 36 layers
    cluster = ClusterSpec.make(gpus, min(per_node, gpus), "h100-80gb")
    layout = Layout(tp=tp, dp=gpus // tp, gbs=gpus * 4)
    broken = {v.rule for v in check(layout, model, cluster)}
    assert ("tp_node" in broken) == refused


@pytest.mark.parametrize(("gpus", "per_node", "pp", "straddles"), [
    (12, 6, 3, True),     # dp groups of 4 consecutive ranks: ranks 4-7 on two nodes
    (12, 4, 3, False),
    (12, 6, 2, False),    # dp groups of 6: one node each
    (24, 8, 3, False),
])
def test_a_group_that_straddles_nodes_is_priced_over_the_network(
        gpus: int, per_node: int, pp: int, straddles: bool) -> None:
    """A data-parallel group of 4 consecutive ranks on nodes of 6 was priced at NVLink speed;
    the slowest of the groups sets the step's pace."""
    from autotune.layouts.layout import Layout
    from autotune.predict.cost import estimate_cost
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.presets import load_model

    model = load_model("gpt-7.5b")  # 36 layers
    layout = Layout(pp=pp, dp=gpus // pp, gbs=8 * gpus, overlap_grad_reduce=False)
    priced = estimate_cost(model, layout, ClusterSpec.make(gpus, per_node, "h100-80gb"))
    # The same layout on one node that holds every group: NVLink throughout.
    nvlink = estimate_cost(model, layout, ClusterSpec.make(gpus, gpus, "h100-80gb"))
    assert (priced.dp_comm_s > nvlink.dp_comm_s * 2) == straddles


# -- estimate --layout FILE with options that say otherwise ------------------------------------


@pytest.mark.parametrize(("extra", "message"), [
    (["--tp", "2"], "sets tp 1; the options say --tp 2"),
    (["--tensor-model-parallel-size", "2", "--mbs", "4"],
     "sets tp 1, mbs 2; the options say --tp 2, --mbs 4"),
    (["--gbs", "128"], "sets gbs 16; the options say --gbs 128"),
    (["--recompute", "full"], "sets recompute none; the options say --recompute full"),
    (["--seq-len", "2048"], "says seq_length 1024; --seq-len says 2048"),
    (["--gpu", "h200"], "says gpu h100-80gb; --gpu says h200"),
    (["--gpus-per-node", "2"], "says gpus_per_node 4; --gpus-per-node says 2"),
])
def test_an_option_the_layout_file_contradicts_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
        message: str) -> None:
    """The file's values won in silence: `--tp 2 --layout FILE` estimated the file's tp 1."""
    path = tmp_path / "layout.json"
    path.write_text(json.dumps({"tp": 1, "pp": 2, "mbs": 2, "gbs": 16, "recompute": "none",
                                "model": "gpt2", "gpus": 4, "gpu": "h100-80gb",
                                "seq_length": 1024, "gpus_per_node": 4}))
    code, out, err = run(capsys, "estimate", "--layout", str(path), *extra)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("extra", [[], ["--tp", "1"], ["--gbs", "16"], ["--seq-len", "1024"],
                                   ["--impl", "te"]])
def test_options_the_layout_file_agrees_with_or_leaves_out_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]) -> None:
    path = tmp_path / "layout.json"
    path.write_text(json.dumps({"tp": 1, "pp": 2, "mbs": 2, "gbs": 16, "model": "gpt2",
                                "gpus": 4, "seq_length": 1024}))
    code, _, err = run(capsys, "estimate", "--layout", str(path), *extra)
    assert code == 0, err


# -- --encoder-seq-length, Megatron-LM's other spelling of the sequence --------------------------

_NO_SEQ = COMMAND.replace(" --seq-length 4096", "")


@pytest.mark.parametrize(("command", "seq", "message"), [
    # validate_args: without --seq-length, seq_length = encoder_seq_length.
    (_NO_SEQ + " --encoder-seq-length 2048", 2048, None),
    (COMMAND, 4096, None),
    # validate_args asserts encoder_seq_length is None when --seq-length is given.
    (COMMAND + " --encoder-seq-length 4096", None, "both --seq-length and --encoder-seq-length"),
    (_NO_SEQ + " --encoder-seq-length 8192", None,
     "--max-position-embeddings 4096 is below --seq-length 8192"),
    (_NO_SEQ, None, "the command has no --seq-length"),
])
def test_encoder_seq_length_is_read_as_megatron_lm_does(
        tmp_path: Path, command: str, seq: int | None, message: str | None) -> None:
    """`--encoder-seq-length N` alone was refused as "no --seq-length" (Megatron-LM runs it
    with seq_length N); with --seq-length too it was planned, though Megatron-LM refuses it."""
    script = tmp_path / "train.sh"
    script.write_text(command + "\n")
    if message is None:
        assert read_megatron_command(str(script)).model.seq_length == seq
    else:
        with pytest.raises(ConfigError, match=re.escape(message)):
            read_megatron_command(str(script))


# -- a command in fp32 (neither --bf16 nor --fp16) ---------------------------------------------


@pytest.mark.parametrize(("command", "fp32"), [
    (COMMAND, False),
    (COMMAND.replace(" --bf16", ""), True),
    (COMMAND.replace(" --bf16", " --fp16"), False),     # warned about as --fp16
])
def test_an_fp32_command_is_warned_about(tmp_path: Path, command: str, fp32: bool) -> None:
    """Megatron-LM trains in fp32 without --bf16 or --fp16; autotune predicted the bf16 run
    for it (half the memory, tensor-core speed) without a word."""
    script = tmp_path / "train.sh"
    script.write_text(command + "\n")
    warning = unmodeled_warning(read_megatron_command(str(script))) or ""
    assert ("neither --bf16 nor --fp16" in warning) == fp32, warning


@pytest.mark.parametrize(("extra", "kv_channels", "width"), [
    (" --kv-channels 128", 128, 4096),
    (" --kv-channels=96", 96, 3072),
    ("", None, 2048),
])
def test_kv_channels_are_read_and_written_back(tmp_path: Path, extra: str,
                                               kv_channels: int | None, width: int) -> None:
    """Megatron-LM's --kv-channels (a head dimension other than hidden / heads, as Qwen3's) is
    the model's; the flags autotune writes carry it back."""
    from autotune.layouts.layout import Layout
    from autotune.megatron.megatron_args import megatron_lm_args

    script = tmp_path / "train.sh"
    script.write_text(COMMAND + extra + "\n")
    model = read_megatron_command(str(script)).model
    assert model.kv_channels == kv_channels and model.attention_width == width
    args = megatron_lm_args(model, Layout(gbs=64))
    if kv_channels is None:
        assert "--kv-channels" not in args
    else:
        assert args[args.index("--kv-channels") + 1] == str(kv_channels)


@pytest.mark.parametrize(("extra", "qkv_bias", "qk_norm"), [
    (" --add-qkv-bias", True, False),                  # Qwen2
    (" --qk-layernorm --kv-channels 128", False, True),  # Qwen3
    ("", False, False),
])
def test_qwen_attention_flags_are_read_and_written_back(tmp_path: Path, extra: str,
                                                        qkv_bias: bool, qk_norm: bool) -> None:
    """Megatron-LM's --add-qkv-bias and --qk-layernorm are the model's (counted, modelled, run by
    the worker); the flags autotune writes carry them back, and nothing warns about them."""
    from autotune.layouts.layout import Layout
    from autotune.megatron.megatron_args import megatron_lm_args

    script = tmp_path / "train.sh"
    script.write_text(COMMAND + " --disable-bias-linear" + extra + "\n")
    command = read_megatron_command(str(script))
    assert (command.model.add_qkv_bias, command.model.qk_layernorm) == (qkv_bias, qk_norm)
    assert unmodeled_warning(command) is None
    args = megatron_lm_args(command.model, Layout(gbs=64))
    assert ("--add-qkv-bias" in args, "--qk-layernorm" in args) == (qkv_bias, qk_norm)


@pytest.mark.parametrize(("extra", "width", "gate"), [
    (" --moe-shared-expert-intermediate-size 4096", 4096, False),
    (" --moe-shared-expert-intermediate-size 4096 --moe-shared-expert-gate", 4096, True),
    (" --moe-shared-expert-intermediate-size 0", None, False),
    ("", None, False),
])
def test_shared_expert_flags_both_ways(tmp_path: Path, extra: str, width: int | None,
                                       gate: bool) -> None:
    """Megatron-LM's shared expert (Qwen2-MoE's, DeepSeekMoE's) is the model's: read, counted
    and written back, so the export runs the user's MoE layer and nothing warns about it."""
    from autotune.layouts.layout import Layout
    from autotune.megatron.megatron_args import megatron_lm_args

    script = tmp_path / "train.sh"
    script.write_text(COMMAND + MOE + " --disable-bias-linear" + extra + "\n")
    command = read_megatron_command(str(script))
    model = command.model
    assert (model.moe_shared_expert_intermediate_size, model.moe_shared_expert_gate) \
        == (width, gate)
    assert unmodeled_warning(command) is None
    args = megatron_lm_args(model, Layout(gbs=64))
    written = args[args.index("--moe-shared-expert-intermediate-size") + 1] \
        if "--moe-shared-expert-intermediate-size" in args else None
    assert written == (str(width) if width else None)
    assert ("--moe-shared-expert-gate" in args) == gate


MLA_COMMAND = COMMAND + " --position-embedding-type rope --multi-latent-attention"


@pytest.mark.parametrize(("extra", "sizes"), [
    # Megatron-LM's defaults (arguments.py _add_mla_args): no query latent, kv_lora_rank 32,
    # qk_head_dim 128, qk_pos_emb_head_dim 64, v_head_dim 128.
    ("", (None, 32, 128, 64, 128)),
    # DeepSeek-V2-Lite's and V3's.
    (" --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 "
     "--qk-layernorm", (None, 512, 128, 64, 128)),
    (" --q-lora-rank 1536 --kv-lora-rank 512 --qk-layernorm", (1536, 512, 128, 64, 128)),
    (" --q-lora-rank=768 --kv-lora-rank=256 --qk-head-dim=64 --qk-pos-emb-head-dim=32 "
     "--v-head-dim=64", (768, 256, 64, 32, 64)),
    # NVIDIA's DeepSeek-V3 script (Megatron-LM examples/megatron_fsdp) also passes
    # --kv-channels 128, which MLA never reads: no kv_channels, none written back.
    (" --kv-channels 128 --q-lora-rank 1536 --kv-lora-rank 512 --qk-layernorm",
     (1536, 512, 128, 64, 128)),
])
def test_mla_flags_both_ways(tmp_path: Path, extra: str,
                             sizes: tuple[int | None, ...]) -> None:
    """Megatron-LM's Multi-Latent Attention is the model's: read with its sizes (Megatron-LM's
    defaults where the command gives none), and written back explicitly; no warning."""
    from autotune.layouts.layout import Layout
    from autotune.megatron.megatron_args import megatron_lm_args

    script = tmp_path / "train.sh"
    script.write_text(MLA_COMMAND + extra + "\n")
    command = read_megatron_command(str(script))
    model = command.model
    assert model.multi_latent_attention
    assert (model.q_lora_rank, model.kv_lora_rank, model.qk_head_dim,
            model.qk_pos_emb_head_dim, model.v_head_dim) == sizes
    assert unmodeled_warning(command) is None
    args = megatron_lm_args(model, Layout(gbs=64))
    assert "--multi-latent-attention" in args
    assert model.kv_channels is None and "--kv-channels" not in args
    written = {flag: args[args.index(flag) + 1] if flag in args else None
               for flag in ("--q-lora-rank", "--kv-lora-rank", "--qk-head-dim",
                            "--qk-pos-emb-head-dim", "--v-head-dim")}
    assert tuple(None if v is None else int(v) for v in written.values()) == sizes
    # The sizes alone, without --multi-latent-attention, are no MLA (Megatron-LM ignores them).
    script.write_text(COMMAND + " --position-embedding-type rope --kv-lora-rank 512\n")
    assert not read_megatron_command(str(script)).model.multi_latent_attention


@pytest.mark.parametrize(("freq", "pattern", "written"), [
    ("'([0]*3+[1]*21)'", (0, 0, 0) + (1,) * 21, "[0]*3+[1]*21"),   # DeepSeek's dense first layers
    ("'([1]*3+[0]*1)*6'", (1, 1, 1, 0) * 6, "+".join(["[1]*3+[0]"] * 6)),
    ("2", 2, "2"),                                                     # every other layer MoE
    ("1", 1, None),
])
def test_moe_layer_freq_both_ways(tmp_path: Path, freq: str, pattern: object,
                                  written: str | None) -> None:
    """--moe-layer-freq is the model's: read without evaluating it, written back as a list
    expression Megatron-LM's moe_freq_type takes, and read back the same from the exported
    script (whose shell quoting keeps the brackets and stars from bash)."""
    from autotune.layouts.layout import Layout
    from autotune.megatron.megatron_args import megatron_lm_args
    from autotune.report.scripts import megatron_lm_script

    script = tmp_path / "train.sh"
    script.write_text(COMMAND + MOE + " --moe-layer-freq " + freq + "\n")
    model = read_megatron_command(str(script)).model
    assert model.moe_layer_freq == pattern
    args = megatron_lm_args(model, Layout(gbs=64))
    assert (args[args.index("--moe-layer-freq") + 1] if "--moe-layer-freq" in args
            else None) == written
    exported = tmp_path / "exported.sh"
    exported.write_text(megatron_lm_script(model, Layout(gbs=64), title=["round trip"]))
    assert read_megatron_command(str(exported)).model.moe_layer_freq == pattern
