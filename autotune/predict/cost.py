"""Analytical step time of a Megatron layout: compute, communication, pipeline bubble, optimizer.

The shape follows Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM"): every pipeline stage runs m micro-batches of forward + backward,
the pipeline adds a bubble of (p - 1)/v micro-batch times (Section 2.2), tensor-parallel
all-reduces sit on the critical path (Section 3.2; megatron-core's local spec does not overlap
them), and the data-parallel gradient reduction follows the last backward. The efficiency
constants are empirical and live in `CostParams`; `autotune.predict.calibration` fits them to
measured trials. Pure arithmetic, no torch.

Default calibration (see `CostParams`): gpt2-xl on one H100 80GB, local spec, no TE, mbs 4,
gbs 64 was measured at ~13.6k tokens/s (~14% MFU) and the model predicts 13.6k tokens/s (14.1%);
gpt2-large with TE on 2x H200, dp 2, mbs 32, gbs 64 was measured at ~437 ms per step and the
model predicts 437 ms. Two points fix two constants (the implementation's elementwise factors,
autotune.levers.transformer_impl); everything else is a datasheet number or a first-principles
byte count, so treat other regimes as unvalidated until `autotune.predict.calibration` has seen
trials from them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from autotune.layouts.layout import Layout
from autotune.levers import LEVERS, LeverConstants
from autotune.levers.base import CostState, StageState
from autotune.levers.pipeline_split import even_layers, mix_kinds, stage_kind_shares
from autotune.levers.recompute import acting_layout
from autotune.predict.memory import MAIN_GRAD_BYTES, PARAM_BYTES, stage_linear_params, stage_params
from autotune.predict.mtp_terms import add_difference, mtp_model
from autotune.specs.activations import layer_activations, layer_bytes
from autotune.specs.elementwise import layer_elementwise_bytes
from autotune.specs.flops import (
    GEMM_EFFICIENCY_MAX,
    eh_proj_forward_flops_per_token,
    gemm_efficiency,
    gemm_size,
    hardware_flops_per_token,
    logits_forward_flops_per_token,
    mla_down_flops_per_token,
    mla_up_flops_per_token,
    mlp_forward_flops_per_token,
    model_flops_per_token,
)
from autotune.specs.gemm_rates import mean_rate, rate_curve
from autotune.specs.hardware import ClusterSpec, GpuSpec
from autotune.specs.model import ModelSpec, padded_vocab_size

__all__ = ["CostEstimate", "CostParams", "LayerTimes", "estimate_cost", "gemm_efficiency",
           "gemm_size"]

_BUCKET_PARAMS = 40_000_000
"""megatron/core/distributed/distributed_data_parallel_config.py: bucket_size defaults to
max(40M, 1M x dp) parameters; the last bucket's reduction cannot hide behind backward."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CostParams(LeverConstants):
    """Empirical efficiency constants (fractions of datasheet peaks, bytes moved per element).

    A lever's own constants are declared in its module and inherited (LeverConstants), so
    calibration fits them like these: the transformer implementation's (attention kernels,
    element-wise fusions, TE's host time) are in autotune.levers.transformer_impl.Constants.

    Defaults: gemm_half_size, the attention, HBM and communication efficiencies are
    datasheet-style guesses; gemm_efficiency_max, the implementation's two elementwise factors
    and step_overhead_s are fitted by tools/fit_constants.py (scipy least squares on log step
    time) to all 214 OK trials of tests/data/measured_trials.json (13 families: 7 model shapes,
    GPT and Llama, on H100 and H200), with attention dropout priced apart and the element-wise
    traffic counted per architecture feature (autotune.specs.elementwise); leave-one-family-out
    held-out step-time medians 2.6-8.3% per family
    (results/benchmarks/2026-11-28-cpu-constants-refit-s15.md). One set for both GPU types: fitted
    to each GPU's trials alone they move the shared constants little (same report).
    layer_launch_s was fitted earlier
    (results/benchmarks/2026-11-21-h100-h200x2-model-accuracy.md).
    """

    gemm_efficiency_max: float = GEMM_EFFICIENCY_MAX
    """Fraction of peak bf16 FLOP/s that large GEMMs reach."""
    gemm_half_size: float = 256.0
    """eff = gemm_efficiency_max * x / (x + gemm_half_size), x the GEMM's smaller dimension per
    GPU (min of mbs * seq / cp and hidden / tp): an empirical saturating fit, not a law. Prices
    the layers' GEMMs and the logits only on GPUs never swept (autotune.specs.gemm_rates); the
    unfused attention's batched GEMMs (inner size head_dim, never swept) on every GPU."""
    gemm_rate_scale: float = 0.0
    """0 (shipped): the layers' GEMMs and the logits at gemm_efficiency_max's saturating
    efficiency on every GPU. Above 0, on a GPU with a measured GEMM rate curve
    (autotune.specs.gemm_rates: H100, H200), each GEMM at its own shape's measured rate times
    this: the share of the swept sustained rate that training's GEMMs reach (the sweep ran
    back-to-back matmuls; training interleaves other kernels). FP8's speed-up is the
    measured FP8 / bf16 ratio on a swept GPU either way (autotune.levers.fp8.
    layer_gemm_speedup). Fitted to all of
    tests/data/measured_trials.json it is 1.02, but held out by family the measured form is no
    better than the fitted one (the fitted curve is within 0.93-1.04 of the measured rates for
    every family's GEMMs), so it is off until the non-GEMM misses are priced
    (results/benchmarks/2026-11-28-cpu-gemm-rates.md). A calibration starting from a value above
    0 fits it (autotune.predict.calibration.gemm_rate_fields)."""
    hbm_efficiency: float = 0.8
    """Fraction of datasheet HBM bandwidth that streaming kernels reach."""
    hbm_bytes_per_s: float | None = None
    """HBM bandwidth; None takes the GPU's (autotune.specs.hardware.GpuSpec.hbm_bytes_per_s)."""
    comm_efficiency: float = 0.8
    """NCCL bus bandwidth as a fraction of the link bandwidth in the GPU table."""
    collective_latency_s: float = 20e-6
    """Fixed cost per collective (launch + ring latency)."""
    optimizer_bytes_per_param: float = 32.0
    """Adam step HBM traffic per local-shard parameter: read grad, master, m, v (16 B), write
    master, m, v, bf16 param (14 B), plus the gradient-norm read (2 B)."""
    step_overhead_s: float = 0.000869
    """Per-step fixed cost: data loading, loss all-reduce, Python, zeroing grad buffers. The fit
    to all trials puts it under a millisecond (0.0339 s fitted to the GPT trials alone)."""
    layer_launch_s: float = 0.00162
    """Host time to launch one layer's kernels for one micro-batch (forward + backward) that
    the GPU does not hide: eager megatron-core issues ~100 small kernels per layer. Fitted to
    measurements (autotune calibrate); it is what makes small micro-batches slow."""
    moe_layer_launch_s: float = 0.0103
    """Host time of an MoE layer per micro-batch (forward + backward) that the GPU waits for,
    whatever its expert count; expert_launch_s adds its share per local expert. A profile of one
    H200 step (tools/device_profile.py, results/benchmarks/2026-11-29-h200-moe-dispatcher-s23.md)
    puts the GPU's kernels at 20-36% of the step (mbs 1 and 4): the step waits for the host.
    The largest part is TE's GroupedLinear (fc1 and fc2, forward and backward: its Python sets up
    each expert's GEMM, split and workspace): 7.8 ms per layer and micro-batch with 8 experts,
    16.7 ms with 64 (under the profiler, which slowed the step 1.3-1.5x); the router, the
    permutation and the dispatcher's host synchronizations (moe/token_dispatcher.py,
    _maybe_dtoh_and_synchronize) take a few ms more. Fitted with expert_launch_s (every other
    constant shipped) to
    autotune's first measured MoE trials of real layers, 20 on one H200 in two calls with TE
    2.11 (tests/data/measured_moe_trials.json: 8, 24, 60 and 64 experts of 1408, top 4, with and
    without a shared expert, mbs 1-8, bf16 and FP8, full recompute): every trial's step time
    was predicted 32-80% fast without them (median 60%); with them, median 14.5%, worst 46.5%.
    Per layer alone: 23.3 ms, median 16.6%, worst 84%; per expert alone: 0.57 ms, 17.2%, 67%.
    Fitted to one call and predicting the other: median 10.1% and 32.6%: the host's speed moves
    these trials by tens of percent between machines of one kind (a third call ran the 64-expert
    model at mbs 1 in 1.707 s, the second in 1.210 s; with it, 21 trials, the fit moves under
    1%: 10.34 ms, 0.321 ms)
    (results/benchmarks/2026-11-29-h200-moe-experts-s22.md). Megatron-LM's defaults were run:
    the permutation and the router unfused (--moe-permute-fusion, --moe-router-fusion are named
    in a warning when a command passes them)."""
    expert_launch_s: float = 0.000324
    """Host time per local expert (num_experts / ep) of an MoE layer, per micro-batch (forward +
    backward), beyond moe_layer_launch_s: TE's GroupedLinear runs one GEMM per expert, with its
    split sizes, workspace and (FP8) quantizers set up for each. Fitted with
    moe_layer_launch_s (above). NVIDIA's Qwen3-30B-A3B recipe on 16 x H100, whose MoE runs with
    the permutation and the router fused (Megatron-Bridge 0.1.0rc3 changelog), is predicted at
    0.73 of its published tokens/s without the two terms and at 0.37 with them
    (results/benchmarks/2026-11-29-h200-moe-experts-s22.md)."""
    mla_layer_launch_s: float = 0.00283
    """Host time of a Multi-Latent Attention layer per micro-batch (forward + backward) beyond
    layer_launch_s, which the GPU waits for: megatron-core's MLASelfAttention issues its down
    and up projections, the latent norm, the split of the query and key into their RoPE and
    plain parts, RoPE on the first and the concatenation back as kernels of their own, from
    Python (multi_latent_attention.py, get_query_key_value_tensors). Fitted (every other
    constant shipped) to autotune's first MLA trials, five on one H200 with TE 2.11
    (tests/data/measured_mla_trials.json: DeepSeek-V2-Lite's attention on its dense MLP, mbs 1
    and 4, bf16 and FP8, full recompute): without it the step was predicted 2-28% fast (mbs 1:
    25-28%); with it -4.5..+10.6%. Its MoE layer (held out) -4.3% and +34%
    (results/benchmarks/2026-11-29-h200-mla-s23.md)."""
    cp_ring_step_host_s: float = 0.0036
    """Host time of one step of Transformer Engine's context-parallel ring per layer and
    micro-batch, forward and backward together (transformer_engine/pytorch/attention:
    AttnFuncWithCPAndKVP2P issues each of its cp steps' kernels and p2p exchange from Python).
    When a stage's n x cp of them take longer than its GPU work, the GPU waits. Measured with
    TE 2.11 on two H200 (gpt2-xl, cp 2, mbs 1, results/benchmarks/2026-11-23-h100-te-build-and-
    runs.md): 1.470 and 1.461 s per step at seq 4096 and 8192, the same host-bound time for
    twice the tokens; GPU-bound at 16384 (1.980 s)."""
    checkpoint_call_s: float = 0.0
    """Fixed cost of one activation checkpoint per micro-batch, besides the FLOPs it reruns:
    megatron-core's CheckpointFunction (tensor_parallel/random.py) saves and restores the CPU,
    CUDA and model-parallel-tracker RNG states and runs the recomputed forward and its
    backward as a nested, re-entrant autograd.backward call, whose kernels the host issues
    while the GPU waits on them. Zero by default: the measured trials do not support a
    constant per call (results/benchmarks/2026-11-23-recompute-overhead-analysis.md); `autotune
    calibrate` may fit it to a machine's own trials."""
    pcie_efficiency: float = 0.8
    """Fraction of the host link's datasheet bandwidth that pinned-memory copies reach."""


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
    offload_s: float = 0.0
    """Exposed CPU-offload copies: what the host link does not hide behind the layers."""
    pace_s: float = 0.0
    """The slowest pipeline stage's time for one micro-batch: the pace the stages keep
    (autotune.search.derive.joint_candidates compares pipeline splits by it at pp's level)."""
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    """Model FLOPs (no recompute) per GPU per second, in TFLOP/s."""
    mfu: float

    @property
    def terms(self) -> tuple[float, ...]:
        """Every time term of the step, to 9 significant digits: two layouts whose terms are
        equal are priced alike by the model, term by term (not by a coincidence of sums)."""
        return tuple(float(f"{t:.9g}") for t in (
            self.compute_s, self.tp_comm_s, self.cp_comm_s, self.ep_comm_s, self.pp_comm_s,
            self.dp_comm_s, self.bubble_s, self.optimizer_s, self.overhead_s, self.launch_s,
            self.offload_s, self.step_time_s))

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
    layer_mlp: float
    """The MLP's (MoE layer's) part of layer_mats."""
    logits: float
    """The output layer's: 2 h V per prediction depth (the main model's and each MTP
    layer's)."""
    model_per_token: float


