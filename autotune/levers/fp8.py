"""FP8 training through Transformer Engine: the format, the scaling recipe, FP8 parameters.

megatron-core 0.16.1 (transformer/transformer_config.py `fp8`, `fp8_recipe`, `fp8_param`;
fp8_utils.py get_fp8_recipe / get_fp8_context; transformer_block.py) runs the transformer
layers' GEMMs in FP8 through Transformer Engine: TransformerBlock.forward wraps the layers in
TE's `fp8_autocast` with the recipe (DelayedScaling, Float8CurrentScaling for `tensorwise`,
Float8BlockScaling for `blockwise`, MXFP8BlockScaling for `mxfp8`), and with `fp8_param` builds
each layer under TE's `fp8_model_init`, so that its GEMM weights are FP8 tensors. Only TE's
modules read the autocast: the local spec stays bf16 under it, and the output layer (megatron-
core's own ColumnParallelLinear) always does. Megatron-LM (core_v0.16.1 arguments.py) spells it
`--fp8-format e4m3|hybrid --fp8-recipe ... --fp8-param-gather`; `hybrid` keeps gradients in
E5M2, `e4m3` everything in E4M3: the same bytes and the same cuBLASLt FP8 GEMMs, so the models
price the two alike.

What FP8 changes, from Transformer Engine 2.11 (transformer_engine/pytorch/module/linear.py,
layernorm_linear.py, grouped_linear.py, quantization.py):
- memory: each GEMM keeps its weight's FP8 copy and transpose between micro-batches (the
  `weight` workspace megatron-core's `is_first_microbatch` refreshes once a step: +2 B per
  weight); with FP8 parameters the weight itself is 1 B and its transpose 1 B, no other copy.
  The inputs a GEMM saves for backward are FP8 (1 B instead of bf16's 2; block scaling adds
  its scales), the other activations stay bf16, among them the fused attention's output, which
  the projection shared in bf16 and now keeps an FP8 copy of beside it (AttentionBytes.
  saves_output: autotune.specs.activations.layer_activations) under delayed scaling; with
  the other recipes megatron-core 0.16.1 has the projection save that bf16 output itself
  (attention.py set_save_original_input; MemoryState.proj_saves_original). The scaling state
  (amax history of `fp8_amax_history_len` = 1 and a scale per quantized tensor, fp32, five
  tensors per GEMM: 40 B a GEMM) is left out, far below the model's resolution.
- time: the layers' GEMMs at the FP8 peak with their own size-dependent efficiency, plus the
  memory-bound casts (amax, quantize, transpose) of every GEMM input in forward and every
  output gradient in backward, and of the weights once a step, each as its recipe's kernels
  move it (CastBytes: a normalized input costs delayed scaling least, whose norm kernel writes
  FP8 itself); current scaling's amax all-reduces under sequence parallelism; and TE's host
  time per layer, a floor under the layers' time where their GPU work is shorter, raised for
  tensorwise and blockwise by each tensor sequence parallelism all-gathers (sp_gathers).
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.dimensions import Impl, dimension, flag_label
from autotune.errors import ConfigError
from autotune.levers.base import (
    CostState,
    Lever,
    MemoryState,
    Requires,
    Rule,
    Seed,
    Unread,
    evolve,
)
from autotune.levers.flags import Flag, FlagRow, Given, Part, RunOptions
from autotune.specs.flops import GEMM_EFFICIENCY_MAX, gemm_efficiency, gemm_size
from autotune.specs.gemm_rates import mean_rate

if TYPE_CHECKING:
    from autotune.layouts.layout import Layout
    from autotune.predict.cost import CostParams
    from autotune.specs.hardware import ClusterSpec, GpuSpec
    from autotune.specs.model import ModelSpec

__all__ = [
    "AMAX_READ_BYTES_FP32",
    "CAST_BYTES_PER_ELEMENT",
    "FP8_INPUT_BYTES",
    "LEVER",
    "MEASURED_FIT",
    "OPTIMIZER_FP8_PARAM_BYTES",
    "RECIPE_MIN_CAPABILITY",
    "UNMODELED_FLAGS",
    "WEIGHT_COPY_BYTES",
    "CastBytes",
    "Constants",
    "Fields",
    "Fp8",
    "Fp8Recipe",
    "cast_elements",
    "gemm_dims",
    "gemm_speedup",
    "layer_gemm_speedup",
    "may_outgrow_bf16",
    "recipes_on",
    "sp_gathers",
]


class Fp8(enum.StrEnum):
    """FP8 format (TransformerConfig.fp8, Megatron-LM `--fp8-format`); off is bf16."""

    OFF = "off"
    HYBRID = "hybrid"
    """E4M3 for weights and activations, E5M2 for the gradients (TE's Format.HYBRID)."""
    E4M3 = "e4m3"


class Fp8Recipe(enum.StrEnum):
    """How TE scales FP8 tensors (TransformerConfig.fp8_recipe, `--fp8-recipe`)."""

    DELAYED = "delayed"
    """One scale per tensor from the amax history of earlier steps (DelayedScaling)."""
    TENSORWISE = "tensorwise"
    """One scale per tensor from its own amax, computed before the cast (Float8CurrentScaling)."""
    BLOCKWISE = "blockwise"
    """A scale per 1x128 block of activations and gradients, 128x128 of weights
    (Float8BlockScaling)."""
    MXFP8 = "mxfp8"
    """A power-of-two scale per 32 elements, in the tensor cores (MXFP8BlockScaling)."""


RECIPE_MIN_CAPABILITY: dict[Fp8Recipe, tuple[tuple[int, int], tuple[int, int] | None]] = {
    Fp8Recipe.DELAYED: ((8, 9), None),
    Fp8Recipe.TENSORWISE: ((8, 9), None),
    Fp8Recipe.BLOCKWISE: ((9, 0), None),
    Fp8Recipe.MXFP8: ((10, 0), (12, 0)),
}
"""(lowest compute capability, first one without it) per recipe, Transformer Engine 2.11
(pytorch/quantization.py check_recipe_support): delayed and tensorwise need check_fp8_support
(sm_89 and up: Ada with cuBLASLt 12.1.3, Hopper, Blackwell), blockwise check_fp8_block_scaling_
support (sm_90 and up, and CUDA 12.9, which the worker's TE asserts where it runs), mxfp8
check_mxfp8_support (sm_100 up to, not including, sm_120)."""

FP8_INPUT_BYTES: dict[Fp8Recipe, float] = {
    Fp8Recipe.DELAYED: 1.0,
    Fp8Recipe.TENSORWISE: 1.0,
    Fp8Recipe.BLOCKWISE: 1.0 + 4 / 128,
    Fp8Recipe.MXFP8: 1.0 + 1 / 32,
}
"""Bytes per element of a GEMM input saved for backward: the FP8 byte (linear.py keeps only its
column-wise copy, or the row-wise one where sequence parallelism all-gathers it) plus its
scales: none per element for one scale a tensor, an fp32 scale per 128 elements (blockwise),
an E8M0 byte per 32 (mxfp8)."""

WEIGHT_COPY_BYTES = 2.0
"""TE's FP8 copy of a bf16 weight kept between micro-batches (linear.py get_weight_workspace,
cache "weight"): row-wise and column-wise (the transpose Hopper's TN-only FP8 GEMMs need for
dgrad), 1 B each. With FP8 parameters the parameter is the row-wise byte and only the
transpose (1 B) is added (DDP's post_all_gather_processing, fp8_utils.py)."""

@dataclass(frozen=True, slots=True)
class CastBytes:
    """HBM bytes per element that quantizing one bf16 tensor (its row-wise and column-wise FP8
    copies: Hopper's FP8 GEMMs take TN operands only) moves beyond what the bf16 path moves
    for it, by where the tensor comes from."""

    norm: float
    """A normalized GEMM input: TE's LayerNormLinear (the QKV GEMM's, and the dense MLP's fc1)
    quantizes the norm's output in or right after its norm kernel (pytorch/csrc/extensions/
    normalization.cpp, `Impl`), where the bf16 path writes that output in bf16 (2 B) anyway."""
    plain: float
    """A bf16 tensor quantized by itself: the other GEMM inputs (attention's output, the
    activation's), every output gradient in backward, the weights once a step (block scaling's
    128x128 weight blocks carry 1/128 of the scales counted here: nothing at this scale)."""


CAST_BYTES_PER_ELEMENT: dict[Fp8Recipe, CastBytes] = {
    Fp8Recipe.DELAYED: CastBytes(norm=1.0, plain=4.0),
    Fp8Recipe.TENSORWISE: CastBytes(norm=4.0, plain=6.0),
    Fp8Recipe.BLOCKWISE: CastBytes(norm=4.0 + 8 / 128, plain=4.0 + 8 / 128),
    Fp8Recipe.MXFP8: CastBytes(norm=4.0 + 2 / 32, plain=4.0 + 2 / 32),
}
"""Per recipe, Transformer Engine 2.11's kernels (byte counts, not measurements: the fitted
Constants.fp8_cast_scale scales them all):
- delayed (Float8Quantizer): the scale is known before the tensor is (the amax history), so
  one kernel reads 2 B and writes 1 + 1 (cast_transpose: plain 4 B), and the norm kernel
  writes the FP8 row-wise copy itself (Impl::FULLY_FUSED: 1 B where bf16 writes 2) and
  nvte_transpose makes the column-wise one from it (common/normalization/layernorm/ln_api.cpp
  "Compute FP8 transpose if required": read 1, write 1): norm 1 - 2 + 2 = 1 B;
- tensorwise (Float8CurrentScalingQuantizer::quantize_impl, pytorch/csrc/quantizer.cpp):
  the scale needs this tensor's amax first: nvte_compute_amax reads it (2 B), then
  nvte_compute_scale_from_amax, then nvte_quantize_v2 reads 2 and writes 1 + 1: plain 6 B;
  after a norm the amax comes out of the norm kernel (Impl::FUSED_NORM_AMAX_FP8), which writes
  bf16 as bf16 would, and quantize_with_amax reads 2, writes 2: norm 4 B;
- blockwise (Float8BlockQuantizer: 1x128 blocks of activations and gradients, 128x128 of
  weights) and mxfp8 (1x32, Blackwell): one kernel finds each block's amax in registers and
  writes both copies and their scales (an fp32 per 128 elements of each copy: 8/128 B; an E8M0
  byte per 32: 2/32 B), and no norm kernel writes them (Impl::UNFUSED: the norm writes bf16,
  then the quantizer runs): norm = plain = 4 B and the scales."""


OPTIMIZER_FP8_PARAM_BYTES = 3.0
"""With FP8 parameters the optimizer step writes each updated weight as FP8 from its fp32 master
(read 4, write 1 B) where it copied it into the bf16 parameter (read 4, write 2): the read is
counted already (CostParams.optimizer_bytes_per_param), the write is 1 B less, and quantizing
reads the master once more for the cast (+4): 3 B a parameter."""
AMAX_READ_BYTES_FP32 = 4.0
"""Current scaling's amax pass over an fp32 master shard before it is quantized."""


@dataclass(frozen=True, kw_only=True)
class Fields:
    __slots__ = ()
    fp8: Fp8 = dimension(Fp8.OFF, level=6, label=lambda s, v: None if v == Fp8.OFF else (
        f"fp8={v}" if s.fp8_recipe == Fp8Recipe.DELAYED else f"fp8={v}/{s.fp8_recipe}"), help=(
        "FP8 training through Transformer Engine (`--fp8-format`): off (bf16), hybrid (E4M3 "
        "forward, E5M2 gradients) or e4m3; needs impl te and a GPU with FP8 tensor cores."))
    fp8_recipe: Fp8Recipe = dimension(
        Fp8Recipe.DELAYED, level=6, label=None, folded_into="fp8", help=(
            "With fp8: how TE scales FP8 tensors (`--fp8-recipe`): delayed, tensorwise "
            "(current scaling), blockwise (sm_90+, CUDA 12.9) or mxfp8 (Blackwell)."))
    fp8_param_gather: bool = dimension(False, level=6, label=flag_label("fp8pg"), help=(
        "With fp8: keep the GEMM weights in FP8 and all-gather them in FP8 "
        "(`--fp8-param-gather`): 2 bytes less per weight; needs the distributed optimizer."))


_CUBLAS_FP8_SPEEDUP = 1.75
"""Hopper's large FP8 GEMMs against bf16 (cuBLAS 12.9 post, Constants.fp8_gemm_efficiency_max)."""


@dataclass(frozen=True, kw_only=True)
class Constants:
    __slots__ = ()
    fp8_gemm_efficiency_max: float = _CUBLAS_FP8_SPEEDUP * GEMM_EFFICIENCY_MAX * 989 / 1979
    """Fraction of the dense FP8 peak that large FP8 GEMMs reach. NVIDIA's cuBLAS 12.9 post
    ("Boosting Matrix Multiplication Speed and Flexibility with NVIDIA cuBLAS 12.9", 2025)
    measures Hopper's FP8 GEMMs 1.75x as fast as BF16 for large sizes: 1.75 x CostParams.
    gemm_efficiency_max (GEMM_EFFICIENCY_MAX, 0.6657) x 989 / 1979 TFLOP/s = 0.582 (0.745 while
    bf16's was 0.852). A first-principles value, to be fitted (`autotune calibrate`) on measured
    FP8 trials. It and fp8_gemm_half_size price GPUs never swept only: on H100 and H200 the
    layers' FP8 speed-up is the swept one (layer_gemm_speedup)."""
    fp8_gemm_half_size: float = 768.0
    """The size at which FP8 GEMMs reach half their large-size efficiency (the x of
    CostParams.gemm_half_size: min(local tokens, hidden / tp)). FP8 tiles are twice as deep in
    K as bf16's, so small GEMMs fill the tensor cores less: placed so that a GEMM of x = 1,024
    gains the 1.25x the same post gives for "most other cases" (1.75 x (1024 + 256) / (1024 +
    768) = 1.25), which puts the crossover (no gain) at x = 427 on H100 and H200 alike (the
    same 989 / 1979 TFLOP/s peaks). The sweep on H100 and H200 (which replaces this curve
    there) measured more: 1.79-1.89x at x = 1,536-4,096, where this curve gives 1.36-1.57x."""
    fp8_cast_scale: float = 2.55
    """Multiplies CAST_BYTES_PER_ELEMENT's byte counts (1: the first-principles count). Fitted
    with the three host floors to all 26 OK FP8 trials, every other constant shipped
    (results/benchmarks/2026-11-28-cpu-constants-refit-s15.md, fp8_host_refit.py): 2.55, once the
    shared bf16 constants were refitted to all trials (the element-wise kernels next to free
    there, so the casts carry what TE's FP8 path adds around its GEMMs). It was 1 (the count)
    while 17 trials fitted it to 1.55 and, held out by family, no better than 1
    (results/benchmarks/2026-11-27-cpu-fp8-cost.md)."""
    fp8_layer_host_s: float = 0.00838
    """Host seconds per layer and micro-batch (forward and backward) of TE's FP8 path with
    delayed scaling: its quantizers, amax and scale bookkeeping and casts issued from Python
    for each GEMM. A floor under the layers' time, not a cost added to it: where the GPU's
    work per layer is longer, the host runs ahead and it is hidden. Fitted (with
    fp8_current_layer_host_s, the other constants held) to the 17 FP8 trials of two H100 calls
    two days apart in tests/data/measured_trials.json (s8-fp8-*, s11-fp8-*: gpt2-xl mbs 8/16,
    Llama-3.2-3B mbs 1/2; TE 2.11): median step-time error 6.9%, worst 12.4% (the 8.4 ms
    fitted to the first day alone: 7.6%, 20.6% over both). Fitted on one day, the other is
    predicted within 7.6-8.4% in the median, worst 14-17%: the host's share moves by about
    10% between machines of one kind (results/benchmarks/2026-11-27-h100-session11.md); held
    out by family (fitted to Llama-3.2-3B's FP8 trials, predicting gpt2-xl's, and back), median
    7.4%, worst 18.8%, the worst at gpt2-xl mbs 8: each call's first four trials, which took
    longer per layer and micro-batch than gpt2-xl mbs 16's with half their GPU work, as no
    model of host and GPU time can
    (results/benchmarks/2026-11-27-cpu-fp8-cost.md). Refitted with the casts by recipe
    (CastBytes) it is unchanged (8.00 ms); 8.38 ms refitted with the casts and the other floors to
    all 26 FP8 trials after the shared constants' refit of 2026-11-28 (results/benchmarks/
    2026-11-28-cpu-constants-refit-s15.md). A property of the host as much as of TE:
    `autotune calibrate` refits it. Fitted to each day's FP8 trials alone it is 8.0-9.7 ms on
    the other days with host-bound trials (sessions 8, 11, 12) and 6.4 ms on session 18's
    H200, whose host ran the bf16 twins of the same layouts 20-28% faster per layer too
    (results/benchmarks/2026-11-28-cpu-fp8-h200-misses-s18.md): the shipped value was left as
    it is. Absolute, not a multiple of the bf16 TE layer's host time (CostParams.layer_launch_s
    + te_layer_launch_s) that a search's refit learns from the machine's bf16 trials: that
    time is added to the GPU's work rather than a floor under it, and refitted per machine
    (1.2-4.1 ms) it does not follow the FP8 floors fitted to the same machines (2.0-7.9 times
    it); a floor tied to it would have predicted session 18's H200 within 10.5% but sessions
    8 and 11's H100 39-108% slow (results/benchmarks/2026-11-28-cpu-fp8-host-floor-s19.md)."""
    fp8_current_layer_host_s: float = 0.00881
    """The same for the recipes that take each scale from the tensor itself (tensorwise, and
    blockwise and mxfp8 per block), whose quantizers do more per tensor (tensorwise: an amax
    kernel and a scale kernel before each cast); fitted with fp8_layer_host_s (9.5 ms on the
    first day alone; 8.72 again refitted with CastBytes; 8.81 in the refit of 2026-11-28). One
    constant for the three: blockwise's
    trials ask no other (per layer and micro-batch, where host-bound, 8.1-10.0 ms against
    tensorwise's 8.4-10.1)."""
    fp8_sp_gather_host_s: float = 0.000984
    """Seconds per layer and micro-batch, per FP8 tensor all-gathered across the tensor-parallel
    ranks under sequence parallelism (sp_gathers: 6 a dense layer), that the recipes scaling
    from the tensor itself (tensorwise, blockwise) add to the FP8 host floor; delayed scaling
    adds none. Fitted (alone, everything else shipped) to the two such trials in
    tests/data/measured_trials.json, Llama-3.2-3B seq 4096 mbs 2 on 2 x H200 at tp 2 + sp
    (s12-fp8-l3b2/10 tensorwise 1.765 s, /11 blockwise 1.723 s, against 1.106 / 1.052 s
    without sp and 1.118 s for delayed with it: 5.9 and 6.0 ms more per layer and
    micro-batch): 0.976 ms (0.984 ms refitted with the casts and the other floors to all FP8
    trials, 2026-11-28), both then within 1.3%; fitted to one recipe's trial it predicts
    the other's within 2.4% (results/benchmarks/2026-11-28-cpu-fp8-sp-host.md). Not in
    MEASURED_FIT: no other family has such a trial, so leaving one family out cannot test it.
    One call of one day, one shape, a 2-GPU lane beside it: the size is the measurement's, not
    the source's. By TE 2.11's code the extra calls per gather (an amax all-reduce issued from
    C++, or a coalesced gather of data and scales and its re-layout) cost the host tens of
    microseconds, not a millisecond: the term prices what was measured and does not explain
    it; what settles it is in that report."""

    fp8_delayed_recompute_host_s: float = 0.00412
    """Host seconds per recomputed layer and micro-batch that delayed scaling adds under full
    recompute, beyond running the layer's forward again (CostState.recompute_host_s, on the
    host floor). megatron-core checkpoints FP8 layers with Transformer Engine's checkpoint
    (transformer_block.py _checkpointed_forward: te_checkpoint when config.fp8), and for
    delayed scaling alone TE 2.11 keeps state around it: each FP8 module stashes its forward
    amax history and scale in the first forward (quantization.py
    copy_forward_fp8_meta_tensors_for_recompute: 2 clones), swaps them in and back around the
    recomputed one (get_old_fp8_meta_tensors_for_recompute: 2 clones and 2 copies;
    restore_fp8_meta_tensors: 2 copies), and distributed.py _CheckpointFunction.backward opens
    its own autocast per checkpoint, whose exit (depth 0, grad enabled) runs
    reduce_and_update_fp8_tensors over every registered module's forward amaxes: once per
    micro-batch without recompute, once per recomputed layer with it. Tensorwise, blockwise and
    mxfp8 do none of it (each is a no-op for them). Session 25's profile of Llama-3.1-8B
    under full recompute saw 10,279 small copies a step, about 40 per recomputed layer
    (results/benchmarks/2026-11-29-h200-fp8-offload-profile-s25.md).
    Measured on one H200 (session 26, results/benchmarks/2026-11-29-h200-fp8-recompute-host-s26/),
    with the host speed cancelling within the machine: host-bound, delayed scaling's step per
    layer and micro-batch grew 1.9x (Llama-3.2-3B mbs 1) and 2.2x (gpt2-xl mbs 4) from no
    recompute to full, tensorwise's 1.52x and 1.53x (the 1.5 the floor assumes), bf16's 1.62x
    (gpt2-xl, host-bound there too); the worker's threads put the difference in the backward
    thread, which runs the recomputed forwards. Least squares on log step time over the six
    host-bound delayed full-recompute trials of sessions 25 and 26 (H200; every other FP8
    trial with recompute is GPU-bound and does not move): 4.12 ms; fitted to session 26's four
    it is 3.45 ms, to session 25's two 6.1 ms, and each predicts the other's trials within
    3-18% and 10-31%, where 1.5x alone was 17-34% and 12-25% fast
    (results/benchmarks/2026-11-29-cpu-fp8-recompute-host-s26.md). Absolute, as
    fp8_layer_host_s, and a property of the host as much as of TE. Not priced for selective
    recompute (core attention's checkpoint), whose FP8 trials are GPU-bound."""


MEASURED_FIT: tuple[str, ...] = ("fp8_layer_host_s", "fp8_current_layer_host_s")
"""The constants the measured FP8 trials fit: the host floors. Fitted with them, the GEMM rate
(fp8_gemm_efficiency_max, fp8_gemm_half_size) and fp8_cast_scale move without lowering the
held-out error (results/benchmarks/2026-11-27-cpu-fp8-cost.md): 16 of the 17 trials are
host-bound or close to it, and the one GPU-bound pair runs a single GEMM size; those keep their
first-principles values. With session 16's GPU-bound trials and the swept FP8 speed-up, fitting
fp8_cast_scale too still raises the held-out median (4.3% -> 5.7%; 2026-11-28-cpu-measured-s16-
trials-s17.md). tools/fp8_errors.py and tests/test_fp8.py's held-out test fit these."""


def _on(s: Layout) -> bool:
    return s.fp8 != Fp8.OFF


def may_outgrow_bf16(s: Layout) -> bool:
    """Whether `s` may need more memory than the same layout in bf16 (`_memory`): its FP8 copy
    of each GEMM weight (WEIGHT_COPY_BYTES) beside the bf16 weight. With FP8 parameters the
    weight stays at 2 B (the FP8 byte and its transpose), and what FP8 keeps of the activations
    is at most bf16's (FP8_INPUT_BYTES; the projection's original input where
    proj_saves_original), so it needs no more."""
    return _on(s) and not s.fp8_param_gather


@functools.cache  # the rule fp8_gpu asks for each FP8 combination (116k in a gpt-1t plan)
def recipes_on(gpu: GpuSpec) -> tuple[Fp8Recipe, ...]:
    """The recipes Transformer Engine 2.11 runs on `gpu` (RECIPE_MIN_CAPABILITY); none without
    FP8 tensor cores."""
    if gpu.peak_fp8_flops is None:
        return ()
    cc = gpu.compute_capability
    return tuple(r for r, (low, high) in RECIPE_MIN_CAPABILITY.items()
                 if cc >= low and (high is None or cc < high))


# ---- flags --------------------------------------------------------------------------------


def _emit(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    # Megatron-LM core_v0.16.1: --fp8-format and --fp8-recipe are generated from
    # TransformerConfig's fields (argparse_meta arg_names), --fp8-param-gather is its own
    # (arguments.py _add_transformer_engine_args) and sets fp8_param. An unused recipe is not
    # written: without --fp8-format Megatron-LM reads none of it (the same run).
    args = []
    if _on(s):
        args += ["--fp8-format", str(s.fp8), "--fp8-recipe", str(s.fp8_recipe)]
    if s.fp8_param_gather:
        args.append("--fp8-param-gather")
    return args


def _read(g: Given) -> dict[str, Any]:
    fmt = g.choice("--fp8-format", tuple(f.value for f in Fp8 if f != Fp8.OFF), "off") \
        if g.has("--fp8-format") else Fp8.OFF.value
    recipe = g.text("--fp8-recipe", Fp8Recipe.DELAYED.value)
    if recipe not in tuple(Fp8Recipe):
        raise ConfigError(f"{g.source}: --fp8-recipe {recipe} is not one autotune models "
                          f"({', '.join(Fp8Recipe)})")
    # Without --fp8-format the recipe means nothing (Megatron-LM's default "delayed" runs).
    return {"fp8": fmt, "fp8_recipe": recipe if fmt != Fp8.OFF else Fp8Recipe.DELAYED.value,
            "fp8_param_gather": g.has("--fp8-param-gather")}


UNMODELED_FLAGS: tuple[tuple[str, str], ...] = (
    ("--fp8-amax-history-len", "the amax history delayed scaling keeps and reduces"),
    ("--fp8-amax-compute-algo", "how delayed scaling picks its amax"),
    ("--fp8-margin", "FP8 scales"),
    ("--no-fp8-wgrad", "weight gradients in bf16 instead of FP8"),
    ("--disable-fp8-wgrad", "weight gradients in bf16 instead of FP8"),
    ("--first-last-layers-bf16", "layers kept in bf16"),
    ("--num-layers-at-start-in-bf16", "layers kept in bf16"),
    ("--num-layers-at-end-in-bf16", "layers kept in bf16"),
    ("--fp8-quantizer-factory", "a custom quantization"),
    ("--moe-router-padding-for-fp8", "token padding of the experts"),
    ("--reuse-grad-buf-for-mxfp8-param-ag", "the MXFP8 parameter all-gather's buffer"),
    ("--fp4-format", "FP4 instead of FP8"),
    ("--fp4-param-gather", "FP4 parameters"),
    ("--te-precision-config-file", "per-module precision"),
)
"""Megatron-LM core_v0.16.1 flags of FP8 training that change speed, memory or the numbers
and that this lever does not model: a command with one is warned about (autotune.megatron_
args.UNMODELED_FLAGS)."""


# ---- worker --------------------------------------------------------------------------------


def _core_config(m: ModelSpec, s: Layout) -> dict[str, dict[str, Any]]:
    on = _on(s)
    # TransformerConfig as Megatron-LM's core_transformer_config_from_args sets it (fp8 None
    # for bf16; fp8_param from --fp8-param-gather); the DDP and optimizer configs take the same
    # names from args (training.py get_model, get_megatron_optimizer_config). The recipe is
    # left at its default when FP8 is off, as a command without --fp8-recipe leaves it.
    return {"transformer": {"fp8": str(s.fp8) if on else None,
                            "fp8_recipe": str(s.fp8_recipe) if on else str(Fp8Recipe.DELAYED),
                            "fp8_param": s.fp8_param_gather},
            "ddp": {"fp8_param_gather": s.fp8_param_gather},
            "optimizer": {"fp8_recipe": str(s.fp8_recipe) if on else None}}


# ---- rules ---------------------------------------------------------------------------------


def _needs_te(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # fp8_utils.get_fp8_context wraps the layers in TE's fp8_autocast, which only TE's modules
    # read: the local spec would run bf16 under it (and without TE installed the context is a
    # nullcontext), so an FP8 figure of another impl would be a bf16 one.
    if _on(s) and s.impl != Impl.TE:
        return f"fp8={s.fp8} runs through Transformer Engine's modules (impl=te), got " \
               f"impl={s.impl}"
    return None


def _gpu(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    if not _on(s):
        return None
    if not isinstance(s.fp8_recipe, Fp8Recipe):
        return f"fp8_recipe={s.fp8_recipe!r} must be one of {', '.join(Fp8Recipe)}"
    offered = recipes_on(c.gpu)
    if s.fp8_recipe not in offered:
        major, minor = c.gpu.compute_capability
        runs = f"runs {', '.join(offered)}" if offered else "has no FP8 tensor cores"
        return (f"fp8_recipe={s.fp8_recipe} does not run on the {c.gpu.name} (sm_{major}{minor}"
                f", which {runs}; Transformer Engine 2.11 check_recipe_support)")
    return None


def gemm_dims(m: ModelSpec, s: Layout) -> list[tuple[str, int, int]]:
    """(GEMM, its input's last dimension, its weight's rows) per rank for every GEMM TE runs in
    FP8: each input's features and each weight's output rows, tensor-parallel shards."""
    return _tp_gemm_dims(m, s.tp)


def _tp_gemm_dims(m: ModelSpec, t: int) -> list[tuple[str, int, int]]:
    """gemm_dims at tensor-parallel size t (the one field of the layout they read)."""
    heads = m.num_attention_heads * m.v_dim // t
    gates = 2 if m.gated_linear_unit else 1
    # A shard that is not whole fails megatron-core's own divide() first; rounding down here
    # only keeps the numbers integral for the checks below.
    f = (m.expert_ffn_size if m.is_moe else m.ffn_size) // t
    if m.multi_latent_attention:
        dims = _mla_gemm_dims(m, t)
    else:
        dims = [("qkv", m.hidden_size, heads + 2 * m.head_dim * max(1, m.query_groups // t))]
    dims += [("proj", heads, m.hidden_size),
             ("fc1", m.hidden_size, gates * f), ("fc2", f, m.hidden_size)]
    if fs := m.shared_expert_ffn_size // t:  # the shared expert: a dense MLP (TE linears)
        dims += [("shared_fc1", m.hidden_size, gates * fs), ("shared_fc2", fs, m.hidden_size)]
    return dims


def _mla_gemm_dims(m: ModelSpec, t: int) -> list[tuple[str, int, int]]:
    """Multi-Latent Attention's GEMMs before its output projection, TE's spec (megatron-core
    0.16.1 multi_latent_attention.py): the down projections whole on every rank (TELinear,
    'duplicated'), the up projections split by heads (TEColumnParallelLinear, or
    TELayerNormColumnParallelLinear with the latent norms)."""
    assert m.kv_lora_rank is not None and m.qk_pos_emb_head_dim is not None
    assert m.qk_head_dim is not None
    h, n = m.hidden_size, m.num_attention_heads
    query = n * m.qk_dim // t
    dims = [("q_proj", h, query)] if m.q_lora_rank is None else [
        ("q_down_proj", h, m.q_lora_rank), ("q_up_proj", m.q_lora_rank, query)]
    return [*dims, ("kv_down_proj", h, m.kv_lora_rank + m.qk_pos_emb_head_dim),
            ("kv_up_proj", m.kv_lora_rank, n * (m.qk_head_dim + m.v_dim) // t)]


def _dims(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # TE 2.11 utils.assert_dim_for_fp8_exec, run by Linear, LayerNormLinear and LayerNormMLP on
    # the input and the weight: "the product of all dimensions except the last to be divisible
    # by 8 and the last dimension to be divisible by 16". A GEMM's input is [tokens, in] and
    # its weight [out, in] on the rank; with sequence parallelism the column-parallel GEMMs
    # check their input before the all-gather (tokens / tp).
    if not _on(s):
        return None
    # With dense layers among the MoE layers, both kinds' GEMMs (a dense layer's MLP too).
    kinds = ((m.moe_layer_model, ""), (m.dense_layer_model, "dense layers' ")) \
        if m.has_dense_layers else ((m, ""),)
    for kind, which in kinds:
        for name, features, rows in gemm_dims(kind, s):
            if features % 16:
                return (f"fp8 needs the {which}{name} GEMM's input features divisible by 16 "
                        f"(Transformer Engine), got {features} with tp={s.tp}")
            if rows % 8:
                return (f"fp8 needs the {which}{name} GEMM's weight rows divisible by 8 "
                        f"(Transformer Engine), got {rows} with tp={s.tp}")
    tokens = s.mbs * m.seq_length // s.cp
    local = tokens // s.tp if s.sequence_parallel else tokens
    if local % 8:
        return (f"fp8 needs the tokens of a micro-batch on a rank divisible by 8 (Transformer "
                f"Engine), got mbs={s.mbs} x seq {m.seq_length} / cp={s.cp}"
                + (f" / tp={s.tp}" if s.sequence_parallel else "") + f" = {local}")
    if s.sequence_parallel and s.fp8_recipe in (Fp8Recipe.BLOCKWISE, Fp8Recipe.MXFP8):
        # assert_dim_for_all_gather: the sequence-parallel all-gather of a block-scaled input
        # needs whole blocks (Float8BlockQuantizer / MXFP8Quantizer.is_quantizable).
        block = 128 if s.fp8_recipe == Fp8Recipe.BLOCKWISE else 32
        if local % block or m.hidden_size % block:
            return (f"fp8_recipe={s.fp8_recipe} with sequence_parallel all-gathers whole "
                    f"{block}-element blocks: tokens on a rank ({local}) and hidden "
                    f"({m.hidden_size}) must be multiples of {block}")
    return None


def _recipe_unused(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # Megatron reads fp8_recipe only with fp8 (fp8_utils.get_fp8_recipe is called for an FP8
    # run alone), and neither the export nor the worker passes it then: a layout that names
    # another recipe without fp8 is the same run as the default's (autotune.megatron.identity gives
    # both one key). Offered once, so that the space holds no copies of a run.
    if not _on(s) and s.fp8_recipe != Fp8Recipe.DELAYED:
        return (f"fp8_recipe={s.fp8_recipe} means nothing with fp8=off: the same run as the "
                f"default {Fp8Recipe.DELAYED}, offered once")
    return None


def _param_gather_needs_fp8(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # TransformerConfig.__post_init__: "fp8_param must be used together with fp8 mode."
    if s.fp8_param_gather and not _on(s):
        return "fp8_param_gather needs fp8 (megatron-core: fp8_param must be used together " \
               "with fp8 mode)"
    return None


def _recompute(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # TransformerConfig.__post_init__: "Delayed scaling does not support moe_act and layernorm
    # recompute for fp8" (output-discarding checkpoints recompute a cast whose amax history has
    # moved on).
    if (_on(s) and s.fp8_recipe == Fp8Recipe.DELAYED and s.recompute == "selective"
            and {"moe_act", "layernorm"} & set(s.recompute_modules.modules)):
        return (f"fp8 with the delayed recipe cannot recompute {s.recompute_modules} "
                "(megatron-core: delayed scaling does not support moe_act and layernorm "
                "recompute)")
    return None


def _offload(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # Megatron-LM arguments.py validate_args: "When `--fp8-param-gather` is enabled, the
    # optimizer cpu offload must be used in conjunction with `--fp8-recipe delayed`."
    if (s.fp8_param_gather and s.optimizer_offload_percent
            and s.fp8_recipe != Fp8Recipe.DELAYED):
        return (f"fp8_param_gather with the optimizer's CPU offload needs fp8_recipe=delayed, "
                f"got {s.fp8_recipe}")
    return None


# ---- models --------------------------------------------------------------------------------


def _memory(m: ModelSpec, s: Layout, state: MemoryState) -> MemoryState:
    if not _on(s):
        return state
    weight = (1.0 + WEIGHT_COPY_BYTES / 2) if s.fp8_param_gather \
        else state.linear_weight_bytes + WEIGHT_COPY_BYTES
    # megatron-core 0.16.1 attention.py (SelfAttention.__init__): with fp8 on, a recipe other
    # than delayed and TE >= 2.6, linear_proj (TERowParallelLinear, a TELinear) gets
    # set_save_original_input: "the output of the fused core_attn is saved by itself, and
    # linear_proj also saves the quantized tensor of this output. Here we set the linear_proj
    # to save the original input tensors to avoid the extra memory usage of the quantized
    # tensor." Measured: tensorwise keeps 0.96-1.08 B x h/tp per token and layer less than
    # delayed in 15 pairs of otherwise equal trials (results/benchmarks/2026-11-28-cpu-x4-
    # trials-memory-s19.md).
    return evolve(state, linear_weight_bytes=weight,
                  linear_input_bytes=FP8_INPUT_BYTES[s.fp8_recipe],
                  proj_saves_original=s.impl == Impl.TE and s.fp8_recipe != Fp8Recipe.DELAYED)


def gemm_speedup(x: float, gpu: GpuSpec, p: CostParams) -> float:
    """How many times faster than bf16 a GEMM of size x (CostParams.gemm_half_size's x) runs
    in FP8 on a GPU never swept: the FP8 peak at its own saturating efficiency over the bf16
    peak at bf16's (layer_gemm_speedup takes the measured rates where there are some)."""
    assert gpu.peak_fp8_flops is not None
    fp8 = gpu.peak_fp8_flops * p.fp8_gemm_efficiency_max * x / (x + p.fp8_gemm_half_size)
    return fp8 / (gpu.peak_bf16_flops * gemm_efficiency(x, p))


def layer_gemm_speedup(m: ModelSpec, s: Layout, gpu: GpuSpec, p: CostParams) -> float:
    """How many times faster one layer's GEMMs (gemm_dims) run in FP8 than in bf16. On a swept
    GPU (autotune.specs.gemm_rates: H100, H200): the ratio of their time at the measured bf16
    and FP8 rates, each GEMM at its own shape (torch._scaled_mm against torch.matmul, forward
    layout; 1.79-1.89x for every measured FP8 trial's GEMMs, 1.16-1.24x at 1024^3), whether or
    not the bf16 rate itself is the measured one (CostParams.gemm_rate_scale): a ratio of two
    rates swept on one GPU at one power cap. The swept ratio is cuBLAS's, before TE's casts,
    which the lever prices apart (CastBytes). Otherwise gemm_speedup at gemm_size's x.

    Until 2026-11-28 the ratio was measured only with gemm_rate_scale above 0; gemm_speedup's
    first-principles curve (1.36-1.57x at those trials' x of 1,536-4,096) left session 16's
    GPU-bound FP8 trials 5-21% slower than measured (llama3-8b on 4 x H200, Llama-3.2-3B on
    one H200); the swept ratio brings them within -4% to +6% (results/benchmarks/
    2026-11-28-cpu-measured-s16-trials-s17.md)."""
    ratio = _swept_speedup(gpu.name, m, s.mbs, s.tp, s.cp)
    return gemm_speedup(gemm_size(m, s), gpu, p) if ratio is None else ratio


@functools.lru_cache(maxsize=4096)
def _swept_speedup(gpu: str, m: ModelSpec, mbs: int, tp: int, cp: int) -> float | None:
    """layer_gemm_speedup's measured ratio, None on a GPU never swept; cached per GPU and shape
    (a plan prices the same few thousand many times, as cost._measured_rates)."""
    tokens = mbs * m.seq_length / cp
    dims = tuple((i, o) for _, i, o in _tp_gemm_dims(m, tp))
    bf16 = mean_rate(gpu, "bf16", tokens, dims)
    fp8 = mean_rate(gpu, "fp8", tokens, dims)
    if bf16 is None or fp8 is None:
        return None
    return fp8 / bf16


def cast_elements(m: ModelSpec, s: Layout) -> tuple[float, float]:
    """(normalized, plain) elements per local token of one layer that TE quantizes (CastBytes):
    each GEMM's input in forward and its output gradient in backward (linear.py: the grad
    output quantizer), sequence-parallel inputs on their local shard. The QKV input comes out
    of TE's norm (TELayerNormColumnParallelLinear), and so does a dense MLP's fc1 input; an
    MoE layer's experts take theirs from a separate TENorm (megatron-core 0.16.1
    gpt_layer_specs.py: `pre_mlp_layernorm=TENorm if num_experts else IdentityOp`)."""
    sp = s.tp if s.sequence_parallel else 1
    h = m.hidden_size
    k = m.moe_topk if m.is_moe else 1
    dims = {name: (features, rows) for name, features, rows in gemm_dims(m, s)}
    heads, f, fc1 = dims["proj"][0], dims["fc2"][0], dims["fc1"][1]
    if m.multi_latent_attention:
        norm, forward, backward = _mla_casts(m, dims, sp)
    else:
        norm, forward, backward = h / sp, 0.0, dims["qkv"][1]
    norm += 0.0 if m.is_moe else h / sp
    forward += heads + k * f + (k * h / sp if m.is_moe else 0.0)
    backward += h / sp + k * (fc1 + h / sp)
    # A shared expert (TEColumnParallelLinear + TERowParallelLinear on the separate norm's
    # output, gemm_dims' shared_fc1 and shared_fc2): both inputs forward, both output gradients
    # backward, as a dense MLP's.
    if "shared_fc1" in dims:
        (fc1_in, fc1_out), (fc2_in, fc2_out) = dims["shared_fc1"], dims["shared_fc2"]
        forward += fc1_in / sp + fc2_in
        backward += fc1_out + fc2_out / sp
    return norm, forward + backward


def _mla_casts(m: ModelSpec, dims: dict[str, tuple[int, int]],
               sp: int) -> tuple[float, float, float]:
    """(normalized, plain forward, backward) cast elements per local token of Multi-Latent
    Attention's GEMMs before the projection (`_mla_gemm_dims`). The layer's input norm is a
    separate TENorm with MLA (gpt_layer_specs.py), so the down projections (or linear_q_proj)
    each quantize the hidden state themselves; with qk_layernorm the up projections quantize
    their norm's output (TELayerNormColumnParallelLinear), else their latent. Every input is on
    the local tokens (the latents scattered back under sequence parallelism); the down
    projections' output gradients too, the up projections' on the gathered sequence."""
    assert m.kv_lora_rank is not None
    h = m.hidden_size
    latents = (m.q_lora_rank or 0) + m.kv_lora_rank
    down = ("q_down_proj", "kv_down_proj") if m.q_lora_rank else ("q_proj", "kv_down_proj")
    norm = latents / sp if m.qk_layernorm else 0.0
    forward = len(down) * h / sp + (0.0 if m.qk_layernorm else latents / sp)
    backward = 0.0
    for name, (_, rows) in dims.items():
        if name in ("q_down_proj", "kv_down_proj"):
            backward += rows / sp
        elif name in ("q_proj", "q_up_proj", "kv_up_proj"):
            backward += rows
    return norm, forward, backward


def _dense_mlps(m: ModelSpec) -> int:
    """MLPs of one layer built of TE's column- and row-parallel linears, whose inputs and output
    gradients are gathered and amax-reduced over the tensor-parallel ranks: a dense model's MLP,
    or an MoE layer's shared expert (its routed experts are a GroupedLinear, fed by the
    dispatcher)."""
    return 0 if m.is_moe and not m.shared_expert_ffn_size else 1


def sp_gathers(m: ModelSpec, s: Layout) -> int:
    """FP8 tensors one layer all-gathers across the tensor-parallel ranks per micro-batch
    (forward and backward) under sequence parallelism, Transformer Engine 2.11 with
    megatron-core's TE spec: forward, each column-parallel GEMM's input (layernorm_linear.py /
    linear.py `with_input_all_gather`: QKV, and a dense MLP's fc1); backward, those inputs
    again for the weight gradient (`ln_out_needs_gather`, `backward_input_needs_gather`) and
    each row-parallel GEMM's output gradient (base.py grad_output_preprocess
    `gather_grad_output`: proj, fc2). An MoE layer's experts (GroupedLinear) receive their
    tokens from megatron-core's dispatcher instead: only attention's count, and a shared
    expert's (_dense_mlps). 0 without sequence parallelism."""
    if not (s.sequence_parallel and s.tp > 1):
        return 0
    # Multi-Latent Attention: its two column-parallel up projections (or linear_q_proj and
    # linear_kv_up_proj) gather their inputs; the down projections (TELinear 'duplicated') run
    # on the local tokens and gather nothing.
    column = (2 if m.multi_latent_attention else 1) + _dense_mlps(m)
    row = 1 + _dense_mlps(m)
    return 2 * column + row


def _sp_host_s(m: ModelSpec, s: Layout, p: CostParams) -> float:
    """Host seconds per layer and micro-batch that tensorwise and blockwise scaling add under
    sequence parallelism (Constants.fp8_sp_gather_host_s), on top of their host floor.

    Formula: sp_gathers(m, s) x fp8_sp_gather_host_s; 0 for delayed scaling, without sequence
    parallelism, and for mxfp8 (not measured). What these recipes do per gathered tensor that
    delayed scaling does not (TE 2.11): tensorwise quantizes each forward input and backward
    output gradient with `with_amax_reduction` over the TP group
    (linear.py _customize_quantizers_float8_current_scaling), so quantizer.cpp
    Float8CurrentScalingQuantizer::quantize_impl computes the amax, all-reduces it through
    c10d and waits on it before each cast; blockwise sets `all_gather_usage` (compact scales,
    _customize_quantizers_float8_blockwise_scaling) and distributed.py
    _all_gather_fp8_blockwise gathers data and scales under torch.distributed's
    _coalescing_manager, then _post_process_fp8_blockwise_gather re-lays them out for cuBLAS
    (the column-wise data and row-wise scales transposed). Delayed scaling's gather
    (_all_gather_fp8) casts with a scale already known and reduces its amaxes once per
    autocast, not per tensor. Priced as host time, a floor the layers' GPU work hides (as
    fp8_current_layer_host_s): where the GPU's work per layer is longer, the prediction keeps
    the GPU's, so it is optimistic rather than pessimistic where nothing was measured, and a
    search measures such a layout instead of ruling it out."""
    if s.fp8_recipe not in (Fp8Recipe.TENSORWISE, Fp8Recipe.BLOCKWISE):
        return 0.0
    return sp_gathers(m, s) * p.fp8_sp_gather_host_s


def _cost(m: ModelSpec, s: Layout, c: ClusterSpec, p: CostParams,
          state: CostState) -> CostState:
    if not _on(s) or c.gpu.peak_fp8_flops is None:
        return state
    # The optimizer step (the precision-aware optimizer's own master weights under FP8 are
    # autotune.levers.precision_optimizer's): with FP8 parameters megatron-core quantizes the
    # master shard into them (fp8_utils.quantize_param_shard: read fp32 4 B, write 1 B, instead
    # of the bf16 copy's 2) and current scaling first reads the shard for its amax (+4 B).
    # Counted on every parameter of the shard: the embedding's share is an over-count (4% of
    # gpt2-xl's).
    optimizer = 0.0
    if s.fp8_param_gather:
        optimizer += OPTIMIZER_FP8_PARAM_BYTES + (
            AMAX_READ_BYTES_FP32 if s.fp8_recipe == Fp8Recipe.TENSORWISE else 0.0)
    cast = CAST_BYTES_PER_ELEMENT[s.fp8_recipe]
    norm, plain = cast_elements(m, s)
    # Once a step: the bf16 weights cast to their FP8 copies on the first micro-batch; with
    # FP8 parameters only the transpose is rebuilt after the all-gather (read 1, write 1 B),
    # and the gather moves 1 B a weight.
    weight = 2.0 if s.fp8_param_gather else cast.plain * p.fp8_cast_scale
    host = p.fp8_layer_host_s if s.fp8_recipe == Fp8Recipe.DELAYED else p.fp8_current_layer_host_s
    host += _sp_host_s(m, s, p)
    # Delayed scaling under TE's checkpoint (the only one megatron-core uses with FP8,
    # transformer_block.py _checkpointed_forward): host time each recomputed layer adds besides
    # its forward's (Constants.fp8_delayed_recompute_host_s); the other recipes keep no state
    # to save and restore.
    recompute = p.fp8_delayed_recompute_host_s if s.fp8_recipe == Fp8Recipe.DELAYED else 0.0
    # Current scaling with sequence parallelism agrees on one amax across the tensor-parallel
    # ranks before each cast of a tensor they all-gather or reduce-scatter: the column-parallel
    # GEMMs' inputs in forward and the row-parallel GEMMs' output gradients in backward (TE 2.11
    # linear.py / layernorm_linear.py _customize_quantizers_float8_current_scaling:
    # with_amax_reduction over tp_group; GroupedLinear, an MoE layer's experts, does not), each
    # an all-reduce of one fp32 that the cast waits for (quantizer.cpp quantize_impl):
    # latency, 1 a pass of attention and 1 of each dense MLP (_dense_mlps).
    amax_reductions = 0.0
    if s.fp8_recipe == Fp8Recipe.TENSORWISE and s.sequence_parallel and s.tp > 1:
        amax_reductions = 1.0 + _dense_mlps(m)
    return evolve(state, layer_gemm_speedup=layer_gemm_speedup(m, s, c.gpu, p),
                  layer_host_floor_s=max(state.layer_host_floor_s, host),
                  recompute_host_s=state.recompute_host_s + recompute,
                  layer_tp_extra_s=state.layer_tp_extra_s
                  + amax_reductions * p.collective_latency_s,
                  layer_pass_bytes_per_token=state.layer_pass_bytes_per_token
                  + (norm * cast.norm + plain * cast.plain) * p.fp8_cast_scale,
                  linear_weight_pass_bytes=state.linear_weight_pass_bytes + weight,
                  linear_gather_bytes=1.0 if s.fp8_param_gather else state.linear_gather_bytes,
                  optimizer_bytes_per_param=state.optimizer_bytes_per_param + optimizer)


LEVER = Lever(
    name="fp8",
    fields=Fields,
    # Level 6: FP8's rules read the implementation and recompute chosen at level 5, so that
    # the enumerator expands the precision only for layouts valid without it. The cheap ones
    # first: two of three implementations fail fp8_te at once.
    rules=(Rule("fp8_te", 6, "fp8 runs through Transformer Engine's modules (impl te)",
                _needs_te),
           Rule("fp8_recipe_unused", 6, "fp8_recipe means nothing without fp8 (one run)",
                _recipe_unused),
           Rule("fp8_param_gather", 6, "fp8_param_gather needs fp8", _param_gather_needs_fp8),
           Rule("fp8_gpu", 6, "the FP8 recipe must run on the GPU", _gpu),
           Rule("fp8_dims", 6, "fp8 GEMM dimensions must be multiples of 16 (8 for tokens)",
                _dims),
           Rule("fp8_recompute", 6, "delayed scaling cannot recompute moe_act or layernorm",
                _recompute),
           Rule("fp8_offload", 6, "fp8_param_gather with optimizer offload needs delayed",
                _offload)),
    # Megatron-LM arguments.py validate_args: "--fp8-param-gather only supported with
    # distributed optimizer, torch fsdp2, megatron fsdp, or inference mode".
    requires=(Requires(name="fp8_pg_do", level=6,
                       summary="fp8_param_gather needs the distributed optimizer",
                       needs=(("distributed_optimizer", True),),
                       when=lambda s: s.fp8_param_gather,
                       message=lambda s, unmet: f"fp8_param_gather needs {unmet}"),),
    flag_rows=(FlagRow(name="fp8", part=Part.LAYOUT,
                       flags=(Flag("--fp8-format"), Flag("--fp8-recipe"),
                              Flag("--fp8-param-gather", takes_value=False)),
                       emit=_emit, read=_read),),
    core_config=_core_config,
    memory=_memory,
    cost=_cost,
    seed=Seed.PRACTICE,
    # Megatron-LM's default is bf16; the search, not the seed, decides whether FP8 pays.
    practice=lambda s, impl: {"fp8": Fp8.OFF, "fp8_recipe": Fp8Recipe.DELAYED,
                              "fp8_param_gather": False},
    constants=Constants,
    unmodeled=UNMODELED_FLAGS,
    # _emit writes no --fp8-recipe without --fp8-format and _core_config keeps the default
    # recipe: without FP8, Megatron-LM reads none of it (rule fp8_recipe_unused).
    unread=(Unread(name="fp8_recipe", when=lambda s: not _on(s),
                   reason="Megatron-LM reads --fp8-recipe only with --fp8-format",
                   flags=("--fp8-recipe",)),),
)
