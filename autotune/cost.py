"""Analytical step time of a Megatron layout: compute, communication, pipeline bubble, optimizer.

The shape follows Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM"): every pipeline stage runs m micro-batches of forward + backward,
the pipeline adds a bubble of (p - 1)/v micro-batch times (Section 2.2), tensor-parallel
all-reduces sit on the critical path (Section 3.2; megatron-core's local spec does not overlap
them), and the data-parallel gradient reduction follows the last backward. The efficiency
constants are empirical and live in `CostParams`; `autotune.calibration` fits them to measured
trials. Pure arithmetic, no torch.

Default calibration (see `CostParams`): gpt2-xl on one H100 80GB, local spec, no TE, mbs 4,
gbs 64 was measured at ~13.6k tokens/s (~14% MFU) and the model predicts 13.6k tokens/s (14.1%);
gpt2-large with TE on 2x H200, dp 2, mbs 32, gbs 64 was measured at ~437 ms per step and the
model predicts 437 ms. Two points fix two constants (the elementwise factors); everything else
is a datasheet number or a first-principles byte count, so treat other regimes as unvalidated
until `autotune.calibration` has seen trials from them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from autotune.dimensions import Recompute
from autotune.flops import forward_flops_per_token, hardware_flops_per_token, model_flops_per_token
from autotune.hardware import ClusterSpec
from autotune.layout import Layout
from autotune.memory import MAIN_GRAD_BYTES, PARAM_BYTES, stage_params
from autotune.memory_activations import layer_activations, recomputed_share
from autotune.model import ModelSpec, padded_vocab_size

__all__ = ["HBM_BYTES_PER_S", "CostEstimate", "CostParams", "estimate_cost"]

HBM_BYTES_PER_S: dict[str, float] = {
    # NVIDIA datasheets: H100 SXM 3.35 TB/s, H200 4.8 TB/s, A100 80GB 2.0 TB/s, A100 40GB 1.55.
    "h100-80gb": 3.35e12,
    "h200": 4.8e12,
    "a100-80gb": 2.0e12,
    "a100-40gb": 1.555e12,
}
_DEFAULT_HBM_BYTES_PER_S = 2.0e12
_BUCKET_PARAMS = 40_000_000
"""megatron/core/distributed/distributed_data_parallel_config.py: bucket_size defaults to
max(40M, 1M x dp) parameters; the last bucket's reduction cannot hide behind backward."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CostParams:
    """Empirical efficiency constants (fractions of datasheet peaks, bytes moved per element).

    Defaults: gemm_half_size, the attention, HBM and communication efficiencies are
    datasheet-style guesses; gemm_efficiency_max, the two elementwise factors, step_overhead_s
    and layer_launch_s were fitted (`autotune calibrate`) to 32 measured trials of gpt2-xl on one
    H100 and gpt2-large on two H200 (megatron-core 0.16.1, no TE):
    results/benchmarks/2026-11-21-h100-h200x2-model-accuracy.md, with its cross-validation.
    """

    gemm_efficiency_max: float = 0.95
    """Fraction of peak bf16 FLOP/s that large GEMMs reach."""
    gemm_half_size: float = 256.0
    """eff = gemm_efficiency_max * x / (x + gemm_half_size), x the GEMM's smaller dimension per
    GPU (min of mbs * seq / cp and hidden / tp): an empirical saturating fit, not a law."""
    flash_attention_efficiency: float = 0.45
    """Fraction of peak that fused attention (SDPA flash, TE/cuDNN) reaches on the counted
    (non-causal, 4 s h per token) core-attention FLOPs; causal kernels skip half the work."""
    local_attention_bytes_per_score: float = 82.0
    """HBM bytes per attention score and head, forward + backward, of megatron-core's unfused
    attention without the fused softmax kernel: bf16 scores, fp32 upcast, masked_fill, fp32
    softmax, downcast, dropout + mask, and their backward (each a separate kernel)."""
    elementwise_bytes_local: float = 4.66
    """HBM bytes moved (forward + backward) per byte of stored activation outside core attention,
    local spec: unfused bias, GeLU, dropout, residual adds and LayerNorm. Fitted to gpt2-xl."""
    elementwise_bytes_te: float = 3.23
    """Same with Transformer Engine's fused LayerNorm-Linear, bias-GeLU and bias-dropout-add
    (also used for impl sdpa, whose non-attention kernels are the local ones but it keeps the
    SDPA fused attention). Fitted to gpt2-large on H200."""
    hbm_efficiency: float = 0.8
    """Fraction of datasheet HBM bandwidth that streaming kernels reach."""
    hbm_bytes_per_s: float | None = None
    """HBM bandwidth; None looks the GPU up in HBM_BYTES_PER_S."""
    comm_efficiency: float = 0.8
    """NCCL bus bandwidth as a fraction of the link bandwidth in the GPU table."""
    collective_latency_s: float = 20e-6
    """Fixed cost per collective (launch + ring latency)."""
    optimizer_bytes_per_param: float = 32.0
    """Adam step HBM traffic per local-shard parameter: read grad, master, m, v (16 B), write
    master, m, v, bf16 param (14 B), plus the gradient-norm read (2 B)."""
    step_overhead_s: float = 0.047
    layer_launch_s: float = 0.00162
    """Host time to launch one layer's kernels for one micro-batch (forward + backward) that
    the GPU does not hide: eager megatron-core issues ~100 small kernels per layer. Fitted to
    measurements (autotune calibrate); it is what makes small micro-batches slow."""
    """Per-step fixed cost: data loading, loss all-reduce, Python, zeroing grad buffers."""


