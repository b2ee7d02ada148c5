"""The one place that spells Megatron-LM's command-line flags: `ModelSpec` + `Layout` -> argv.

Every flag below is spelled as Megatron-LM's megatron/training/arguments.py declares it (read at
commit 000c4ac24f61159c138b0975def722c65245983c); elsewhere autotune speaks in the short names
`tp pp dp cp ep vpp mbs gbs`. Pure: no I/O, no subprocess, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.errors import ConfigError, InvalidLayoutError
from autotune.layout import Layout
from autotune.model import ModelSpec

__all__ = ["TRAINING_SCRIPT", "TRANSFORMER_IMPLS", "flag_names", "megatron_lm_args",
           "training_script"]

TRAINING_SCRIPT = "pretrain_gpt.py"

TRANSFORMER_IMPLS: dict[str, str] = {"local": "local", "te": "transformer_engine"}
"""autotune impl -> Megatron-LM `--transformer-impl`. autotune's "sdpa" (a local spec with
PyTorch SDPA as core attention) lives only in autotune's worker; Megatron-LM has no such choice."""

_ACTIVATION_FLAGS: dict[tuple[str, bool], tuple[str, ...]] = {
    # (activation, gated_linear_unit) -> flags. Megatron-LM's default MLP is GELU; --swiglu sets
    # gated_linear_unit with SiLU (core_transformer_config_from_args in arguments.py).
    ("gelu", False): (),
    ("swiglu", True): ("--swiglu",),
    ("silu", True): ("--swiglu",),
    ("squared_relu", False): ("--squared-relu",),
}


def megatron_lm_args(model: ModelSpec, layout: Layout, *, train_iters: int | None = None,
                     mock_data: bool = True, lr: float = 1.0e-4, seed: int = 1234,
                     log_interval: int = 1, distributed_timeout_minutes: int | None = None,
                     extra_args: Sequence[str] = ()) -> list[str]:
    """Megatron-LM `pretrain_gpt.py` arguments for one model and layout, each flag once.

    `train_iters` is the total number of iterations (warm-up included); `mock_data` trains on
    Megatron's synthetic GPT dataset with a NullTokenizer so no data or tokenizer files are needed.
    `extra_args` are appended verbatim; repeating a flag set here raises ConfigError.
    """
    if seed < 1:
        # megatron/core/tensor_parallel/random.py, model_parallel_cuda_manual_seed via
        # initialize.py _set_random_seed: "Seed (0) should be a positive integer."
        raise ConfigError(f"Megatron-LM needs a positive --seed, got {seed}")
    args: list[str] = []
    args += _model_args(model)
    args += _parallel_args(model, layout)
    args += _batch_args(layout)
    args += _recompute_args(layout)
    args += _optimizer_args(layout, lr=lr, seed=seed)
    args += _impl_args(layout)
    if train_iters is not None:
        if train_iters < 1:
            raise ConfigError(f"train_iters must be >= 1, got {train_iters}")
        args += ["--train-iters", str(train_iters)]
    if distributed_timeout_minutes is not None:
        args += ["--distributed-timeout-minutes", str(distributed_timeout_minutes)]
    args += _logging_args(log_interval)
    args += _data_args(model, mock_data=mock_data)
    extra = list(extra_args)
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


def _model_args(m: ModelSpec) -> list[str]:
    args = ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
            "--num-attention-heads", str(m.num_attention_heads)]
    if m.num_query_groups is not None and m.num_query_groups != m.num_attention_heads:
        # Megatron-LM reads --num-query-groups only with --group-query-attention set.
        args += ["--group-query-attention", "--num-query-groups", str(m.num_query_groups)]
    # Always explicit: with --swiglu and no --ffn-hidden-size Megatron-LM picks 8h/3 rounded to 64,
    # not the 4h ModelSpec.ffn_size assumes.
    args += ["--ffn-hidden-size", str(m.ffn_size)]
    args += ["--seq-length", str(m.seq_length),
             "--max-position-embeddings", str(max(m.max_positions, m.seq_length)),
             "--position-embedding-type", m.position_embedding]
    if m.position_embedding == "rope":
        args += ["--rotary-base", str(m.rotary_base)]
    args += ["--normalization", m.normalization]
    key = (m.activation, m.gated_linear_unit)
    if key not in _ACTIVATION_FLAGS:
        raise ConfigError(f"model {m.name}: activation={m.activation!r} with "
                          f"gated_linear_unit={m.gated_linear_unit} has no Megatron-LM flag")
    args += _ACTIVATION_FLAGS[key]
    if not m.add_bias_linear:
        args.append("--disable-bias-linear")
    if not m.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    args += ["--make-vocab-size-divisible-by", str(m.make_vocab_size_divisible_by)]
    # Megatron-LM's default is 0.1 for both; only a model that differs (Llama, Mixtral) says so.
    if m.attention_dropout != 0.1:
        args += ["--attention-dropout", str(m.attention_dropout)]
    if m.hidden_dropout != 0.1:
        args += ["--hidden-dropout", str(m.hidden_dropout)]
    if m.is_moe:
        assert m.num_experts is not None
        args += ["--num-experts", str(m.num_experts), "--moe-router-topk", str(m.moe_topk)]
        if m.moe_ffn_hidden_size is not None:
            args += ["--moe-ffn-hidden-size", str(m.moe_ffn_hidden_size)]
    return args


