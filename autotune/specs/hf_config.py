"""A Hugging Face `config.json` as a ModelSpec: GPT-2, Llama, Mistral, Mixtral, Qwen2, Qwen3,
DeepSeek-V2 and V3, Granite, Phi-3, Nemotron, StarCoder2.

Read from a file (or a folder holding config.json), never from the network. Every field the
analytical models and the Megatron-LM export use is mapped from the config's own keys, with
transformers' defaults where a key may be absent (transformers' configuration_<model>.py of
each architecture). What autotune's models cannot represent is refused in one line rather than
approximated silently: an unknown architecture, a known one that needs modelling autotune
lacks (UNMAPPED: soft-capping, parallel attention and MLP, post-norms, ...), a sequence longer
than the window of sliding-window attention in use (the sequence defaults to the window).
Dense layers among the MoE layers (DeepSeek's first_k_dense_replace, Qwen's mlp_only_layers),
Qwen2's QKV bias, Qwen3's QK norm, Qwen2-MoE's gated shared expert, DeepSeek's Multi-Latent
Attention and Nemotron's squared ReLU, LayerNorm 1p and partial RoPE are part of the model
(ModelSpec.moe_layer_freq, add_qkv_bias, qk_layernorm, moe_shared_expert_intermediate_size,
multi_latent_attention, activation, apply_layernorm_1p, rotary_percent); fields that do not
change memory or step time (RoPE scaling, the checkpoint's dtype, Granite's multipliers) are
noted, not refused; a dtype that is no torch dtype is refused, as transformers refuses it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError
from autotune.inputs.documents import parse_json
from autotune.inputs.files import read_text
from autotune.inputs.untrusted import for_terminal, shown
from autotune.specs.model import MODEL_NAME_MAX, ModelSpec, model_from_mapping
from autotune.specs.params import check_size

__all__ = ["CONFIG_NAME", "HfModel", "is_hf_config", "load_hf_config", "read_hf_config"]

log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"

SEQ_LENGTH_MAX = 8192
"""The sequence a config's model is tuned for: its max_position_embeddings, at most this (the
llama3 presets' 8192, NeMo's Llama 3 recipe); --seq-len overrides it."""

GLOBAL_BATCH = {"gpt2": 64}
"""Global batch in sequences, which config.json does not say: the presets' of the same
family (gpt2*.yaml 64; llama3 and mixtral 512, DEFAULT_GLOBAL_BATCH); --global-batch-size
overrides it."""
DEFAULT_GLOBAL_BATCH = 512

TORCH_DTYPES = frozenset((
    "bfloat16", "bool", "cdouble", "cfloat", "chalf", "complex128", "complex32", "complex64",
    "double", "float", "float16", "float32", "float4_e2m1fn_x2", "float64", "float8_e4m3fn",
    "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "half", "int",
    "int1", "int16", "int2", "int3", "int32", "int4", "int5", "int6", "int64", "int7", "int8",
    "long", "qint32", "qint8", "quint2x4", "quint4x2", "quint8", "short", "uint1", "uint16",
    "uint2", "uint3", "uint32", "uint4", "uint5", "uint6", "uint64", "uint7", "uint8"))
"""The names `dtype` / `torch_dtype` may hold: torch 2.13's attributes that are a torch.dtype
(the bits* types left out), which transformers' PreTrainedConfig.__post_init__ looks up with
getattr(torch, name); any other name stops transformers loading the config."""
CHECKPOINT_DTYPE_USUAL = "bfloat16"
"""The dtype checkpoints of the mapped families are stored in, and the one autotune trains in
(Megatron --bf16): not worth a note."""

_LLAMA_LIKE = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
               "granite", "phi3")
_DEEPSEEK = ("deepseek_v2", "deepseek_v3")
SUPPORTED = ("gpt2", *_LLAMA_LIKE, "nemotron", "starcoder2", *_DEEPSEEK)
"""config.json `model_type`s autotune maps."""

_POSITIONS_DEFAULT = {"llama": 2048, "granite": 2048, "phi3": 4096, "mistral": 4096 * 32,
                      "mixtral": 4096 * 32, "qwen2": 32768, "qwen2_moe": 32768, "qwen3": 32768,
                      "qwen3_moe": 32768}
"""max_position_embeddings where a Llama-like config leaves it out: transformers'
configuration_<model>.py defaults (the sequence is then this, at most SEQ_LENGTH_MAX)."""

_WINDOW_IN_USE = ("mistral", "mixtral", "phi3", "starcoder2")
"""The families whose transformers attention applies a config's sliding_window whenever it is
set (no use_sliding_window key: Phi3Attention and Starcoder2Attention pass
config.sliding_window on); Qwen2's and Qwen3's need use_sliding_window, default false."""

_PARTIAL_ROPE = {"nemotron": 0.5, "phi3": 1.0}
"""The families whose transformers RoPE rotates partial_rotary_factor of each head (the rest
passed through; Megatron --rotary-percent), with its default: NemotronConfig.__post_init__ sets
0.5, Phi3Config 1.0 (Phi-4-mini publishes 0.75)."""

GRANITE_MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier",
                       "logits_scaling")
"""GraniteConfig's scalars (modeling_granite.py: the embeddings times embedding_multiplier,
each residual branch times residual_multiplier, attention_multiplier as the softmax scale,
the logits divided by logits_scaling), 1.0 by default. They change no shape; Megatron-LM has
no flag for them."""

UNMAPPED = {
    "gemma": "hidden_activation: a GELU-gated MLP (GeGLU) and embeddings scaled by "
             "sqrt(hidden_size), which Megatron-LM has no flags for",
    "gemma2": "attn_logit_softcapping / final_logit_softcapping (soft-capped logits) and "
              "sliding_window on every other layer are not in autotune's models",
    "gemma3": "layer_types: sliding-window attention on some layers only, and norms after "
              "attention and the MLP, are not in autotune's models",
    "gemma3_text": "layer_types: sliding-window attention on some layers only, and norms "
                   "after attention and the MLP, are not in autotune's models",
    "cohere": "attention and the MLP run in parallel from one norm (CohereDecoderLayer), "
              "which autotune's models do not have",
    "cohere2": "attention and the MLP run in parallel from one norm, and layer_types "
               "alternates sliding windows: not in autotune's models",
    "phi": "attention and the MLP run in parallel from one norm (PhiDecoderLayer), which "
           "autotune's models do not have",
    "gpt_neox": "use_parallel_residual (Pythia, GPT-NeoX-20B) runs attention and the MLP in "
                "parallel, which autotune's models do not have",
    "falcon": "parallel_attn / new_decoder_architecture run attention and the MLP in "
              "parallel, which autotune's models do not have",
    "olmo2": "norms after attention and after the MLP (post_attention_layernorm, "
             "post_feedforward_layernorm), not before them, are not in autotune's models",
    "nemotron_h": "hybrid_override_pattern: Mamba layers among the attention layers are not "
                  "in autotune's models",
}
"""Families a Megatron user may hold a config of that need modelling autotune does not have:
refused with the config key or the architecture that makes them so."""


@dataclass(frozen=True, slots=True)
class HfModel:
    """A config's ModelSpec, with what the mapping noted (printed when it is loaded)."""

    spec: ModelSpec
    notes: tuple[str, ...]


