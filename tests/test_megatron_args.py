"""Megatron-LM flags: exact lists for known layouts, and every flag as arguments.py declares it."""

from __future__ import annotations

import argparse
from collections import Counter

import pytest

from autotune.errors import ConfigError, InvalidLayoutError
from autotune.layouts.layout import Layout
from autotune.levers import LEVERS
from autotune.megatron.core_config import core_config
from autotune.megatron.megatron_args import (
    FLAG_TABLE,
    flag_names,
    megatron_lm_args,
    training_script,
)
from autotune.specs.model import ModelSpec, padded_vocab_size
from autotune.trials.protocol import distributed_timeout_minutes

GPT2 = ModelSpec(name="gpt2", num_layers=12, hidden_size=768, num_attention_heads=12,
                 vocab_size=50257, seq_length=1024, max_position_embeddings=1024,
                 global_batch_size=64)
LLAMA = ModelSpec(name="llama", num_layers=32, hidden_size=4096, num_attention_heads=32,
                  num_query_groups=8, ffn_hidden_size=14336, vocab_size=128256, seq_length=8192,
                  max_position_embeddings=8192, global_batch_size=512, gated_linear_unit=True,
                  activation="swiglu", normalization="RMSNorm", add_bias_linear=False,
                  tied_embeddings=False, position_embedding="rope", rotary_base=500000)
MIXTRAL = ModelSpec(name="mixtral", num_layers=32, hidden_size=4096, num_attention_heads=32,
                    num_query_groups=8, ffn_hidden_size=14336, vocab_size=32000,
                    seq_length=4096, max_position_embeddings=32768, global_batch_size=512,
                    num_experts=8, moe_topk=2, gated_linear_unit=True, activation="swiglu",
                    normalization="RMSNorm", add_bias_linear=False, tied_embeddings=False,
                    position_embedding="rope", rotary_base=1000000)