@functools.lru_cache(maxsize=1024)
def _flops(model: ModelSpec) -> _Flops:
    """Per-token forward FLOPs split into GEMMs / core attention / logits, from
    autotune.specs.flops."""
    base = model_flops_per_token(model)
    core = (hardware_flops_per_token(model, "selective") - base) / model.num_layers
    mats = (hardware_flops_per_token(model, "full") - base) / model.num_layers - core
    return _Flops(layer_mats=mats, layer_core=core, layer_mlp=mlp_forward_flops_per_token(model),
                  logits=logits_forward_flops_per_token(model), model_per_token=base)


def _gemm_rates(model: ModelSpec, s: Layout, gpu: GpuSpec,
                prm: CostParams) -> tuple[float, float, float]:
    """FLOP/s of (one layer's GEMMs, its MLP's, the output layer's) for one micro-batch.

    With CostParams.gemm_rate_scale above 0, on a swept GPU (autotune.specs.gemm_rates), each
    GEMM runs at the measured rate of its own
    shape, m = the micro-batch's local tokens (all of them with sequence parallelism: the
    column-parallel GEMMs run after the all-gather), in and out features per tensor-parallel
    rank (autotune.levers.fp8.gemm_dims; an MoE layer's experts taken at the same m, an
    approximation), times gemm_rate_scale. The backward's two GEMMs per weight permute the
    same three dimensions and so share the forward's rate (gemm_rates.gemm_x is symmetric).
    Otherwise (the default) all run at CostParams.gemm_efficiency_max's saturating efficiency
    of the datasheet peak (autotune.specs.flops.gemm_efficiency)."""
    scale = prm.gemm_rate_scale
    if scale > 0 and rate_curve(gpu.name) is not None:
        layer, mlp, logits = _measured_rates(gpu.name, model, s.mbs, s.tp, s.cp)
        return layer * scale, mlp * scale, logits * scale
    rate = gpu.peak_bf16_flops * gemm_efficiency(gemm_size(model, s), prm)
    return rate, rate, rate