def is_hf_config(name_or_path: str) -> bool:
    """True for a .json file or a folder holding config.json: what load_model hands here."""
    path = Path(name_or_path)
    return name_or_path.endswith(".json") or (path.is_dir() and (path / CONFIG_NAME).is_file())


def _config_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    return path / CONFIG_NAME if path.is_dir() else path


def _name(path: Path, data: dict[str, Any]) -> str:
    # _name_or_path names the checkpoint (meta-llama/Meta-Llama-3-8B); else the folder's name.
    raw = data.get("_name_or_path") or (path.parent.name if path.name == CONFIG_NAME
                                        else path.stem)
    name = str(raw).rstrip("/").rsplit("/", 1)[-1]
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in name).strip("-.")
    return name[:MODEL_NAME_MAX] or "hf-model"


class _Config:
    """The config's keys with one-line errors naming the file."""

    def __init__(self, data: dict[str, Any], source: str) -> None:
        self.data = data
        self.source = source

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def count(self, key: str, default: int | None = None) -> int:
        value = self.get(key, default)
        if value is None:
            raise ConfigError(f"{self.source}: no {key!r}, which autotune needs")
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{self.source}: {key} must be a positive integer, got "
                              f"{shown(value)}")
        return value

    def optional_count(self, key: str) -> int | None:
        return None if self.get(key) is None else self.count(key)

    def flag(self, key: str, default: bool) -> bool:
        # JSON's true/false only: the string "false" is truthy to Python.
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{self.source}: {key} must be true or false, got "
                              f"{shown(value)}")
        return value

    def number(self, key: str, default: float) -> float:
        value = self.get(key, default)
        if not isinstance(value, int | float) or isinstance(value, bool) \
                or not math.isfinite(value):
            raise ConfigError(f"{self.source}: {key} must be a finite number, got "
                              f"{shown(value)}")
        return float(value)

    def text(self, key: str, default: str) -> str:
        value = self.get(key, default)
        if not isinstance(value, str):
            raise ConfigError(f"{self.source}: {key} must be a string, got {shown(value)}")
        return value

    def refuse(self, what: str) -> ConfigError:
        return ConfigError(f"{self.source}: {what}")


