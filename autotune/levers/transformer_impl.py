"""The transformer implementation: megatron-core's local spec, Transformer Engine's, or SDPA.

megatron-core 0.16.1 builds a GPT layer from a spec (models/gpt/gpt_layer_specs.py):
`get_gpt_layer_local_spec` (plain PyTorch modules, the unfused DotProductAttention) or
`get_gpt_layer_with_transformer_engine_spec` (TE's fused LayerNorm-Linear, cuDNN fused
attention, grouped GEMMs for experts); Megatron-LM picks one with `--transformer-impl local|
transformer_engine` (arguments.py, default transformer_engine). autotune's `sdpa` is the local
spec with PyTorch's scaled_dot_product_attention as core attention (autotune.worker.attention),
which Megatron-LM does not have: its command runs TE's spec instead (`exported_layout`).

What the choice changes: core attention's kernels (the local spec's unfused softmax saves its
fp32 probabilities and moves every score through HBM several times; the fused kernels keep a
log-sum-exp and recompute the rest), the element-wise kernels' fusions, and the host time TE's
modules add per layer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from autotune.dimensions import Impl, dimension, value_label
from autotune.errors import ConfigError, InvalidLayoutError
from autotune.levers.base import AttentionBytes, CostState, Lever, MemoryState, Rule, Seed, evolve
from autotune.levers.flags import Flag, FlagRow, Given, Part, Place, RunOptions
from autotune.specs.activations import dropout_rate
from autotune.specs.elementwise import rope_fused
from autotune.specs.flops import gemm_efficiency

if TYPE_CHECKING:
    from autotune.layouts.layout import Layout
    from autotune.predict.cost import CostParams
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.model import ModelSpec

__all__ = ["CALIBRATED", "FUSED_ATTENTION_HEAD_DIM_MAX", "FUSED_ATTENTION_HEAD_DIM_MULTIPLE",
           "FUSED_IMPLS", "GROUPED_GEMM_FLAG", "LEVER", "LOCAL_SOFTMAX_SAVED_BYTES",
           "SDPA_STANDS_IN", "TRANSFORMER_IMPLS", "Constants", "Fields", "attention_bytes",
           "exported_layout", "fused_attention_unavailable", "grouped_gemm",
           "measured_as_exported"]


@dataclass(frozen=True, kw_only=True)
class Fields:
    __slots__ = ()
    impl: Impl = dimension(Impl.LOCAL, level=5, label=value_label(), help=(
        "Transformer implementation: local, sdpa or te."))


@dataclass(frozen=True, kw_only=True)
class Constants:
    """The implementation's cost constants: its attention kernels' efficiency and traffic, its
    element-wise fusions, TE's host time. autotune.predict.cost.CostParams inherits them
    (autotune.levers.LeverConstants); every calibration fits the element-wise factors
    (`CALIBRATED`)."""

    __slots__ = ()
    flash_attention_efficiency: float = 0.727
    """Fraction of peak that fused attention (SDPA flash, TE/cuDNN) reaches on the counted
    (non-causal, 4 s h per token) core-attention FLOPs; causal kernels skip half the work.
    Without attention dropout: its random numbers are attention_dropout_ops_per_score. 0.727 is
    the rate that, with attention_dropout_ops_per_score = 11, prices head-dim-64 attention with
    dropout as the 0.45 shipped before did (3 * 512 / (P * 0.45) = 3 * 512 / (P * e) + 2 * 11 /
    R_int32 on H100 / H200; results/benchmarks/2026-11-28-cpu-attention-dropout.md, variant M),
    so the GPT shapes' attention is priced as before and the no-dropout Llama shapes' at its own
    faster rate (results/benchmarks/2026-11-28-cpu-gemm-rates.md: every family's held-out
    step-time median under 10% with it)."""
    attention_dropout_ops_per_score: float = 11.0
    """Integer instructions per computed score that fused attention spends on attention dropout,
    each time it draws the random numbers, at the GPU's integer rate (GpuSpec.int32_ops_per_s);
    FLOP-free, so neither the head dim nor the tensor cores' speed enters. A fused kernel never
    stores the mask: it draws a Philox number per score in the forward and draws the same ones
    again in the backward (FlashAttention, Dao et al. 2022, Algorithms 2 and 4: the generator
    state is saved, the mask regenerated), and again in a recomputed forward. FlashAttention-2
    (PyTorch's copy, aten/src/ATen/native/transformers/cuda/flash_attn/dropout.h, philox.cuh)
    makes one Philox-4x32-7 call per 16 scores, 7 rounds of two mul.wide.u32 (two IMADs each),
    XORs and key additions (~56 instructions, 3.5 a score), then per score a byte unpack, a
    compare against the threshold (set.le.f16x2 on two) and an AND: ~5-6 a score counted. cuDNN's
    fused attention, which SDPA prefers on sm90 (torch 2.11, sdp_utils.cpp
    check_prefer_cudnn_attention) and TE runs, takes a Philox seed and offset too (at::native
    run_cudnn_SDP_fprop / bprop, aten/src/ATen/native/cudnn/MHA.h); its kernels are closed.
    Measured: the Llama-3.2-1B shape at seq 16384 on one H100 ran 1.682 s without and 2.042 s
    with attention dropout 0.1 (results/benchmarks/2026-11-28-h100-host-profile.md, section 2),
    0.360 s over 2 draws of 2.75e11 scores: 11 instructions a score at the H100's integer rate,
    about twice the count (the kernel does not hide them behind its GEMMs). Shipped with
    flash_attention_efficiency's no-dropout 0.727 (variant M of
    results/benchmarks/2026-11-28-cpu-attention-dropout.md): held out by family every median
    is under issue 28's 10% (llama-1b on H200 15.2% -> 3.2%, wide-8k 10.6% -> 7.4%), the GPT
    families' grow by 2.7-3.4 points (gpt-3.6b 4.9% -> 8.3%), because the shared GEMM efficiency
    refits from 0.733 to 0.665. Not because the Llama shapes' GEMMs are slower: swept on one
    H100 and one H200 they are not (results/benchmarks/2026-11-28-cpu-gemm-rates.md); what the
    refit absorbs is a non-GEMM cost of the Llama shapes the model lacks. `tools/fit_constants.py
    --also flash_attention_efficiency,attention_dropout_ops_per_score` fits both."""
    local_attention_bytes_per_score: float = 82.0
    """HBM bytes per attention score and head, forward + backward, of megatron-core's unfused
    attention without the fused softmax kernel: bf16 scores, fp32 upcast, masked_fill, fp32
    softmax, downcast, dropout + mask, and their backward (each a separate kernel)."""
    elementwise_bytes_local: float = 0.7528
    """Multiple of the counted HBM traffic of the layers' element-wise kernels
    (autotune.specs.elementwise: norms, residual branches, the MLP activation, RoPE, GQA's repeat)
    that the step spends on them with the local spec: the bandwidth share these small kernels
    reach and what the count leaves out. Fitted with elementwise_bytes_te, gemm_efficiency_max
    and step_overhead_s to all measured trials (results/benchmarks/2026-11-28-cpu-constants-
    refit-s15.md)."""
    elementwise_bytes_te: float = 0.02135
    """Same with Transformer Engine (also used for impl sdpa, whose non-attention kernels are the
    local ones but it keeps the SDPA fused attention). The fit puts it near zero with every form
    tried (per stored activation byte 0.029, per counted byte 0.021): the data give the time to
    the GEMM efficiency instead, whose refit (0.6657) sits ~9% under the GEMM sweep's rates; the
    split is not identified (same report)."""
    te_layer_launch_s: float = 0.00035
    """What Transformer Engine's modules add to CostParams.layer_launch_s per layer and
    micro-batch. The worker measured impl te 2-8% slower than impl sdpa on the same layouts, the
    same kernels of attention and GEMMs, with identical memory: the median over six pairs
    (gpt2-xl and gpt2-large, one H100 and two H200, tp 1 and 2, TE 2.11) is 0.35 ms per layer and
    micro-batch, range 0.08-0.85 ms (results/benchmarks/2026-11-23-h100-te-build-and-runs.md)."""


CALIBRATED = ("elementwise_bytes_local", "elementwise_bytes_te")
"""The constants every calibration fits (Lever.calibrated), whatever the trials: each trial runs
one implementation, so each measures one of the factors (a search's refit leaves them: it fits
few constants). The others are measured or first-principles values that the trials' step times
do not pin down."""


# ---- what Megatron-LM runs -----------------------------------------------------------------

TRANSFORMER_IMPLS: dict[str, str] = {"local": "local", "te": "transformer_engine"}
"""autotune impl -> Megatron-LM `--transformer-impl`. autotune's "sdpa" (a local spec with
PyTorch SDPA as core attention) lives only in autotune's worker; Megatron-LM has no such choice."""

