"""Odd config.json values a new user may paste: each refused in one line naming the file (exit
2), or planned as Megatron would run it, with the line that says how."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.dimensions import Impl
from autotune.errors import ConfigError
from autotune.levers.transformer_impl import fused_attention_unavailable
from autotune.search.impls import rankable_impls
from autotune.specs.hf_config import read_hf_config
from autotune.specs.presets import list_presets, load_model

HF = Path(__file__).parent / "data" / "hf"

NO_FUSED = ("head dim {d}: Transformer Engine's fused attention (flash-attn, cuDNN) needs a "
            "multiple of 8 up to 256; impl local (Megatron's unfused attention) runs any")
STORED = ("{key} {value} is how the checkpoint's weights are stored, not how Megatron trains "
          "them: autotune plans bf16 mixed precision (--bf16; FP8 where a layout says so) for "
          "every model")


def _config(tmp_path: Path, change: dict[str, object], base: str = "llama-3-8b.json") -> Path:
    data = json.loads((HF / base).read_text())
    data.update(change)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("change", "line"), [
    # Degenerate sizes: one token has nothing to predict (autotune.inputs.bounds.VOCAB_MIN).
    ({"vocab_size": 1}, "vocab_size must be at least 2, got 1"),
    ({"vocab_size": 0}, "vocab_size must be a positive integer, got 0"),
    ({"intermediate_size": 0}, "intermediate_size must be a positive integer, got 0"),
    ({"max_position_embeddings": 0}, "max_position_embeddings must be a positive integer, got 0"),
    ({"max_position_embeddings": -5},
     "max_position_embeddings must be a positive integer, got -5"),
    ({"max_position_embeddings": 0.5},
     "max_position_embeddings must be a positive integer, got 0.5"),
    # Heads that do not divide: named with the config's own keys.
    ({"num_key_value_heads": 7}, "num_key_value_heads 7 must divide num_attention_heads 32"),
    ({"num_key_value_heads": 64}, "num_key_value_heads 64 must divide num_attention_heads 32"),
    ({"num_attention_heads": 33}, "hidden_size 4096 is not a multiple of num_attention_heads "
                                  "33 and no head_dim says the heads' width"),
    # RoPE's base is Megatron's --rotary-base, an int.
    ({"rope_theta": -10000}, "rope_theta must be a positive whole number, got -10000"),
    ({"rope_theta": 0.5}, "rope_theta must be a positive whole number, got 0.5"),
    # Strings for numbers and flags: refused, not guessed at.
    ({"rope_theta": "500000"}, "rope_theta must be a finite number, got '500000'"),
    ({"hidden_size": "4096"}, "hidden_size must be a positive integer, got '4096'"),
    ({"num_hidden_layers": 32.5}, "num_hidden_layers must be a positive integer, got 32.5"),
    ({"head_dim": "128"}, "head_dim must be a positive integer, got '128'"),
    ({"attention_dropout": 1.5}, "attention_dropout must be at most 1.0, got 1.5"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false, got 'false'"),
    # No torch dtype: transformers' PreTrainedConfig cannot load the file (getattr(torch, ...)).
    ({"torch_dtype": "int33"}, "torch_dtype 'int33' is not a torch dtype, so transformers cannot "
                               "load this config (the usual ones: bfloat16, float16, float32)"),
    ({"torch_dtype": "auto"}, "torch_dtype 'auto' is not a torch dtype, so transformers cannot "
                              "load this config (the usual ones: bfloat16, float16, float32)"),
    ({"torch_dtype": 5}, "torch_dtype 5 is not a torch dtype, so transformers cannot load this "
                         "config (the usual ones: bfloat16, float16, float32)"),
    ({"dtype": "bf16"}, "dtype 'bf16' is not a torch dtype, so transformers cannot load this "
                        "config (the usual ones: bfloat16, float16, float32)"),
])
def test_refused_in_one_line(tmp_path: Path, change: dict[str, object], line: str,
                             capsys: pytest.CaptureFixture[str]) -> None:
    path = _config(tmp_path, change)
    assert main([str(path), "--gpus", "8", "--dry-run"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"autotune: error: {path}: {line}\n"
    assert captured.out == ""


def _plan(tmp_path: Path, path: Path, capsys: pytest.CaptureFixture[str],
          *extra: str) -> tuple[list[str], list[dict[str, object]]]:
    code = main([str(path), "--gpus", "8", "--backend", "simulate", "--trials", "3", "--json",
                 "--results-dir", str(tmp_path / "results"), *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.err.splitlines(), json.loads(captured.out)["best"]


@pytest.mark.parametrize(("change", "head_dim"), [
    ({"head_dim": 7}, 7),
    ({"head_dim": 264}, 264),
    # 4100 / 41: a head dim of the model's default width, not of head_dim.
    ({"hidden_size": 4100, "num_attention_heads": 41, "num_key_value_heads": 41}, 100),
    # hf-internal-testing's tiny-random Llama shape (hidden 16, 4 heads): a real test model.
    ({"hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 4,
      "intermediate_size": 64, "num_hidden_layers": 2}, 4),
])
def test_a_head_dim_fused_attention_cannot_run_plans_local(
        tmp_path: Path, change: dict[str, object], head_dim: int,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Megatron-LM trains it with --transformer-impl local: the plan ranks local only and says
    why in one line, instead of pricing te/sdpa as fused attention that would not run."""
    err, best = _plan(tmp_path, _config(tmp_path, change), capsys)
    assert err == [f"autotune: impl left out: sdpa, te ({NO_FUSED.format(d=head_dim)})"]
    assert best and {b["impl"] for b in best} == {"local"}
    assert {b["cp"] for b in best} == {1} and {b["fp8"] for b in best} == {"off"}