def _checkpoint_dtype(c: _Config) -> list[str]:
    """A note on the checkpoint's dtype where it is not bf16, or ConfigError where it is no
    dtype. It says how the weights are stored, not how Megatron trains them: the precision is
    Megatron's --bf16 (autotune.megatron.megatron_args) and FP8 where a layout asks for it,
    whatever the checkpoint's, so it changes neither memory nor step time."""
    # transformers >= 4.56 writes `dtype`, older ones `torch_dtype`; with both, `dtype` wins
    # (PreTrainedConfig.__post_init__).
    key = "dtype" if c.get("dtype") is not None else "torch_dtype"
    value = c.get(key)
    if value is None or value == CHECKPOINT_DTYPE_USUAL:
        return []
    if not isinstance(value, str) or value not in TORCH_DTYPES:
        raise c.refuse(f"{key} {shown(value)} is not a torch dtype, so transformers cannot "
                       "load this config (the usual ones: bfloat16, float16, float32)")
    return [f"{key} {value} is how the checkpoint's weights are stored, not how Megatron "
            "trains them: autotune plans bf16 mixed precision (--bf16; FP8 where a layout "
            "says so) for every model"]


def _gpt2(c: _Config) -> tuple[dict[str, Any], list[str]]:
    # transformers GPT2Config: n_inner None means 4 * n_embd; gelu_new is the tanh-approximated
    # GELU, which Megatron's default MLP (bias_gelu) computes; LayerNorm with biases; tied
    # embeddings.
    act = c.text("activation_function", "gelu_new")
    if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        raise c.refuse(f"GPT-2 activation_function {shown(act)} has no Megatron-LM equivalent "
                       "autotune models (gelu)")
    positions = c.count("n_positions", 1024)
    hidden = c.count("n_embd")
    return {
        "num_layers": c.count("n_layer"), "hidden_size": hidden,
        "num_attention_heads": c.count("n_head"), "ffn_hidden_size": c.optional_count("n_inner"),
        "vocab_size": c.count("vocab_size"), "seq_length": min(positions, SEQ_LENGTH_MAX),
        "max_position_embeddings": positions, "activation": "gelu",
        "normalization": "LayerNorm", "add_bias_linear": True,
        "tied_embeddings": c.flag("tie_word_embeddings", True),
        "position_embedding": "learned_absolute",
        "hidden_dropout": c.number("resid_pdrop", 0.1),
        "attention_dropout": c.number("attn_pdrop", 0.1),
    }, []


def _heads(c: _Config, groups_default: int | None = None) -> tuple[int, int, int, int | None]:
    """(hidden_size, heads, key/value groups, kv_channels) of a config's attention, refused in
    one line naming its keys where megatron-core could not build it. kv_channels is a head
    dimension of the model's own (Qwen3, Gemma, Nemotron: Megatron --kv-channels), None where
    it equals hidden / heads, Megatron's default, left implicit."""
    hidden, heads = c.count("hidden_size"), c.count("num_attention_heads")
    head_dim = c.optional_count("head_dim")
    if head_dim is None and hidden % heads:
        raise c.refuse(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                       "and no head_dim says the heads' width")
    groups = c.count("num_key_value_heads", heads if groups_default is None else groups_default)
    if heads % groups:
        # Each key/value head serves a whole group of query heads (GQA; Megatron
        # --num-query-groups, which megatron-core asserts divides the heads).
        raise c.refuse(f"num_key_value_heads {groups} must divide num_attention_heads {heads}")
    kv_channels = None if head_dim is None or head_dim * heads == hidden else head_dim
    return hidden, heads, groups, kv_channels