DEFAULT_COST_PARAMS = CostParams()


@dataclass(frozen=True, slots=True, kw_only=True)
class CostEstimate:
    """Predicted time of one training step, by term, and the throughput it implies."""

    compute_s: float
    """Forward + backward (+ recompute) kernels of the slowest stage, all micro-batches."""
    tp_comm_s: float
    cp_comm_s: float
    """Exposed part of the context-parallel K/V ring (the rest hides behind attention)."""
    ep_comm_s: float
    pp_comm_s: float
    dp_comm_s: float
    """Exposed part of the gradient reduction and parameter all-gather."""
    bubble_s: float
    optimizer_s: float
    overhead_s: float
    launch_s: float
    """Host launch time of every layer and micro-batch not hidden behind GPU work."""
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    """Model FLOPs (no recompute) per GPU per second, in TFLOP/s."""
    mfu: float

    @property
    def bubble_fraction(self) -> float:
        """Bubble over ideal pipeline time: (p - 1)/(v m) (Narayanan et al. 2021, Section 2.2)."""
        busy = self.step_time_s - self.bubble_s - self.dp_comm_s - self.optimizer_s \
            - self.overhead_s
        return self.bubble_s / busy if busy > 0 else 0.0


@dataclass(frozen=True, slots=True)
class _Flops:
    layer_mats: float
    layer_core: float
    logits: float
    model_per_token: float


@functools.lru_cache(maxsize=1024)
def _flops(model: ModelSpec) -> _Flops:
    """Per-token forward FLOPs split into GEMMs / core attention / logits, from autotune.flops."""
    base = model_flops_per_token(model)
    core = (hardware_flops_per_token(model, "selective") - base) / model.num_layers
    mats = (hardware_flops_per_token(model, "full") - base) / model.num_layers - core
    logits = forward_flops_per_token(model) - model.num_layers * (mats + core)
    return _Flops(layer_mats=mats, layer_core=core, logits=logits, model_per_token=base)


def gemm_efficiency(x: float, params: CostParams) -> float:
    """Saturating fit eff_max * x / (x + x_half) (empirical, see CostParams.gemm_half_size)."""
    return params.gemm_efficiency_max * x / (x + params.gemm_half_size)


def ring_allreduce_s(nbytes: float, n: int, bytes_per_s: float, params: CostParams) -> float:
    """Ring all-reduce: 2 (n - 1)/n of the buffer crosses each link (Patarasuk & Yuan 2009);
    reduce-scatter + all-gather move the same volume."""
    if n <= 1:
        return 0.0
    return params.collective_latency_s + 2 * (n - 1) / n * nbytes / (
        bytes_per_s * params.comm_efficiency)


def _one_way_s(nbytes: float, n: int, bytes_per_s: float, params: CostParams) -> float:
    """All-gather, reduce-scatter or all-to-all: (n - 1)/n of the buffer per link."""
    if n <= 1:
        return 0.0
    return params.collective_latency_s + (n - 1) / n * nbytes / (
        bytes_per_s * params.comm_efficiency)


def _link(cluster: ClusterSpec, span: int) -> float:
    """Bandwidth of a group whose ranks span `span` consecutive global ranks.

    Megatron orders ranks tp-cp-ep-dp-pp (tp innermost; parallel_state.RankGenerator), so a
    group of stride st and size n covers st * n ranks and leaves the node when that exceeds
    gpus_per_node; a ring is then as fast as its inter-node hops.
    """
    gpu = cluster.gpu
    if span > cluster.gpus_per_node:
        return gpu.inter_node_bytes_per_s
    return gpu.intra_node_bytes_per_s