def _parallel_args(m: ModelSpec, s: Layout) -> list[str]:
    args = ["--tensor-model-parallel-size", str(s.tp),
            "--pipeline-model-parallel-size", str(s.pp)]
    if s.vpp > 1:
        # Megatron-LM accepts either --num-layers-per-virtual-pipeline-stage (layers per chunk) or
        # --num-virtual-stages-per-pipeline-rank (chunks per rank, the newer flag, also the one
        # that works with uneven first/last stages); vpp is the latter.
        args += ["--num-virtual-stages-per-pipeline-rank", str(s.vpp)]
    if s.cp > 1:
        args += ["--context-parallel-size", str(s.cp)]
    if s.ep > 1:
        args += ["--expert-model-parallel-size", str(s.ep)]
    if m.is_moe:
        # arguments.py help: "We recommend using 'alltoall' when applying expert parallelism";
        # the default 'allgather' gathers every token on every rank.
        args += ["--moe-token-dispatcher-type", "alltoall" if s.ep > 1 else "allgather"]
    if s.sequence_parallel:
        args.append("--sequence-parallel")
    return args


def _batch_args(s: Layout) -> list[str]:
    return ["--micro-batch-size", str(s.mbs), "--global-batch-size", str(s.gbs)]


def _recompute_args(s: Layout) -> list[str]:
    if s.recompute == "none":
        return []
    if s.recompute == "selective":
        # validate_args: "recompute method is not yet supported for selective recomputing".
        return ["--recompute-granularity", "selective"]
    if s.recompute == "full":
        return ["--recompute-granularity", "full", "--recompute-method", s.recompute_method,
                "--recompute-num-layers", str(s.recompute_num_layers)]
    raise InvalidLayoutError(f"recompute={s.recompute!r} must be none, selective or full")


def _optimizer_args(s: Layout, *, lr: float, seed: int) -> list[str]:
    args = ["--bf16", "--lr", repr(lr), "--seed", str(seed)]
    if s.distributed_optimizer:
        args.append("--use-distributed-optimizer")
    if s.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
    if s.overlap_param_gather:
        args.append("--overlap-param-gather")
    if s.cross_entropy_fusion:
        # TransformerConfig fields (model_parallel_config.py), flags generated from them.
        args += ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "native"]
    return args


_LOCAL_SPEC_ARGS: tuple[str, ...] = (
    "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion", "--no-persist-layer-norm",
    "--attention-softmax-in-fp32")
"""impl local is the local spec on plain PyTorch, as autotune's worker measures it: no apex
(gradient-accumulation fusion, persistent LayerNorm) and no fused softmax kernel. Megatron-LM's
defaults turn all three on and, without apex or TE, stop at start-up (tensor_parallel/layers.py
"gradient_accumulation_fusion ... requires", transformer/torch_norm.py persist_layer_norm,
fusions/fused_softmax.py scaled_masked_softmax_cuda), so the command says so explicitly.
The worker's TransformerConfig keeps megatron-core's attention_softmax_in_fp32=True, whose fp32
probabilities the unfused attention saves for backward; Megatron-LM's flag defaults to False.
Measured on an H100 (gpt2-xl, mbs 4): without the flag Megatron-LM peaked 9.4 GiB lower than
the worker, 2 bytes x heads x s^2 x mbs per layer."""


def _impl_args(s: Layout) -> list[str]:
    if s.impl not in TRANSFORMER_IMPLS:
        raise InvalidLayoutError(
            f"impl={s.impl} has no Megatron-LM equivalent; --transformer-impl takes "
            f"{' or '.join(TRANSFORMER_IMPLS.values())} (impl {' or '.join(TRANSFORMER_IMPLS)})")
    args = ["--transformer-impl", TRANSFORMER_IMPLS[s.impl]]
    if s.impl == "local":
        args += _LOCAL_SPEC_ARGS
    return args


def _logging_args(log_interval: int) -> list[str]:
    # --log-throughput adds "throughput per GPU (TFLOP/s/GPU)" to each iteration line; timers
    # stay out of TensorBoard by leaving --log-timers-to-tensorboard (a store_true flag) unset.
    # --eval-iters 0 skips validation, which would otherwise run after the last iteration.
    # --eval-interval too: at core_v0.16.1 its default is None, and get_train_valid_test_num_
    # samples (training.py) computes train_iters // eval_interval before looking at eval_iters,
    # so a run without it dies with a TypeError (found running pretrain_gpt.py on an H100).
    return ["--log-interval", str(log_interval), "--log-throughput", "--eval-iters", "0",
            "--eval-interval", str(_EVAL_INTERVAL)]


_EVAL_INTERVAL = 1000
"""Megatron-LM's old default; with --eval-iters 0 no evaluation runs at any interval."""


def _data_args(m: ModelSpec, *, mock_data: bool) -> list[str]:
    if not mock_data:
        return []
    # NullTokenizer's vocab_size is --vocab-size + 1 (it appends an end-of-document id;
    # megatron/core/tokenizers/text/libraries/null_tokenizer.py), and Megatron pads that to a
    # multiple of make_vocab_size_divisible_by * tp. Passing vocab_size - 1 gives the model the
    # same padded vocabulary as autotune.model.padded_vocab_size.
    return ["--mock-data", "--tokenizer-type", "NullTokenizer",
            "--vocab-size", str(m.vocab_size - 1)]