def _megatron_lm_parser() -> argparse.ArgumentParser:
    """The flags autotune emits, declared as Megatron-LM's megatron/training/arguments.py does
    (commit 000c4ac24f61159c138b0975def722c65245983c): name, type, choices, store_true."""
    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for name in ("--num-layers", "--hidden-size", "--num-attention-heads", "--num-query-groups",
                 "--ffn-hidden-size", "--seq-length", "--max-position-embeddings",
                 "--rotary-base", "--make-vocab-size-divisible-by", "--num-experts",
                 "--moe-router-topk", "--moe-ffn-hidden-size", "--tensor-model-parallel-size",
                 "--pipeline-model-parallel-size", "--num-virtual-stages-per-pipeline-rank",
                 "--num-layers-per-virtual-pipeline-stage", "--context-parallel-size",
                 "--expert-model-parallel-size", "--micro-batch-size", "--global-batch-size",
                 "--recompute-num-layers", "--seed", "--train-iters",
                 "--distributed-timeout-minutes", "--log-interval", "--eval-iters",
                 "--eval-interval",
                 "--vocab-size"):
        p.add_argument(name, type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--attention-dropout", type=float)
    p.add_argument("--hidden-dropout", type=float)
    for name in ("--group-query-attention", "--swiglu", "--squared-relu",
                 "--untie-embeddings-and-output-weights", "--sequence-parallel", "--bf16",
                 "--use-distributed-optimizer", "--overlap-grad-reduce",
                 "--overlap-param-gather", "--log-throughput", "--mock-data",
                 "--log-timers-to-tensorboard", "--moe-grouped-gemm"):
        p.add_argument(name, action="store_true")
    p.add_argument("--disable-bias-linear", action="store_false", dest="add_bias_linear")
    # core_v0.16.1 arguments.py: the first two store_false into the fusion's name, the third
    # is a store_true named after itself.
    p.add_argument("--no-masked-softmax-fusion", action="store_false",
                   dest="masked_softmax_fusion")
    p.add_argument("--no-gradient-accumulation-fusion", action="store_false",
                   dest="gradient_accumulation_fusion")
    p.add_argument("--no-persist-layer-norm", action="store_true")
    p.add_argument("--no-rope-fusion", action="store_false", dest="apply_rope_fusion")
    p.add_argument("--attention-softmax-in-fp32", action="store_true")
    # Generated from TransformerConfig (model_parallel_config.py) at core_v0.16.1.
    p.add_argument("--cross-entropy-loss-fusion", action="store_true")
    p.add_argument("--cross-entropy-fusion-impl", choices=["native", "te"])
    p.add_argument("--position-embedding-type",
                   choices=["learned_absolute", "rope", "mrope", "relative", "none"])
    p.add_argument("--normalization", choices=["LayerNorm", "RMSNorm"])
    p.add_argument("--moe-token-dispatcher-type", choices=["allgather", "alltoall", "flex"])
    p.add_argument("--recompute-granularity", choices=["full", "selective"])
    p.add_argument("--recompute-method", choices=["uniform", "block"])
    # TransformerConfig.recompute_modules (Optional[List[str]] -> nargs +, no choices) and
    # cpu_offloading_num_layers, generated by argument_utils.py at core_v0.16.1; the uneven
    # split's two flags from _add_distributed_args.
    p.add_argument("--recompute-modules", nargs="+", type=str)
    p.add_argument("--cpu-offloading-num-layers", type=int)
    p.add_argument("--decoder-first-pipeline-num-layers", type=int)
    p.add_argument("--decoder-last-pipeline-num-layers", type=int)
    p.add_argument("--transformer-impl", choices=["local", "transformer_engine"])
    p.add_argument("--tokenizer-type", choices=["GPT2BPETokenizer", "NullTokenizer"])
    return p


GPT2_BASE = [
    "--num-layers", "12", "--hidden-size", "768", "--num-attention-heads", "12",
    "--ffn-hidden-size", "3072", "--seq-length", "1024", "--max-position-embeddings", "1024",
    "--position-embedding-type", "learned_absolute", "--normalization", "LayerNorm",
    "--make-vocab-size-divisible-by", "128",
    "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
    "--micro-batch-size", "4", "--global-batch-size", "64",
    "--bf16", "--lr", "0.0001", "--seed", "1234",
    "--transformer-impl", "local",
    "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion", "--no-persist-layer-norm",
    "--attention-softmax-in-fp32",
    "--train-iters", "13",
    "--log-interval", "1", "--log-throughput", "--eval-iters", "0", "--eval-interval", "1000",
    "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "50256",
]

LLAMA_PP_VPP = [
    "--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32",
    "--group-query-attention", "--num-query-groups", "8",
    "--ffn-hidden-size", "14336", "--seq-length", "8192", "--max-position-embeddings", "8192",
    "--position-embedding-type", "rope", "--rotary-base", "500000",
    "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
    "--untie-embeddings-and-output-weights", "--make-vocab-size-divisible-by", "128",
    "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4",
    "--num-virtual-stages-per-pipeline-rank", "2", "--sequence-parallel",
    "--micro-batch-size", "1", "--global-batch-size", "512",
    "--recompute-granularity", "full", "--recompute-method", "block",
    "--recompute-num-layers", "2",
    "--bf16", "--lr", "0.0001", "--seed", "1234",
    "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
    "--transformer-impl", "transformer_engine", "--no-gradient-accumulation-fusion",
    "--train-iters", "20", "--distributed-timeout-minutes", "2",
    "--log-interval", "1", "--log-throughput", "--eval-iters", "0", "--eval-interval", "1000",
    "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128255",
]

MIXTRAL_EP = [
    "--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32",
    "--group-query-attention", "--num-query-groups", "8",
    "--ffn-hidden-size", "14336", "--seq-length", "4096", "--max-position-embeddings", "32768",
    "--position-embedding-type", "rope", "--rotary-base", "1000000",
    "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
    "--untie-embeddings-and-output-weights", "--make-vocab-size-divisible-by", "128",
    "--num-experts", "8", "--moe-router-topk", "2",
    "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1",
    "--expert-model-parallel-size", "4", "--moe-token-dispatcher-type", "alltoall",
    "--sequence-parallel",
    "--micro-batch-size", "1", "--global-batch-size", "512",
    "--recompute-granularity", "selective",
    "--bf16", "--lr", "0.0001", "--seed", "1234",
    "--use-distributed-optimizer",
    "--transformer-impl", "transformer_engine", "--no-gradient-accumulation-fusion",
    "--moe-grouped-gemm",
    "--log-interval", "1", "--log-throughput", "--eval-iters", "0", "--eval-interval", "1000",
    "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "31999",
]


@pytest.mark.parametrize(("model", "layout", "kwargs", "expected"), [
    (GPT2, Layout(mbs=4, gbs=64), {"train_iters": 13}, GPT2_BASE),
    (LLAMA, Layout(tp=2, pp=4, dp=1, vpp=2, mbs=1, gbs=512, sequence_parallel=True,
                   recompute="full", recompute_method="block", recompute_num_layers=2,
                   distributed_optimizer=True, overlap_grad_reduce=True,
                   overlap_param_gather=True, impl="te"),
     {"train_iters": 20, "distributed_timeout_minutes": 2}, LLAMA_PP_VPP),
    (MIXTRAL, Layout(tp=2, dp=4, ep=4, mbs=1, gbs=512, sequence_parallel=True,
                     recompute="selective", distributed_optimizer=True, impl="te"),
     {}, MIXTRAL_EP),
], ids=["gpt2-dp", "llama-tp-pp-vpp-sp-full-block-do-overlap", "mixtral-ep-tp-sp-selective"])
def test_exact_flags(model: ModelSpec, layout: Layout, kwargs: dict[str, int],
                     expected: list[str]) -> None:
    assert megatron_lm_args(model, layout, **kwargs) == expected


LAYOUTS = [
    Layout(),
    Layout(tp=2, dp=4, sequence_parallel=True, mbs=2, gbs=64),
    Layout(pp=4, vpp=2, dp=2, mbs=1, gbs=64),
    Layout(cp=2, dp=4, impl="te", mbs=1, gbs=64),
    Layout(tp=2, cp=2, dp=2, sequence_parallel=True, impl="te", gbs=64),
    Layout(recompute="full", recompute_method="uniform", recompute_num_layers=4, gbs=64),
    Layout(recompute="selective", gbs=64),
    Layout(dp=8, distributed_optimizer=True, overlap_grad_reduce=True,
           overlap_param_gather=True, gbs=64),
    Layout(tp=2, dp=2, sequence_parallel=True, cross_entropy_fusion=True, impl="te", gbs=64),
]


@pytest.mark.parametrize("model", [GPT2, LLAMA, MIXTRAL], ids=lambda m: m.name)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda s: s.describe())
def test_every_flag_parses_as_megatron_lm_declares_it(model: ModelSpec,
                                                      layout: Layout) -> None:
    args = megatron_lm_args(model, layout, train_iters=10, distributed_timeout_minutes=2)
    names = flag_names(args)
    assert [n for n, c in Counter(names).items() if c > 1] == []
    ns = _megatron_lm_parser().parse_args(args)  # unknown flags or bad values raise
    assert ns.tensor_model_parallel_size == layout.tp
    assert ns.pipeline_model_parallel_size == layout.pp
    assert (ns.context_parallel_size or 1) == layout.cp
    assert (ns.num_virtual_stages_per_pipeline_rank or 1) == layout.vpp
    assert ns.micro_batch_size == layout.mbs
    assert ns.global_batch_size == layout.gbs
    assert ns.sequence_parallel == layout.sequence_parallel
    assert ns.use_distributed_optimizer == layout.distributed_optimizer
    assert ns.num_layers == model.num_layers
    assert ns.ffn_hidden_size == model.ffn_size
    assert ns.add_bias_linear == model.add_bias_linear
    assert ns.untie_embeddings_and_output_weights == (not model.tied_embeddings)
    assert ns.recompute_granularity == (None if layout.recompute == "none"
                                        else layout.recompute)
    assert not ns.log_timers_to_tensorboard
    # impl local runs on plain PyTorch, as the worker measured it: no apex or fused softmax;
    # neither local nor te assumes apex's gradient-accumulation fusion.
    local = layout.impl == "local"
    assert ns.gradient_accumulation_fusion is (layout.impl not in ("local", "te"))
    assert ns.masked_softmax_fusion is not local
    assert ns.no_persist_layer_norm is local
    assert ns.attention_softmax_in_fp32 is local  # as megatron-core's TransformerConfig default
    assert ns.cross_entropy_loss_fusion is layout.cross_entropy_fusion
    # The experts as the worker builds them: grouped (TEGroupedMLP) with TE's spec.
    assert ns.moe_grouped_gemm is (model.is_moe and layout.impl == "te")


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("model", [GPT2, LLAMA, MIXTRAL], ids=lambda m: m.name)
def test_null_tokenizer_gets_autotunes_padded_vocabulary(model: ModelSpec, tp: int) -> None:
    # Megatron-LM: NullTokenizer.vocab_size = --vocab-size + 1, then padded to a multiple of
    # make_vocab_size_divisible_by * tp (vocab_size_with_padding).
    args = megatron_lm_args(model, Layout(tp=tp))
    vocab = int(args[args.index("--vocab-size") + 1]) + 1
    multiple = model.make_vocab_size_divisible_by * tp
    assert -(-vocab // multiple) * multiple == padded_vocab_size(model, tp)


@pytest.mark.parametrize("ep", [1, 2, 8])
def test_moe_export_runs_the_workers_dispatcher_at_every_ep(ep: int) -> None:
    # Megatron-LM's default is allgather; the worker builds alltoall, measured faster at ep 1.
    args = megatron_lm_args(MIXTRAL, Layout(dp=8, ep=ep, gbs=512))
    dispatcher = args[args.index("--moe-token-dispatcher-type") + 1]
    assert dispatcher == core_config(MIXTRAL, Layout(dp=8, ep=ep, gbs=512)).transformer[
        "moe_token_dispatcher_type"] == "alltoall"
    assert ("--expert-model-parallel-size" in args) == (ep > 1)


def test_dense_model_has_no_moe_flags() -> None:
    names = flag_names(megatron_lm_args(GPT2, Layout()))
    assert not [n for n in names if "expert" in n or n.startswith("--moe")]


def test_real_data_leaves_the_data_flags_to_the_caller() -> None:
    names = flag_names(megatron_lm_args(GPT2, Layout(), mock_data=False))
    assert not {"--mock-data", "--tokenizer-type", "--vocab-size"} & set(names)


def test_extra_args_are_appended() -> None:
    args = megatron_lm_args(GPT2, Layout(), extra_args=["--no-bias-gelu-fusion"])
    assert args[-1] == "--no-bias-gelu-fusion"


@pytest.mark.parametrize("extra", [["--micro-batch-size", "8"], ["--bf16"], ["--lr=3e-4"]])
def test_extra_args_may_not_repeat_a_flag(extra: list[str]) -> None:
    with pytest.raises(ConfigError, match="repeat"):
        megatron_lm_args(GPT2, Layout(), extra_args=extra)


def test_sdpa_has_no_megatron_lm_equivalent() -> None:
    with pytest.raises(InvalidLayoutError, match="impl=sdpa"):
        megatron_lm_args(GPT2, Layout(impl="sdpa"))


def test_unknown_activation_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="activation must be one of"):
        ModelSpec(name="odd", num_layers=2, hidden_size=64, num_attention_heads=4,
                  vocab_size=1000, seq_length=128, global_batch_size=8, activation="relu")
    # A known activation in a combination Megatron-LM has no flag for.
    odd = ModelSpec(name="odd", num_layers=2, hidden_size=64, num_attention_heads=4,
                    vocab_size=1000, seq_length=128, global_batch_size=8,
                    activation="squared_relu", gated_linear_unit=True,
                    add_bias_linear=False)
    with pytest.raises(ConfigError, match="activation='squared_relu'"):
        megatron_lm_args(odd, Layout())