SDPA_STANDS_IN = ("impl sdpa (autotune's local spec with PyTorch SDPA attention) has no "
                  "Megatron-LM equivalent; this uses --transformer-impl transformer_engine, "
                  "whose fused attention is the closest.")
"""What the export says of a layout measured with sdpa (`exported_layout`)."""


def exported_layout(layout: Layout) -> Layout:
    """The layout a Megatron-LM command runs for `layout`: impl sdpa, which Megatron-LM does not
    have, runs as Transformer Engine (Megatron-LM's default). The one place that decides it:
    the export (autotune.report.scripts), a run's identity (autotune.megatron.identity),
    `--from-megatron`'s flag changes (autotune.megatron.megatron_command) and what a search
    measures where TE is installed (autotune.commands.search) all ask here (through
    autotune.megatron.megatron_args)."""
    return replace(layout, impl=Impl.TE) if layout.impl == Impl.SDPA else layout


def measured_as_exported(layout: Layout) -> bool:
    """Whether a figure measured with `layout` is the figure of the Megatron-LM command the
    export writes for it (not so for sdpa, which runs as TE there)."""
    return exported_layout(layout) == layout


# ---- the head dims fused attention runs ----------------------------------------------------

FUSED_ATTENTION_HEAD_DIM_MULTIPLE = 8
FUSED_ATTENTION_HEAD_DIM_MAX = 256
"""The head dims (Megatron --kv-channels) Transformer Engine 2.x runs as fused attention on the
GPUs autotune plans for (A100, H100, H200): a multiple of 8, at most 256. TE picks a backend per
shape (transformer_engine/pytorch/attention/dot_product_attention/utils.py,
get_attention_backend): flash-attn is disabled unless "head_dim_qk %8 = 0, head_dim_qk <= 256";
cuDNN's fused attention (common/fused_attn/fused_attn.cpp, nvte_get_fused_attn_backend) wants
a multiple of 8 too, up to 128, up to 256 for training on sm90 with cuDNN 9.5 or later (the
cuDNN frontend's support matrix: Hopper bprop d <= 256). Outside both, TE runs its
UnfusedDotProductAttention: the s^2 scores in memory, as megatron-core's local spec does."""