def estimate_cost(model: ModelSpec, layout: Layout, cluster: ClusterSpec,
                  params: CostParams | None = None) -> CostEstimate:
    """Predicted step time and throughput of `layout` for `model` on `cluster`."""
    prm = params or DEFAULT_COST_PARAMS
    s = layout
    fl = _flops(model)
    gpu = cluster.gpu
    hbm = (prm.hbm_bytes_per_s or HBM_BYTES_PER_S.get(gpu.name, _DEFAULT_HBM_BYTES_PER_S)) \
        * prm.hbm_efficiency
    peak = gpu.peak_bf16_flops
    h, t, m = model.hidden_size, s.tp, s.num_microbatches
    seq = model.seq_length / s.cp
    tokens = s.mbs * seq  # local tokens of one micro-batch
    layers = model.num_layers // s.pp
    tsp = t if s.sequence_parallel else 1
    # Forward = 1, backward = 2 forwards; full recompute adds a forward of the layers it
    # recomputes (all of them with `uniform`, the first recompute_num_layers of each chunk with
    # `block`), selective a forward of core attention (Korthikanti et al. 2022, Section 5).
    full = (recomputed_share(layers // s.vpp, method=s.recompute_method,
                             num_layers=s.recompute_num_layers)
            if s.recompute == Recompute.FULL else 0.0)
    mats_passes = 3 + full
    core_passes = 3 + (full if s.recompute == Recompute.FULL
                       else float(s.recompute == Recompute.SELECTIVE))

    # --- compute of one micro-batch on one stage ---
    eff = gemm_efficiency(min(tokens, h / t), prm)
    gemm_s = tokens * layers * fl.layer_mats * mats_passes / t / (peak * eff)
    core_flops = tokens * layers * fl.layer_core * core_passes / t
    acts = layer_activations(model, t, s.impl)
    stored_per_token = acts.replicated / tsp + acts.split
    if s.impl == "local":
        # Unfused attention: two batched GEMMs with inner size head_dim, then s^2 memory traffic.
        attn_s = core_flops / (peak * gemm_efficiency(model.head_dim, prm))
        attn_s += (tokens * seq * layers * model.num_attention_heads / t
                   * prm.local_attention_bytes_per_score * core_passes / 3 / hbm)
        elementwise = prm.elementwise_bytes_local
    else:
        attn_s = core_flops / (peak * prm.flash_attention_efficiency)
        elementwise = prm.elementwise_bytes_te
    elem_s = tokens * layers * stored_per_token * elementwise * mats_passes / 3 / hbm
    layer_stage_s = gemm_s + attn_s + elem_s
    # The last stage adds the output layer (2 h V per token forward) and the vocab-parallel
    # cross entropy over fp32 logits (cross_entropy.py: ~4 passes over 4-byte elements; the
    # fused kernels ~2: 3.5 ms less per 16k-token micro-batch of gpt2-xl on an H100,
    # results/benchmarks/2026-11-21-h100-gpt2-xl-mfu.md).
    vocab_rank = padded_vocab_size(model, t) / t
    ce_passes = 2 if s.cross_entropy_fusion else 4
    logits_s = (tokens * fl.logits * 3 / t / (peak * eff)
                + tokens * vocab_rank * 4 * ce_passes / hbm)
    # Stages run in lock-step; the last one (its layers + the logits) sets the pace.
    compute_mb = layer_stage_s + logits_s

    # --- tensor parallel: 2 all-reduces forward + 2 backward per layer (+2 with full
    # recompute), of s b h bf16 (Korthikanti et al. 2022, Section 4.2.2; SP swaps each for
    # all-gather + reduce-scatter of the same volume). Megatron's local spec does not overlap.
    act_bytes = tokens * h * 2
    tp_mb = layers * (4 + 2 * full) * ring_allreduce_s(act_bytes, t, gpu.intra_node_bytes_per_s,
                                                       prm)
    # --- context parallel: TE's ring passes K and V of the local chunk cp - 1 times forward
    # (again when recompute reruns attention), K, V and their gradients backward; overlapped
    # with attention (Liu et al. 2023, Ring Attention): exposed = max(0, comm - attention).
    cp_mb = 0.0
    if s.cp > 1:
        kv_bytes = tokens * 2 * model.head_dim * max(1, model.query_groups // t) * 2
        bw = _link(cluster, t * s.cp) * prm.comm_efficiency
        comm = layers * (s.cp - 1) * kv_bytes * core_passes / bw
        cp_mb = max(0.0, comm - attn_s)  # every layer alike: sum of per-layer max(0, .)
    # --- expert parallel: token dispatch + combine all-to-all forward and backward.
    ep_mb = 0.0
    if model.is_moe and s.ep > 1:
        a2a_bytes = tokens / tsp * model.moe_topk * h * 2
        ep_mb = layers * (4 + 2 * full) * _one_way_s(a2a_bytes, s.ep, _link(cluster, t * s.ep),
                                                     prm)
    # --- pipeline: send + receive of s b h bf16 per chunk boundary, forward and backward
    # (1/t of it with SP or Megatron's scatter-gather; Narayanan et al. 2021, Section 4.1).
    pp_mb = 0.0
    if s.pp > 1:
        bw = _link(cluster, cluster.num_gpus) * prm.comm_efficiency
        pp_mb = 2 * s.vpp * (prm.collective_latency_s + act_bytes / t / bw)
    launch_mb = layers * prm.layer_launch_s * (1 + 0.5 * full)  # recompute relaunches fwd
    mb_s = compute_mb + tp_mb + cp_mb + ep_mb + pp_mb + launch_mb
    # Bubble: (p - 1)/v micro-batch times (Narayanan et al. 2021, Section 2.2.2).
    bubble_s = (s.pp - 1) / s.vpp * mb_s

    dp_s = _dp_exposed(model, s, cluster, prm, bwd_window_s=mb_s * 2 / 3,
                       fwd_window_s=mb_s / 3)
    # Adam over the local shard is memory-bound (megatron/core/optimizer: one fused pass).
    dense, expert = _largest_stage(model, s)
    shard = dense / (s.dp * s.cp if s.distributed_optimizer else 1) + expert / (
        s.expert_dp if s.distributed_optimizer else 1)
    optimizer_s = shard * prm.optimizer_bytes_per_param / hbm
    step = m * mb_s + bubble_s + dp_s + optimizer_s + prm.step_overhead_s
    tokens_per_s = s.gbs * model.seq_length / step
    world = s.world_size
    tflops = fl.model_per_token * tokens_per_s / world / 1e12
    return CostEstimate(compute_s=m * compute_mb, tp_comm_s=m * tp_mb, cp_comm_s=m * cp_mb,
                        ep_comm_s=m * ep_mb, pp_comm_s=m * pp_mb, dp_comm_s=dp_s,
                        bubble_s=bubble_s, optimizer_s=optimizer_s,
                        overhead_s=prm.step_overhead_s, launch_s=m * launch_mb,
                        step_time_s=step,
                        tokens_per_s=tokens_per_s, tflops_per_gpu=tflops,
                        mfu=tflops * 1e12 / peak)


def _largest_stage(model: ModelSpec, s: Layout) -> tuple[float, float]:
    """(dense, expert) parameters of the stage with the most: first (embedding) or last."""
    first = stage_params(model, s, 0)
    if s.pp == 1:
        return first
    last = stage_params(model, s, s.pp - 1)
    return first if sum(first) >= sum(last) else last


def _dp_exposed(model: ModelSpec, s: Layout, cluster: ClusterSpec, prm: CostParams, *,
                bwd_window_s: float, fwd_window_s: float) -> float:
    """Exposed gradient reduction (+ parameter all-gather with the distributed optimizer).

    Dense gradients reduce over the dp x cp group (stride tp), expert gradients over the
    expert-data-parallel group; megatron-core reduces the grad buffer in its own dtype
    (MAIN_GRAD_BYTES). With overlap_grad_reduce, buckets reduce during the last micro-batch's
    backward: exposed = max(0, comm - backward) + the last bucket (Megatron DDP docs).
    """
    dense, expert = _largest_stage(model, s)
    groups = [(dense, s.dp * s.cp, s.tp * s.cp * s.dp)]
    if expert:
        groups.append((expert, s.expert_dp, cluster.num_gpus // s.pp))
    grad_s = gather_s = tail_s = 0.0
    for n_params, n, span in groups:
        if n <= 1:
            continue
        bw = _link(cluster, span)
        bucket = min(n_params, max(_BUCKET_PARAMS, 1_000_000 * n))
        if s.distributed_optimizer:
            grad_s += _one_way_s(n_params * MAIN_GRAD_BYTES, n, bw, prm)
            gather_s += _one_way_s(n_params * PARAM_BYTES, n, bw, prm)
            tail_s += _one_way_s(bucket * MAIN_GRAD_BYTES, n, bw, prm)
        else:
            grad_s += ring_allreduce_s(n_params * MAIN_GRAD_BYTES, n, bw, prm)
            tail_s += ring_allreduce_s(bucket * MAIN_GRAD_BYTES, n, bw, prm)
    if s.overlap_grad_reduce:
        grad_s = max(0.0, grad_s - bwd_window_s) + tail_s
    if s.overlap_param_gather:
        gather_s = max(0.0, gather_s - fwd_window_s) + tail_s * PARAM_BYTES / MAIN_GRAD_BYTES
    embed_s = 0.0
    if s.pp > 1 and model.tied_embeddings:
        # Tied word embeddings: first and last stage all-reduce the embedding gradient
        # (megatron/core/distributed/finalize_model_grads.py), not overlapped.
        nbytes = padded_vocab_size(model, s.tp) * model.hidden_size / s.tp * MAIN_GRAD_BYTES
        embed_s = ring_allreduce_s(nbytes, 2, _link(cluster, cluster.num_gpus), prm)
    return grad_s + gather_s + embed_s
