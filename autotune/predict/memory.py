"""Analytical peak memory per GPU of a Megatron layout: model states, activations, overheads.

Model states follow megatron-core's mixed precision with Adam (Rajbhandari et al. 2020, "ZeRO",
Section 3.1; megatron-core docs/source/api-guide/dist_optimizer.md): bf16 parameters (2 B), fp32
main gradients (4 B), fp32 master weights + Adam m and v (12 B) = 18 B per parameter; the
distributed optimizer (ZeRO-1) shards the 12 B over the data-parallel group: 6 + 12/d B.
Activations come from `autotune.specs.activations` (Korthikanti et al. 2022). The
constants that are not facts of the code (CUDA context, NCCL buffers, allocator fragmentation) live
in `MemoryParams` so `autotune.predict.calibration` can fit them to measured peaks. Pure
arithmetic.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

from autotune.layouts.layout import DIMENSIONS, Layout, stage_layers
from autotune.levers import LEVERS
from autotune.levers.base import ActivationState, MemoryState
from autotune.levers.pipeline_split import (
    even_layers,
    kind_shares,
    mix_kinds,
    stage_kind_shares,
    stage_layer_kinds,
)
from autotune.levers.recompute import acting_layout
from autotune.predict.mtp_terms import add_difference, mtp_model
from autotune.specs.activations import (
    LayerActivations,
    inflight_microbatches,
    layer_activations,
    layer_bytes,
)
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec, padded_vocab_size
from autotune.specs.params import mla_attention_params, mtp_own_params

__all__ = ["BLOCK_MARGIN", "MEMORY_BLIND", "MemoryEstimate", "MemoryParams", "StageMemory",
           "estimate_memory", "memory_key", "stage_linear_params", "stage_params"]

GIB = 1024**3
PARAM_BYTES = 2
"""bf16 model parameters (megatron-core Float16Module)."""
MAIN_GRAD_BYTES = 4
"""fp32 main-gradient buffers: Megatron-LM's arguments.py turns on accumulate_allreduce_grads_in_
fp32 for --bf16, which sets megatron-core DistributedDataParallelConfig.grad_reduce_in_fp32 (its
own default is False, i.e. bf16 buffers of 2 B). The worker must match; the cost model reduces
gradients in this dtype too (the grad buffer is what is reduced). The default of
MemoryState.main_grad_bytes; `--grad-reduce-in-bf16` makes it 2 (autotune.levers.grad_reduce)."""
OPTIMIZER_BYTES = 12
"""fp32 master weights + Adam first and second moments (ZeRO Section 3.1: K = 12)."""
LOGITS_BYTES_PER_ELEMENT = 6
"""megatron/core/tensor_parallel/cross_entropy.py: the bf16 logits (2 B) plus the fp32 copy that
becomes exp(logits) / softmax and is saved for backward (4 B), per vocabulary entry and token.
The fused cross entropy adds a copy (autotune.levers.cross_entropy)."""

BLOCK_MARGIN = 1.0
"""Free memory, in largest blocks, that a layout needs beside its predicted peak to run.

PyTorch's caching allocator (c10/cuda/CUDACachingAllocator.cpp) serves an allocation from one
cached block or a new segment of its own size and never joins blocks of different segments, so
near capacity the memory freed in pieces between live tensors cannot hold the step's largest
allocation, the fp32 copy of the logits (cross_entropy.py, calculate_logits_max). Measured: on
an H100 (79.19 GiB allocatable), gpt2-large mbs 32 ran out of memory allocating that 6.14 GiB
block with 73.4 GiB in use, its peak predicted at 75.5 GiB (s6-te-l-pairs/4 and /5 of
tests/data/measured_trials.json), and the seed tutorial's two context-parallel OOMs (gpt2-xl
seq 4096 batch 4 cp 1, seq 8192 batch 8 cp 4: ../shared/seeds/000, tests/test_memory_seed_cp.py)
are predicted at 76.2 and 78.0 GiB with 3.07 GiB blocks; every OK trial on an H100 kept a
margin of one block but one: Llama-3.2-3B at mbs 2 with the precision-aware optimizer and FP8
tensorwise (s8-fp8-l3b/mbs2-pao-tensorwise) ran at 76.65 GiB with a 3.91 GiB block, 2.5 GiB
free. A condition of fitting, not a term of the peak: NVML never shows it.

