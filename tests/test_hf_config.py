"""Hugging Face config.json -> ModelSpec: published sizes, refusals in one line, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.errors import ConfigError
from autotune.specs.hf_config import read_hf_config
from autotune.specs.params import count_parameters, parameter_counts
from autotune.specs.presets import load_model

HF = Path(__file__).parent / "data" / "hf"

SIZE_TOLERANCE = 0.01
"""Relative, against the model cards' rounded sizes; Megatron pads the vocabulary to a multiple
of 128 (gpt2-xl: +75k parameters)."""


@pytest.mark.parametrize(("file", "published", "shape"), [
    ("gpt2-xl.json", 1.5576e9, {"num_layers": 48, "hidden_size": 1600, "tied_embeddings": True,
                                 "position_embedding": "learned_absolute"}),
    ("llama-3-8b.json", 8.03e9, {"num_query_groups": 8, "rotary_base": 500000,
                                  "seq_length": 8192, "tied_embeddings": False}),
    ("llama-3.1-8b.json", 8.03e9, {"max_position_embeddings": 131072, "seq_length": 8192}),
    ("mistral-7b-v0.3.json", 7.25e9, {"vocab_size": 32768, "rotary_base": 1000000}),
    ("mixtral-8x7b-v0.1.json", 46.7e9, {"num_experts": 8, "moe_topk": 2,
                                         "moe_ffn_hidden_size": None}),
    ("qwen2-7b.json", 7.62e9, {"num_query_groups": 4, "ffn_hidden_size": 18944}),
    ("qwen3-8b.json", 8.2e9, {"num_layers": 36, "num_query_groups": 8}),
    ("qwen3-4b.json", 4.0e9, {"kv_channels": 128, "tied_embeddings": True,
                               "qk_layernorm": True}),
    ("qwen1.5-moe-a2.7b.json", 14.3e9, {"num_experts": 60, "moe_topk": 4,
                                         "moe_ffn_hidden_size": 1408,
                                         "moe_shared_expert_intermediate_size": 5632,
                                         "moe_shared_expert_gate": True, "add_qkv_bias": True}),
], ids=lambda v: v if isinstance(v, str) else "")
def test_published_sizes(file: str, published: float, shape: dict[str, object]) -> None:
    model = read_hf_config(str(HF / file)).spec
    assert count_parameters(model) == pytest.approx(published, rel=SIZE_TOLERANCE)
    for field, value in shape.items():
        assert getattr(model, field) == value, field


@pytest.mark.parametrize(("file", "parameters"), [
    # The checkpoints' own counts: model.safetensors.index.json's metadata.total_size / 2 (bf16
    # weights). Their vocabularies are multiples of 128, so Megatron pads nothing; every feature
    # counts to the parameter: GQA, tied and untied embeddings, MoE, Qwen2's QKV bias (28 x
    # 4,608 of 7.6B), Qwen3's QK norm (36 x 256) and head dimension of its own.
    ("llama-3-8b.json", 8_030_261_248),
    ("llama-3.2-3b.json", 3_212_749_824),
    ("mistral-7b-v0.1.json", 7_241_732_096),
    ("mistral-7b-v0.3.json", 7_248_023_552),
    ("mixtral-8x7b-v0.1.json", 46_702_792_704),
    ("qwen2-7b.json", 7_615_616_512),
    ("qwen3-8b.json", 8_190_735_360),
    ("qwen3-30b-a3b.json", 30_532_122_624),
])
def test_checkpoint_sizes_to_the_parameter(file: str, parameters: int) -> None:
    assert count_parameters(read_hf_config(str(HF / file)).spec) == parameters


@pytest.mark.parametrize(("file", "qkv_bias", "qk_norm"), [
    ("qwen2-7b.json", True, False),
    ("qwen3-8b.json", False, True),
    ("qwen3-30b-a3b.json", False, True),
    ("llama-3-8b.json", False, False),
    ("mixtral-8x7b-v0.1.json", False, False),
])
def test_qwen_attention_features_are_read(file: str, qkv_bias: bool, qk_norm: bool) -> None:
    read = read_hf_config(str(HF / file))
    assert (read.spec.add_qkv_bias, read.spec.qk_layernorm) == (qkv_bias, qk_norm)
    assert not any("left out" in n for n in read.notes)


def test_llama_is_swiglu_rmsnorm_rope_without_biases() -> None:
    m = read_hf_config(str(HF / "llama-3-8b.json")).spec
    assert (m.activation, m.gated_linear_unit, m.normalization, m.add_bias_linear,
            m.position_embedding, m.hidden_dropout) == ("swiglu", True, "RMSNorm", False,
                                                       "rope", 0.0)


def test_rope_scaling_is_noted() -> None:
    notes = read_hf_config(str(HF / "llama-3.1-8b.json")).notes
    assert any("rope_scaling (llama3)" in n for n in notes)


def test_a_folder_holding_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((HF / "qwen2-7b.json").read_text())
    assert load_model(str(tmp_path)).hidden_size == 3584


@pytest.mark.parametrize(("change", "message"), [
    ({"model_type": "mamba", "architectures": ["MambaForCausalLM"]},
     "model_type 'mamba' (MambaForCausalLM) is not an architecture autotune maps"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"num_hidden_layers": None}, "no 'num_hidden_layers'"),
    ({"hidden_size": -1}, "hidden_size must be a positive integer"),
    # Each count within its bound, the model they make is not: refused, not planned with
    # figures of 1e18 GiB and 0 tokens/s.
    ({"num_hidden_layers": 10**12}, "parameters, over the 100T"),
    ({"hidden_size": 2**40}, "parameters, over the 100T"),
    ({"intermediate_size": 2**40, "vocab_size": 2**40}, "parameters, over the 100T"),
])
def test_what_cannot_be_mapped_is_refused(tmp_path: Path, change: dict[str, object],
                                          message: str) -> None:
    data = json.loads((HF / "llama-3-8b.json").read_text())
    data.update(change)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_hf_config(str(path))


@pytest.mark.parametrize(("file", "kv_channels", "attention_width", "total", "active"), [
    # Qwen3's model cards: 30.5B total, 3.3B activated; 8.2B. A head dimension of the model's
    # own is kept (Megatron --kv-channels); equal to
    # hidden / heads it stays Megatron's default.
    ("qwen3-30b-a3b.json", 128, 4096, 30.5e9, 3.3e9),
    ("qwen3-8b.json", None, 4096, 8.2e9, 8.2e9),
    ("llama-3-8b.json", None, 4096, 8.0e9, 8.0e9),
])
def test_a_head_dimension_of_its_own_is_read(file: str, kv_channels: int | None,
                                             attention_width: int, total: float,
                                             active: float) -> None:
    from autotune.specs.params import parameter_counts

    model = load_model(str(HF / file))
    assert model.kv_channels == kv_channels and model.attention_width == attention_width
    counts = parameter_counts(model)
    experts = counts.expert_per_layer * model.num_layers
    used = experts * model.moe_topk // model.num_experts if model.is_moe else experts
    assert counts.total == pytest.approx(total, rel=0.01)
    assert counts.total - experts + used == pytest.approx(active, rel=0.02)


@pytest.mark.parametrize("head_dim", [64, 96, 256])
def test_the_head_dimension_sets_the_attention_width_only(tmp_path: Path, head_dim: int) -> None:
    """The query and the attention output are heads x head_dim wide; the residual stream, the
    MLP and K/V per group follow their own fields (megatron-core attention.py's
    query_projection_size and kv_projection_size)."""
    from autotune.specs.flops import forward_flops_per_token
    from autotune.specs.params import parameter_counts

    data = json.loads((HF / "llama-3-8b.json").read_text())
    base = load_model(str(HF / "llama-3-8b.json"))
    data["head_dim"] = head_dim
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    model = load_model(str(path))
    h, heads, groups = 4096, 32, 8
    q_old, q_new = h, heads * head_dim
    kv_old, kv_new = groups * 128, groups * head_dim
    per_layer = parameter_counts(model).dense_per_layer - parameter_counts(base).dense_per_layer
    assert per_layer == h * (q_new - q_old) + h * 2 * (kv_new - kv_old) + h * (q_new - q_old)
    flops = forward_flops_per_token(model) - forward_flops_per_token(base)
    assert flops == pytest.approx(model.num_layers * (2 * per_layer
                                                      + 4 * model.seq_length * (q_new - q_old)))


def test_qwen2_moe_shared_expert_is_read(tmp_path: Path) -> None:
    # transformers' Qwen2MoeSparseMoeBlock: the shared expert's MLP and its 1 x h sigmoid gate,
    # 0 for none; the count moves by exactly their weights per layer.
    data = json.loads((HF / "qwen1.5-moe-a2.7b.json").read_text())
    with_shared = read_hf_config(str(HF / "qwen1.5-moe-a2.7b.json")).spec
    data["shared_expert_intermediate_size"] = 0
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    without = read_hf_config(str(path)).spec
    assert without.moe_shared_expert_intermediate_size is None
    assert not without.moe_shared_expert_gate
    h, f = 2048, 5632
    assert count_parameters(with_shared) - count_parameters(without) == 24 * (3 * h * f + h)


def test_estimate_reads_a_config(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", str(HF / "llama-3-8b.json"), "--gpus", "8", "--tp", "8", "--sp",
                 "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "Meta-Llama-3-8B" and out["layout"]["tp"] == 8


@pytest.mark.parametrize("change", [
    {"model_type": "qwen2_moe", "num_experts": 60, "num_experts_per_tok": 4,
     "moe_intermediate_size": 1408, "shared_expert_intermediate_size": -1},
    {"model_type": "qwen2_moe", "num_experts": 60, "num_experts_per_tok": 4,
     "moe_intermediate_size": 1408, "mlp_only_layers": [0, 99]},   # no layer 99
    {"model_type": "qwen2_moe", "num_experts": 60, "num_experts_per_tok": 4,
     "moe_intermediate_size": 1408, "mlp_only_layers": "0"},
    {"model_type": "qwen2_moe", "num_experts": 60, "num_experts_per_tok": 4,
     "moe_intermediate_size": 1408, "decoder_sparse_step": 100},   # no MoE layer left
    {"hidden_act": "gelu"},
    {"num_hidden_layers": 10**12},
    {"hidden_size": 2**40},
])
def test_cli_refuses_in_one_line(tmp_path: Path, change: dict[str, object],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads((HF / "qwen3-8b.json").read_text())
    data.update(change)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    code = main([str(path), "--gpus", "8", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("autotune: error: ")


@pytest.mark.parametrize(("change", "seq"), [
    ({"model_type": "mistral", "sliding_window": 4096}, 4096),
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 4096}, 4096),
    ({"model_type": "qwen2", "use_sliding_window": False, "sliding_window": 4096}, 8192),
    ({"model_type": "mistral", "sliding_window": None}, 8192),
    ({"model_type": "mistral", "sliding_window": 16384}, 8192),
])
def test_sliding_window_in_use_bounds_the_default_sequence(
        tmp_path: Path, change: dict[str, object], seq: int) -> None:
    # Up to its window, sliding-window attention is full causal attention: the sequence
    # defaults to the window rather than refusing the config (Mistral-7B v0.1).
    data = json.loads((HF / "llama-3-8b.json").read_text())
    data.update(change)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    model = read_hf_config(str(path))
    assert model.spec.seq_length == seq
    assert any("sliding_window" in n for n in model.notes) == (seq == 4096)


@pytest.mark.parametrize(("file", "seq", "refused"), [
    ("mistral-7b-v0.1.json", None, False),
    ("mistral-7b-v0.1.json", 4096, False),
    ("mistral-7b-v0.1.json", 2048, False),
    ("mistral-7b-v0.1.json", 8192, True),
    ("mistral-7b-v0.3.json", 32768, False),
])
def test_seq_len_is_checked_against_the_window(
        file: str, seq: int | None, refused: bool, capsys: pytest.CaptureFixture[str]) -> None:
    # --seq-len is what the window is checked against, not the config's default sequence.
    argv = ["estimate", str(HF / file), "--gpus", "8", "--tp", "8", "--json"]
    code = main(argv + (["--seq-len", str(seq)] if seq else []))
    err = capsys.readouterr().err
    if refused:
        assert code == 2 and err.startswith("autotune: error: ")
        assert err.count("\n") == 1 and "--seq-len 4096 or less" in err
    else:
        assert code == 0, err


@pytest.mark.parametrize(("change", "expected"), [
    # transformers' defaults where the MoE keys are left out (configuration_<model>.py):
    # Qwen3MoeConfig 128 experts, top 8, moe_intermediate_size 768; MixtralConfig 8, top 2.
    ({"model_type": "qwen3_moe"}, {"num_experts": 128, "moe_topk": 8,
                                   "moe_ffn_hidden_size": 768}),
    ({"model_type": "qwen3_moe", "num_experts": 64, "num_experts_per_tok": 4},
     {"num_experts": 64, "moe_topk": 4}),
    ({"model_type": "mixtral"}, {"num_experts": 8, "moe_topk": 2}),
    # Qwen2MoeConfig: 60 experts, top 4, with a gated shared expert of 5632.
    ({"model_type": "qwen2_moe", "moe_intermediate_size": 1408},
     {"num_experts": 60, "moe_topk": 4, "moe_shared_expert_intermediate_size": 5632,
      "moe_shared_expert_gate": True}),
])
def test_moe_keys_left_out_take_transformers_defaults(
        tmp_path: Path, change: dict[str, object], expected: dict[str, int] | str) -> None:
    # Were read as a dense model (no num_experts: no experts) and top-2 whatever the family.
    data = json.loads((HF / "llama-3-8b.json").read_text())
    data.update(change)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match=expected):
            read_hf_config(str(path))
        return
    model = read_hf_config(str(path)).spec
    for field, value in expected.items():
        assert getattr(model, field) == value, field


@pytest.mark.parametrize(("seq", "refused"), [(None, True), (64, False), (32, False),
                                              (128, True)])
def test_a_model_files_window_is_checked_after_seq_len(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], seq: int | None,
        refused: bool) -> None:
    # A model YAML whose seq_length exceeds its sliding_window: --seq-len, which the refusal
    # names, is what makes it usable (it was refused while loading, before --seq-len applied).
    model = tmp_path / "m.yaml"
    model.write_text("name: m\nnum_layers: 2\nhidden_size: 256\nnum_attention_heads: 4\n"
                     "vocab_size: 1000\nseq_length: 128\nglobal_batch_size: 8\n"
                     "sliding_window: 64\n")
    argv = ["estimate", str(model), "--gpus", "1", "--json"]
    code = main(argv + (["--seq-len", str(seq)] if seq else []))
    err = capsys.readouterr().err
    if refused:
        assert code == 2 and err.count("\n") == 1 and "--seq-len 64 or less" in err, err
    else:
        assert code == 0, err


# -- DeepSeek-V2 / V3: Multi-Latent Attention and DeepSeekMoE ---------------------------------

V2_LITE = HF / "deepseek-v2-lite.json"


def _deepseek(tmp_path: Path, change: dict[str, object]) -> Path:
    data = json.loads(V2_LITE.read_text())
    data.update(change)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def test_deepseek_dense_first_layers_are_mapped(capsys: pytest.CaptureFixture[str]) -> None:
    """DeepSeek-V2-Lite's first layer is dense (first_k_dense_replace 1): the model has one
    dense layer among 26 MoE layers (Megatron --moe-layer-freq), counted to its published
    15.7B and planned (it was refused before session 23)."""
    spec = read_hf_config(str(V2_LITE)).spec
    assert spec.moe_layer_freq == (0,) + (1,) * 26 and spec.has_dense_layers
    assert count_parameters(spec) == 15_706_484_224
    code = main([str(V2_LITE), "--gpus", "8", "--dry-run"])
    assert code == 0, capsys.readouterr().err


def test_deepseek_v3_counts_its_published_size() -> None:
    """DeepSeek-V3: 61 layers, the first 3 dense, MLA with a query latent, 256 experts of 2048
    and a shared one: 671B without its MTP module (its technical report and README: "671B of
    the Main Model weights"); the MTP module's own parameters "11.5B unique parameters
    (excluding the shared 0.9B Embedding and 0.9B output Head)" (README_WEIGHTS.md), an MoE
    layer, eh_proj and three norms; with the two shared copies the checkpoint's 685B."""
    spec = read_hf_config(str(HF / "deepseek-v3.json")).spec
    assert spec.moe_layer_freq == (0, 0, 0) + (1,) * 58
    assert spec.mtp_num_layers == 1 and spec.mtp_layer_is_moe
    counts = parameter_counts(spec)
    assert counts.without_mtp == count_parameters(spec.without_mtp) == 671_026_404_352
    assert counts.without_mtp == pytest.approx(671e9, rel=0.001)
    assert counts.total == count_parameters(spec) == 682_636_472_320
    mtp = counts.total - counts.without_mtp
    assert mtp == 11_610_067_968 == pytest.approx(11.5e9, rel=0.01)
    head_and_embedding = 2 * 129_280 * 7168
    assert counts.total + head_and_embedding == pytest.approx(685e9, rel=0.001)


@pytest.mark.parametrize(("change", "pattern"), [
    # transformers' DeepseekV2DecoderLayer: MoE from first_k_dense_replace on, every
    # moe_layer_freq-th layer; Qwen2MoeDecoderLayer: not in mlp_only_layers and every
    # decoder_sparse_step-th layer counted from 1.
    ({"first_k_dense_replace": 3}, (0, 0, 0) + (1,) * 24),
    ({"first_k_dense_replace": 1, "moe_layer_freq": 2}, (0,) + (0, 1) * 13),
    ({"first_k_dense_replace": 0}, 1),
])
def test_deepseek_layer_patterns(tmp_path: Path, change: dict[str, object],
                                 pattern: object) -> None:
    data = {**json.loads(V2_LITE.read_text()), **change}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    assert read_hf_config(str(path)).spec.moe_layer_freq == pattern


@pytest.mark.parametrize(("change", "pattern"), [
    ({"mlp_only_layers": [0, 1]}, (0, 0) + (1,) * 22),
    ({"decoder_sparse_step": 2}, (0, 1) * 12),
    ({"mlp_only_layers": [], "decoder_sparse_step": 1}, 1),
])
def test_qwen_moe_layer_patterns(tmp_path: Path, change: dict[str, object],
                                 pattern: object) -> None:
    data = {**json.loads((HF / "qwen1.5-moe-a2.7b.json").read_text()), **change}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    assert read_hf_config(str(path)).spec.moe_layer_freq == pattern


@pytest.mark.parametrize(("change", "shape"), [
    # V2-Lite with every layer MoE: MLA without a query latent, 64 experts of 1408, top 6, two
    # shared experts as one MLP of 2 x 1408, ungated; the latent norms (kv_a_layernorm).
    ({"first_k_dense_replace": 0},
     {"multi_latent_attention": True, "q_lora_rank": None, "kv_lora_rank": 512,
      "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128, "qk_layernorm": True,
      "num_query_groups": None, "kv_channels": None, "num_experts": 64, "moe_topk": 6,
      "moe_ffn_hidden_size": 1408, "moe_shared_expert_intermediate_size": 2816,
      "moe_shared_expert_gate": False, "position_embedding": "rope", "tied_embeddings": False,
      "seq_length": 8192, "max_position_embeddings": 163840}),
    # V2's and V3's query latent; one shared expert.
    ({"first_k_dense_replace": 0, "q_lora_rank": 1536, "n_shared_experts": 1},
     {"q_lora_rank": 1536, "moe_shared_expert_intermediate_size": 1408}),
    ({"first_k_dense_replace": 0, "n_shared_experts": None},
     {"moe_shared_expert_intermediate_size": None}),
    # No routed experts: a dense MLA model, whose first_k_dense_replace says nothing.
    ({"n_routed_experts": None}, {"num_experts": None, "ffn_hidden_size": 10944,
                                  "multi_latent_attention": True}),
    ({"model_type": "deepseek_v3", "first_k_dense_replace": 0, "q_lora_rank": 1536,
      "qk_nope_head_dim": 64, "v_head_dim": 64},
     {"qk_head_dim": 64, "v_head_dim": 64, "q_lora_rank": 1536}),
], ids=["v2-lite-all-moe", "query-latent", "no-shared", "dense", "v3"])
def test_deepseek_configs_are_read(tmp_path: Path, change: dict[str, object],
                                   shape: dict[str, object]) -> None:
    model = read_hf_config(str(_deepseek(tmp_path, change))).spec
    for field, value in shape.items():
        assert getattr(model, field) == value, field


def test_deepseek_v2_lite_counts_its_published_size(tmp_path: Path) -> None:
    """Read with every layer MoE and one MoE layer swapped for the dense first layer it has
    (10944-wide SwiGLU MLP), V2-Lite counts the model card's 15.7B; its MoE layers' share
    follows autotune's own count, megatron-core's to the parameter
    (tests/test_param_counts_megatron.py, the MLA rows)."""
    import dataclasses

    from autotune.specs.params import parameter_counts

    model = read_hf_config(str(_deepseek(tmp_path, {"first_k_dense_replace": 0}))).spec
    counts = parameter_counts(model)
    dense = parameter_counts(dataclasses.replace(
        model, num_experts=None, moe_ffn_hidden_size=None,
        moe_shared_expert_intermediate_size=None))
    moe_layer = counts.dense_per_layer + counts.expert_per_layer
    assert counts.total == 16_210_324_992
    assert counts.total - moe_layer + dense.dense_per_layer == pytest.approx(15.7e9, rel=0.005)


@pytest.mark.parametrize(("change", "noted"), [
    ({"first_k_dense_replace": 0}, ["rope_scaling (yarn)", "scoring_func 'softmax'"]),
    ({"first_k_dense_replace": 0, "model_type": "deepseek_v3", "scoring_func": "sigmoid",
      "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
      "num_nextn_predict_layers": 1},
     ["scoring_func 'sigmoid', topk_method 'noaux_tc', n_group 8, topk_group 4, "
      "routed_scaling_factor 2.5"]),
])
def test_deepseek_router_options_are_noted(tmp_path: Path, change: dict[str, object],
                                           noted: list[str]) -> None:
    notes = read_hf_config(str(_deepseek(tmp_path, change))).notes
    for text in noted:
        assert any(text in n for n in notes), (text, notes)


@pytest.mark.parametrize(("change", "mtp", "moe"), [
    ({"num_nextn_predict_layers": None}, 0, True), ({"num_nextn_predict_layers": 0}, 0, True),
    ({"num_nextn_predict_layers": 1}, 1, True), ({"num_nextn_predict_layers": 2}, 2, True),
    # The MTP layer is the last layer's kind: dense where the last layer is (every other layer
    # MoE from the first, 26 layers: layer 25 is dense).
    ({"num_nextn_predict_layers": 1, "first_k_dense_replace": 0, "moe_layer_freq": 2,
      "num_hidden_layers": 26}, 1, False),
])
def test_deepseek_mtp_layers_are_mapped(tmp_path: Path, change: dict[str, object], mtp: int,
                                        moe: bool) -> None:
    spec = read_hf_config(str(_deepseek(tmp_path, change))).spec
    assert spec.mtp_num_layers == mtp and spec.mtp_layer_is_moe == moe
    assert spec.mtp_loss_scaling_factor is None  # Megatron's default, 0.1


@pytest.mark.parametrize(("change", "message"), [
    ({"first_k_dense_replace": 27}, "no layer is an MoE layer"),
    ({"first_k_dense_replace": -1}, "first_k_dense_replace must be a positive integer"),
    ({"num_key_value_heads": 8}, "num_key_value_heads 8 differs from num_attention_heads 16"),
    ({"attention_bias": True}, "attention_bias: megatron-core's Multi-Latent Attention"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"kv_lora_rank": None}, "no 'kv_lora_rank'"),
    ({"qk_rope_head_dim": 0}, "qk_rope_head_dim must be a positive integer"),
    ({"first_k_dense_replace": 0, "num_experts_per_tok": None}, "no 'num_experts_per_tok'"),
    ({"first_k_dense_replace": 0, "num_experts_per_tok": 65}, "moe_topk=65 must be between"),
    ({"num_nextn_predict_layers": -1}, "num_nextn_predict_layers must be a positive integer"),
    ({"num_nextn_predict_layers": 17}, "mtp_num_layers must be an integer between 0 and 16"),
])
def test_deepseek_what_cannot_be_mapped_is_refused(tmp_path: Path, change: dict[str, object],
                                                   message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        read_hf_config(str(_deepseek(tmp_path, change)))
    assert "\n" not in str(caught.value)
