"""The one place that spells Megatron-LM's command-line flags: one table, read both ways.

`FLAG_TABLE` holds a row per group of flags that belong together (the pipeline sizes, the
recompute trio, ...): its flags as Megatron-LM's megatron/training/arguments.py declares them
(read at commit 000c4ac24f61159c138b0975def722c65245983c), how a `ModelSpec` and a `Layout` emit
them (`megatron_lm_args`: ModelSpec + Layout -> argv), and how given flag values read back into
model and layout fields (`read_fields`, used by autotune.megatron.megatron_command to read a user's
own pretrain_gpt.py command). Elsewhere autotune speaks in the short names `tp pp dp cp ep vpp mbs
gbs`. Pure: no I/O, no subprocess, no torch.

Adding a flag is one row (or one flag in a row): its emission and its reading side by side, so
the export and the reader of user commands cannot drift apart (tests/test_megatron_command.py
round-trips every preset through both). A lever's rows live in its module (autotune.levers) and
are spliced into the table at the lever's `flag_place` (the recompute trio after the batch, the
transformer implementation last, ...); the row types are in autotune.levers.flags. What
Megatron-LM runs for impl sdpa (`exported_layout`) is the implementation lever's, re-exported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.errors import ConfigError, MissingFlagError
from autotune.layouts.layout import Layout
from autotune.levers import LEVERS
from autotune.levers.flags import (
    Emit,
    Flag,
    FlagRow,
    Given,
    Part,
    Place,
    RunOptions,
    switch,
    value,
)
from autotune.levers.transformer_impl import (
    SDPA_STANDS_IN,
    TRANSFORMER_IMPLS,
    exported_layout,
    measured_as_exported,
)
from autotune.megatron.core_config import MOE_TOKEN_DISPATCHER
from autotune.megatron.layer_pattern import format_layer_freq, parse_layer_freq
from autotune.megatron.megatron_versions import MegatronVersion, running, spell_args
from autotune.megatron.pipeline_layout import CONFLICTS, LAYOUT_FLAG, read_layout
from autotune.specs.elementwise import rope_fused
from autotune.specs.model import ModelSpec

__all__ = ["FLAG_TABLE", "GPT2_BPE_VOCAB", "PIPELINE_LAYOUT", "SDPA_STANDS_IN",
           "TRAINING_SCRIPT", "TRANSFORMER_IMPLS", "UNMODELED_DEFAULTS", "UNMODELED_FLAGS",
           "UNREPRESENTED_FLAGS",
           "Flag", "FlagRow", "Given", "Part", "RunOptions", "Unrepresented",
           "exported_layout", "flag_names", "known_flags", "measured_as_exported",
           "megatron_lm_args", "read_fields", "row_args", "training_script"]

TRAINING_SCRIPT = "pretrain_gpt.py"

GPT2_BPE_VOCAB = 50257
"""Entries of GPT-2's BPE vocabulary (gpt2-vocab.json, Radford et al. 2019): the vocabulary of
Megatron-LM's GPT2BPETokenizer, which reads it from --vocab-file and --merge-file."""

_ACTIVATION_FLAGS: dict[tuple[str, bool], tuple[str, ...]] = {
    # (activation, gated_linear_unit) -> flags. Megatron-LM's default MLP is GELU; --swiglu sets
    # gated_linear_unit with SiLU (core_transformer_config_from_args in arguments.py).
    ("gelu", False): (),
    ("swiglu", True): ("--swiglu",),
    ("silu", True): ("--swiglu",),
    ("squared_relu", False): ("--squared-relu",),
}


# ---- the model's shape -------------------------------------------------------------------