Not under full recompute (StageMemory.block_margin_bytes is 0 there: autotune.levers.recompute
sets ActivationState.block_margin to 0): on an H100 on 2026-11-25
(tests/data/measured_trials.json, s7-*), Llama-3.2-3B at seq 8192 with full recompute ran with
its 3.91 GiB logits block at 78.98 GiB used (block/10, predicted 78.80 GiB: one block over) and
gpt2-xl at seq 32768 with its 6.14 GiB block at 72.5 GiB (block/31, predicted 74.7); every
full-recompute OOM measured (block/6, /8 of that Llama, block/24 of that gpt2-xl) is predicted
over the usable memory by its peak alone, and their OOM messages (2.1-2.3 GiB reserved but free,
what `fragmentation` prices) do not need the block twice. Every OOM the margin alone predicts
(gpt2-large mbs 32, the seed's two CP rows, gpt2-xl mbs 16 selective local) has no full
recompute. Why the two differ is not measured (tests/test_memory_block_margin.py holds the
cases); the gate runs a layout this rule alone rules out as a risk, not a verdict.

Not with expandable segments either (autotune.levers.allocator sets the margin to 0): the
allocator unmaps cached free pages to map a block that finds no free piece."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryParams:
    """Overheads outside the tensors the model allocates; fitted by
    autotune.predict.calibration."""

    cuda_context_bytes: float = 2.57 * GIB
    """CUDA context, cuBLAS/cuDNN workspaces and kernels loaded by torch 2.11 + megatron-core:
    what NVML counts beyond torch's reserve. Fitted with the other two fields (`autotune
    calibrate`) to NVML device memory of 32 trials on H100 and H200
    (results/benchmarks/2026-11-21-h100-h200x2-model-accuracy.md)."""
    nccl_bytes_per_group: float = 0.84 * GIB
    """NCCL channel buffers per communicator a rank uses (NCCL_BUFFSIZE 4 MiB x channels x
    peers, plus proxy state); fitted as above."""
    fragmentation: float = 0.039
    """PyTorch caching-allocator reserve beyond the peak allocated bytes, as a fraction: a fitted
    average, not a term of the layout. The allocator serves a request from the smallest cached
    block that fits and splits it; blocks of different cudaMalloc segments never merge
    (c10/cuda/CUDACachingAllocator.cpp, its opening comment and Note [Expandable Segments]). So
    what it keeps above the peak follows the order and sizes of every allocation of a step,
    e.g. optimizer state made or widened inside the step (TE FusedAdam's, under the
    precision-aware optimizer) splitting the segments the freed activations left. Measured
    (max reserved - max allocated): 0.1 to 3 fp32 logits blocks, the same on an H100 and an
    H200 for one layout, but not monotonic in any size this model knows; a term of the logits
    block that narrows the gate's band over-predicts other layouts and puts some that ran over
    the usable memory (results/benchmarks/2026-11-27-cpu-memory-reserve.md). The reserve of
    the allocator's default segments: every trial of tests/data/measured_trials.json ran them;
    a layout with expandable segments (autotune.levers.allocator) takes the next field's."""
    expandable_fragmentation: float = 0.01
    """The same reserve with expandable segments (autotune.levers.allocator), as a fraction of
    the allocated peak. Measured on one H200 (results/benchmarks/2026-11-29-h200-allocator-s24.md,
    tests/data/measured_allocator_trials.json): 0.2-0.9% on four layouts, 2.7% with the
    precision-aware optimizer (its state made inside the first step), 1.7-2.3% for gpt2-xl
    near the capacity (mbs 36, 38); the same layouts left 4.9-17% with the default
    segments. Device memory is predicted within -1.8..+2.3% on the seven."""


DEFAULT_MEMORY_PARAMS = MemoryParams()


@dataclass(frozen=True, slots=True, kw_only=True)
class StageMemory:
    """Bytes on the busiest rank of one pipeline stage, by term."""

    stage: int
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    logits_bytes: float
    workspace_bytes: float
    """Transient tensors of one layer: unfused attention scores, a recomputed block."""
    overhead_bytes: float
    """CUDA context, NCCL buffers and allocator fragmentation."""
    saved_bytes: float = 0.0
    """Activations that recompute or CPU offloading keep off the GPU: what this stage would
    store without them, less what it stores and rebuilds (not part of the total)."""
    largest_block_bytes: float = 0.0
    """The largest single allocation of the stage (the fp32 copy of the logits on the last
    stage)."""
    block_margin_bytes: float = 0.0
    """Free memory the stage needs beside its peak: BLOCK_MARGIN largest blocks, none under
    full recompute (see BLOCK_MARGIN)."""
    host_bytes: float = 0.0
    """Host (CPU) memory this rank keeps, e.g. an offloaded optimizer's state (not part of the
    GPU total)."""

    @property
    def allocated_bytes(self) -> float:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes
                + self.activations_bytes + self.logits_bytes + self.workspace_bytes)

    @property
    def total_bytes(self) -> float:
        return self.allocated_bytes + self.overhead_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """Per-stage memory of a layout and whether its busiest stage fits the GPU."""

    stages: tuple[StageMemory, ...]
    """First stage, the busiest middle stage (1) and the last stage; one entry without PP."""
    peak_stage: int
    peak_bytes: float
    capacity_bytes: int
    gpu_name: str
    usable_bytes: int = 0
    """What CUDA lets the process allocate (GpuSpec.usable_bytes); 0: capacity_bytes."""
    host_memory_bytes: float | None = None
    """Host memory of a node (ClusterSpec.host_memory_bytes); None: not known, not checked."""
    ranks_per_node: int = 1

    @property
    def host_bytes_per_node(self) -> float:
        """Host memory the node's ranks keep, each taken at the busiest stage's (pipeline stages
        share a node only when pp ranks sit on it, so this errs on the safe side)."""
        return max(st.host_bytes for st in self.stages) * self.ranks_per_node

    @property
    def host_fits(self) -> bool:
        return self.host_memory_bytes is None or \
            self.host_bytes_per_node <= self.host_memory_bytes

    @property
    def required_bytes(self) -> float:
        """The peak plus the free block its largest allocation needs (BLOCK_MARGIN; none under
        full recompute), on the stage where that sum is largest: what must stay below the
        usable memory."""
        return max(st.total_bytes + st.block_margin_bytes for st in self.stages)

    @property
    def limit_bytes(self) -> int:
        return self.usable_bytes or self.capacity_bytes

    @property
    def fits(self) -> bool:
        return (self.peak_bytes <= self.capacity_bytes and self.required_bytes <= self.limit_bytes
                and self.host_fits)

    @property
    def peak(self) -> StageMemory:
        return next(s for s in self.stages if s.stage == self.peak_stage)

    def breakdown_gib(self) -> dict[str, float]:
        """The peak stage's terms in GiB, for display."""
        s = self.peak
        return {"weights": s.weights_bytes / GIB, "gradients": s.gradients_bytes / GIB,
                "optimizer": s.optimizer_bytes / GIB, "activations": s.activations_bytes / GIB,
                "logits": s.logits_bytes / GIB, "workspace": s.workspace_bytes / GIB,
                "overhead": s.overhead_bytes / GIB, "total": s.total_bytes / GIB,
                "saved": s.saved_bytes / GIB}

    def explain(self) -> str | None:
        """Why the layout does not fit, calculon-style; None when it fits."""
        if self.fits:
            return None
        if not self.host_fits:
            assert self.host_memory_bytes is not None
            return (f"its {self.ranks_per_node} ranks per node keep "
                    f"{self.host_bytes_per_node / GIB:.1f} GiB in host memory but a node has "
                    f"{self.host_memory_bytes / GIB:.1f} GiB")
        if self.peak_bytes <= self.capacity_bytes:
            return (f"a peak of {self.peak_bytes / GIB:.1f} GiB leaves too little free memory "
                    f"for its largest allocation (needs {self.required_bytes / GIB:.1f} of "
                    f"{self.limit_bytes / GIB:.1f} GiB allocatable on the {self.gpu_name})")
        return (f"stage {self.peak_stage} needs {self.peak_bytes / GIB:.1f} GiB but the "
                f"{self.gpu_name} has {self.capacity_bytes / GIB:.1f} GiB")