def _window_sequence(c: _Config, seq: int, in_use: bool,
                     notes: list[str]) -> tuple[int, int | None]:
    """(the sequence, the window) of sliding-window attention where `in_use`: up to its window
    it is full causal attention, which autotune models, so the sequence defaults to the window
    and a longer --seq-len is refused (ModelSpec.sliding_window); said in `notes`."""
    window = c.optional_count("sliding_window")  # checked even where not in use
    if not in_use:
        window = None
    if window is not None and window < seq:
        notes.append(f"sliding_window {window} is in use: the sequence defaults to {window} "
                     "tokens (full causal attention up to the window; autotune's models have "
                     "no sliding window, so --seq-len may not exceed it)")
        seq = window
    return seq, window


def _llama_like(c: _Config, kind: str) -> tuple[dict[str, Any], list[str]]:
    notes: list[str] = []
    hidden, heads, groups, kv_channels = _heads(c)
    if c.text("hidden_act", "silu") != "silu":
        raise c.refuse(f"hidden_act {shown(c.get('hidden_act'))}: autotune maps the SwiGLU "
                       "(silu-gated) MLP of these models only")
    positions = c.count("max_position_embeddings", _POSITIONS_DEFAULT[kind])
    seq, window = _window_sequence(c, min(positions, SEQ_LENGTH_MAX),
                                   c.flag("use_sliding_window", kind in _WINDOW_IN_USE), notes)
    notes += _rope_scaling_note(c)
    if c.flag("attention_bias", False) or c.flag("mlp_bias", False):
        raise c.refuse("attention_bias / mlp_bias on some layers only: autotune's models have "
                       "biases on every linear layer or none")
    values: dict[str, Any] = {
        "num_layers": c.count("num_hidden_layers"), "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_query_groups": groups, "kv_channels": kv_channels,
        "ffn_hidden_size": c.count("intermediate_size"), "vocab_size": c.count("vocab_size"),
        "seq_length": seq, "max_position_embeddings": positions, "sliding_window": window,
        "gated_linear_unit": True, "activation": "swiglu", "normalization": "RMSNorm",
        "add_bias_linear": False, "tied_embeddings": c.flag("tie_word_embeddings", False),
        "position_embedding": "rope", "rotary_base": _rope_theta(c),
        "rotary_percent": _rotary_percent(c, kind),
        # Phi3DecoderLayer drops each residual branch with resid_pdrop (Megatron's hidden
        # dropout, bias_dropout_add); Llama and the others have no residual dropout.
        "hidden_dropout": c.number("resid_pdrop", 0.0) if kind == "phi3" else 0.0,
        "attention_dropout": c.number("attention_dropout", 0.0),
        # transformers' Qwen2Attention gives q, k and v a bias (Megatron --add-qkv-bias);
        # Qwen3Attention drops it and norms each query and key head (--qk-layernorm).
        "add_qkv_bias": kind in ("qwen2", "qwen2_moe"),
        "qk_layernorm": kind in ("qwen3", "qwen3_moe"),
    }
    if kind == "granite":
        notes += _granite_notes(c)
    if kind == "phi3":
        # Megatron drops the embeddings' output with the hidden dropout (embedding.py).
        notes += _embedding_dropout_note(c, "embd_pdrop", values["hidden_dropout"])
    moe = _MOE_DEFAULTS.get(kind)
    if moe is not None:
        key, experts_default, topk_default, width_default, shared_default = moe
        # transformers' Qwen2MoeSparseMoeBlock: a shared expert of that width (0: none) beside
        # the routed ones, its output scaled by sigmoid(shared_expert_gate(x)), a 1 x h
        # linear: megatron-core's moe_shared_expert_intermediate_size and
        # moe_shared_expert_gate.
        shared = c.get("shared_expert_intermediate_size", shared_default)
        if shared:
            values.update(moe_shared_expert_intermediate_size=c.count(
                "shared_expert_intermediate_size", shared_default),
                moe_shared_expert_gate=True)
        # transformers' Qwen2MoeDecoderLayer: layer i is sparse unless it is among
        # mlp_only_layers, and when (i + 1) % decoder_sparse_step == 0; the others are dense
        # MLPs of intermediate_size (ModelSpec.moe_layer_freq).
        step = c.count("decoder_sparse_step", 1)
        only = c.get("mlp_only_layers", [])
        layers = c.count("num_hidden_layers")
        if not isinstance(only, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < layers for i in only):
            raise c.refuse(f"mlp_only_layers {shown(only)}: expected a list of layer indices "
                           f"below num_hidden_layers {layers}")
        values["moe_layer_freq"] = _layer_mask(
            c, [i not in only and (i + 1) % step == 0 for i in range(layers)])
        values.update(num_experts=c.count(key, experts_default),
                      moe_topk=c.count("num_experts_per_tok", topk_default))
        if width_default is not None:
            values["moe_ffn_hidden_size"] = c.count("moe_intermediate_size", width_default)
    return values, notes


