"""ModelSpec: the shape of a decoder-only transformer in Megatron's terms, and its checks.

Read from a preset, a model YAML file or a Hugging Face config.json by autotune.specs.presets
(`load_model`); from a study's records by `model_from_mapping`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from typing import Any

from autotune.errors import ConfigError
from autotune.inputs.bounds import Count, Fraction, Vocabulary

__all__ = ["MODEL_NAME_MAX", "MTP_LAYERS_MAX", "MTP_LOSS_SCALE_MAX", "ModelSpec",
           "model_from_mapping", "padded_vocab_size"]

MODEL_NAME_MAX = 100
"""Characters of a model's `name:`; it titles reports and exported scripts."""

MTP_LAYERS_MAX = 16
"""Multi-Token Prediction layers autotune accepts (DeepSeek-V3 trains with 1); more would be a
typo, each a whole transformer layer on the last pipeline stage."""

MTP_LOSS_SCALE_MAX = 100.0
"""The largest --mtp-loss-scaling-factor accepted (megatron-core's default is 0.1)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """The shape of a decoder-only transformer, in Megatron's terms."""

    name: str
    num_layers: Count
    hidden_size: Count
    num_attention_heads: Count
    num_query_groups: Count | None = None
    """GQA groups (Megatron `--num-query-groups`); None means multi-head attention."""
    kv_channels: Count | None = None
    """The attention head dimension (Megatron `--kv-channels`, config.json's `head_dim`); None
    means hidden_size / num_attention_heads, as Megatron defaults. Qwen3 and Gemma set their
    own: the query and the attention output are then heads x kv_channels wide, not hidden."""
    ffn_hidden_size: Count | None = None
    """MLP width; None means 4 * hidden_size, as Megatron defaults."""
    vocab_size: Vocabulary
    seq_length: Count
    max_position_embeddings: Count | None = None
    sliding_window: Count | None = None
    """The attention window of sliding-window attention in use (config.json's
    `sliding_window`); None: full causal attention. autotune's models and export have full
    causal attention only, the same as a window up to seq_length: a longer sequence is refused
    by `with_overrides`, where the command line's --seq-len has been applied."""
    global_batch_size: Count
    """The preset's global batch in sequences; `--global-batch-size` overrides it."""
    num_experts: Count | None = None
    moe_topk: Count = 2
    moe_ffn_hidden_size: Count | None = None
    """Expert MLP width; None means ffn_hidden_size."""
    moe_shared_expert_intermediate_size: Count | None = None
    """The width of the MoE layer's shared expert, an MLP every token goes through beside its
    routed experts (Megatron `--moe-shared-expert-intermediate-size`; Qwen2-MoE's
    shared_expert_intermediate_size, DeepSeekMoE's shared experts as one MLP of their summed
    width); None: no shared expert. megatron-core's SharedExpertMLP (moe/shared_experts.py) is a
    dense MLP split over the tensor-parallel ranks, not over the experts'."""
    moe_shared_expert_gate: bool = False
    """The shared expert's output scaled by sigmoid(x . w) per token, w one hidden-wide vector
    (Megatron `--moe-shared-expert-gate`; Qwen2-MoE's shared_expert_gate)."""
    moe_layer_freq: int | tuple[int, ...] = 1
    """Which layers are MoE layers (Megatron `--moe-layer-freq`, megatron-core gpt_layer_specs.py
    get_gpt_decoder_block_spec): an int N makes layer i an MoE layer when i % N == 0; a tuple
    says 1 (MoE) or 0 (dense) per layer, as DeepSeek's and GLM-4.5's dense first layers. 1:
    every layer (the default). A dense layer is the model's MLP of ffn_hidden_size; the
    models price a mixed model's stages from its two kinds of layer (`dense_layer_model`,
    `moe_layer_model`)."""
    gated_linear_unit: bool = False
    """SwiGLU-style MLP: three h x f matrices instead of two."""
    activation: str = "gelu"
    normalization: str = "LayerNorm"
    add_bias_linear: bool = True
    add_qkv_bias: bool = False
    """A bias on the QKV projection only (Megatron `--add-qkv-bias`; Qwen2): megatron-core gives
    linear_qkv a bias with add_bias_linear or add_qkv_bias (attention.py)."""
    qk_layernorm: bool = False
    """A norm (the model's `normalization`) on each query and key head before RoPE (Megatron
    `--qk-layernorm`; Qwen3, OLMo 2): attention.py get_query_key_value_tensors applies
    q_layernorm and k_layernorm of width head_dim."""
    multi_latent_attention: bool = False
    """DeepSeek-V2's Multi-Latent Attention (Megatron `--multi-latent-attention`; megatron-core
    transformer/multi_latent_attention.py, MLASelfAttention): the key and value come from one
    low-rank latent of kv_lora_rank per token, the query from one of q_lora_rank (or straight
    from the hidden state without it); each head's query and key are qk_head_dim wide plus a
    qk_pos_emb_head_dim part that carries RoPE (the key's shared by all heads), its value
    v_head_dim wide. With it qk_layernorm means the norms of the two latents (q_layernorm over
    q_lora_rank, kv_layernorm over kv_lora_rank: gpt_layer_specs.py), as DeepSeek's models have."""
    q_lora_rank: Count | None = None
    """The query's latent rank (Megatron `--q-lora-rank`); None: no query compression, the query
    projected from the hidden state (DeepSeek-V2-Lite)."""
    kv_lora_rank: Count | None = None
    """The key and value latent rank (Megatron `--kv-lora-rank`); MLA only."""
    qk_head_dim: Count | None = None
    """The query and key heads' width without the RoPE part (Megatron `--qk-head-dim`)."""
    qk_pos_emb_head_dim: Count | None = None
    """The query and key heads' RoPE part (Megatron `--qk-pos-emb-head-dim`)."""
    v_head_dim: Count | None = None
    """The value heads' width (Megatron `--v-head-dim`)."""
    tied_embeddings: bool = True
    position_embedding: str = "learned_absolute"
    rotary_base: Count = 10000
    rotary_percent: Fraction = 1.0
    """The share of each head's dimensions RoPE rotates, the rest passed through (Megatron
    `--rotary-percent`; config.json's `partial_rotary_factor`: Nemotron 0.5, Phi-4-mini 0.75).
    megatron-core's RotaryEmbedding rotates int(kv_channels * rotary_percent) dimensions
    (models/common/embeddings/rotary_pos_embedding.py) and _apply_rotary_pos_emb_bshd slices
    the query and key to them. No parameter and no GEMM: it changes the unfused RoPE's
    element-wise traffic only, by less than the share it leaves out, which
    autotune.specs.elementwise counts at the whole head (an over-count of at most that much of
    the RoPE bytes)."""
    apply_layernorm_1p: bool = False
    """Norm weights stored as (gamma - 1), the norm multiplying by 1 + w (Megatron
    `--apply-layernorm-1p`, TransformerConfig.layernorm_zero_centered_gamma; Nemotron's
    NemotronLayerNorm1P). The same parameters and the same fused kernel (Transformer Engine's
    zero_centered_gamma): shape, memory and step time unchanged; it is part of the model the
    exported command trains."""
    rope_fusion: bool = True
    """Megatron-LM's default (--no-rope-fusion turns it off): RoPE as Transformer Engine's fused
    kernel where TE builds the layer (autotune.specs.elementwise.rope_fused says where it runs).
    A training option, like the dropouts, that changes speed and not the model's shape."""
    hidden_dropout: Fraction = 0.1
    """Megatron's default (--hidden-dropout); GPT-2 trains with it, Llama and Mixtral with 0."""
    attention_dropout: Fraction = 0.1
    make_vocab_size_divisible_by: Count = 128
    mtp_num_layers: int = 0
    """Multi-Token Prediction layers (Megatron `--mtp-num-layers`; config.json's
    `num_nextn_predict_layers`: DeepSeek-V3 has 1); 0: none. megatron-core 0.16.1's
    MultiTokenPredictionBlock (transformer/multi_token_prediction.py) puts them all on the last
    pipeline stage (mtp_on_this_rank without a custom layout): each is an enorm and an hnorm,
    eh_proj (2h x h, no bias), one transformer layer of the kind of the model's last layer
    (Megatron-LM gpt_builders.py: decoder_layer_specs[-1]; `mtp_layer_model`) and a final norm;
    it shares the embedding and the output layer, and adds one more output GEMM and cross
    entropy per layer (gpt_model.py _postprocess). The last stage of a pipeline keeps its own
    copy of the word embeddings for it (GPTModel builds `embedding` where mtp_process)."""
    mtp_loss_scaling_factor: float | None = None
    """The MTP loss's weight (Megatron `--mtp-loss-scaling-factor`); None: megatron-core's
    default, 0.1. A training option: no parameter, FLOP or byte depends on it."""

    def __post_init__(self) -> None:
        # The name reaches report titles, script comments and the default study name: one
        # printable line (no newline or other control character), of a sensible length.
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"model name must be a non-empty string, got {self.name!r}")
        if not self.name.isprintable() or len(self.name) > MODEL_NAME_MAX:
            shown = self.name if len(self.name) <= 40 else self.name[:40] + "..."
            raise ConfigError(f"model name {shown!r} must be one line of at most "
                              f"{MODEL_NAME_MAX} printable characters")
        # Files are checked field by field before they get here (autotune.inputs.schema);
        # these rules hold for every ModelSpec, whatever built it.
        for name in _COUNTS:
            value = getattr(self, name)
            if value is None and name not in _REQUIRED:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model {self.name}: {name} must be a positive integer, "
                                  f"got {value!r}")
        for name in ("hidden_dropout", "attention_dropout"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 <= value <= 1:
                raise ConfigError(f"model {self.name}: {name} must be between 0 and 1, "
                                  f"got {value!r}")
        self._check_mla()
        self._check_layer_freq()
        self._check_mtp()
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"model {self.name}: hidden_size={self.hidden_size} must be "
                              f"divisible by num_attention_heads={self.num_attention_heads}")
        if self.num_attention_heads % self.query_groups:
            raise ConfigError(f"model {self.name}: num_query_groups={self.query_groups} must "
                              f"divide num_attention_heads={self.num_attention_heads}")
        for name, allowed in (("normalization", ("LayerNorm", "RMSNorm")),
                              ("activation", ("gelu", "swiglu", "silu", "squared_relu"))):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"model {self.name}: {name} must be one of "
                                  f"{', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.position_embedding not in ("learned_absolute", "rope", "none"):
            raise ConfigError(f"model {self.name}: position_embedding must be learned_absolute, "
                              f"rope or none, got {self.position_embedding!r}")
        if self.rotary_percent != 1.0:
            # rotary_pos_embedding.py: int(kv_channels * rotary_percent) dimensions, in pairs.
            rotated = int(self.head_dim * self.rotary_percent)
            if self.position_embedding != "rope" or rotated < 2 or rotated % 2:
                raise ConfigError(f"model {self.name}: rotary_percent={self.rotary_percent} "
                                  "needs position_embedding rope and an even number of rotated "
                                  f"dimensions (int({self.head_dim} x {self.rotary_percent}) = "
                                  f"{rotated})")
        if self.activation == "squared_relu" and self.add_bias_linear:
            # megatron-core's MLP fuses a bias with GELU and SwiGLU only (mlp.py: "Only support
            # fusion of gelu and swiglu"); Megatron-LM's --squared-relu then needs
            # --no-bias-gelu-fusion, an unfused bias that autotune does not model.
            raise ConfigError(f"model {self.name}: squared_relu with biases (add_bias_linear) "
                              "is not modelled: megatron-core fuses a bias with gelu and swiglu "
                              "only; set add_bias_linear false (--disable-bias-linear)")
        if self.num_experts is not None and not 1 <= self.moe_topk <= self.num_experts:
            raise ConfigError(f"model {self.name}: moe_topk={self.moe_topk} must be between 1 "
                              f"and num_experts={self.num_experts}")
        if (self.moe_shared_expert_intermediate_size or self.moe_shared_expert_gate) \
                and not self.is_moe:
            raise ConfigError(f"model {self.name}: a shared expert "
                              "(moe_shared_expert_intermediate_size, moe_shared_expert_gate) "
                              "needs num_experts above 1")
        if self.moe_shared_expert_gate and not self.moe_shared_expert_intermediate_size:
            raise ConfigError(f"model {self.name}: moe_shared_expert_gate needs "
                              "moe_shared_expert_intermediate_size")
        if self.moe_shared_expert_intermediate_size and self.add_bias_linear:
            # shared_experts.py: `assert config.add_bias_linear == False`.
            raise ConfigError(f"model {self.name}: megatron-core's shared expert has no "
                              "biases: set add_bias_linear false (--disable-bias-linear)")

    def _check_layer_freq(self) -> None:
        """Megatron-LM's rules for --moe-layer-freq (arguments.py moe_freq_type; megatron-core
        asserts the list's length), and one of autotune's: at least one MoE layer."""
        freq = self.moe_layer_freq
        if isinstance(freq, list):  # from JSON: hashable, as every field
            freq = tuple(freq)
            object.__setattr__(self, "moe_layer_freq", freq)
        if isinstance(freq, bool) or not isinstance(freq, int | tuple):
            raise ConfigError(f"model {self.name}: moe_layer_freq must be a positive integer or "
                              f"a list of 0 and 1 per layer, got {freq!r}")
        if freq == 1:
            return
        if not self.is_moe:
            raise ConfigError(f"model {self.name}: moe_layer_freq={freq!r} needs num_experts "
                              "above 1")
        if isinstance(freq, int):
            if not 1 <= freq <= self.num_layers:
                raise ConfigError(f"model {self.name}: moe_layer_freq={freq} must be between 1 "
                                  f"and num_layers={self.num_layers}")
            return
        if len(freq) != self.num_layers or any(
                v not in (0, 1) or isinstance(v, bool) for v in freq):
            raise ConfigError(f"model {self.name}: moe_layer_freq must give 0 (dense) or 1 (MoE) "
                              f"for each of the {self.num_layers} layers, got {len(freq)} "
                              "values")
        if 1 not in freq:
            raise ConfigError(f"model {self.name}: moe_layer_freq has no MoE layer (no 1): "
                              "leave num_experts out for a dense model")

    def _check_mtp(self) -> None:
        """Megatron-LM's rules for Multi-Token Prediction (arguments.py validate_args)."""
        n, factor = self.mtp_num_layers, self.mtp_loss_scaling_factor
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MTP_LAYERS_MAX:
            raise ConfigError(f"model {self.name}: mtp_num_layers must be an integer between 0 "
                              f"and {MTP_LAYERS_MAX}, got {n!r}")
        if factor is not None:
            if not n:
                raise ConfigError(f"model {self.name}: mtp_loss_scaling_factor needs "
                                  "mtp_num_layers above 0")
            if isinstance(factor, bool) or not isinstance(factor, int | float) \
                    or not 0 <= factor <= MTP_LOSS_SCALE_MAX:
                raise ConfigError(f"model {self.name}: mtp_loss_scaling_factor must be a number "
                                  f"between 0 and {MTP_LOSS_SCALE_MAX:g}, got {factor!r}")
        # arguments.py: "Multi-Token Prediction (MTP) is not supported with
        # learned_absolute position embedding type" (rope and none only).
        if n and self.position_embedding == "learned_absolute":
            raise ConfigError(f"model {self.name}: Multi-Token Prediction (mtp_num_layers={n}) "
                              "needs position_embedding rope or none (Megatron-LM refuses "
                              "learned_absolute with it)")

    def _check_mla(self) -> None:
        """megatron-core 0.16.1's rules for Multi-Latent Attention, each a one-line ConfigError."""
        mla_fields = [n for n in _MLA_DIMS if getattr(self, n) is not None]
        if not self.multi_latent_attention:
            if mla_fields:
                raise ConfigError(f"model {self.name}: {', '.join(mla_fields)} need "
                                  "multi_latent_attention true")
            return
        missing = [n for n in _MLA_DIMS[1:] if getattr(self, n) is None]
        if missing:
            raise ConfigError(f"model {self.name}: multi_latent_attention needs "
                              f"{', '.join(missing)}")
        # Megatron-LM arguments.py validate_args: "Group query attention is mutually exclusive
        # with multi latent attention"; MLASelfAttention has one key per head.
        if self.query_groups != self.num_attention_heads:
            raise ConfigError(f"model {self.name}: multi_latent_attention has no query groups "
                              f"(GQA): num_query_groups={self.num_query_groups} must be unset")
        # MLA's heads are qk_head_dim + qk_pos_emb_head_dim and v_head_dim wide; kv_channels
        # would size nothing (multi_latent_attention.py builds every projection from those).
        if self.kv_channels is not None:
            raise ConfigError(f"model {self.name}: multi_latent_attention sizes its heads with "
                              "qk_head_dim, qk_pos_emb_head_dim and v_head_dim: kv_channels "
                              "must be unset")
        # MLASelfAttention builds its down and up projections with bias=False.
        if self.add_qkv_bias:
            raise ConfigError(f"model {self.name}: multi_latent_attention's projections have no "
                              "bias: add_qkv_bias must be false")
        # RoPE is applied inside MLA to the qk_pos_emb_head_dim part (GPTModel makes no rotary
        # embedding with it, gpt_model.py); another position embedding would be added on top.
        if self.position_embedding != "rope":
            raise ConfigError(f"model {self.name}: multi_latent_attention applies RoPE to "
                              "its qk_pos_emb_head_dim part: position_embedding must be rope, "
                              f"got {self.position_embedding!r}")

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def expert_ffn_size(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_size

    @property
    def shared_expert_ffn_size(self) -> int:
        """The shared expert's MLP width; 0 without one."""
        return self.moe_shared_expert_intermediate_size or 0

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def attention_width(self) -> int:
        """The query's and the attention output's width: heads x head_dim (megatron-core's
        query_projection_size, attention.py); hidden_size unless kv_channels says otherwise.
        With MLA the attention output's: heads x v_head_dim (multi_latent_attention.py)."""
        return self.num_attention_heads * self.v_dim

    @property
    def qk_dim(self) -> int:
        """A query or key head's width in core attention: head_dim, or with MLA qk_head_dim +
        qk_pos_emb_head_dim (MultiLatentAttention.q_head_dim)."""
        if self.multi_latent_attention:
            assert self.qk_head_dim is not None and self.qk_pos_emb_head_dim is not None
            return self.qk_head_dim + self.qk_pos_emb_head_dim
        return self.head_dim

    @property
    def v_dim(self) -> int:
        """A value head's width in core attention: head_dim, or with MLA v_head_dim."""
        if self.multi_latent_attention:
            assert self.v_head_dim is not None
            return self.v_head_dim
        return self.head_dim

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts and self.num_experts > 1)

    @property
    def moe_layer_mask(self) -> tuple[bool, ...]:
        """Per layer, whether it is an MoE layer (megatron-core get_gpt_decoder_block_spec's
        moe_layer_pattern): none for a dense model."""
        return _moe_layer_mask(self.is_moe, self.moe_layer_freq, self.num_layers)

    @property
    def has_dense_layers(self) -> bool:
        """Dense layers among the MoE layers (moe_layer_freq other than every layer)."""
        return self.is_moe and not all(self.moe_layer_mask)

    def layer_kinds(self, start: int, stop: int) -> tuple[int, int]:
        """(dense, MoE) layers among layers start..stop - 1."""
        moe = sum(self.moe_layer_mask[start:stop])
        return stop - start - moe, moe

    @property
    def dense_layer_model(self) -> ModelSpec:
        """A model whose every layer is one of this model's dense layers: no experts."""
        return _dense_layer_model(self)

    @property
    def moe_layer_model(self) -> ModelSpec:
        """A model whose every layer is one of this model's MoE layers."""
        return _moe_layer_model(self)

    @property
    def mtp_layer_is_moe(self) -> bool:
        """Whether the MTP layers' transformer layer is an MoE layer: the model's last layer's
        kind (Megatron-LM gpt_builders.py builds it from decoder_layer_specs[-1])."""
        return self.moe_layer_mask[-1]

    @property
    def mtp_layer_model(self) -> ModelSpec:
        """A model whose every layer is the MTP layers' transformer layer, without MTP."""
        return _mtp_layer_model(self)

    @property
    def without_mtp(self) -> ModelSpec:
        """The same model without its Multi-Token Prediction layers."""
        return _without_mtp(self)

    @property
    def max_positions(self) -> int:
        return self.max_position_embeddings or self.seq_length

    def with_overrides(self, *, seq_length: int | None = None,
                       global_batch_size: int | None = None) -> ModelSpec:
        """The same model with a different sequence length or global batch (CLI overrides)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        if seq_length is not None:
            values["seq_length"] = seq_length
            values["max_position_embeddings"] = max(seq_length, self.max_positions)
        if global_batch_size is not None:
            values["global_batch_size"] = global_batch_size
        model = ModelSpec(**values)
        # Checked here, where the sequence is final (a model file's seq_length may be longer
        # than its window; --seq-len is what makes it usable).
        window = model.sliding_window
        if window is not None and window < model.seq_length:
            raise ConfigError(f"model {model.name}: sliding-window attention (window {window}) "
                              f"is in use and the sequence is {model.seq_length} tokens; "
                              "autotune's models and export have full causal attention only, "
                              f"the same up to the window: pass --seq-len {window} or less")
        return model


@functools.lru_cache(maxsize=256)
def _dense_layer_model(model: ModelSpec) -> ModelSpec:
    # Cached: the models price a mixed model's stages from it on every estimate.
    # Without MTP: a stage's MTP layers are priced apart (its layer is one kind, the model's
    # last layer's: `mtp_layer_model`), not as a share of each kind.
    return replace(model, num_experts=None, moe_topk=2, moe_ffn_hidden_size=None,
                   moe_shared_expert_intermediate_size=None, moe_shared_expert_gate=False,
                   moe_layer_freq=1, mtp_num_layers=0, mtp_loss_scaling_factor=None)


@functools.lru_cache(maxsize=256)
def _moe_layer_model(model: ModelSpec) -> ModelSpec:
    return replace(model, moe_layer_freq=1, mtp_num_layers=0, mtp_loss_scaling_factor=None)


@functools.lru_cache(maxsize=256)
def _without_mtp(model: ModelSpec) -> ModelSpec:
    return replace(model, mtp_num_layers=0, mtp_loss_scaling_factor=None)


@functools.lru_cache(maxsize=256)
def _mtp_layer_model(model: ModelSpec) -> ModelSpec:
    if not model.has_dense_layers:
        return model.without_mtp
    return model.moe_layer_model if model.mtp_layer_is_moe else model.dense_layer_model


def padded_vocab_size(model: ModelSpec, tp: int = 1) -> int:
    """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by * tp.

    Source: Megatron-LM megatron/training/tokenizer/tokenizer.py, `_vocab_size_with_padding`.
    """
    multiple = model.make_vocab_size_divisible_by * tp
    return -(-model.vocab_size // multiple) * multiple


_REQUIRED = ("name", "num_layers", "hidden_size", "num_attention_heads", "vocab_size",
             "seq_length", "global_batch_size")
_COUNTS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
           "ffn_hidden_size", "vocab_size", "seq_length", "max_position_embeddings",
           "sliding_window", "global_batch_size", "num_experts", "moe_topk",
           "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "rotary_base",
           "make_vocab_size_divisible_by", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
           "qk_pos_emb_head_dim", "v_head_dim")
"""The fields that are counts (positive integers; None for the optional ones: a default)."""


_MLA_DIMS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
"""Multi-Latent Attention's sizes; the first (q_lora_rank) is optional with MLA."""


def model_from_mapping(data: Any, source: str) -> ModelSpec:
    """A ModelSpec from a mapping read from a file or a study (`source` names it): every field
    checked (autotune.inputs.schema), then the model's own rules."""
    from autotune.inputs.schema import build  # pydantic: imported when a model is read

    return build(ModelSpec, data, source, what="model")


@functools.lru_cache(maxsize=256)
def _moe_layer_mask(is_moe: bool, freq: int | tuple[int, ...],
                    num_layers: int) -> tuple[bool, ...]:
    """ModelSpec.moe_layer_mask, remembered by what it reads: the memory and cost models ask
    it of every stage of every estimate (1.9M times in DeepSeek-V3's plan on 1,024 GPUs)."""
    if not is_moe:
        return (False,) * num_layers
    if isinstance(freq, int):
        return tuple(i % freq == 0 for i in range(num_layers))
    return tuple(bool(v) for v in freq)