@pytest.mark.parametrize("head_dim", [8, 256])
def test_head_dims_fused_attention_runs_keep_te(tmp_path: Path, head_dim: int,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    err, best = _plan(tmp_path, _config(tmp_path, {"head_dim": head_dim}), capsys)
    assert err == []
    assert "te" in {b["impl"] for b in best}


def test_impl_te_asked_for_such_a_head_dim_is_refused(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = _config(tmp_path, {"head_dim": 7})
    assert main(["estimate", str(path), "--gpus", "8", "--impl", "te"]) == 2
    assert capsys.readouterr().err == f"autotune: error: impl=te: {NO_FUSED.format(d=7)}\n"
    assert main([str(path), "--gpus", "8", "--backend", "simulate", "--impl", "te",
                 "--results-dir", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith(f"(impl=te: {NO_FUSED.format(d=7)})\n")


def test_rankable_impls_leave_fused_impls_out_for_the_model(tmp_path: Path) -> None:
    model = read_hf_config(str(_config(tmp_path, {"head_dim": 12}))).spec
    choice = rankable_impls((Impl.LOCAL, Impl.SDPA, Impl.TE), "simulate", te_installed=False,
                            asked=False, model=model)
    # sdpa's stand-in te is not added back either.
    assert choice.kept == (Impl.LOCAL,)
    assert choice.note() == f"autotune: impl left out: sdpa, te ({NO_FUSED.format(d=12)})"
    with pytest.raises(ConfigError, match="impl candidates te cannot run here"):
        rankable_impls((Impl.TE,), "simulate", te_installed=True, asked=True, model=model)


def test_every_preset_runs_fused_attention() -> None:
    assert [n for n in list_presets() if fused_attention_unavailable(load_model(n))] == []


@pytest.mark.parametrize(("change", "note"), [
    ({"torch_dtype": "float16"}, STORED.format(key="torch_dtype", value="float16")),
    ({"torch_dtype": "float32"}, STORED.format(key="torch_dtype", value="float32")),
    # torch has had sub-byte integer dtypes since 2.6 (torch.int1 ... torch.int7).
    ({"torch_dtype": "int3"}, STORED.format(key="torch_dtype", value="int3")),
    # transformers >= 4.56 writes `dtype`; with both, it wins (PreTrainedConfig.__post_init__).
    ({"torch_dtype": "bfloat16", "dtype": "float32"}, STORED.format(key="dtype",
                                                                    value="float32")),
    ({"torch_dtype": "bfloat16"}, None),
    ({"torch_dtype": None}, None),
])
def test_the_checkpoint_dtype_is_noted_not_trained_in(tmp_path: Path, change: dict[str, object],
                                                      note: str | None) -> None:
    model = read_hf_config(str(_config(tmp_path, change)))
    base = load_model(str(HF / "llama-3-8b.json"))
    assert model.spec == base
    assert list(model.notes) == ([] if note is None else [note])


def test_the_dtype_note_is_logged_by_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            caplog: pytest.LogCaptureFixture) -> None:
    # The CLI's log handler writes to stderr as "autotune: <model>: <note>".
    caplog.set_level("INFO", logger="autotune.specs.hf_config")
    _, best = _plan(tmp_path, _config(tmp_path, {"torch_dtype": "float16"}), capsys)
    assert caplog.messages == ["autotune: Meta-Llama-3-8B: " + STORED.format(
        key="torch_dtype", value="float16")]
    assert best


def test_a_model_file_with_one_token_is_refused(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text("name: tiny\nnum_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n"
                    "vocab_size: 1\nseq_length: 128\nglobal_batch_size: 8\n")
    assert main([str(path), "--gpus", "8", "--dry-run"]) == 2
    assert capsys.readouterr().err == (f"autotune: error: {path}: vocab_size must be at least "
                                       "2, got 1\n")