FUSED_IMPLS = (Impl.TE, Impl.SDPA)
"""The implementations priced with fused attention (`_cost`, `attention_bytes`): TE's, and
autotune's sdpa, which the export writes as TE (`exported_layout`)."""


def fused_attention_unavailable(m: ModelSpec,
                                compute_capability: tuple[int, int] | None = None) -> str | None:
    """Why no fused attention kernel runs `m`'s head dim; None where one does.

    Such a model is not refused: Megatron-LM trains it with --transformer-impl local, whose
    unfused attention runs any head dim and is what autotune prices for impl local. Its te and
    sdpa layouts are dropped instead (rule `fused_head_dim`, autotune.search.impls): both are
    priced as fused attention (no s^2 scores kept), while TE would run its unfused fallback
    and the export writes TE for sdpa, so their figures would promise memory and speed that
    the exported command does not have; and with cp > 1 TE has no backend at all
    (get_attention_backend disables UnfusedDotProductAttention under context parallelism).
    Multi-Latent Attention's query/key heads differ from its value heads (`_mla_unfused`);
    `compute_capability` (the GPU's, None: a Hopper's) decides there."""
    if m.qk_dim != m.v_dim:
        return _mla_unfused(m.qk_dim, m.v_dim, compute_capability or (9, 0))
    d = m.head_dim
    if d % FUSED_ATTENTION_HEAD_DIM_MULTIPLE == 0 and d <= FUSED_ATTENTION_HEAD_DIM_MAX:
        return None
    return (f"head dim {d}: Transformer Engine's fused attention (flash-attn, cuDNN) needs a "
            f"multiple of {FUSED_ATTENTION_HEAD_DIM_MULTIPLE} up to "
            f"{FUSED_ATTENTION_HEAD_DIM_MAX}; impl local (Megatron's unfused attention) runs any")