def _emit_gqa(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    if m.num_query_groups is not None and m.num_query_groups != m.num_attention_heads:
        # Megatron-LM reads --num-query-groups only with --group-query-attention set.
        return ["--group-query-attention", "--num-query-groups", str(m.num_query_groups)]
    return []


def _read_gqa(g: Given) -> dict[str, Any]:
    # --num-query-groups defaults to 1 in Megatron-LM's argparse, and reaches the model only
    # with --group-query-attention (core_transformer_config_from_args): the flag alone is one
    # KV group (multi-query attention), not a group per head.
    groups = g.integer("--num-query-groups", 1) if g.has("--group-query-attention") else None
    return {"num_query_groups": groups}


MLA_FLAG_DEFAULTS: dict[str, int | None] = {
    "q_lora_rank": None, "kv_lora_rank": 32, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64,
    "v_head_dim": 128}
"""Megatron-LM's defaults of Multi-Latent Attention's sizes (core_v0.16.1 arguments.py
_add_mla_args: --q-lora-rank None, --kv-lora-rank 32, --qk-head-dim 128, --qk-pos-emb-head-dim
64, --v-head-dim 128), which it hands MLATransformerConfig (whose own kv_lora_rank default,
512, a command never reaches)."""


def _mla_flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _emit_mla(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    if not m.multi_latent_attention:
        return []
    # Every size explicit (the defaults above are Megatron-LM's, not the model's); the query's
    # latent only where it has one (absent: None, no query compression).
    args = ["--multi-latent-attention"]
    for field in MLA_FLAG_DEFAULTS:
        value = getattr(m, field)
        if value is not None:
            args += [_mla_flag(field), str(value)]
    return args


def _read_mla(g: Given) -> dict[str, Any]:
    # The sizes reach the model only with --multi-latent-attention (core_transformer_config_
    # from_args picks MLATransformerConfig with it; TransformerConfig has none of them).
    if not g.has("--multi-latent-attention"):
        return {}
    sizes = {field: g.integer(_mla_flag(field), default)
             for field, default in MLA_FLAG_DEFAULTS.items()}
    return {"multi_latent_attention": True, **sizes}


def _read_kv_channels(g: Given) -> dict[str, Any]:
    # With --multi-latent-attention megatron-core sizes the heads by --qk-head-dim,
    # --qk-pos-emb-head-dim and --v-head-dim and never reads kv_channels (multi_latent_
    # attention.py; gpt_model.py builds no RotaryEmbedding from it with MLA), yet NVIDIA's
    # DeepSeek-V3 script passes --kv-channels 128 beside them
    # (examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh): read as the nothing it is.
    value = g.integer("--kv-channels", None)
    return {"kv_channels": None if g.has("--multi-latent-attention") else value}


def _emit_kv_channels(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    # Megatron-LM's validate_args sets kv_channels to hidden / heads when the flag is absent.
    return [] if m.kv_channels is None else ["--kv-channels", str(m.kv_channels)]


def _emit_ffn(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    # Always explicit: with --swiglu and no --ffn-hidden-size Megatron-LM picks 8h/3 rounded to 64,
    # not the 4h ModelSpec.ffn_size assumes.
    return ["--ffn-hidden-size", str(m.ffn_size)]


def _read_ffn(g: Given) -> dict[str, Any]:
    hidden = g.required("--hidden-size")
    # Megatron-LM's validate_args when --ffn-hidden-size is absent: 4h, or with --swiglu
    # int(4h * 2/3 / 64) * 64, "a multiple of 64" keeping the parameters near the 4h MLP's.
    default = int((4 * hidden * 2 / 3) / 64) * 64 if g.has("--swiglu") else 4 * hidden
    return {"ffn_hidden_size": g.integer("--ffn-hidden-size", default)}


def _emit_positions(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    args = ["--max-position-embeddings", str(max(m.max_positions, m.seq_length)),
            "--position-embedding-type", m.position_embedding]
    if m.position_embedding == "rope":
        args += ["--rotary-base", str(m.rotary_base)]
        if m.rotary_percent != 1.0:  # partial RoPE (Nemotron); Megatron-LM's default is 1.0
            args += ["--rotary-percent", str(m.rotary_percent)]
    return args


def _sequence(g: Given, *, required: bool = True) -> int | None:
    """The sequence Megatron-LM runs: --seq-length, else --encoder-seq-length (validate_args
    takes one for the other and asserts that only one is given)."""
    if g.has("--seq-length") and g.has("--encoder-seq-length"):
        raise ConfigError(f"{g.source}: the command sets both --seq-length and "
                          "--encoder-seq-length; Megatron-LM refuses it (validate_args asserts "
                          "one only): keep --seq-length")
    if g.has("--encoder-seq-length"):
        return g.integer("--encoder-seq-length")
    return g.required("--seq-length") if required else g.integer("--seq-length")


def _read_positions(g: Given) -> dict[str, Any]:
    # --use-rotary-position-embeddings is the older spelling of --position-embedding-type rope.
    default = "rope" if g.has("--use-rotary-position-embeddings") else "learned_absolute"
    kind = g.choice("--position-embedding-type", ("learned_absolute", "rope", "none"), default)
    # validate_args requires --max-position-embeddings and asserts it is at least the
    # sequence, whatever the position embedding (core_v0.16.1 arguments.py).
    positions, seq = g.integer("--max-position-embeddings"), _sequence(g, required=False)
    if positions is None:
        raise MissingFlagError(f"{g.source}: the command has no --max-position-embeddings, "
                               "which Megatron-LM requires: add it (at least the --seq-length)",
                               "--max-position-embeddings")
    if seq is not None and positions < seq:
        raise ConfigError(f"{g.source}: --max-position-embeddings {positions} is below "
                          f"--seq-length {seq}; Megatron-LM refuses it (it must be at least "
                          "the sequence)")
    return {"max_position_embeddings": positions,
            "position_embedding": kind, "rotary_base": g.integer("--rotary-base", 10000),
            # Megatron-LM reads --rotary-percent for RoPE only (gpt_builders.py hands it to
            # GPTModel, whose rotary embedding exists with rope alone).
            "rotary_percent": g.number("--rotary-percent", 1.0) if kind == "rope" else 1.0}


def _emit_rope_fusion(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    # Megatron-LM fuses RoPE by default; where the worker measured it unfused (the local
    # spec, or a user's --no-rope-fusion), the command says so (elementwise.rope_fused).
    if m.position_embedding != "rope" or rope_fused(m, str(s.impl)):
        return []
    return ["--no-rope-fusion"]


def _emit_activation(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    key = (m.activation, m.gated_linear_unit)
    if key not in _ACTIVATION_FLAGS:
        raise ConfigError(f"model {m.name}: activation={m.activation!r} with "
                          f"gated_linear_unit={m.gated_linear_unit} has no Megatron-LM flag")
    return list(_ACTIVATION_FLAGS[key])


def _read_activation(g: Given) -> dict[str, Any]:
    if g.has("--swiglu"):
        return {"activation": "swiglu", "gated_linear_unit": True}
    if g.has("--squared-relu"):
        return {"activation": "squared_relu", "gated_linear_unit": False}
    return {"activation": "gelu", "gated_linear_unit": False}


def _emit_dropout(name: str, field: str) -> Emit:
    def emit(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
        # Megatron-LM's default is 0.1 for both; only a model that differs (Llama) says so.
        value = getattr(m, field)
        return [] if value == 0.1 else [name, str(value)]
    return emit


def _dropout(name: str, field: str) -> FlagRow:
    return FlagRow(name=field, part=Part.MODEL, flags=(Flag(name),),
                   emit=_emit_dropout(name, field),
                   read=lambda g: {field: g.number(name, 0.1)})


def _emit_moe(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    if not m.is_moe:
        return []
    assert m.num_experts is not None
    args = ["--num-experts", str(m.num_experts), "--moe-router-topk", str(m.moe_topk)]
    if m.moe_ffn_hidden_size is not None:
        args += ["--moe-ffn-hidden-size", str(m.moe_ffn_hidden_size)]
    if m.moe_shared_expert_intermediate_size is not None:
        args += ["--moe-shared-expert-intermediate-size",
                 str(m.moe_shared_expert_intermediate_size)]
    if m.moe_shared_expert_gate:
        args.append("--moe-shared-expert-gate")
    if m.moe_layer_freq != 1:
        args += ["--moe-layer-freq", format_layer_freq(m.moe_layer_freq)]
    return args


def _read_moe(g: Given) -> dict[str, Any]:
    # arguments.py: --moe-router-topk defaults to 2; validate_args reads --num-experts 0 as
    # no experts (a dense model).
    # --moe-shared-expert-intermediate-size 0 is no shared expert, as its default (None).
    return {"num_experts": g.integer("--num-experts") or None,
            "moe_topk": g.integer("--moe-router-topk", 2),
            "moe_ffn_hidden_size": g.integer("--moe-ffn-hidden-size"),
            "moe_shared_expert_intermediate_size":
                g.integer("--moe-shared-expert-intermediate-size") or None,
            "moe_shared_expert_gate": g.has("--moe-shared-expert-gate"),
            # Which layers are MoE: read, never evaluated (autotune.megatron.layer_pattern);
            # without experts Megatron-LM builds no MoE layer whatever it says.
            "moe_layer_freq": parse_layer_freq(freq, g.source)
            if (freq := g.text("--moe-layer-freq")) is not None
            and (g.integer("--num-experts") or 0) > 1 else 1}


def _emit_mtp(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    if not m.mtp_num_layers:
        return []
    args = ["--mtp-num-layers", str(m.mtp_num_layers)]
    if m.mtp_loss_scaling_factor is not None:  # None: megatron-core's default, unsaid
        args += ["--mtp-loss-scaling-factor", repr(float(m.mtp_loss_scaling_factor))]
    return args


def _read_mtp(g: Given) -> dict[str, Any]:
    # TransformerConfig's mtp_num_layers (None: no MTP, as 0: `if args.mtp_num_layers`) and
    # mtp_loss_scaling_factor; the factor without layers changes nothing Megatron-LM builds.
    layers = g.integer("--mtp-num-layers") or 0
    factor = g.number("--mtp-loss-scaling-factor", 0.1) \
        if layers and g.has("--mtp-loss-scaling-factor") else None
    return {"mtp_num_layers": layers, "mtp_loss_scaling_factor": factor}


# ---- the layout ----------------------------------------------------------------------------


def _emit_vpp(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    # Megatron-LM accepts either --num-layers-per-virtual-pipeline-stage (layers per chunk) or
    # --num-virtual-stages-per-pipeline-rank (chunks per rank, the newer flag, also the one
    # that works with uneven first/last stages); vpp is the latter.
    return ["--num-virtual-stages-per-pipeline-rank", str(s.vpp)] if s.vpp > 1 else []


def _read_vpp(g: Given) -> dict[str, Any]:
    per_stage = g.integer("--num-layers-per-virtual-pipeline-stage")
    if per_stage is None:
        return {"vpp": g.integer("--num-virtual-stages-per-pipeline-rank", 1)}
    # validate_args: num_layers // pp // layers-per-virtual-stage chunks per rank.
    layers, pp = g.required("--num-layers"), g.integer("--pipeline-model-parallel-size", 1) or 1
    if per_stage < 1 or (layers // pp) % per_stage:
        raise ConfigError(f"{g.source}: --num-layers-per-virtual-pipeline-stage {per_stage} "
                          f"must divide the {layers // pp} layers of a pipeline stage")
    return {"vpp": layers // pp // per_stage}


PIPELINE_LAYOUT = "pipeline_layout"
"""The row of --pipeline-model-parallel-layout, and the key its reading gives read_fields: the
string read and checked (autotune.megatron.pipeline_layout.PipelineLayout), which
autotune.megatron.megatron_command maps to the split fields once the model is known."""


def _read_pipeline_layout(g: Given) -> dict[str, Any]:
    text = g.text(LAYOUT_FLAG)
    if text is None:
        return {}
    given = [flag for flag in CONFLICTS if g.has(flag)]
    if given:
        raise ConfigError(f"{g.source}: {LAYOUT_FLAG} with {given[0]}: Megatron-LM refuses "
                          "the two together (validate_args, TransformerConfig): the layout "
                          "string says the split and the virtual stages itself")
    pp = g.integer("--pipeline-model-parallel-size", 1) or 1
    layout = read_layout(text, pp=pp, num_layers=g.required("--num-layers"),
                         mtp_num_layers=g.integer("--mtp-num-layers") or 0, source=g.source)
    return {PIPELINE_LAYOUT: layout}


def _read_sequence_parallel(g: Given) -> dict[str, Any]:
    # validate_args turns sequence parallelism off where tensor parallelism is (tp 1), with a
    # warning, and runs on: a command with both runs without it (core_v0.16.1 arguments.py).
    tp = g.integer("--tensor-model-parallel-size", 1) or 1
    return {"sequence_parallel": g.has("--sequence-parallel") and tp > 1}


def _emit_dispatcher(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    if not m.is_moe:
        return []
    # The dispatcher the worker measured, at every ep (Megatron-LM's default is allgather).
    return ["--moe-token-dispatcher-type", MOE_TOKEN_DISPATCHER]


def _read_batch(g: Given) -> dict[str, Any]:
    mbs = g.integer("--micro-batch-size", 1)
    gbs = g.integer("--global-batch-size")
    if gbs is None:
        raise MissingFlagError(f"{g.source}: the command has no --global-batch-size "
                               "(Megatron-LM then takes micro-batch x data-parallel size); "
                               "autotune needs the global batch it keeps fixed: add it",
                               "--global-batch-size")
    return {"mbs": mbs, "gbs": gbs, "global_batch_size": gbs}


# ---- the run -------------------------------------------------------------------------------


def _emit_precision(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    return ["--bf16", "--lr", repr(run.lr), "--seed", str(run.seed)]


def _emit_train_iters(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    if run.train_iters is None:
        return []
    if run.train_iters < 1:
        raise ConfigError(f"train_iters must be >= 1, got {run.train_iters}")
    return ["--train-iters", str(run.train_iters)]


def _emit_timeout(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    if run.distributed_timeout_minutes is None:
        return []
    return ["--distributed-timeout-minutes", str(run.distributed_timeout_minutes)]


_EVAL_INTERVAL = 1000
"""Megatron-LM's old default; with --eval-iters 0 no evaluation runs at any interval."""


def _emit_logging(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    # --log-throughput adds "throughput per GPU (TFLOP/s/GPU)" to each iteration line; timers
    # stay out of TensorBoard by leaving --log-timers-to-tensorboard (a store_true flag) unset.
    # --eval-iters 0 skips validation, which would otherwise run after the last iteration.
    # --eval-interval too: at core_v0.16.1 its default is None, and get_train_valid_test_num_
    # samples (training.py) computes train_iters // eval_interval before looking at eval_iters,
    # so a run without it dies with a TypeError (found running pretrain_gpt.py on an H100).
    return ["--log-interval", str(run.log_interval), "--log-throughput", "--eval-iters", "0",
            "--eval-interval", str(_EVAL_INTERVAL)]


def _emit_data(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    if not run.mock_data:
        return []
    # NullTokenizer's vocab_size is --vocab-size + 1 (it appends an end-of-document id;
    # megatron/core/tokenizers/text/libraries/null_tokenizer.py), and Megatron pads that to a
    # multiple of make_vocab_size_divisible_by * tp. Passing vocab_size - 1 gives the model the
    # same padded vocabulary as autotune.specs.model.padded_vocab_size.
    return ["--mock-data", "--tokenizer-type", "NullTokenizer",
            "--vocab-size", str(m.vocab_size - 1)]


def _read_vocabulary(g: Given) -> dict[str, Any]:
    tokenizer = g.text("--tokenizer-type")
    size = g.integer("--vocab-size")
    if tokenizer == "NullTokenizer" and size is not None:
        return {"vocab_size": size + 1}  # the end-of-document id, as _emit_data says
    if tokenizer == "GPT2BPETokenizer" or (
            tokenizer is None and g.has("--vocab-file") and g.has("--merge-file")):
        return {"vocab_size": GPT2_BPE_VOCAB}
    if size is not None:
        return {"vocab_size": size}
    raise ConfigError(f"{g.source}: cannot tell the vocabulary size from the command "
                      f"(--tokenizer-type {tokenizer or 'not given'} reads it from its files); "
                      "add --vocab-size N with the tokenizer's vocabulary to the command "
                      "(Megatron-LM reads --vocab-size only for NullTokenizer)")


_DATA_FLAGS = (Flag("--mock-data", takes_value=False), Flag("--tokenizer-type"),
               Flag("--vocab-size"), Flag("--vocab-file"), Flag("--merge-file"))


def _lever_rows(place: Place) -> tuple[FlagRow, ...]:
    """The rows of the levers placed at `place` (autotune.levers: the pipeline split after the
    pipeline sizes, recompute and offload after the batch, the optimizer, overlap, fusion and
    FP8 levers after the precision, the implementation last), in registry order."""
    return tuple(row for lever in LEVERS if lever.flag_place == place
                 for row in lever.flag_rows)


FLAG_TABLE: tuple[FlagRow, ...] = (
    # The model's shape.
    value("--num-layers", "num_layers", Part.MODEL),
    value("--hidden-size", "hidden_size", Part.MODEL),
    value("--num-attention-heads", "num_attention_heads", Part.MODEL),
    FlagRow(name="num_query_groups", part=Part.MODEL,
            flags=(Flag("--group-query-attention", takes_value=False),
                   Flag("--num-query-groups")), emit=_emit_gqa, read=_read_gqa),
    FlagRow(name="kv_channels", part=Part.MODEL, flags=(Flag("--kv-channels"),),
            emit=_emit_kv_channels,
            read=_read_kv_channels),
    FlagRow(name="multi_latent_attention", part=Part.MODEL,
            flags=(Flag("--multi-latent-attention", takes_value=False),
                   *(Flag(_mla_flag(field)) for field in MLA_FLAG_DEFAULTS)),
            emit=_emit_mla, read=_read_mla),
    FlagRow(name="ffn_hidden_size", part=Part.MODEL, flags=(Flag("--ffn-hidden-size"),),
            emit=_emit_ffn, read=_read_ffn),
    FlagRow(name="seq_length", part=Part.MODEL,
            flags=(Flag("--seq-length"), Flag("--encoder-seq-length")),
            emit=lambda m, s, run: ["--seq-length", str(m.seq_length)],
            read=lambda g: {"seq_length": _sequence(g)}),
    FlagRow(name="positions", part=Part.MODEL,
            flags=(Flag("--max-position-embeddings"), Flag("--position-embedding-type"),
                   Flag("--rotary-base"), Flag("--rotary-percent"),
                   Flag("--use-rotary-position-embeddings", takes_value=False)),
            emit=_emit_positions, read=_read_positions),
    FlagRow(name="rope_fusion", part=Part.MODEL,
            flags=(Flag("--no-rope-fusion", takes_value=False),), emit=_emit_rope_fusion,
            read=lambda g: {"rope_fusion": not g.has("--no-rope-fusion")}),
    FlagRow(name="normalization", part=Part.MODEL, flags=(Flag("--normalization"),),
            emit=lambda m, s, run: ["--normalization", m.normalization],
            read=lambda g: {"normalization": g.choice("--normalization",
                                                      ("LayerNorm", "RMSNorm"), "LayerNorm")}),
    switch("--apply-layernorm-1p", "apply_layernorm_1p", Part.MODEL),
    FlagRow(name="activation", part=Part.MODEL,
            flags=(Flag("--swiglu", takes_value=False), Flag("--squared-relu", takes_value=False)),
            emit=_emit_activation, read=_read_activation),
    switch("--disable-bias-linear", "add_bias_linear", Part.MODEL, on_means=False),
    switch("--add-qkv-bias", "add_qkv_bias", Part.MODEL),
    switch("--qk-layernorm", "qk_layernorm", Part.MODEL),
    switch("--untie-embeddings-and-output-weights", "tied_embeddings", Part.MODEL,
            on_means=False),
    value("--make-vocab-size-divisible-by", "make_vocab_size_divisible_by", Part.MODEL,
           default=128),
    _dropout("--attention-dropout", "attention_dropout"),
    _dropout("--hidden-dropout", "hidden_dropout"),
    FlagRow(name="experts", part=Part.MODEL,
            flags=(Flag("--num-experts"), Flag("--moe-router-topk"),
                   Flag("--moe-ffn-hidden-size"), Flag("--moe-shared-expert-intermediate-size"),
                   Flag("--moe-shared-expert-gate", takes_value=False),
                   Flag("--moe-layer-freq")),
            emit=_emit_moe, read=_read_moe),
    FlagRow(name="mtp", part=Part.MODEL,
            flags=(Flag("--mtp-num-layers"), Flag("--mtp-loss-scaling-factor")),
            emit=_emit_mtp, read=_read_mtp),
    # The parallel layout.
    value("--tensor-model-parallel-size", "tp", Part.LAYOUT, default=1),
    value("--pipeline-model-parallel-size", "pp", Part.LAYOUT, default=1),
    # A user's own layout string: read (the split it gives, mapped once the model is known),
    # never written by autotune's own commands, which write the split's flags; an export that
    # edits a script holding one rewrites the string (megatron_command.layout_changes).
    FlagRow(name=PIPELINE_LAYOUT, part=Part.LAYOUT, flags=(Flag(LAYOUT_FLAG),),
            emit=lambda m, s, run: [], read=_read_pipeline_layout),
    FlagRow(name="vpp", part=Part.LAYOUT,
            flags=(Flag("--num-virtual-stages-per-pipeline-rank"),
                   Flag("--num-layers-per-virtual-pipeline-stage")),
            emit=_emit_vpp, read=_read_vpp),
    *_lever_rows(Place.PIPELINE),
    value("--context-parallel-size", "cp", Part.LAYOUT, default=1, omit_at=1),
    value("--expert-model-parallel-size", "ep", Part.LAYOUT, default=1, omit_at=1),
    FlagRow(name="moe_token_dispatcher", part=Part.LAYOUT,
            flags=(Flag("--moe-token-dispatcher-type"),), emit=_emit_dispatcher),
    FlagRow(name="sequence_parallel", part=Part.LAYOUT,
            flags=(Flag("--sequence-parallel", takes_value=False),),
            emit=lambda m, s, run: ["--sequence-parallel"] if s.sequence_parallel else [],
            read=_read_sequence_parallel),
    FlagRow(name="batch", part=Part.LAYOUT,
            flags=(Flag("--micro-batch-size"), Flag("--global-batch-size")),
            emit=lambda m, s, run: ["--micro-batch-size", str(s.mbs),
                                    "--global-batch-size", str(s.gbs)],
            read=_read_batch),
    *_lever_rows(Place.MEMORY),
    FlagRow(name="precision", part=Part.RUN,
            flags=(Flag("--bf16", takes_value=False), Flag("--lr"), Flag("--seed")),
            emit=_emit_precision),
    *_lever_rows(Place.OPTIONS),
    *_lever_rows(Place.IMPLEMENTATION),
    # The run: a user's own values of these stay as they are.
    FlagRow(name="train_iters", part=Part.RUN, flags=(Flag("--train-iters"),),
            emit=_emit_train_iters),
    FlagRow(name="timeout", part=Part.RUN, flags=(Flag("--distributed-timeout-minutes"),),
            emit=_emit_timeout),
    FlagRow(name="logging", part=Part.RUN,
            flags=(Flag("--log-interval"), Flag("--log-throughput", takes_value=False),
                   Flag("--eval-iters"), Flag("--eval-interval")), emit=_emit_logging),
    FlagRow(name="data", part=Part.RUN, flags=_DATA_FLAGS, emit=_emit_data,
            read=_read_vocabulary),
)
"""Every flag autotune writes or reads, in the order megatron_lm_args writes them: the core
rows, with each lever's rows at its place (autotune.levers.flags.Place)."""


_UNMODELED: tuple[tuple[str, str], ...] = (
    ("--tp-comm-overlap", "tensor-parallel communication overlapped with the GEMMs"),
    ("--overlap-moe-expert-parallel-comm", "expert-parallel communication overlap"),
    ("--delay-wgrad-compute", "weight gradients computed later"),
    ("--enable-cuda-graph", "CUDA graphs"),
    ("--cuda-graph-impl", "CUDA graphs"),
    ("--external-cuda-graph", "CUDA graphs"),
    ("--use-torch-fsdp2", "FSDP instead of the distributed optimizer"),
    ("--use-megatron-fsdp", "FSDP instead of the distributed optimizer"),
    ("--num-distributed-optimizer-instances", "optimizer state replicated in groups"),
    ("--fp16", "fp16 instead of bf16"),
    ("--attention-backend", "which fused attention kernel runs, when not auto"),
    ("--te-rng-tracker", "Transformer Engine's RNG tracker"),
    ("--no-bias-gelu-fusion", "an unfused bias-GELU"),
    ("--no-bias-swiglu-fusion", "an unfused bias-SwiGLU"),
    ("--no-bias-dropout-fusion", "an unfused bias-dropout-add"),
    ("--fine-grained-activation-offloading", "activations offloaded per module"),
    ("--use-nccl-ub", "NCCL user buffers"),
    ("--symmetric-ar-type", "symmetric-memory all-reduces"),
    ("--expert-tensor-parallel-size",
     "the experts' weights split over other ranks than tensor parallelism's"),
    ("--moe-expert-capacity-factor", "tokens dropped or padded at an expert's capacity"),
    ("--moe-pad-expert-input-to-capacity", "every expert's input padded to its capacity"),
    ("--moe-layer-recompute", "the MoE layers recomputed in the backward pass"),
    # Measured no faster on one H200 at ep 1 (64 experts, host-bound: 1.707 s unfused, 1.732
    # with the permutation fused, 1.844 with the router, 1.947 with both; 2026-11-29-h200-moe-
    # fusion-s22.md); at ep > 1, where NVIDIA's recipes run them, not measured.
    ("--moe-permute-fusion", "the MoE token permutation fused (Transformer Engine's kernels)"),
    ("--moe-router-fusion", "the MoE router's top-k and auxiliary loss fused (TE's kernels)"),
    # The worker's and the export's dispatcher is alltoall (core_config.MOE_TOKEN_DISPATCHER,
    # measured faster than allgather at ep 1); flex (DeepEP, HybridEP) is not measured.
    ("--moe-token-dispatcher-type",
     f"a token dispatcher other than {MOE_TOKEN_DISPATCHER}, which autotune measures and its "
     "export writes"),
    ("--moe-shared-expert-overlap",
     "the shared expert run on a side stream, overlapped with the token dispatch"),
    ("--use-flash-attn", "FlashAttention as core attention"),
    ("--cp-comm-type", "context-parallel communication other than p2p"),
    ("--hierarchical-context-parallel-sizes", "context-parallel communication in levels"),
    ("--account-for-embedding-in-pipeline-split", "the embedding counted as a pipeline layer"),
    ("--account-for-loss-in-pipeline-split", "the loss counted as a pipeline layer"),
    ("--fp32-residual-connection", "the residual stream kept in fp32"),
)
"""Megatron-LM core_v0.16.1 flags outside the levers that change speed or memory and that
autotune does not model, each with what it changes."""

UNMODELED_DEFAULTS: dict[str, str] = {"--attention-backend": "auto", "--cp-comm-type": "p2p",
                                      "--moe-token-dispatcher-type": MOE_TOKEN_DISPATCHER}
"""Values of UNMODELED_FLAGS that are Megatron-LM's default (arguments.py), which autotune
runs too: a command that spells one out is not warned about."""

UNMODELED_FLAGS: dict[str, str] = dict(
    (*_UNMODELED, *(pair for lever in LEVERS for pair in lever.unmodeled)))
"""Every Megatron-LM flag that changes a run in a way autotune's models and worker leave out
(the levers' own, autotune.levers.base.Lever.unmodeled, among them), with what it changes: a
user's command that passes one is warned about in one line
(autotune.megatron.megatron_command.unmodeled_warning), never followed in silence."""


OursTest = Callable[[list[str], ModelSpec], bool]


def _never(values: list[str], model: ModelSpec) -> bool:
    return False


def _one_value(test: Callable[[str, ModelSpec], bool]) -> OursTest:
    def ours(values: list[str], model: ModelSpec) -> bool:
        return len(values) == 1 and test(values[0], model)
    return ours


def _integer(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _full_window(text: str, model: ModelSpec) -> bool:
    # Megatron-LM's --window-size "LEFT,RIGHT" (TransformerConfig.window_size): LEFT -1 is an
    # unbounded window, and one at least the sequence long attends to every earlier token.
    left = _integer(text.strip("()[] ").split(",")[0])
    return left is not None and (left < 0 or left >= model.seq_length)


@dataclass(frozen=True, slots=True)
class Unrepresented:
    """A Megatron-LM flag that gives the model a shape (or the pipeline a placement) autotune's
    models do not have: a user's command that passes it is refused in one line rather than
    predicted as another model, unless its value is the one autotune's model has (`ours`)."""

    what: str
    ours: OursTest = _never


UNREPRESENTED_FLAGS: dict[str, Unrepresented] = {
    # hf_config refuses the same shapes in a config.json (sliding_window in use):
    # a Megatron-LM command must not get further with them.
    "--window-size": Unrepresented("sliding-window attention", _one_value(_full_window)),
    "--window-attn-skip-freq": Unrepresented("sliding-window attention on some layers"),
    # Megatron-LM: MLA's RoPE is YaRN unless --rope-type (MLATransformerConfig's default,
    # autotune's: autotune.megatron.core_config.MLA_ROPE_TYPE); other attention asserts rope.
    "--rope-type": Unrepresented(
        "another RoPE type than the attention's default (MLA: yarn, else rope)",
        _one_value(lambda v, m: v == ("yarn" if m.multi_latent_attention else "rope"))),
    "--experimental-attention-variant": Unrepresented("an attention variant of its own"),
    "--moe-latent-size": Unrepresented("MoE experts in a latent space"),
    "--heterogeneous-layers-config-path": Unrepresented("layers of different shapes"),
    "--heterogeneous-layers-config-encoded-json": Unrepresented("layers of different shapes"),
}
"""Megatron-LM core_v0.16.1 flags (declared by 0.19 too) whose model autotune's analytical
models, worker and export do not have, each with what it gives the model and the values that
are autotune's own (a head dimension of hidden / heads, every layer MoE, ...). A flag autotune
does not know is otherwise kept and passed on untouched; one of these would be followed in
silence by a prediction for another model."""


def known_flags() -> dict[str, Flag]:
    """Every flag of the table by name: what a reader of a command recognises."""
    return {flag.name: flag for row in FLAG_TABLE for flag in row.flags}


def read_fields(given: Given) -> dict[str, Any]:
    """ModelSpec and Layout fields (by name; `global_batch_size` for the model, `gbs` for the
    layout) from a command's flag values, every row's reading in table order. dp is not among
    them: it follows from the GPUs the command runs on."""
    fields: dict[str, Any] = {}
    for row in FLAG_TABLE:
        if row.read is not None:
            fields.update(row.read(given))
    return fields


def row_args(row: FlagRow, model: ModelSpec, layout: Layout,
             run: RunOptions | None = None) -> list[str]:
    """One row's arguments for a model and layout."""
    return row.emit(model, layout, run or RunOptions())


def megatron_lm_args(model: ModelSpec, layout: Layout, *, train_iters: int | None = None,
                     mock_data: bool = True, lr: float = 1.0e-4, seed: int = 1234,
                     log_interval: int = 1, distributed_timeout_minutes: int | None = None,
                     extra_args: Sequence[str] = (),
                     megatron_version: MegatronVersion | None = None) -> list[str]:
    """Megatron-LM `pretrain_gpt.py` arguments for one model and layout, each flag once.

    `train_iters` is the total number of iterations (warm-up included); `mock_data` trains on
    Megatron's synthetic GPT dataset with a NullTokenizer so no data or tokenizer files are needed.
    `extra_args` are appended verbatim; repeating a flag set here raises ConfigError.
    The flags are spelled for `megatron_version` (default: the installed megatron-core's
    release, else autotune.megatron.megatron_versions.DEFAULT): the table's spellings are those of
    every supported release, and `extra_args` in another release's spelling are respelled.
    """
    if seed < 1:
        # megatron/core/tensor_parallel/random.py, model_parallel_cuda_manual_seed via
        # initialize.py _set_random_seed: "Seed (0) should be a positive integer."
        raise ConfigError(f"Megatron-LM needs a positive --seed, got {seed}")
    run = RunOptions(train_iters=train_iters, mock_data=mock_data, lr=lr, seed=seed,
                     log_interval=log_interval,
                     distributed_timeout_minutes=distributed_timeout_minutes)
    version = megatron_version or running()
    args = spell_args([arg for row in FLAG_TABLE for arg in row.emit(model, layout, run)],
                      version)
    extra = spell_args(extra_args, version)
    if not extra:
        return args
    clash = sorted(set(flag_names(args)) & set(flag_names(extra)))
    if clash:
        raise ConfigError(f"extra Megatron-LM argument(s) {', '.join(clash)} repeat flags "
                          "autotune already sets")
    return args + extra


def training_script(megatron_lm: str) -> str:
    """The script `--megatron-lm PATH` names: PATH/pretrain_gpt.py for a checkout, or PATH itself
    when it is a .py file (a site wrapper that runs pretrain_gpt.py, e.g. one that sets up
    a container or skips the build steps of a pip-installed megatron-core)."""
    path = megatron_lm.rstrip("/")
    return path if path.endswith(".py") else f"{path}/{TRAINING_SCRIPT}"


def flag_names(args: Sequence[str]) -> list[str]:
    """The `--flag` names in an argument list, in order (values and `=value` tails dropped)."""
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]