@pytest.mark.parametrize(("seconds", "minutes"), [(1, 1), (60, 1), (61, 2), (120, 2), (600, 10)])
def test_distributed_timeout_minutes_rounds_up(seconds: float, minutes: int) -> None:
    assert distributed_timeout_minutes(seconds) == minutes


def test_presets_without_dropout_say_so() -> None:
    from autotune.specs.presets import load_model

    llama = megatron_lm_args(load_model("llama3-8b"), Layout(tp=8, gbs=512))
    assert llama[llama.index("--attention-dropout") + 1] == "0.0"
    assert llama[llama.index("--hidden-dropout") + 1] == "0.0"
    parsed = _megatron_lm_parser().parse_known_args(llama)[0]
    assert parsed.attention_dropout == parsed.hidden_dropout == 0.0
    gpt2 = megatron_lm_args(load_model("gpt2"), Layout(gbs=64))
    assert "--attention-dropout" not in gpt2 and "--hidden-dropout" not in gpt2


@pytest.mark.parametrize(("path", "script"), [
    ("/opt/Megatron-LM", "/opt/Megatron-LM/pretrain_gpt.py"),
    ("/opt/Megatron-LM/", "/opt/Megatron-LM/pretrain_gpt.py"),
    ("Megatron-LM", "Megatron-LM/pretrain_gpt.py"),
    ("/site/run_pretrain_gpt.py", "/site/run_pretrain_gpt.py"),
])
def test_training_script_is_the_checkout_s_or_the_named_file(path: str, script: str) -> None:
    assert training_script(path) == script