def _deepseek(c: _Config) -> tuple[dict[str, Any], list[str]]:
    """DeepSeek-V2 and V3 (and the models on their code: Moonlight, Kimi K2): Multi-Latent
    Attention and DeepSeekMoE, as transformers' modeling_deepseek_v2 / _v3 build them.

    MLA: q_lora_rank (null: the query from the hidden state, V2-Lite), kv_lora_rank,
    qk_nope_head_dim (megatron-core's qk_head_dim), qk_rope_head_dim (qk_pos_emb_head_dim),
    v_head_dim; the latents' RMSNorms (q_a_layernorm with a query latent, kv_a_layernorm) are
    megatron-core's qk_layernorm with MLA. MoE: n_routed_experts experts (null: a dense model)
    of moe_intermediate_size, num_experts_per_tok per token, and n_shared_experts shared
    experts that every token goes through, one MLP of n_shared_experts x
    moe_intermediate_size (DeepseekV2MoE's shared_experts; Megatron
    --moe-shared-expert-intermediate-size), ungated. The first first_k_dense_replace layers
    are dense MLPs of intermediate_size: dense layers among MoE layers, which autotune's
    models do not have yet (Megatron --moe-layer-freq): refused. The router's scoring
    (softmax or sigmoid), its group-limited top-k, routed_scaling_factor and norm_topk_prob
    change no memory and no step time noticeably (one h x experts GEMM either way): noted.
    Multi-Token Prediction modules (num_nextn_predict_layers, V3: 1) are megatron-core's MTP
    layers (ModelSpec.mtp_num_layers); the published 671B counts the main model alone, the
    checkpoint's 685B adds the MTP module (11.5B of its own, its embedding and head copies of
    the main model's: DeepSeek-V3's README and README_WEIGHTS.md)."""
    notes: list[str] = []
    hidden, heads = c.count("hidden_size"), c.count("num_attention_heads")
    groups = c.count("num_key_value_heads", heads)
    if groups != heads:
        raise c.refuse(f"num_key_value_heads {groups} differs from num_attention_heads {heads}: "
                       "Multi-Latent Attention has a key and value per head")
    if c.text("hidden_act", "silu") != "silu":
        raise c.refuse(f"hidden_act {shown(c.get('hidden_act'))}: autotune maps the SwiGLU "
                       "(silu-gated) MLP of these models only")
    if c.flag("attention_bias", False):
        raise c.refuse("attention_bias: megatron-core's Multi-Latent Attention projections "
                       "have no bias")
    positions = c.count("max_position_embeddings", 2048)
    values: dict[str, Any] = {
        "num_layers": c.count("num_hidden_layers"), "hidden_size": hidden,
        "num_attention_heads": heads, "ffn_hidden_size": c.count("intermediate_size"),
        "vocab_size": c.count("vocab_size"), "seq_length": min(positions, SEQ_LENGTH_MAX),
        "max_position_embeddings": positions, "gated_linear_unit": True,
        "activation": "swiglu", "normalization": "RMSNorm", "add_bias_linear": False,
        "tied_embeddings": c.flag("tie_word_embeddings", False), "position_embedding": "rope",
        "rotary_base": _integral(c, "rope_theta", 10000), "hidden_dropout": 0.0,
        "attention_dropout": c.number("attention_dropout", 0.0),
        "multi_latent_attention": True, "qk_layernorm": True,
        # Published configs write every key; q_lora_rank null (or absent) is no query latent.
        "q_lora_rank": c.optional_count("q_lora_rank"),
        "kv_lora_rank": c.count("kv_lora_rank"), "qk_head_dim": c.count("qk_nope_head_dim"),
        "qk_pos_emb_head_dim": c.count("qk_rope_head_dim"),
        "v_head_dim": c.count("v_head_dim"),
    }
    if c.get("rope_scaling"):
        scaling = c.get("rope_scaling")
        kind_of = scaling.get("rope_type") or scaling.get("type") if isinstance(
            scaling, dict) else scaling
        notes.append(f"rope_scaling ({for_terminal(str(kind_of))[:40]}) changes positions, not "
                     "memory or step time: megatron-core's MLA runs YaRN RoPE on the "
                     "qk_rope_head_dim part either way")
    experts = c.optional_count("n_routed_experts")
    if experts is not None:
        # transformers' DeepseekV2DecoderLayer: layer i is MoE from first_k_dense_replace on
        # and when i % moe_layer_freq == 0; the others are dense MLPs of intermediate_size
        # (ModelSpec.moe_layer_freq, Megatron --moe-layer-freq).
        first = c.get("first_k_dense_replace", 0)
        if first != 0:
            first = c.count("first_k_dense_replace")
        freq = c.count("moe_layer_freq", 1)
        layers = values["num_layers"]
        values["moe_layer_freq"] = _layer_mask(
            c, [i >= first and i % freq == 0 for i in range(layers)])
        width = c.count("moe_intermediate_size")
        values.update(num_experts=experts, moe_topk=c.count("num_experts_per_tok"),
                      moe_ffn_hidden_size=width)
        shared = c.optional_count("n_shared_experts")
        if shared:
            values["moe_shared_expert_intermediate_size"] = shared * width
        router = [f"{key} {shown(c.get(key))}" for key in (
            "scoring_func", "topk_method", "n_group", "topk_group", "routed_scaling_factor",
            "norm_topk_prob") if c.get(key) is not None]
        if router:
            notes.append(f"the router's {', '.join(router)} change no memory and no step time "
                         "noticeably: autotune plans megatron-core's softmax top-k router")
    # DeepSeek-V3's Multi-Token Prediction modules (README_WEIGHTS.md: model.layers.61, one
    # module; its embed_tokens and shared_head the main model's), megatron-core's MTP layers.
    mtp = c.get("num_nextn_predict_layers", 0)
    if mtp != 0:
        values["mtp_num_layers"] = c.count("num_nextn_predict_layers")
    return values, notes