MLA_FUSED_HEAD_DIMS = (192, 128)
"""DeepSeek's query/key and value head dims (128 + 64 RoPE, 128): the one unequal pair cuDNN
trains on every recent GPU (fused_attn.cpp: Blackwell's 9.11 case, and exempt from Hopper's)."""


def _mla_unfused(qk: int, v: int, cc: tuple[int, int]) -> str | None:
    """Why TE 2.11 has no fused attention for query/key heads `qk` and value heads `v` (qk != v)
    in training on compute capability `cc`; None where it has one.

    transformer_engine/pytorch/attention/dot_product_attention/utils.py get_attention_backend
    disables flash-attn 2 when head_dim_qk != head_dim_v ("does not support MLA"); flash-attn 3
    (Hopper only, not what TE installs by default) is left out. cuDNN's fused attention
    (common/fused_attn/fused_attn.cpp, nvte_get_fused_attn_backend, arbitrary-seqlen backend)
    wants multiples of 8 and: both up to 128 anywhere; up to 256 for training on sm90 with
    cuDNN 9.5 or later; (192, 128) on sm100 with cuDNN 9.11 or later. From cuDNN 9.11, Hopper's
    backward excludes 128 <= qk, v with qk != v other than (192, 128) (a cuDNN bug TE works
    around); the cuDNN release is not known when planning, so that range counts as unfused."""
    why = (f"query/key head dim {qk} and value head dim {v} (Multi-Latent Attention): "
           "Transformer Engine's fused attention (cuDNN; flash-attn 2 runs equal dims only) ")
    if qk % FUSED_ATTENTION_HEAD_DIM_MULTIPLE or v % FUSED_ATTENTION_HEAD_DIM_MULTIPLE:
        return why + f"needs multiples of {FUSED_ATTENTION_HEAD_DIM_MULTIPLE}"
    if (qk <= 128 and v <= 128) or ((qk, v) == MLA_FUSED_HEAD_DIMS and cc >= (9, 0)):
        return None
    if cc == (9, 0):
        if qk > FUSED_ATTENTION_HEAD_DIM_MAX or v > FUSED_ATTENTION_HEAD_DIM_MAX:
            return why + f"trains up to {FUSED_ATTENTION_HEAD_DIM_MAX} on Hopper"
        if qk >= 128 and v >= 128:
            return why + ("excludes both from 128 with cuDNN 9.11 or later on Hopper "
                          f"(but {MLA_FUSED_HEAD_DIMS[0]}, {MLA_FUSED_HEAD_DIMS[1]})")
        return None
    return why + (f"trains up to 128 (or {MLA_FUSED_HEAD_DIMS[0]}, {MLA_FUSED_HEAD_DIMS[1]} "
                  f"from Hopper) on sm{cc[0]}{cc[1]}")


# ---- rules ---------------------------------------------------------------------------------