@pytest.mark.parametrize("seed", [0, -1])
def test_megatron_lm_refuses_a_seed_below_one(seed: int) -> None:
    with pytest.raises(ConfigError, match="positive --seed"):
        megatron_lm_args(GPT2, Layout(), seed=seed)


@pytest.mark.parametrize(("fields", "flags"), [
    ({"pp": 2, "first_stage_layers": 5}, ["--decoder-first-pipeline-num-layers", "5"]),
    ({"pp": 2, "last_stage_layers": 7}, ["--decoder-last-pipeline-num-layers", "7"]),
    ({"pp": 4, "first_stage_layers": 2, "last_stage_layers": 2},
     ["--decoder-first-pipeline-num-layers", "2", "--decoder-last-pipeline-num-layers", "2"]),
    ({"recompute": "selective", "recompute_modules": "core_attn+layernorm+mlp"},
     ["--recompute-granularity", "selective", "--recompute-modules", "core_attn", "layernorm",
      "mlp"]),
    ({"recompute": "selective"}, ["--recompute-granularity", "selective"]),
    ({"impl": "te", "offload_layers": 3}, ["--cpu-offloading-num-layers", "3"]),
])
def test_memory_option_flags(fields: dict[str, object], flags: list[str]) -> None:
    """Each new memory option's flags, in one run of the command, parsed as Megatron-LM does."""
    args = megatron_lm_args(GPT2, Layout(gbs=64, **fields))  # type: ignore[arg-type]
    text = " ".join(args)
    assert " ".join(flags) in text
    parsed = _megatron_lm_parser().parse_args(args)
    if "recompute_modules" in fields:
        assert parsed.recompute_modules == str(fields["recompute_modules"]).split("+")
    if "offload_layers" in fields:
        assert parsed.cpu_offloading_num_layers == fields["offload_layers"]