def _nemotron(c: _Config) -> tuple[dict[str, Any], list[str]]:
    """Nemotron-4 / Minitron (transformers NemotronConfig; Megatron-LM trains it with
    --squared-relu --apply-layernorm-1p --rotary-percent, as NeMo's and Megatron-Bridge's
    Nemotron recipes do): a non-gated squared-ReLU MLP (hidden_act relu2), LayerNorm with bias
    storing gamma - 1 (NemotronLayerNorm1P), partial RoPE, GQA, untied embeddings, no biases."""
    hidden, heads, groups, kv_channels = _heads(c)
    act = c.text("hidden_act", "relu2")
    if act != "relu2":
        raise c.refuse(f"hidden_act {shown(act)}: autotune maps Nemotron's squared-ReLU MLP "
                       "(relu2, Megatron --squared-relu) only")
    if c.flag("attention_bias", False) or c.flag("mlp_bias", False):
        raise c.refuse("attention_bias / mlp_bias with squared ReLU: megatron-core fuses a "
                       "bias with gelu and swiglu only, and autotune models Nemotron without "
                       "biases, as it is published")
    positions = c.count("max_position_embeddings", 4096)
    return {
        "num_layers": c.count("num_hidden_layers"), "hidden_size": hidden,
        "num_attention_heads": heads, "num_query_groups": groups,
        "kv_channels": kv_channels,
        "ffn_hidden_size": c.count("intermediate_size"), "vocab_size": c.count("vocab_size"),
        "seq_length": min(positions, SEQ_LENGTH_MAX), "max_position_embeddings": positions,
        "gated_linear_unit": False, "activation": "squared_relu",
        "normalization": "LayerNorm", "apply_layernorm_1p": True, "add_bias_linear": False,
        "tied_embeddings": c.flag("tie_word_embeddings", False),
        "position_embedding": "rope", "rotary_base": _rope_theta(c),
        "rotary_percent": _rotary_percent(c, "nemotron"),
        "hidden_dropout": 0.0, "attention_dropout": c.number("attention_dropout", 0.0),
    }, _rope_scaling_note(c)