@functools.lru_cache(maxsize=4096)
def _measured_rates(gpu: str, model: ModelSpec, mbs: int, tp: int,
                    cp: int) -> tuple[float, float, float]:
    """_gemm_rates' measured (layer, MLP, logits) FLOP/s at scale 1; cached per GPU and shape
    (a plan prices the same few thousand times: results/benchmarks/2026-11-28-cpu-gemm-rates.md,
    planning time)."""
    from autotune.levers.fp8 import gemm_dims  # the levers import this module

    split = Layout(mbs=mbs, tp=tp, cp=cp, gbs=mbs)
    tokens = mbs * model.seq_length / cp
    dims = tuple((i, o) for _, i, o in gemm_dims(model, split))
    layer = mean_rate(gpu, "bf16", tokens, dims)
    mlp = mean_rate(gpu, "bf16", tokens, dims[2:])
    logits = mean_rate(gpu, "bf16", tokens,
                       ((model.hidden_size, padded_vocab_size(model, tp) // tp),))
    assert layer is not None and mlp is not None and logits is not None
    return layer, mlp, logits


def _attention_tp_width(model: ModelSpec, sequence_parallel: bool) -> float:
    """Elements per token of the attention block's tensor-parallel collectives per pass, as the
    width of one all-reduce (or its all-gather + reduce-scatter pair): h for attention with one
    QKV GEMM (Korthikanti et al. 2022, Section 4.2.2: the output projection's all-reduce
    forward, the QKV input's backward).

    Multi-Latent Attention (megatron-core 0.16.1 multi_latent_attention.py, TE's spec) keeps
    the projection's h but gathers other inputs: its column-parallel up projections take the
    latents (q_lora_rank and kv_lora_rank; linear_q_proj the hidden state without a query
    latent) and the key's RoPE part is gathered apart (gather_from_sequence_parallel_region).
    With sequence parallelism each is all-gathered forward and reduce-scattered backward;
    without, the down projections (whole on each rank) see the whole sequence and only the up
    projections' input gradients are all-reduced, backward. Per pass, the mean of the two
    directions: (h + what the up projections gather) / 2 with SP, counted as one collective;
    without SP the backward's latents and the forward's h, likewise."""
    h = model.hidden_size
    if not model.multi_latent_attention:
        return float(h)
    assert model.kv_lora_rank is not None and model.qk_pos_emb_head_dim is not None
    gathered = (model.q_lora_rank or h) + model.kv_lora_rank
    if sequence_parallel:
        gathered += model.qk_pos_emb_head_dim
    return (h + gathered) / 2


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


def _alltoall_s(nbytes: float, n: int, stride: int, cluster: ClusterSpec,
                params: CostParams) -> float:
    """An all-to-all of `nbytes` per rank among `n` ranks `stride` global ranks apart.

    NCCL runs it as n - 1 point-to-point sends at once (ncclGroupStart, ncclSend/ncclRecv per
    peer; megatron-core's all-to-all token dispatcher calls torch.distributed.all_to_all_single),
    each over the path between its two ranks: NVLink to the peers on the rank's node, the
    rank's network link to the others. Each peer gets 1/n of the buffer, so the time is the
    slower of the remote peers' share over the network link and the local peers' over NVLink.
    A group within a node is all NVLink (as `_link`); a group that straddles nodes of a size
    that does not hold whole groups is priced all remote, as `_link` prices it.
    """
    if n <= 1:
        return 0.0
    gpu, per_node = cluster.gpu, cluster.gpus_per_node
    span = stride * n
    if not _leaves_node(cluster, span):
        local = n
    elif span > per_node and per_node % stride == 0:
        local = per_node // stride  # the group's ranks on each node, every node alike
    else:
        local = 1
    remote_s = (n - local) / n * nbytes / gpu.inter_node_bytes_per_s
    local_s = (local - 1) / n * nbytes / gpu.intra_node_bytes_per_s
    return params.collective_latency_s + max(remote_s, local_s) / params.comm_efficiency


def _link(cluster: ClusterSpec, span: int) -> float:
    """Bandwidth of a group whose ranks span `span` consecutive global ranks.

    Megatron orders ranks tp-cp-ep-dp-pp (tp innermost; parallel_state.RankGenerator), so a
    group of stride st and size n covers st * n ranks and leaves the node when that exceeds
    gpus_per_node; a ring is then as fast as its inter-node hops. A group that fits a node
    still leaves it when nodes do not hold whole spans: with nodes of 6, the span of ranks 4-7
    lies on two nodes, and the slowest group sets the pace of the step.
    """
    gpu = cluster.gpu
    return gpu.inter_node_bytes_per_s if _leaves_node(cluster, span) \
        else gpu.intra_node_bytes_per_s


def _leaves_node(cluster: ClusterSpec, span: int) -> bool:
    """Whether a group spanning `span` consecutive global ranks has ranks on several nodes
    (`_link`): it covers more than a node, or nodes do not hold whole spans."""
    per_node = cluster.gpus_per_node
    straddles = cluster.num_gpus > per_node and per_node % span != 0
    return span > per_node or straddles


def estimate_cost(model: ModelSpec, layout: Layout, cluster: ClusterSpec,
                  params: CostParams | None = None) -> CostEstimate:
    """Predicted step time and throughput of `layout` for `model` on `cluster`."""
    prm = params or DEFAULT_COST_PARAMS
    s = layout
    state = _cost_state(model, s, cluster, prm)
    if model.has_dense_layers:
        # Dense layers among the MoE layers: each stage's time from its layers of each kind,
        # priced as a model of that kind alone prices them (pipeline_split.mix_kinds: exact
        # where a term is linear in the stage's layers; FP8's host floor, a max over the stage,
        # and CP's exposed ring host time are taken as the same mean); the step's pipeline,
        # data-parallel and optimizer terms are the whole model's.
        dense_model, moe_model = model.dense_layer_model, model.moe_layer_model
        dense_s, moe_s = acting_layout(dense_model, s), acting_layout(moe_model, s)
        dense_times, pp_mb = _stage_times(dense_model, dense_s, cluster, prm,
                                          _cost_state(dense_model, dense_s, cluster, prm))
        moe_times, _ = _stage_times(moe_model, moe_s, cluster, prm,
                                    _cost_state(moe_model, moe_s, cluster, prm))
        per_stage = [mix_kinds(d, e, stage_kind_shares(s, model, i))
                     for i, (d, e) in enumerate(zip(dense_times, moe_times, strict=True))]
        if model.mtp_num_layers:
            # The MTP layers, one kind, on the last stage (autotune.predict.mtp_terms).
            kind = mtp_model(model)
            kind_s = acting_layout(kind, s)
            plus, _ = _stage_times(kind, kind_s, cluster, prm,
                                   _cost_state(kind, kind_s, cluster, prm))
            minus = moe_times if model.mtp_layer_is_moe else dense_times
            per_stage[-1] = add_difference(per_stage[-1], plus[-1], minus[-1])
    else:
        per_stage, pp_mb = _stage_times(model, s, cluster, prm, state)
    fl = _flops(model)
    gpu = cluster.gpu
    hbm = (prm.hbm_bytes_per_s or gpu.hbm_bytes_per_s) * prm.hbm_efficiency
    peak = gpu.peak_bf16_flops
    m = s.num_microbatches
    counts = state.stage_layers
    pace = max(per_stage, key=lambda st: st.total)
    compute_mb, tp_mb, cp_mb, ep_mb = pace.compute, pace.tp, pace.cp, pace.ep
    launch_mb, mb_s = pace.launch, pace.total
    # Stages run in lock-step at the pace of the slowest (the last one, with the logits, unless
    # an uneven split moved layers off it): m slots of it, plus Narayanan et al. 2021's bubble
    # of (p - 1)/v slots (Section 2.2.2). An uneven split pays or gains through that slot.
    bubble_s = (s.pp - 1) / s.vpp * mb_s

    dp_s = _dp_exposed(model, s, cluster, prm, state, bwd_window_s=mb_s * 2 / 3,
                       fwd_window_s=mb_s / 3)
    # Adam over the local shard is memory-bound (megatron/core/optimizer: one fused pass); a
    # lever may move part of it off the GPU (optimizer_host_s_per_param).
    dense, expert = _largest_stage(model, s, counts)
    shard = dense / state.dense_shard + expert / state.expert_shard
    optimizer_s = shard * state.optimizer_bytes_per_param / hbm \
        + shard * state.optimizer_host_s_per_param
    # A lever's once-a-step pass over the stage's GEMM weights (FP8's weight casts), with the
    # optimizer's time: both run outside the pipeline's micro-batches.
    if state.linear_weight_pass_bytes:
        optimizer_s += _busiest_linear(model, s, counts) * state.linear_weight_pass_bytes / hbm
    step = m * mb_s + bubble_s + dp_s + optimizer_s + prm.step_overhead_s
    tokens_per_s = s.gbs * model.seq_length / step
    world = s.world_size
    tflops = fl.model_per_token * tokens_per_s / world / 1e12
    return CostEstimate(compute_s=m * compute_mb, tp_comm_s=m * tp_mb, cp_comm_s=m * cp_mb,
                        ep_comm_s=m * ep_mb, pp_comm_s=m * pp_mb, dp_comm_s=dp_s,
                        offload_s=m * pace.offload, pace_s=mb_s,
                        bubble_s=bubble_s, optimizer_s=optimizer_s,
                        overhead_s=prm.step_overhead_s, launch_s=m * launch_mb,
                        step_time_s=step,
                        tokens_per_s=tokens_per_s, tflops_per_gpu=tflops,
                        mfu=tflops * 1e12 / peak)




def _cost_state(model: ModelSpec, s: Layout, cluster: ClusterSpec,
                prm: CostParams) -> CostState:
    """The terms the levers change, each lever in registry order (autotune.levers)."""
    state = CostState(optimizer_bytes_per_param=prm.optimizer_bytes_per_param,
                      main_grad_bytes=MAIN_GRAD_BYTES,
                      linear_gather_bytes=PARAM_BYTES, stage_layers=even_layers(s, model))
    for term in _COST_TERMS:
        state = term(model, s, cluster, prm, state)
    return state


def _stage_times(model: ModelSpec, s: Layout, cluster: ClusterSpec, prm: CostParams,
                 state: CostState) -> tuple[list[_StageTime], float]:
    """Each pipeline stage's time for one micro-batch (forward, backward, what the levers add),
    first to last, and the pipeline transfer time per micro-batch."""
    fl = _flops(model)
    gpu = cluster.gpu
    hbm = (prm.hbm_bytes_per_s or gpu.hbm_bytes_per_s) * prm.hbm_efficiency
    peak = gpu.peak_bf16_flops
    h, t = model.hidden_size, s.tp
    seq = model.seq_length / s.cp
    tokens = s.mbs * seq  # local tokens of one micro-batch
    tsp = t if s.sequence_parallel else 1

    # --- one layer, one micro-batch, one forward pass (backward = 2 forwards) ---
    # The GEMMs' rate (FLOP/s): measured per GEMM shape where the GPU was swept, the datasheet
    # peak at one saturating efficiency elsewhere (_gemm_rates).
    layer_rate, mlp_rate, logits_rate = _gemm_rates(model, s, gpu, prm)
    # A lever may run the layers' GEMMs faster than bf16 (FP8: autotune.levers.fp8); the
    # output layer's below stays at bf16's rate.
    gemm_fwd = tokens * fl.layer_mats / t / layer_rate / state.layer_gemm_speedup
    if s.impl == "te" and not s.sequence_parallel:
        # MLA's down projections run whole on every rank in TE's spec (TELinear 'duplicated'),
        # on the whole sequence without sequence parallelism (mla_down_flops_per_token).
        gemm_fwd += tokens * mla_down_flops_per_token(model) * (1 - 1 / t) / layer_rate \
            / state.layer_gemm_speedup
    mlp_fwd = tokens * fl.layer_mlp / t / mlp_rate / state.layer_gemm_speedup
    mla_up_fwd = tokens * mla_up_flops_per_token(model) / t / layer_rate \
        / state.layer_gemm_speedup
    core_flops = tokens * fl.layer_core / t
    acts = layer_activations(model, t, state.attention)
    # Core attention at its kernel's efficiency, and an unfused one's s^2 memory traffic
    # (the implementation's: autotune.levers.transformer_impl).
    core_fwd = core_flops / (peak * state.attention_efficiency)
    # Attention dropout in a fused kernel: integer work per computed score (its random
    # numbers), no FLOPs; causal kernels compute about half of the s x s scores.
    dropout_fwd = (tokens * model.seq_length * model.num_attention_heads / t / 2
                   * state.attention_dropout_ops_per_score / gpu.int32_ops_per_s)
    if state.attention_bytes_per_score:
        core_fwd += (tokens * seq * model.num_attention_heads / t
                     * state.attention_bytes_per_score / 3 / hbm)
    elementwise = state.elementwise_bytes
    # Element-wise kernels: the bytes they move, forward + backward, counted from the model's
    # features (norms, residual branches with or without dropout, GeLU or SwiGLU, RoPE, GQA's
    # repeat: autotune.specs.elementwise) times the implementation's fitted factor; a lever's
    # own passes (FP8's casts) add their bytes, forward + backward as well.
    traffic = layer_elementwise_bytes(model, t, str(s.impl)).per_token(t, s.sequence_parallel)
    elem_fwd = tokens * traffic * elementwise / 3 / hbm \
        + tokens * state.layer_pass_bytes_per_token / 3 / hbm
    # Tensor parallel: 2 all-reduces of s b h bf16 per layer forward, 2 backward (Korthikanti
    # et al. 2022, Section 4.2.2; SP swaps each for all-gather + reduce-scatter of the same
    # volume); megatron-core's local spec does not overlap them. A lever may add collectives of
    # its own to each pass (FP8 current scaling's amax all-reduces).
    # A shared expert is one more dense MLP in the layer, with its own pair (shared_experts.py:
    # megatron-core's MLP on the tensor-parallel group).
    # Multi-Latent Attention's pair moves other widths (_attention_tp_width).
    act_bytes = tokens * h * 2
    mlp_passes = 2 if model.shared_expert_ffn_size else 1
    attention_bytes = tokens * _attention_tp_width(model, s.sequence_parallel) * 2
    tp_fwd = mlp_passes * ring_allreduce_s(act_bytes, t, gpu.intra_node_bytes_per_s, prm) \
        + ring_allreduce_s(attention_bytes, t, gpu.intra_node_bytes_per_s, prm) \
        + state.layer_tp_extra_s
    # Context parallel: TE's ring passes K and V of the local chunk cp - 1 times per pass of
    # attention, overlapped with it (Liu et al. 2023, Ring Attention): exposed max(0, .).
    cp_fwd = 0.0
    if s.cp > 1:
        # K and V: head_dim each per group, MLA's qk_dim and v_dim per head.
        kv_bytes = tokens * (model.qk_dim + model.v_dim) * max(1, model.query_groups // t) * 2
        bw = _link(cluster, t * s.cp) * prm.comm_efficiency
        cp_fwd = max(0.0, (s.cp - 1) * kv_bytes / bw - core_fwd)
    # Expert parallel: token dispatch + combine all-to-all per pass.
    ep_fwd = 0.0
    if model.is_moe and s.ep > 1:
        a2a_bytes = tokens / tsp * model.moe_topk * h * 2
        ep_fwd = 2 * _alltoall_s(a2a_bytes, s.ep, t, cluster, prm)
    layer = LayerTimes(gemm=gemm_fwd, core=core_fwd, elem=elem_fwd, tp=tp_fwd, cp=cp_fwd,
                       ep=ep_fwd, dropout=dropout_fwd)

    # The host time a layer's own modules add per micro-batch, which the GPU waits for: an MoE
    # layer's, per layer and per local expert (moe_layer_launch_s, expert_launch_s), and
    # Multi-Latent Attention's (mla_layer_launch_s).
    module_host_s = prm.moe_layer_launch_s + prm.expert_launch_s * model.num_experts / s.ep \
        if model.is_moe and model.num_experts else 0.0
    if model.multi_latent_attention:
        module_host_s += prm.mla_layer_launch_s

    # The last stage adds the output layer (2 h V per token forward) and the vocab-parallel
    # cross entropy over fp32 logits (cross_entropy.py: ~4 passes over 4-byte elements; the
    # fused kernels fewer, autotune.levers.cross_entropy).
    # Each MTP layer adds one more of both (fl.logits counts its GEMM) and its eh_proj, a
    # column-parallel 2h x h GEMM (multi_token_prediction.py) at the layers' rate; its
    # transformer layer is one more layer of the last stage, below. Its output's gather over
    # the tensor-parallel group (and the sequence-parallel gather of its input) is not priced.
    vocab_rank = padded_vocab_size(model, t) / t
    ce_passes = state.cross_entropy_passes
    mtp = model.mtp_num_layers
    logits_s = (tokens * fl.logits * 3 / t / logits_rate
                + (1 + mtp) * tokens * vocab_rank * 4 * ce_passes / hbm)
    if mtp:
        logits_s += tokens * eh_proj_forward_flops_per_token(model) * 3 / t / layer_rate \
            / state.layer_gemm_speedup
    # Pipeline: send + receive of s b h bf16 per chunk boundary, forward and backward (1/t of
    # it with SP or Megatron's scatter-gather; Narayanan et al. 2021, Section 4.1).
    pp_mb = 0.0
    if s.pp > 1:
        bw = _link(cluster, cluster.num_gpus) * prm.comm_efficiency
        pp_mb = 2 * s.vpp * (prm.collective_latency_s + act_bytes / t / bw)
    full_bytes = layer_bytes(acts, tokens=tokens, seq=seq, tp=t,
                             sequence_parallel=s.sequence_parallel)

    # --- each pipeline stage, one micro-batch: its layers (an uneven split gives the first or
    # last stage its own count) and, on the last, the logits and the MTP layers' transformer
    # layers (of this model's one kind: a mixed model adds them apart, autotune.predict.
    # mtp_terms), in its last chunk.
    counts = state.stage_layers
    times: dict[tuple[int, bool], _StageTime] = {}
    stages: dict[tuple[int, int], StageState] = {}  # the levers' terms: by layers and chunk
    for i, n in enumerate(counts):
        key = (n, i == s.pp - 1)
        if key in times:
            continue
        extra = mtp if key[1] else 0
        shape = (n + extra, n // s.vpp + extra)
        stage = stages.get(shape)
        if stage is None:
            stage = StageState(layers=shape[0], chunk=shape[1], layer=layer,
                               mlp_forward_s=mlp_fwd, mla_up_forward_s=mla_up_fwd,
                               activations=acts, tokens=tokens, layer_bytes=full_bytes,
                               hbm_bytes_per_s=hbm, elementwise_bytes=elementwise)
            for stage_term in _STAGE_TERMS:
                stage = stage_term(model, s, cluster, prm, stage)
            stages[shape] = stage
        times[key] = _stage_time(s, prm, state, stage, logits_s=logits_s if key[1] else 0.0,
                                 pp_s=pp_mb, module_host_s=module_host_s)
    per_stage = [times[(n, i == s.pp - 1)] for i, n in enumerate(counts)]
    return per_stage, pp_mb


_COST_TERMS = tuple(lever.cost for lever in LEVERS if lever.cost is not None)
_STAGE_TERMS = tuple(lever.stage_cost for lever in LEVERS if lever.stage_cost is not None)


@dataclass(frozen=True, slots=True)
class LayerTimes:
    """One layer, one micro-batch, one forward pass: its terms in seconds."""

    gemm: float
    core: float
    elem: float
    tp: float
    cp: float
    ep: float
    dropout: float = 0.0
    """Attention dropout's random numbers in a fused kernel, drawn once per pass: the forward,
    the backward (which regenerates them rather than reading a stored mask) and each
    recomputed forward, not twice in the backward as the FLOPs are."""


@dataclass(frozen=True, slots=True)
class _StageTime:
    """One pipeline stage, one micro-batch (forward + backward + recompute), by term."""

    compute: float
    tp: float
    cp: float
    ep: float
    pp: float
    launch: float
    offload: float

    @property
    def total(self) -> float:
        return self.compute + self.tp + self.cp + self.ep + self.pp + self.launch + self.offload


def _stage_time(s: Layout, prm: CostParams, state: CostState, stage: StageState, *,
                logits_s: float, pp_s: float, module_host_s: float) -> _StageTime:
    """Time of one stage of `stage.layers` layers for one micro-batch: forward (1) + backward
    (2) of every layer, plus what the levers add (StageState: the forwards recompute reruns,
    its checkpoints, offload's exposed copies). `module_host_s`: the host time a layer's own
    modules add (MoE's, MLA's: CostParams.moe_layer_launch_s, expert_launch_s,
    mla_layer_launch_s), launched like the rest of the layer."""
    n, layer = stage.layers, stage.layer
    full = stage.recomputed_forwards
    compute = n * (3 + full) * (layer.gemm + layer.core + layer.elem) \
        + n * (2 + full) * layer.dropout
    # 2 collectives per pass forward (layer.tp, layer.ep), 2 in backward, 2 per recompute.
    tp = n * (2 + full) * layer.tp
    cp = n * (3 + full + stage.attention_reruns) * layer.cp
    ep = n * (2 + full) * layer.ep
    per_layer = prm.layer_launch_s + state.layer_launch_extra_s + module_host_s
    relaunch = 1 + 0.5 * full  # recompute relaunches the forward
    launches = n * per_layer * relaunch
    launch = launches
    compute += n * stage.rerun_s
    launch += s.vpp * stage.checkpoints * prm.checkpoint_call_s
    floor = 0.0
    if state.layer_host_floor_s:
        # A host-bound path (TE's FP8): the GPU waits for the host where its own work per
        # layer is shorter than the host's; the wait is host time, with the launches. The
        # floor is a plain layer's host time: the modules' own (MoE's, MLA's) come on top. A
        # recomputed forward costs its host time again, and what the path adds around each
        # recompute (CostState.recompute_host_s: delayed scaling's, under TE's checkpoint).
        floor = n * ((state.layer_host_floor_s + module_host_s) * relaunch
                     + full * state.recompute_host_s)
        launch += max(0.0, floor - (compute + tp + cp + ep + launch))
    offload = stage.offload_s
    if s.cp > 1:
        # The ring's host time hides behind the stage's GPU work only up to that work's length
        # (offload's copies wait on the host link, not on that work: priced on top). Its
        # constant is a bf16 TE layer's whole host time per ring step; a host-bound path (FP8's
        # quantizers) adds what its floor holds over the plain launches, issued from the same
        # Python thread as the ring (TE's AttnFuncWithCPAndKVP2P: each step's attention call,
        # P2P exchange and output correction; transformer_engine/pytorch/attention/
        # dot_product_attention/context_parallel.py). Without that sum llama3-8b's FP8 cp 2 trial
        # on 4 x H200 was predicted 17% fast, with it 2% slow (2026-11-28-cpu-measured-s16-
        # trials-s17.md).
        host = n * s.cp * prm.cp_ring_step_host_s + max(0.0, floor - launches)
        busy = compute + logits_s + tp + cp + ep + pp_s + launch
        cp += max(0.0, host - busy)
    return _StageTime(compute=compute + logits_s, tp=tp, cp=cp, ep=ep, pp=pp_s, launch=launch,
                      offload=offload)


def _busiest_linear(model: ModelSpec, s: Layout, counts: tuple[int, ...]) -> float:
    """GEMM weights of the stage with the most (autotune.predict.memory.stage_linear_params), of
    the stages' layer `counts`."""
    return max(stage_linear_params(model, s, i, counts[i]) for i in {0, s.pp - 1})


def _largest_stage(model: ModelSpec, s: Layout, counts: tuple[int, ...]) -> tuple[float, float]:
    """(dense, expert) parameters of the stage with the most: first (embedding) or last, of
    the stages' layer `counts`."""
    first = stage_params(model, s, 0, counts[0])
    if s.pp == 1:
        return first
    last = stage_params(model, s, s.pp - 1, counts[-1])
    return first if sum(first) >= sum(last) else last


def _dp_exposed(model: ModelSpec, s: Layout, cluster: ClusterSpec, prm: CostParams,
                state: CostState, *, bwd_window_s: float, fwd_window_s: float) -> float:
    """Exposed gradient reduction (+ parameter all-gather with the distributed optimizer).

    Dense gradients reduce over the dp x cp group (stride tp), expert gradients over the
    expert-data-parallel group; megatron-core reduces the grad buffer in its own dtype
    (CostState.main_grad_bytes: MAIN_GRAD_BYTES unless a lever changes it). With
    overlap_grad_reduce, buckets reduce during the last micro-batch's
    backward: exposed = max(0, comm - backward) + the last bucket (Megatron DDP docs).
    """
    grad_bytes = state.main_grad_bytes
    dense, expert = _largest_stage(model, s, state.stage_layers)
    # The GEMM weights' share of the gathered parameters (FP8 parameters gather in 1 byte).
    linear_share = 0.0 if state.linear_gather_bytes == PARAM_BYTES else \
        _busiest_linear(model, s, state.stage_layers) / max(1.0, dense + expert)
    groups = [(dense, s.dp * s.cp, s.tp * s.cp * s.dp)]
    if expert:
        groups.append((expert, s.expert_dp, cluster.num_gpus // s.pp))
    grad_s = gather_s = tail_s = 0.0
    for n_params, n, span in groups:
        if n <= 1:
            continue
        bw = _link(cluster, span)
        bucket = min(n_params, max(_BUCKET_PARAMS, 1_000_000 * n))
        if state.dp_sharded:
            grad_s += _one_way_s(n_params * grad_bytes, n, bw, prm)
            gather_s += _one_way_s(n_params * PARAM_BYTES + linear_share * n_params
                                   * (state.linear_gather_bytes - PARAM_BYTES), n, bw, prm)
            tail_s += _one_way_s(bucket * grad_bytes, n, bw, prm)
        else:
            grad_s += ring_allreduce_s(n_params * grad_bytes, n, bw, prm)
            tail_s += ring_allreduce_s(bucket * grad_bytes, n, bw, prm)
    if state.overlap_grad_reduce:
        grad_s = max(0.0, grad_s - bwd_window_s) + tail_s
    if state.overlap_param_gather:
        gather_s = max(0.0, gather_s - fwd_window_s) + tail_s * PARAM_BYTES / grad_bytes
    embed_s = 0.0
    if s.pp > 1 and (model.tied_embeddings or model.mtp_num_layers):
        # Tied word embeddings, or the MTP layers' copy of them on the last stage: first and
        # last stage all-reduce the embedding gradient (megatron/core/distributed/
        # finalize_model_grads.py _get_shared_word_embedding_weight), not overlapped.
        nbytes = padded_vocab_size(model, s.tp) * model.hidden_size / s.tp * grad_bytes
        embed_s = ring_allreduce_s(nbytes, 2, _link(cluster, cluster.num_gpus), prm)
    return grad_s + gather_s + embed_s
