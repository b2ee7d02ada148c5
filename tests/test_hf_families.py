"""config.json families beyond Llama and Qwen: Nemotron, Granite, Phi-3, StarCoder2 mapped
(sizes, shapes, transformers' defaults, notes, the exported flags read back, a simulated
plan), and the families that need modelling autotune lacks refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.errors import ConfigError
from autotune.layouts.layout import Layout
from autotune.megatron.core_config import core_config
from autotune.megatron.megatron_args import megatron_lm_args
from autotune.megatron.megatron_command import read_megatron_command
from autotune.report.scripts import megatron_lm_script
from autotune.specs.hf_config import UNMAPPED, read_hf_config
from autotune.specs.params import count_parameters

HF = Path(__file__).parent / "data" / "hf"

FAMILIES = ("minitron-8b-base.json", "granite-3.0-8b-base.json", "phi-3-mini-4k-instruct.json",
            "starcoder2-7b.json")


def _config(tmp_path: Path, data: dict[str, object]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def _changed(tmp_path: Path, file: str, change: dict[str, object]) -> Path:
    data = json.loads((HF / file).read_text())
    data.update(change)
    return _config(tmp_path, {k: v for k, v in data.items() if v is not None})


@pytest.mark.parametrize(("file", "published", "parameters"), [
    # The sizes the checkpoints publish (tests/data/hf/README.md); the count is Megatron's,
    # its vocabulary padded to a multiple of 128 (Phi-3's 32064 -> 32128: +393,216 over the
    # checkpoint's 3,821,079,552; Granite's 49155 -> 49280: +512,000).
    ("minitron-8b-base.json", 8.27e9, 8_271_699_968),
    ("granite-3.0-8b-base.json", 8.17e9, 8_171_360_256),
    ("phi-3-mini-4k-instruct.json", 3.82e9, 3_821_472_768),
    ("starcoder2-7b.json", 7.17e9, 7_173_923_840),
])
def test_published_sizes(file: str, published: float, parameters: int) -> None:
    counted = count_parameters(read_hf_config(str(HF / file)).spec)
    assert counted == parameters
    assert counted == pytest.approx(published, rel=0.005)


@pytest.mark.parametrize(("file", "shape"), [
    # Nemotron: squared ReLU, LayerNorm 1p with bias, half the head rotated, head_dim 128 of
    # its own (48 x 128 over hidden 4096), untied, no biases.
    ("minitron-8b-base.json", {
        "activation": "squared_relu", "gated_linear_unit": False, "normalization": "LayerNorm",
        "apply_layernorm_1p": True, "rotary_percent": 0.5, "add_bias_linear": False,
        "tied_embeddings": False, "num_query_groups": 8, "kv_channels": 128,
        "seq_length": 4096, "hidden_dropout": 0.0, "position_embedding": "rope"}),
    # Granite: Llama's shape; attention dropout 0.1 as published, tied embeddings.
    ("granite-3.0-8b-base.json", {
        "activation": "swiglu", "gated_linear_unit": True, "normalization": "RMSNorm",
        "apply_layernorm_1p": False, "rotary_percent": 1.0, "add_bias_linear": False,
        "tied_embeddings": True, "num_query_groups": 8, "attention_dropout": 0.1,
        "seq_length": 4096}),
    # Phi-3: Llama's shape (its fused qkv_proj and gate_up_proj are how the checkpoint stores
    # the same matrices); the window of 2047 in use makes the default sequence.
    ("phi-3-mini-4k-instruct.json", {
        "activation": "swiglu", "normalization": "RMSNorm", "num_query_groups": 32,
        "tied_embeddings": False, "sliding_window": 2047, "seq_length": 2047,
        "rotary_percent": 1.0, "hidden_dropout": 0.0}),
    # StarCoder2: GELU with biases everywhere, LayerNorm, GQA 4, tied, dropouts 0.1.
    ("starcoder2-7b.json", {
        "activation": "gelu", "gated_linear_unit": False, "normalization": "LayerNorm",
        "add_bias_linear": True, "tied_embeddings": True, "num_query_groups": 4,
        "sliding_window": 4096, "seq_length": 4096, "max_position_embeddings": 16384,
        "rotary_base": 1000000, "hidden_dropout": 0.1, "attention_dropout": 0.1,
        "apply_layernorm_1p": False}),
], ids=lambda v: v if isinstance(v, str) else "")
def test_each_family_maps_to_its_shape(file: str, shape: dict[str, object]) -> None:
    model = read_hf_config(str(HF / file)).spec
    assert {field: getattr(model, field) for field in shape} == shape


@pytest.mark.parametrize(("data", "expected"), [
    # transformers' defaults where a key is left out (configuration_<model>.py): NemotronConfig
    # relu2, partial_rotary_factor 0.5, untied, 4096 positions, GQA off.
    ({"model_type": "nemotron"}, {"activation": "squared_relu", "rotary_percent": 0.5,
                                  "tied_embeddings": False, "max_position_embeddings": 4096,
                                  "num_query_groups": 8, "apply_layernorm_1p": True}),
    # Starcoder2Config: 2 key/value heads, biases, tied embeddings, no window.
    ({"model_type": "starcoder2"}, {"num_query_groups": 2, "add_bias_linear": True,
                                    "tied_embeddings": True, "sliding_window": None,
                                    "seq_length": 4096, "hidden_dropout": 0.0}),
    # Phi3Config: whole heads rotated, no window, untied.
    ({"model_type": "phi3"}, {"rotary_percent": 1.0, "sliding_window": None,
                              "tied_embeddings": False, "seq_length": 4096}),
    ({"model_type": "granite"}, {"tied_embeddings": False, "max_position_embeddings": 2048}),
    # transformers >= 5 writes rope_theta and partial_rotary_factor into rope_parameters.
    ({"model_type": "phi3", "rope_parameters": {"rope_type": "default", "rope_theta": 250000.0,
                                                "partial_rotary_factor": 0.75}},
     {"rotary_base": 250000, "rotary_percent": 0.75}),
    ({"model_type": "nemotron", "partial_rotary_factor": 1.0}, {"rotary_percent": 1.0}),
    # Llama's RoPE rotates whole heads whatever the key says (modeling_llama.py reads no factor).
    ({"model_type": "llama", "partial_rotary_factor": 0.5}, {"rotary_percent": 1.0}),
])
def test_keys_left_out_take_transformers_defaults(tmp_path: Path, data: dict[str, object],
                                                  expected: dict[str, object]) -> None:
    base = {"hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 4,
            "intermediate_size": 4096, "vocab_size": 32000}
    if data["model_type"] == "nemotron":
        base["num_key_value_heads"] = 8
    model = read_hf_config(str(_config(tmp_path, {**base, **data}))).spec
    assert {field: getattr(model, field) for field in expected} == expected


@pytest.mark.parametrize(("file", "change", "line"), [
    ("minitron-8b-base.json", {"hidden_act": "silu"},
     "hidden_act 'silu': autotune maps Nemotron's squared-ReLU MLP (relu2, Megatron "
     "--squared-relu) only"),
    ("minitron-8b-base.json", {"mlp_bias": True},
     "attention_bias / mlp_bias with squared ReLU: megatron-core fuses a bias with gelu and "
     "swiglu only, and autotune models Nemotron without biases, as it is published"),
    ("minitron-8b-base.json", {"partial_rotary_factor": 0},
     "partial_rotary_factor must be in (0, 1], got 0"),
    ("minitron-8b-base.json", {"partial_rotary_factor": 1.5},
     "partial_rotary_factor must be in (0, 1], got 1.5"),
    ("minitron-8b-base.json", {"num_key_value_heads": 5},
     "num_key_value_heads 5 must divide num_attention_heads 48"),
    ("starcoder2-7b.json", {"hidden_act": "relu"},
     "hidden_act 'relu' has no Megatron-LM equivalent autotune models (gelu)"),
    ("starcoder2-7b.json", {"num_key_value_heads": 5},
     "num_key_value_heads 5 must divide num_attention_heads 36"),
    ("starcoder2-7b.json", {"use_bias": "yes"}, "use_bias must be true or false, got 'yes'"),
    ("phi-3-mini-4k-instruct.json", {"hidden_act": "gelu"},
     "hidden_act 'gelu': autotune maps the SwiGLU (silu-gated) MLP of these models only"),
    ("granite-3.0-8b-base.json", {"attention_bias": True},
     "attention_bias / mlp_bias on some layers only: autotune's models have biases on every "
     "linear layer or none"),
], ids=lambda v: v if isinstance(v, str) and v.endswith(".json") else "")
def test_what_a_family_cannot_map_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], file: str,
        change: dict[str, object], line: str) -> None:
    path = _changed(tmp_path, file, change)
    assert main([str(path), "--gpus", "8", "--dry-run"]) == 2
    assert capsys.readouterr().err == f"autotune: error: {path}: {line}\n"


def test_a_rotated_share_of_no_even_width_is_refused(tmp_path: Path) -> None:
    # 128 x 0.01 = 1 dimension: RoPE rotates pairs (megatron-core's inv_freq over arange(0,
    # dim, 2)), so the model is refused rather than built with a rotation of nothing.
    path = _changed(tmp_path, "minitron-8b-base.json", {"partial_rotary_factor": 0.01})
    with pytest.raises(ConfigError, match=r"an even number of rotated dimensions "
                                          r"\(int\(128 x 0.01\) = 1\)"):
        read_hf_config(str(path))


@pytest.mark.parametrize(("model_type", "key"), [
    ("gemma", "hidden_activation"), ("gemma2", "attn_logit_softcapping"),
    ("gemma3", "layer_types"), ("gemma3_text", "layer_types"), ("cohere", "parallel"),
    ("cohere2", "layer_types"), ("phi", "parallel"), ("gpt_neox", "use_parallel_residual"),
    ("falcon", "parallel_attn"), ("olmo2", "post_feedforward_layernorm"),
    ("nemotron_h", "hybrid_override_pattern"),
])
def test_families_needing_other_modelling_are_refused_with_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], model_type: str, key: str) -> None:
    path = _changed(tmp_path, "phi-3-mini-4k-instruct.json", {"model_type": model_type})
    assert main([str(path), "--gpus", "8", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err == f"autotune: error: {path}: model_type {model_type}: {UNMAPPED[model_type]}\n"
    assert key in err


@pytest.mark.parametrize(("file", "change", "noted"), [
    ("granite-3.0-8b-base.json", {},
     "Granite's multipliers (embedding_multiplier 12, residual_multiplier 0.22, "
     "attention_multiplier 0.0078125, logits_scaling 16)"),
    ("phi-3-mini-4k-instruct.json", {}, "sliding_window 2047 is in use"),
    ("starcoder2-7b.json", {}, "sliding_window 4096 is in use"),
    ("starcoder2-7b.json", {"embedding_dropout": 0.0},
     "embedding_dropout 0 differs from the residual dropout 0.1"),
    ("phi-3-mini-4k-instruct.json", {"embd_pdrop": 0.1},
     "embd_pdrop 0.1 differs from the residual dropout 0"),
    ("phi-3-mini-4k-instruct.json",
     {"rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}},
     "rope_scaling (longrope) changes positions"),
], ids=lambda v: v if isinstance(v, str) and v.endswith(".json") else "")
def test_what_changes_no_shape_is_noted(tmp_path: Path, file: str, change: dict[str, object],
                                        noted: str) -> None:
    notes = read_hf_config(str(_changed(tmp_path, file, change))).notes
    assert [n for n in notes if n.startswith(noted)], notes


@pytest.mark.parametrize(("file", "change"), [
    ("granite-3.0-8b-base.json", {"embedding_multiplier": 1.0, "residual_multiplier": 1.0,
                                  "attention_multiplier": 1.0, "logits_scaling": 1.0}),
    ("phi-3-mini-4k-instruct.json", {"sliding_window": None}),
    ("minitron-8b-base.json", {}),
])
def test_nothing_to_note(tmp_path: Path, file: str, change: dict[str, object]) -> None:
    assert read_hf_config(str(_changed(tmp_path, file, change))).notes == ()


@pytest.mark.parametrize(("file", "present", "absent"), [
    ("minitron-8b-base.json",
     ["--squared-relu", "--apply-layernorm-1p", "--rotary-percent 0.5", "--disable-bias-linear",
      "--untie-embeddings-and-output-weights", "--normalization LayerNorm", "--kv-channels 128",
      "--num-query-groups 8", "--hidden-dropout 0.0", "--attention-dropout 0.0"],
     ["--swiglu"]),
    ("granite-3.0-8b-base.json",
     # Attention dropout 0.1 is Megatron-LM's default: no flag.
     ["--swiglu", "--normalization RMSNorm", "--hidden-dropout 0.0"],
     ["--rotary-percent", "--apply-layernorm-1p", "--untie-embeddings-and-output-weights",
      "--attention-dropout"]),
    ("phi-3-mini-4k-instruct.json",
     ["--swiglu", "--seq-length 2047", "--untie-embeddings-and-output-weights"],
     ["--group-query-attention", "--rotary-percent"]),
    ("starcoder2-7b.json",
     ["--normalization LayerNorm", "--num-query-groups 4", "--seq-length 4096",
      "--rotary-base 1000000"],
     ["--disable-bias-linear", "--swiglu", "--squared-relu", "--hidden-dropout",
      "--untie-embeddings-and-output-weights"]),
], ids=lambda v: v if isinstance(v, str) else "")
def test_the_export_writes_the_model_megatron_lm_trains(file: str, present: list[str],
                                                        absent: list[str]) -> None:
    args = " ".join(megatron_lm_args(read_hf_config(str(HF / file)).spec, Layout()))
    for flag in present:
        assert f"{flag} " in args + " ", flag
    for flag in absent:
        assert f"{flag} " not in args + " ", flag


@pytest.mark.parametrize("file", FAMILIES)
def test_the_exported_script_reads_back_as_the_same_model(tmp_path: Path, file: str) -> None:
    model = read_hf_config(str(HF / file)).spec
    layout = Layout(tp=2, sequence_parallel=True, mbs=1, gbs=model.global_batch_size)
    script = tmp_path / "run.sh"
    script.write_text(megatron_lm_script(model, layout, title=["families"], nodes=1))
    back = read_megatron_command(str(script)).model
    fields = ("activation", "gated_linear_unit", "normalization", "apply_layernorm_1p",
              "rotary_percent", "add_bias_linear", "tied_embeddings", "query_groups",
              "kv_channels", "rotary_base", "hidden_dropout", "attention_dropout",
              "seq_length")
    assert {f: getattr(back, f) for f in fields} == {f: getattr(model, f) for f in fields}
    assert count_parameters(back) == count_parameters(model)


@pytest.mark.parametrize(("file", "transformer", "gpt"), [
    ("minitron-8b-base.json", {"activation_func": "squared_relu", "gated_linear_unit": False,
                               "bias_activation_fusion": False, "kv_channels": 128,
                               "layernorm_zero_centered_gamma": True},
     {"rotary_percent": 0.5}),
    ("starcoder2-7b.json", {"activation_func": "gelu", "bias_activation_fusion": True,
                            "add_bias_linear": True, "hidden_dropout": 0.1}, {}),
    ("granite-3.0-8b-base.json", {"activation_func": "silu", "gated_linear_unit": True}, {}),
], ids=lambda v: v if isinstance(v, str) else "")
def test_the_worker_builds_the_same_model(file: str, transformer: dict[str, object],
                                          gpt: dict[str, object]) -> None:
    config = core_config(read_hf_config(str(HF / file)).spec, Layout())
    assert {k: config.transformer.get(k) for k in transformer} == transformer
    assert {k: config.model[k] for k in gpt} == gpt
    if not gpt:  # whole-head RoPE and the usual norms keep the run keys of earlier models
        assert "rotary_percent" not in config.model
        assert "layernorm_zero_centered_gamma" not in config.transformer


@pytest.mark.parametrize("file", FAMILIES)
def test_a_simulated_plan_of_each_family(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         file: str) -> None:
    code = main([str(HF / file), "--gpus", "8", "--backend", "simulate", "--trials", "6",
                 "--json", "--results-dir", str(tmp_path / "results")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    best = json.loads(captured.out)["best"]
    assert best and all(b["tokens_per_s"] > 0 for b in best)


@pytest.mark.parametrize(("edit", "rotary_percent"), [
    ((), 0.5),
    (("--rotary-percent 0.5", "--rotary-percent 0.25"), 0.25),
    # Megatron-LM hands --rotary-percent to the rotary embedding, which learned positions
    # do not have: the flag means nothing there and is not read.
    (("--position-embedding-type rope", "--position-embedding-type learned_absolute"), 1.0),
])
def test_a_commands_rotary_percent_is_read_with_rope_only(
        tmp_path: Path, edit: tuple[str, ...], rotary_percent: float) -> None:
    model = read_hf_config(str(HF / "minitron-8b-base.json")).spec
    text = megatron_lm_script(model, Layout(gbs=model.global_batch_size), title=["rope"],
                              nodes=1)
    if edit:
        assert edit[0] in text
        text = text.replace(*edit)
    script = tmp_path / "run.sh"
    script.write_text(text)
    assert read_megatron_command(str(script)).model.rotary_percent == rotary_percent


@pytest.mark.parametrize(("kind", "positions"), [
    # transformers' configuration_<model>.py defaults where a config leaves the key out.
    ("llama", 2048), ("granite", 2048), ("phi3", 4096), ("mistral", 131072),
    ("mixtral", 131072), ("qwen2", 32768), ("qwen2_moe", 32768), ("qwen3", 32768),
    ("qwen3_moe", 32768),
])
def test_positions_default_per_family(tmp_path: Path, kind: str, positions: int) -> None:
    data: dict[str, object] = {
        "model_type": kind, "hidden_size": 1024, "num_attention_heads": 16,
        "num_hidden_layers": 4, "intermediate_size": 4096, "vocab_size": 32000,
        "use_sliding_window": False, "sliding_window": None}
    spec = read_hf_config(str(_config(tmp_path, {k: v for k, v in data.items()
                                                 if v is not None}))).spec
    assert spec.max_position_embeddings == positions
    assert spec.seq_length == min(positions, 8192)


def test_every_llama_like_family_has_a_positions_default() -> None:
    from autotune.specs import hf_config

    assert set(hf_config._POSITIONS_DEFAULT) == set(hf_config._LLAMA_LIKE)