def _starcoder2(c: _Config) -> tuple[dict[str, Any], list[str]]:
    """StarCoder2 (transformers Starcoder2Config): a GELU MLP (tanh approximation, Megatron's
    default bias-GELU) with biases on every linear layer (use_bias), LayerNorm, GQA, RoPE,
    tied embeddings, sliding-window attention wherever sliding_window is set (up to the
    window: full causal attention, as for Mistral)."""
    notes: list[str] = []
    hidden, heads, groups, kv_channels = _heads(c, groups_default=2)  # Starcoder2Config's
    act = c.text("hidden_act", "gelu_pytorch_tanh")
    if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        raise c.refuse(f"hidden_act {shown(act)} has no Megatron-LM equivalent autotune models "
                       "(gelu)")
    positions = c.count("max_position_embeddings", 4096)
    seq, window = _window_sequence(c, min(positions, SEQ_LENGTH_MAX), True, notes)
    notes += _rope_scaling_note(c)
    # Starcoder2MLP and Starcoder2Attention drop their outputs with residual_dropout:
    # Megatron's hidden dropout (bias_dropout_add), which also drops the embeddings.
    hidden_dropout = c.number("residual_dropout", 0.0)
    notes += _embedding_dropout_note(c, "embedding_dropout", hidden_dropout)
    return {
        "num_layers": c.count("num_hidden_layers"), "hidden_size": hidden,
        "num_attention_heads": heads, "num_query_groups": groups, "kv_channels": kv_channels,
        "ffn_hidden_size": c.count("intermediate_size"), "vocab_size": c.count("vocab_size"),
        "seq_length": seq, "max_position_embeddings": positions, "sliding_window": window,
        "gated_linear_unit": False, "activation": "gelu", "normalization": "LayerNorm",
        "add_bias_linear": c.flag("use_bias", True),
        "tied_embeddings": c.flag("tie_word_embeddings", True),
        "position_embedding": "rope", "rotary_base": _rope_theta(c),
        "hidden_dropout": hidden_dropout,
        "attention_dropout": c.number("attention_dropout", 0.0),
    }, notes


def _rope_parameters(c: _Config) -> dict[str, Any]:
    """transformers >= 5 writes rope_theta, partial_rotary_factor and the scaling into one
    rope_parameters mapping; the earlier configs keep them at the top level."""
    value = c.get("rope_parameters")
    return value if isinstance(value, dict) else {}


def _rope_value(c: _Config, key: str, default: float) -> float:
    if c.get(key) is not None:
        return c.number(key, default)
    nested = _Config(_rope_parameters(c), f"{c.source}: rope_parameters")
    return nested.number(key, default)


def _rope_theta(c: _Config) -> int:
    if c.get("rope_theta") is not None:
        return _integral(c, "rope_theta", 10000)
    value = _rope_value(c, "rope_theta", 10000)
    if not value.is_integer() or value <= 0:
        raise c.refuse(f"rope_parameters' rope_theta must be a positive whole number, got "
                       f"{shown(value)}")
    return int(value)


def _rotary_percent(c: _Config, kind: str) -> float:
    """partial_rotary_factor as Megatron's --rotary-percent, for the families whose RoPE reads
    it (_PARTIAL_ROPE); 1.0 for the others, whose transformers code rotates whole heads."""
    if kind not in _PARTIAL_ROPE:
        return 1.0
    value = _rope_value(c, "partial_rotary_factor", _PARTIAL_ROPE[kind])
    if not 0 < value <= 1:
        raw = c.get("partial_rotary_factor", _rope_parameters(c).get("partial_rotary_factor"))
        raise c.refuse(f"partial_rotary_factor must be in (0, 1], got {shown(raw)}")
    return value


def _rope_scaling_note(c: _Config) -> list[str]:
    scaling = c.get("rope_scaling")
    if not scaling:
        scaling = {k: v for k, v in _rope_parameters(c).items()
                   if k in ("rope_type", "type")} or None
        if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) \
                == "default":
            scaling = None
    if not scaling:
        return []
    kind_of = scaling.get("rope_type") or scaling.get("type") if isinstance(
        scaling, dict) else scaling
    shown_kind = for_terminal(str(kind_of))[:40]
    return [f"rope_scaling ({shown_kind}) changes positions, not memory or step time: not part "
            "of the model autotune tunes, nor of the exported flags"]