@pytest.mark.parametrize("fields", [{}, {"recompute": "full"}, {"pp": 2}])
def test_no_memory_option_flags_at_the_defaults(fields: dict[str, object]) -> None:
    args = megatron_lm_args(GPT2, Layout(gbs=64, **fields))  # type: ignore[arg-type]
    for flag in ("--recompute-modules", "--cpu-offloading-num-layers",
                 "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"):
        assert flag not in args


def test_lever_rows_sit_at_their_place() -> None:
    """Each lever's rows are spliced in beside the core rows of their subject
    (autotune.levers.flags.Place), so an exported command reads as it did before the levers
    moved into autotune.levers: the pipeline split after the pipeline sizes, recompute and
    offload after the batch, the optimizer and precision levers after --bf16, the
    implementation last of the layout."""
    names = [row.name for row in FLAG_TABLE]

    def after(first: str, second: str) -> bool:
        return names.index(second) == names.index(first) + 1

    assert after("vpp", "first_stage_layers") and after("embedding_loss_split", "cp")
    assert after("batch", "recompute") and after("recompute", "offload_layers")
    assert after("offload_layers", "precision")
    assert after("precision", "distributed_optimizer")
    assert after("impl", "train_iters")
    for lever in LEVERS:
        if not lever.flag_rows:  # a setting of the run's environment (the allocator's)
            assert lever.environment is not None, lever.name
            continue
        at = [names.index(row.name) for row in lever.flag_rows]
        assert at == list(range(at[0], at[0] + len(at))), lever.name