def _known(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    if not isinstance(s.impl, Impl):
        return f"impl={s.impl!r} must be one of {', '.join(Impl)}"
    return None


def _cp(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # megatron/core/transformer/dot_product_attention.py: the local core attention asserts
    # context_parallel_size == 1; only TEDotProductAttention implements context parallelism.
    if s.cp > 1 and s.impl != "te":
        return f"cp={s.cp} needs impl=te (Transformer Engine attention), got impl={s.impl}"
    return None


def _fused_head_dim(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # fused_attention_unavailable says why such layouts are dropped rather than the model.
    why = fused_attention_unavailable(m, c.gpu.compute_capability) \
        if s.impl in FUSED_IMPLS else None
    return None if why is None else f"impl={s.impl}: {why}"


# ---- flags ---------------------------------------------------------------------------------

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


_TE_SPEC_ARGS: tuple[str, ...] = ("--no-gradient-accumulation-fusion",)
"""impl te as the worker measures it. Megatron-LM's default gradient-accumulation fusion also
covers the output layer, megatron-core's own ColumnParallelLinear, which needs apex's
fused_weight_gradient_mlp_cuda even when TE builds the layers: without apex Megatron-LM stops at
start-up (measured on an H100 with TE 2.11, results/benchmarks/2026-11-23-h100-te-build-and-
runs.md). The worker accumulates without the fusion (autotune.megatron.core_config), so the command
says the same; with apex installed, dropping the flag is the user's choice."""


GROUPED_GEMM_FLAG = "--moe-grouped-gemm"


def grouped_gemm(m: ModelSpec, s: Layout) -> bool:
    """The experts' GEMMs run grouped (megatron-core moe_grouped_gemm): TE's spec with experts
    builds TEGroupedMLP, one TE GroupedLinear per projection (gpt_layer_specs.py
    get_gpt_layer_with_transformer_engine_spec). The worker builds it and the export writes
    --moe-grouped-gemm for it: without the flag Megatron-LM's TE spec runs SequentialMLP, one TE
    Linear per expert, an implementation autotune never measured (the export left the flag out
    until session 23)."""
    return m.is_moe and s.impl == Impl.TE


def _emit(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    if s.impl not in TRANSFORMER_IMPLS:
        raise InvalidLayoutError(
            f"impl={s.impl} has no Megatron-LM equivalent; --transformer-impl takes "
            f"{' or '.join(TRANSFORMER_IMPLS.values())} (impl {' or '.join(TRANSFORMER_IMPLS)})")
    args = ["--transformer-impl", TRANSFORMER_IMPLS[s.impl]]
    if s.impl == "local":
        args += _LOCAL_SPEC_ARGS
    elif s.impl == "te":
        args += _TE_SPEC_ARGS
    if grouped_gemm(m, s):
        args.append(GROUPED_GEMM_FLAG)
    return args


def _read(g: Given) -> dict[str, Any]:
    # arguments.py: --transformer-impl defaults to transformer_engine.
    chosen = g.choice("--transformer-impl", tuple(TRANSFORMER_IMPLS.values()),
                      TRANSFORMER_IMPLS["te"])
    if chosen == TRANSFORMER_IMPLS["local"] and g.has(GROUPED_GEMM_FLAG) and g.integer(
            "--num-experts"):
        # The local spec with grouped GEMMs is megatron-core's legacy GroupedMLP (the
        # grouped_gemm package); autotune's local spec runs one MLP per expert.
        raise ConfigError(f"{g.source}: {GROUPED_GEMM_FLAG} with --transformer-impl local runs "
                          "megatron-core's legacy GroupedMLP, which autotune does not model; "
                          "use --transformer-impl transformer_engine (grouped as TEGroupedMLP) "
                          "or drop the flag")
    return {"impl": next(k for k, v in TRANSFORMER_IMPLS.items() if v == chosen)}


# ---- worker --------------------------------------------------------------------------------


def _core_config(m: ModelSpec, s: Layout) -> dict[str, dict[str, Any]]:
    # The layer spec autotune.worker.build builds for the implementation; with experts, TE's
    # spec runs them as grouped GEMMs (TEGroupedMLP), the local spec as one MLP each.
    keys: dict[str, dict[str, Any]] = {"model": {"layer_spec": str(s.impl)}}
    transformer: dict[str, Any] = {}
    if m.is_moe:
        transformer["moe_grouped_gemm"] = grouped_gemm(m, s)
    if m.position_embedding == "rope":
        # What Megatron-LM runs with TE (autotune.specs.elementwise.rope_fused).
        transformer["apply_rope_fusion"] = rope_fused(m, s.impl)
    if transformer:
        keys["transformer"] = transformer
    return keys


# ---- models --------------------------------------------------------------------------------

LOCAL_SOFTMAX_SAVED_BYTES = 4
"""Bytes per attention score that the local spec's softmax saves for backward.
megatron-core's FusedScaleMaskSoftmax uses the fused kernel only when masked_softmax_fusion is set
(default False, transformer_config.py) and the apex/TE kernel is installed; otherwise
`forward_torch_softmax` upcasts to fp32 (attention_softmax_in_fp32=True) and torch's softmax saves
its fp32 output. The paper's 5 a s^2 b assumes the fused kernel (2 bytes): 2 + 1 mask + 2."""


def attention_bytes(m: ModelSpec, impl: str) -> AttentionBytes:
    """What core attention keeps per score and head with implementation `impl` (Korthikanti
    et al. 2022, Section 4.1's 5 a s^2 b term, and what replaces it in a fused kernel)."""
    return _attention_bytes(impl, dropout_rate(m, "attention_dropout") > 0)


@functools.lru_cache(maxsize=16)
def _attention_bytes(impl: str, dropout: bool) -> AttentionBytes:
    if impl == "local":
        # Unfused core attention: softmax output (fp32 without the fused kernel), dropout mask
        # (1 B) and dropout output (2 B, input of scores x V) per score: a s^2 b (4 + 1 + 2).
        mask = 1.0 if dropout else 0.0
        # Forward workspace beyond what the layer stores: megatron-core's
        # fusions/fused_softmax.py forward_torch_softmax holds the bf16 scores (2, the caller's
        # `attention_scores`, alive until DotProductAttention.forward returns) and their fp32
        # copy (4) while softmax writes its fp32 output; that output is the tensor
        # SoftmaxBackward saves, already counted in LOCAL_SOFTMAX_SAVED_BYTES. Later the copy
        # is freed and the bf16 probs (2) live until dropout: max(2 + 4, 2 + 2) = 6.
        # (Counting the fp32 output here too put full recompute of the local spec ~3 GiB high
        # at gpt2-xl mbs 32, where one layer's s^2 terms dominate: s3-xl-search/2.)
        # Its GEMMs save query, key and value as given (baddbmm, bmm; dot_product_attention.py
        # repeats each key/value group for its heads first).
        return AttentionBytes(saved_per_score=LOCAL_SOFTMAX_SAVED_BYTES + mask + 2,
                              workspace_per_score=2 + 4, qkv_as_given=True)
    # Flash attention (SDPA flash backend, TE/cuDNN fused attention) keeps Q, K, V, the output
    # (saves_output) and the fp32 log-sum-exp per head; dropout is regenerated from the RNG
    # state. SDPA saves its inputs as autotune.worker.attention.SdpaAttention passes them
    # (strided views, key and value repeated with GQA); Transformer Engine 2.11 copies them
    # unless they fit one of its layouts (attention/dot_product_attention/utils.py,
    # get_qkv_layout: "force q,k,v to be contiguous").
    return AttentionBytes(saved_per_head=4, qkv_as_given=impl == "sdpa", saves_output=True)


def _memory(m: ModelSpec, s: Layout, state: MemoryState) -> MemoryState:
    return evolve(state, attention=attention_bytes(m, s.impl))


def _cost(m: ModelSpec, s: Layout, c: ClusterSpec, p: CostParams,
          state: CostState) -> CostState:
    attention = attention_bytes(m, s.impl)
    if s.impl == "local":
        # Unfused attention: two batched GEMMs with inner size head_dim, then s^2 memory
        # traffic; unfused bias, GeLU, dropout, residual adds and LayerNorm.
        return evolve(state, attention=attention,
                      attention_efficiency=gemm_efficiency(m.qk_dim, p),
                      attention_bytes_per_score=p.local_attention_bytes_per_score,
                      elementwise_bytes=p.elementwise_bytes_local)
    # Fused attention (SDPA's flash backend, TE/cuDNN); sdpa keeps the local spec's other
    # kernels but is priced with TE's element-wise factor (Constants.elementwise_bytes_te),
    # and TE's modules add host time per layer (Constants.te_layer_launch_s).
    dropout = dropout_rate(m, "attention_dropout") > 0
    return evolve(state, attention=attention,
                  attention_efficiency=p.flash_attention_efficiency,
                  attention_dropout_ops_per_score=(p.attention_dropout_ops_per_score
                                                   if dropout else 0.0),
                  elementwise_bytes=p.elementwise_bytes_te,
                  layer_launch_extra_s=p.te_layer_launch_s if s.impl == Impl.TE else 0.0)


LEVER = Lever(
    name="transformer_impl",
    fields=Fields,
    rules=(Rule("impl_known", 5, "impl must be local, te or sdpa", _known),
           Rule("cp_impl", 5, "context parallelism needs Transformer Engine attention", _cp),
           Rule("fused_head_dim", 5, "impl te and sdpa need a head dim fused attention runs",
                _fused_head_dim)),
    flag_rows=(FlagRow(name="impl", part=Part.LAYOUT,
                       flags=(Flag("--transformer-impl"),
                              *(Flag(name, takes_value=False) for name in dict.fromkeys(
                                  (*_LOCAL_SPEC_ARGS, *_TE_SPEC_ARGS, GROUPED_GEMM_FLAG)))),
                       emit=_emit, read=_read),),
    flag_place=Place.IMPLEMENTATION,
    core_config=_core_config,
    memory=_memory,
    cost=_cost,
    constants=Constants,
    calibrated=CALIBRATED,
    seed=Seed.PRACTICE,
    # Megatron practice: the fastest implementation installed (the seeds are told which).
    practice=lambda s, impl: {"impl": impl},
)