def _granite_notes(c: _Config) -> list[str]:
    set_ = [f"{key} {c.number(key, 1.0):g}" for key in GRANITE_MULTIPLIERS
            if c.number(key, 1.0) != 1.0]
    if not set_:
        return []
    return [f"Granite's multipliers ({', '.join(set_)}) scale the embeddings, the residual "
            "branches, the attention scores and the logits by constants: no shape, memory or "
            "step time of their own (a scalar in an element-wise pass), but Megatron-LM has no "
            "flag for them: the exported command trains the Llama-shaped model without them"]


def _embedding_dropout_note(c: _Config, key: str, hidden_dropout: float) -> list[str]:
    value = c.number(key, 0.0)
    if value == hidden_dropout:
        return []
    return [f"{key} {value:g} differs from the residual dropout {hidden_dropout:g}: Megatron "
            "drops the embeddings with the hidden dropout (--hidden-dropout), one h-wide mask "
            "per token, and the exported command does so"]


_MOE_DEFAULTS: dict[str, tuple[str, int, int, int | None, int | None]] = {
    "mixtral": ("num_local_experts", 8, 2, None, None),
    "qwen2_moe": ("num_experts", 60, 4, 1408, 5632),
    "qwen3_moe": ("num_experts", 128, 8, 768, None),
}
"""Per MoE model_type: the experts key, then transformers' defaults (configuration_<model>.py)
for the expert count, num_experts_per_tok, moe_intermediate_size (None: the MLP's width) and
shared_expert_intermediate_size (None: no shared expert), taken where the config leaves a key
out: a config without them is that family's model, not a dense one."""


def _layer_mask(c: _Config, moe: list[bool]) -> int | tuple[int, ...]:
    """ModelSpec.moe_layer_freq of a config's MoE layers (1: every layer); refused in one line
    when none is left."""
    if all(moe):
        return 1
    if not any(moe):
        raise c.refuse("no layer is an MoE layer (first_k_dense_replace, moe_layer_freq, "
                       "mlp_only_layers or decoder_sparse_step leave none)")
    return tuple(int(v) for v in moe)


def _integral(c: _Config, key: str, default: int) -> int:
    """A whole number that configs write either way (rope_theta: 10000 or 500000.0)."""
    value = c.number(key, default)
    if not value.is_integer() or value <= 0:
        raise ConfigError(f"{c.source}: {key} must be a positive whole number, got "
                          f"{shown(c.get(key))}")
    return int(value)


def read_hf_config(name_or_path: str) -> HfModel:
    """The ModelSpec of a config.json (or a folder holding one), with the mapping's notes."""
    path = _config_path(name_or_path)
    source = str(path)
    data = parse_json(read_text(path, "config file"), source)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object (a Hugging Face config.json)")
    c = _Config(data, source)
    kind = data.get("model_type")
    if isinstance(kind, str) and kind in UNMAPPED:
        raise ConfigError(f"{source}: model_type {kind}: {UNMAPPED[kind]}")
    if not isinstance(kind, str) or kind not in SUPPORTED:
        archs = data.get("architectures")
        arch = for_terminal(", ".join(map(str, archs))[:80]) if isinstance(archs, list) \
            and archs else "no architectures"
        raise ConfigError(f"{source}: model_type {shown(kind)} ({arch}) is not an architecture "
                          f"autotune maps (it reads {', '.join(SUPPORTED)})")
    reader = {"gpt2": _gpt2, "nemotron": _nemotron, "starcoder2": _starcoder2,
              **dict.fromkeys(_DEEPSEEK, _deepseek)}.get(kind)
    values, notes = reader(c) if reader is not None else _llama_like(c, kind)
    notes += _checkpoint_dtype(c)
    values["global_batch_size"] = GLOBAL_BATCH.get(kind, DEFAULT_GLOBAL_BATCH)
    spec = model_from_mapping({"name": _name(path, data), **values}, source)
    return HfModel(check_size(spec), tuple(notes))


def load_hf_config(name_or_path: str) -> ModelSpec:
    """read_hf_config's ModelSpec; its notes go to the log (stderr on the command line)."""
    model = read_hf_config(name_or_path)
    for note in model.notes:
        log.info("autotune: %s: %s", model.spec.name, note)
    return model.spec