@dataclass(frozen=True, slots=True)
class _Params:
    """Parameters per tensor-parallel rank: dense (DP-sharded) and expert (EDP-sharded)."""

    layer_dense: float
    layer_expert: float
    first_extra: float
    last_extra: float
    layer_linear: float = 0.0
    """Of a layer's parameters, the weights of its GEMMs (QKV, projection, MLP or experts):
    what Transformer Engine runs in FP8. Norms, biases, the router and the embedding and output
    layers are not among them."""
    last_expert: float = 0.0
    """The last stage's expert parameters besides its layers' (MTP layers' experts)."""
    last_linear: float = 0.0
    """The last stage's GEMM weights besides its layers' (MTP layers' and their eh_proj)."""


@functools.lru_cache(maxsize=4096)
def _param_counts(model: ModelSpec, tp: int, ep: int, pp: int) -> _Params:
    h, t = model.hidden_size, tp
    bias = 1 if model.add_bias_linear else 0
    norm = h if model.normalization == "RMSNorm" else 2 * h  # LayerNorm has weight and bias
    kv_rank = model.head_dim * max(1, model.query_groups // t)
    gates = 2 if model.gated_linear_unit else 1
    # Column-parallel QKV (q: h/t, k and v: kv per rank) and row-parallel projection, whose bias
    # is not split (megatron/core/tensor_parallel/layers.py).
    q = model.attention_width  # h unless the head dimension is the model's own (kv_channels)
    qkv_out = q / t + 2 * kv_rank
    qkv_bias = 1 if model.add_bias_linear or model.add_qkv_bias else 0
    dense = 2 * norm + h * qkv_out + qkv_bias * qkv_out + (q / t) * h + bias * h
    if model.qk_layernorm:
        # q_layernorm and k_layernorm, head_dim wide, replicated on every rank (their gradients
        # are summed over the TP group: finalize_model_grads.py, by name).
        dense += 2 * (norm / h) * model.head_dim
    linear = h * qkv_out + (q / t) * h
    if model.multi_latent_attention:
        # Multi-Latent Attention instead of the QKV, its norms and the projection.
        attention, linear = mla_attention_params(model, t)
        dense = 2 * norm + attention
    expert = 0.0
    if model.is_moe:
        assert model.num_experts is not None
        fe = model.expert_ffn_size
        dense += h * model.num_experts  # router, replicated
        # Experts split over ep, each expert's MLP over expert-TP = tp.
        weights = h * gates * fe / t + fe / t * h
        per_expert = weights + bias * (gates * fe / t + h)
        expert = model.num_experts / ep * per_expert
        linear += model.num_experts / ep * weights
        # The shared expert: a dense MLP split over tp (no biases: shared_experts.py asserts
        # it), and its gate's one hidden-wide row on every rank.
        fs = model.shared_expert_ffn_size
        shared = h * gates * fs / t + fs / t * h
        dense += shared + (h if model.moe_shared_expert_gate else 0)
        linear += shared
    else:
        f = model.ffn_size
        dense += h * gates * f / t + f / t * h + bias * (gates * f / t + h)
        linear += h * gates * f / t + f / t * h
    vocab = padded_vocab_size(model, tp) * h / t
    first = vocab + (model.max_positions * h if model.position_embedding == "learned_absolute"
                     else 0)
    # The last stage holds the final norm and the output layer; a tied output layer is the
    # embedding itself when pp == 1 and a synchronized copy on the last stage when pp > 1.
    last = norm + (vocab if (not model.tied_embeddings or pp > 1) else 0)
    if not model.mtp_num_layers:
        return _Params(layer_dense=dense, layer_expert=expert, first_extra=first,
                       last_extra=last, layer_linear=linear)
    # Multi-Token Prediction, all on the last stage (megatron-core 0.16.1 mtp_on_this_rank):
    # each MTP layer's transformer layer (a layer of the model's, here every layer's kind:
    # a mixed model's stages add it apart, _mixed_stages) and its own norms and eh_proj
    # (column-parallel). Away from the first stage GPTModel builds a word embedding there too,
    # synchronized with the first stage's (gpt_model.py: `if self.pre_process or
    # self.mtp_process`; language_module.py setup_embeddings_and_output_layer), beside the
    # output layer's weight, which it allocates even when tied (skip_weight_param_allocation
    # only with pre_process).
    n, own = model.mtp_num_layers, mtp_own_params(model, t)
    eh_proj = 2 * h * h / t
    last += n * (dense + own) + (vocab if pp > 1 else 0)
    return _Params(layer_dense=dense, layer_expert=expert, first_extra=first, last_extra=last,
                   layer_linear=linear, last_expert=n * expert,
                   last_linear=n * (linear + eh_proj))


def stage_params(model: ModelSpec, layout: Layout, stage: int,
                 layers: int | None = None) -> tuple[float, float]:
    """(dense, expert) parameters on one rank of pipeline stage `stage` of `layers` transformer
    layers (the pipeline split's stage_layers when None)."""
    if layers is None:
        layers = stage_layers(layout, model)[stage]
    if model.has_dense_layers:
        a, b = stage_kind_shares(layout, model, stage)
        dense = stage_params(model.dense_layer_model, layout, stage, layers)
        moe = stage_params(model.moe_layer_model, layout, stage, layers)
        mixed = a * dense[0] + b * moe[0], a * dense[1] + b * moe[1]
        if model.mtp_num_layers and stage == layout.pp - 1:  # autotune.predict.mtp_terms
            plus = stage_params(mtp_model(model), layout, stage, layers)
            minus = moe if model.mtp_layer_is_moe else dense
            mixed = mixed[0] + plus[0] - minus[0], mixed[1] + plus[1] - minus[1]
        return mixed
    return _stage_params(_param_counts(model, layout.tp, layout.ep, layout.pp), layers, stage,
                         layout.pp)


def _stage_params(counts: _Params, layers: int, stage: int, pp: int) -> tuple[float, float]:
    dense, expert = layers * counts.layer_dense, layers * counts.layer_expert
    if stage == 0:
        dense += counts.first_extra
    if stage == pp - 1:
        dense += counts.last_extra
        expert += counts.last_expert
    return dense, expert


def _stage_linear(counts: _Params, layers: int, stage: int, pp: int) -> float:
    return layers * counts.layer_linear + (counts.last_linear if stage == pp - 1 else 0.0)


def stage_linear_params(model: ModelSpec, layout: Layout, stage: int,
                        layers: int | None = None) -> float:
    """The weights of the transformer layers' GEMMs on one rank of pipeline stage `stage`
    (dense and expert): what Transformer Engine casts to FP8 (autotune.levers.fp8)."""
    if layers is None:
        layers = stage_layers(layout, model)[stage]
    if model.has_dense_layers:
        a, b = stage_kind_shares(layout, model, stage)
        dense = stage_linear_params(model.dense_layer_model, layout, stage, layers)
        moe = stage_linear_params(model.moe_layer_model, layout, stage, layers)
        mixed = a * dense + b * moe
        if model.mtp_num_layers and stage == layout.pp - 1:  # autotune.predict.mtp_terms
            mixed += stage_linear_params(mtp_model(model), layout, stage, layers) \
                - (moe if model.mtp_layer_is_moe else dense)
        return mixed
    counts = _param_counts(model, layout.tp, layout.ep, layout.pp)
    return _stage_linear(counts, layers, stage, layout.pp)


def _nccl_groups(s: Layout, model: ModelSpec) -> int:
    """Communicators a rank uses: tp, cp, dp (x cp), pp, embedding, ep, expert-dp.

    NCCL makes a communicator on a group's first collective (the worker does not bind the
    device at init_process_group: autotune.worker.run), so a group with no collective holds no
    buffers. megatron-core 0.16.1 all-reduces over the embedding group only when the input
    embedding and the output layer share their weight (distributed/finalize_model_grads.py,
    `_allreduce_word_embedding_grads`: `if model_module.share_embeddings_and_output_weights`),
    as the cost model prices it (autotune.predict.cost._dp_exposed), or with MTP layers
    (whose last stage keeps a copy of the embedding: `or getattr(config, 'mtp_num_layers', 0)`
    there); an untied model's embedding group never makes one without them."""
    groups = (s.tp > 1) + (s.cp > 1) + (s.dp * s.cp > 1) + (s.pp > 1) \
        + (s.pp > 1 and (model.tied_embeddings or model.mtp_num_layers > 0))
    if model.is_moe:
        groups += (s.ep > 1) + (s.expert_dp > 1)
    return int(groups)


_MEMORY_TERMS = tuple(lever.memory for lever in LEVERS if lever.memory is not None)
_ACTIVATION_TERMS = tuple(lever.activations for lever in LEVERS if lever.activations is not None)


def _model_states(model: ModelSpec, s: Layout) -> MemoryState:
    """What a rank keeps per parameter and per element, the same on every stage: with every
    lever off (fp32 master weights and Adam moments, fp32 main gradients; bf16 weights and saved
    GEMM inputs), then as the levers change it in registry
    order: the distributed optimizer shards the optimizer state (dist_optimizer.md: 6 + 12/d),
    the implementation says what attention keeps, ... (autotune.levers)."""
    states = MemoryState(
        optimizer_bytes_per_param=OPTIMIZER_BYTES, main_grad_bytes=MAIN_GRAD_BYTES,
        logits_bytes_per_element=LOGITS_BYTES_PER_ELEMENT, linear_weight_bytes=PARAM_BYTES,
        linear_input_bytes=PARAM_BYTES, stage_layers=even_layers(s, model))
    for term in _MEMORY_TERMS:
        states = term(model, s, states)
    return states


@dataclass(frozen=True, slots=True)
class _Layers:
    """What is the same on every stage: the parameters of a layer and of the first and last
    stages' extras, and what one layer stores for one micro-batch (its activations per token,
    the local sequence and tokens, its bytes stored in full)."""

    params: _Params
    acts: LayerActivations
    seq: float
    tokens: float
    full: float


def _layers(model: ModelSpec, s: Layout, states: MemoryState) -> _Layers:
    acts = layer_activations(model, s.tp, states.attention, states.linear_input_bytes,
                             proj_saves_original=states.proj_saves_original)
    seq = model.seq_length / s.cp
    tokens = s.mbs * seq
    full = layer_bytes(acts, tokens=tokens, seq=seq, tp=s.tp,
                       sequence_parallel=s.sequence_parallel)
    return _Layers(params=_param_counts(model, s.tp, s.ep, s.pp), acts=acts, seq=seq,
                   tokens=tokens, full=full)


def _chunk(model: ModelSpec, s: Layout, layers: int, one: _Layers) -> ActivationState:
    """One model chunk of `layers` layers for one micro-batch: every layer stored in full, then
    as the levers keep less of them (recompute, CPU offloading: autotune.levers)."""
    chunk = ActivationState(layers=layers, layer=one.acts, tokens=one.tokens, seq=one.seq,
                            layer_bytes=one.full, stored_bytes=layers * one.full,
                            workspace_bytes=one.tokens * one.seq * one.acts.transient_per_key,
                            block_margin=BLOCK_MARGIN)
    for term in _ACTIVATION_TERMS:
        chunk = term(model, s, chunk)
    return chunk


def _stage(model: ModelSpec, s: Layout, stage: int, mp: MemoryParams, states: MemoryState,
           one: _Layers, chunks: dict[int, ActivationState]) -> StageMemory:
    """One pipeline stage's memory; `chunks` holds the chunk terms of the stages done so far
    (they depend on a chunk's layers alone)."""
    layers = states.stage_layers[stage]
    dense, expert = _stage_params(one.params, layers, stage, s.pp)
    n_params = dense + expert
    shard = dense / states.dense_shard + expert / states.expert_shard
    optimizer = states.optimizer_bytes_per_param * shard
    host = states.host_bytes_per_param * shard
    step = states.step_bytes_per_param * shard + states.step_group_bytes_per_param * max(
        dense / states.dense_shard, expert / states.expert_shard)

    acts, seq, tokens, full = one.acts, one.seq, one.tokens, one.full
    tsp = s.tp if s.sequence_parallel else 1
    m = s.num_microbatches
    # The largest chunk: with embedding_loss_split the first and last ranks' layers do not
    # divide by vpp (one chunk there holds the embedding or the loss instead of a layer).
    chunk_layers = -(-layers // s.vpp)
    chunk = chunks.get(chunk_layers)
    if chunk is None:
        chunk = chunks[chunk_layers] = _chunk(model, s, chunk_layers, one)
    stored, workspace = chunk.stored_bytes, chunk.workspace_bytes
    inflight = inflight_microbatches(pp=s.pp, vpp=s.vpp, stage=stage, num_microbatches=m)
    activations = inflight * s.vpp * stored
    # What recompute or offloading saved: the stage's activations stored in full, less what it
    # stores and the workspace it needs to rebuild them (reported, not counted).
    saved = max(0.0, inflight * s.vpp * chunk_layers * full - activations
                - (workspace - tokens * seq * acts.transient_per_key))
    h = model.hidden_size
    logits = block = 0.0
    if stage == 0:
        # Embedding dropout mask (1 B per element), one per micro-batch in flight on chunk 0.
        activations += min(s.pp, m) * tokens * h * acts.dropout_mask / tsp
    if stage == s.pp - 1:
        # Final norm input and output-layer input (2 B each), then the logits of the one
        # micro-batch between its forward and backward (1F1B runs the last stage's back-to-back).
        activations += tokens * 4 * h / tsp
        logits = tokens * padded_vocab_size(model, s.tp) / s.tp \
            * states.logits_bytes_per_element
        block = tokens * padded_vocab_size(model, s.tp) / s.tp * 4  # the fp32 copy
        if model.mtp_num_layers:
            mtp = _mtp_activations(model, s, acts, full, tokens)
            activations += mtp
            # Each MTP layer's logits and cross entropy run before the main model's
            # (gpt_model.py _postprocess), each saving its softmax for backward: one more
            # logits block per MTP layer (exact for one; with more, the bf16 logits of all but
            # the last are freed, 2 B of the 6 per element: an over-count).
            logits *= 1 + model.mtp_num_layers
    # The layers' GEMM weights at what the levers keep of each (FP8 copies or parameters).
    linear = _stage_linear(one.params, layers, stage, s.pp)
    weights = PARAM_BYTES * n_params + (states.linear_weight_bytes - PARAM_BYTES) * linear
    grads = states.main_grad_bytes * n_params
    # What lives only through the optimizer step (MemoryState.step_bytes_per_param) sets the
    # peak where it outweighs the micro-batches' memory, freed by then; shown as workspace.
    busy = workspace
    workspace = max(workspace, step - activations - logits)
    # The largest block must be free beside the micro-batches' peak (BLOCK_MARGIN), not beside
    # the step's, which comes after they are freed: what the step holds beyond their peak
    # counts towards that free block.
    margin = max(0.0, chunk.block_margin * block - (workspace - busy))
    allocated = weights + grads + optimizer + activations + logits + workspace
    reserve = mp.expandable_fragmentation if states.expandable_segments else mp.fragmentation
    overhead = (reserve * allocated + mp.cuda_context_bytes
                + mp.nccl_bytes_per_group * _nccl_groups(s, model))
    return StageMemory(stage=stage, weights_bytes=weights, gradients_bytes=grads,
                       optimizer_bytes=optimizer, activations_bytes=activations,
                       logits_bytes=logits, workspace_bytes=workspace, overhead_bytes=overhead,
                       saved_bytes=saved, largest_block_bytes=block, host_bytes=host,
                       block_margin_bytes=margin)


MTP_BYTES_PER_HIDDEN = 10
"""Bytes per token and hidden unit an MTP layer keeps for backward besides its transformer
layer, bf16 (megatron-core 0.16.1 multi_token_prediction.py): enorm's input (the embedding of
the next tokens, 2), eh_proj's input (the 2h concatenation, 4), its final_layernorm's input
and the output layer's input (2 + 2). hnorm's input is the decoder's output, which the main
final norm keeps already; its embedding's dropout mask is the layer's dropout_mask apart."""


def _mtp_activations(model: ModelSpec, s: Layout, acts: LayerActivations, full: float,
                     tokens: float) -> float:
    """What the MTP layers on the last stage keep for one micro-batch (the one micro-batch
    between its forward and backward there, as the logits): each its transformer layer in full
    (uniform full recompute checkpoints it, multi_token_prediction.py _checkpointed_forward,
    the block method does not: an over-count with the former) and MTP_BYTES_PER_HIDDEN, with
    its embedding's dropout mask, per token and hidden unit (sequence-parallel: split)."""
    tsp = s.tp if s.sequence_parallel else 1
    own = tokens * model.hidden_size * (MTP_BYTES_PER_HIDDEN + acts.dropout_mask) / tsp
    return model.mtp_num_layers * (full + own)


MEMORY_BLIND: frozenset[str] = frozenset(
    name for lever in LEVERS if lever.memory is None and lever.activations is None
    for name in lever.field_names)
"""The fields of the levers without a memory term (`Lever.no_memory`: overlap_grad_reduce,
overlap_param_gather, nan_checks): no memory estimate reads them (tests/test_derive.py holds
it), so layouts that differ only there have one estimate (memory_key) and resolve to the same
derived counts (autotune.search.derive)."""

_MEMORY_FIELDS = attrgetter(*(name for name in DIMENSIONS if name not in MEMORY_BLIND))


def memory_key(layout: Layout) -> tuple[object, ...]:
    """`layout`'s values of every field but the MEMORY_BLIND ones: equal for two layouts whose
    estimates (estimate_memory, for one model, cluster and constants) are equal, so a memo of
    estimates keyed by it answers both (autotune.predict.gate)."""
    key: tuple[object, ...] = _MEMORY_FIELDS(layout)
    return key


def estimate_memory(model: ModelSpec, layout: Layout, cluster: ClusterSpec,
                    params: MemoryParams | None = None) -> MemoryEstimate:
    """Peak bytes per GPU of `layout` for `model` on `cluster`, stage by stage.

    Stages reported: 0 (embedding, most micro-batches in flight), 1 (the busiest middle stage:
    in-flight counts fall with the stage index) and pp - 1 (output layer, logits, loss).
    """
    mp = params or DEFAULT_MEMORY_PARAMS
    indices = _reported(layout.pp)
    if model.has_dense_layers:
        stages = _mixed_stages(model, layout, mp, indices)
    else:
        stages = _stages(model, layout, mp, indices)
    peak = max(stages, key=lambda st: st.total_bytes)
    return MemoryEstimate(stages=stages, peak_stage=peak.stage, peak_bytes=peak.total_bytes,
                          capacity_bytes=cluster.gpu.memory_bytes, gpu_name=cluster.gpu.name,
                          usable_bytes=cluster.gpu.usable_bytes,
                          host_memory_bytes=cluster.host_memory_bytes,
                          ranks_per_node=min(cluster.gpus_per_node, cluster.num_gpus))


def _reported(pp: int) -> tuple[int, ...]:
    """The stages an estimate reports (estimate_memory), the last one last."""
    return (0,) if pp == 1 else (0, 1) if pp == 2 else (0, 1, pp - 1)


def _stages(model: ModelSpec, layout: Layout, mp: MemoryParams,
            indices: Sequence[int]) -> tuple[StageMemory, ...]:
    """Stages `indices` of a model of one kind of layer. Each stage's terms are its own (the
    chunks' memo is of a chunk's layers alone), so a stage is the same asked alone or with
    others."""
    states = _model_states(model, layout)
    one = _layers(model, layout, states)
    chunks: dict[int, ActivationState] = {}
    return tuple(_stage(model, layout, i, mp, states, one, chunks) for i in indices)


def _mixed_stages(model: ModelSpec, layout: Layout, mp: MemoryParams,
                  indices: tuple[int, ...]) -> tuple[StageMemory, ...]:
    """Dense layers among the MoE layers (ModelSpec.moe_layer_freq): each stage from its layers
    of each kind, as a model of that kind alone has them on that stage. A stage's weights,
    gradients, optimizer state and stored activations are its fixed part (embedding, output
    layer, logits: the same in both) plus its layers' sum, so the layer-weighted mean is exact
    for them; the recompute workspace, the overhead and the largest block are taken as the
    same mean (the layers' kinds within a chunk, which full recompute's block method and
    offloading see, are not told apart). The MTP layers are added to the last stage apart
    (autotune.predict.mtp_terms).

    A stage of one kind of layer alone (shares 1 and 0: DeepSeek-V3's three dense layers sit
    on the first stage at pp 16 and more) is that kind's stage, the mean's value exactly, so
    the other kind's model prices only the stages it has layers on (and the last, where the
    MTP layer's kind is taken away again): of the nine stages DeepSeek-V3's estimate priced at
    pp 16 (dense, MoE and MTP models, three stages each) five are left."""
    kinds = stage_layer_kinds(layout, model)
    shares = {i: kind_shares(kinds[i]) for i in indices}
    last = indices[-1]
    mtp_kind = (model.mtp_layer_is_moe,) if model.mtp_num_layers else ()
    priced: dict[bool, dict[int, StageMemory]] = {}
    for is_moe, kind in ((False, model.dense_layer_model), (True, model.moe_layer_model)):
        wanted = [i for i in indices if shares[i][is_moe] or (i == last and is_moe in mtp_kind)]
        priced[is_moe] = dict(zip(wanted, _stages(kind, acting_layout(kind, layout), mp, wanted),
                                  strict=True))

    def mixed(i: int) -> StageMemory:
        dense_share, moe_share = shares[i]
        if not moe_share:
            return priced[False][i]
        if not dense_share:
            return priced[True][i]
        return mix_kinds(priced[False][i], priced[True][i], shares[i], stage=i)

    stages = tuple(mixed(i) for i in indices)
    if mtp_kind:
        # The MTP layers, one kind, on the last stage (autotune.predict.mtp_terms).
        kind = mtp_model(model)
        plus = _stages(kind, acting_layout(kind, layout), mp, (last,))[0]
        minus = priced[model.mtp_layer_is_moe][last]
        end = stages[-1]
        stages = (*stages[:-1], add_difference(
            end, plus, minus, stage=end.stage, largest_block_bytes=end.largest_block_bytes,
            block_margin_bytes=end.block_margin_bytes))
    return stages
