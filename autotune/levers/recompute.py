"""Activation recomputation: selective (a layer's modules) or full (whole layers).

megatron-core 0.16.1 (TransformerConfig `recompute_granularity`, `recompute_method`,
`recompute_num_layers`, `recompute_modules`): full recompute checkpoints whole layers
(transformer_block.py _checkpointed_forward), `uniform` in groups of recompute_num_layers
layers, `block` the first recompute_num_layers layers of each pipeline chunk; selective
recompute checkpoints modules of each layer (attention.py core_attn; transformer_layer.py
layernorm and mlp; experts.py moe_act; moe_layer.py moe and shared_experts;
multi_latent_attention.py mla_up_proj). Megatron-LM spells it
`--recompute-granularity full|selective --recompute-method --recompute-num-layers
--recompute-modules` (arguments.py; core_v0.16.1 argument_utils.py generates the last).

What it changes, from Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models": a layer stores what its checkpoint keeps instead of every activation
(Section 4.3 for full: the layer input 2 s b h, /t with sequence parallelism; eq. 4 for
core_attn: no 5 a s^2 b term), a rebuilt region lives while its backward runs, and each
recomputed forward runs again (Section 5), with one checkpoint call per region.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from autotune.dimensions import (
    MEGATRON_RECOMPUTE_MODULES,
    RECOMPUTE_MODULES,
    Impl,
    Recompute,
    RecomputeMethod,
    RecomputeModules,
    dimension,
)
from autotune.errors import ConfigError, InvalidLayoutError
from autotune.levers.base import (
    ActivationState,
    Derivable,
    Lever,
    Rule,
    Seed,
    StageState,
    Unread,
    evolve,
)
from autotune.levers.flags import Flag, FlagRow, Given, Part, Place, RunOptions
from autotune.levers.pipeline_split import chunk_layers, common_divisors
from autotune.specs.activations import LayerActivations, layer_bytes
from autotune.specs.elementwise import NORM_BYTES, layer_elementwise_bytes
from autotune.specs.flops import mlp_forward_flops_per_token, shared_expert_flops_per_token

if TYPE_CHECKING:
    from autotune.layouts.layout import Layout
    from autotune.predict.cost import CostParams
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.model import ModelSpec

__all__ = ["LEVER", "Fields", "acting_layout", "checkpoint_calls", "full_recompute_chunk",
           "module_position_savings", "module_savings", "module_workspace", "recomputed_share"]


def _label(s: Layout, value: Recompute) -> str | None:
    """`rc=selective`, `rc=full`, or `rc=full(block/2)` when the method or layer count is not
    the default, `rc=selective(core_attn+mlp)` when the modules are not core_attn alone:
    recompute_method and recompute_num_layers mean nothing without full, recompute_modules
    nothing without selective."""
    if value == Recompute.FULL and (s.recompute_method, s.recompute_num_layers) != (
            RecomputeMethod.UNIFORM, 1):
        return f"rc=full({s.recompute_method}/{s.recompute_num_layers})"
    if value == Recompute.SELECTIVE and s.recompute_modules != RecomputeModules.CORE_ATTN:
        return f"rc=selective({s.recompute_modules})"
    return None if value == Recompute.NONE else f"rc={value}"


@dataclass(frozen=True, kw_only=True)
class Fields:
    __slots__ = ()
    recompute: Recompute = dimension(Recompute.NONE, level=5, label=_label, help=(
        "Activation recomputation: none, selective (the recompute_modules) or full."))
    recompute_method: RecomputeMethod = dimension(
        RecomputeMethod.UNIFORM, level=5, label=None, folded_into="recompute", help=(
            "With full recompute: uniform (every group of layers) or block (the first n "
            "layers of each stage)."))
    recompute_num_layers: int = dimension(1, level=5, label=None, folded_into="recompute",
                                          help="With full recompute: layers per group (uniform)"
                                               " or recomputed layers per stage (block).")
    recompute_modules: RecomputeModules = dimension(
        RecomputeModules.CORE_ATTN, level=5, label=None, folded_into="recompute",
        metavar="MODULES", help=(
            "With selective recompute: the modules checkpointed (`--recompute-modules`), "
            f"among {', '.join(RECOMPUTE_MODULES)}, joined by + in that order (core_attn+mlp); "
            "moe with neither moe_act nor shared_experts; Megatron's default is core_attn."))


# ---- rules ---------------------------------------------------------------------------------


def _kind(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    if not isinstance(s.recompute, Recompute):
        return f"recompute={s.recompute!r} must be one of {', '.join(Recompute)}"
    if s.recompute == Recompute.FULL and not isinstance(s.recompute_method, RecomputeMethod):
        return f"recompute_method={s.recompute_method!r} must be uniform or block"
    return None


def _layers(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # TransformerConfig.__post_init__: between 1 and the layers of one pipeline rank (the
    # largest chunk, with an uneven split). The chunks are counted only under full recompute
    # (a tuple of pp counts: the enumeration checks 115k layouts of gpt-1t on 3072 GPUs).
    if s.recompute != "full":
        return None
    per_chunk = max(chunk_layers(s, m))
    if not 1 <= s.recompute_num_layers <= per_chunk:
        return (f"recompute_num_layers={s.recompute_num_layers} must be between 1 and the "
                f"{per_chunk} layers of a pipeline chunk")
    return None


def _groups(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # TransformerConfig.recompute_method: uniform "will uniformly divide the total number of
    # transformer layers in a transformer block" into groups of recompute_num_layers;
    # transformer_block.py's _checkpointed_forward leaves a shorter last group otherwise, which
    # saves no memory over the even groups and is not the documented use.
    if s.recompute != "full" or s.recompute_method != RecomputeMethod.UNIFORM:
        return None
    if m.mtp_num_layers and s.recompute_num_layers != 1:
        # multi_token_prediction.py _checkpointed_forward: "recompute_num_layers must be 1 for
        # MTP recompute" (an assert in the MTP layer's forward).
        return (f"uniform recompute_num_layers={s.recompute_num_layers} with MTP layers: "
                "megatron-core checkpoints them with 1 only")
    counts = sorted(set(chunk_layers(s, m)))
    if any(n % s.recompute_num_layers for n in counts):
        listed = ", ".join(map(str, counts))
        return (f"uniform recompute_num_layers={s.recompute_num_layers} must divide the "
                f"layers of every pipeline chunk ({listed})")
    return None


def _modules(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # Which modules take effect, megatron-core 0.16.1. Megatron accepts a module that acts on
    # nothing; the rule keeps such a layout from passing for a different run.
    if s.recompute != "selective":
        return None
    if not isinstance(s.recompute_modules, RecomputeModules):
        return (f"recompute_modules={s.recompute_modules!r} must be one of "
                f"{', '.join(RecomputeModules)}")
    modules = s.recompute_modules.modules
    if "mlp" in modules and m.is_moe and not m.has_dense_layers:
        # transformer_layer.py: recompute_mlp only `if not self.is_moe_layer`.
        return f"recompute_modules mlp acts on dense MLPs; every layer of {m.name} is MoE"
    if ("moe" in modules or "moe_act" in modules) and not m.is_moe:
        # moe_layer.py / experts.py read them; a dense model has no expert layer.
        return f"recompute_modules {s.recompute_modules} acts on MoE layers; {m.name} has none"
    if "mla_up_proj" in modules and not m.multi_latent_attention:
        # TransformerConfig.__post_init__: "mla_up_proj in recompute_modules is only supported
        # with multi_latent_attention" (a ValueError).
        return f"recompute_modules mla_up_proj acts on Multi-Latent Attention; {m.name} has none"
    if "shared_experts" in modules and not (m.is_moe and m.shared_expert_ffn_size):
        # moe_layer.py checkpoints self.shared_experts, built only with
        # moe_shared_expert_intermediate_size.
        return (f"recompute_modules shared_experts acts on an MoE layer's shared expert; "
                f"{m.name} has none")
    if "moe_act" in modules and s.impl != Impl.TE:
        # TransformerConfig.__post_init__: "moe_act in recompute_modules is only supported
        # with moe_grouped_gemm", which the worker turns on for impl te only (TEGroupedMLP).
        return f"recompute_modules moe_act needs moe_grouped_gemm (impl=te), got impl={s.impl}"
    if "layernorm" in modules and s.impl == Impl.TE and not m.is_moe:
        # gpt_layer_specs.py, the TE spec: both norms are fused into TELayerNormColumnParallel-
        # Linear (input_layernorm and pre_mlp_layernorm are IdentityOp), and
        # transformer_layer.py recomputes a norm only when it is not an IdentityOp.
        return "recompute_modules layernorm has no effect with impl=te: TE fuses the norms"
    return None


# ---- flags ---------------------------------------------------------------------------------


def _emit(m: ModelSpec, s: Layout, run: RunOptions) -> list[str]:
    if s.recompute == "none":
        return []
    if s.recompute == "selective":
        # validate_args: "recompute method is not yet supported for selective recomputing".
        # --recompute-modules is generated from TransformerConfig.recompute_modules (nargs +,
        # core_v0.16.1 argument_utils.py); without it, core_attn alone.
        args = ["--recompute-granularity", "selective"]
        if s.recompute_modules != "core_attn":
            args += ["--recompute-modules", *s.recompute_modules.split("+")]
        return args
    if s.recompute == "full":
        return ["--recompute-granularity", "full", "--recompute-method", s.recompute_method,
                "--recompute-num-layers", str(s.recompute_num_layers)]
    raise InvalidLayoutError(f"recompute={s.recompute!r} must be none, selective or full")


def _read(g: Given) -> dict[str, Any]:
    # --recompute-activations is the older spelling of --recompute-granularity selective, and
    # it wins: Megatron-LM's validate_args sets the granularity to selective whenever it is
    # given, over a --recompute-granularity full beside it (core_v0.16.1 arguments.py).
    granularity = g.choice("--recompute-granularity", ("full", "selective"), "none") \
        if g.has("--recompute-granularity") else "none"
    if g.has("--recompute-activations"):
        granularity = "selective"
    refused = [flag for flag in ("--recompute-method", "--recompute-num-layers")
               if granularity == "selective" and g.has(flag)]
    if refused:
        # validate_args: "recompute method is not yet supported for selective recomputing
        # granularity" (an assert); TransformerConfig.__post_init__: "When using
        # recompute_granularity: selective recompute_num_layers must be None" (a ValueError).
        clobbered = (" (--recompute-activations makes it selective over --recompute-"
                     "granularity full)" if g.text("--recompute-granularity") == "full" else "")
        raise ConfigError(f"{g.source}: Megatron-LM refuses {' and '.join(refused)} with "
                          f"selective recompute{clobbered}: the command does not run as "
                          "written")
    if granularity == "selective":
        # nargs +: the modules may come as one space-separated value; autotune writes a set
        # as `a+b` in its own order (dimensions.RecomputeModules).
        given = (g.text("--recompute-modules") or "core_attn").replace("+", " ").split()
        invalid = [m for m in given if m not in MEGATRON_RECOMPUTE_MODULES]
        if invalid:
            raise ConfigError(f"{g.source}: --recompute-modules {' '.join(invalid)}: "
                              f"megatron-core takes {', '.join(MEGATRON_RECOMPUTE_MODULES)} (the "
                              "command does not run as written)")
        if "mla_up_proj" in given and not g.has("--multi-latent-attention"):
            # TransformerConfig.__post_init__ raises a ValueError.
            raise ConfigError(f"{g.source}: --recompute-modules mla_up_proj needs "
                              "--multi-latent-attention (megatron-core refuses it without: the "
                              "command does not run as written)")
        # shared_experts with --moe-shared-expert-overlap stops Megatron-LM
        # (TransformerConfig.__post_init__); the overlap is a flag autotune does not read
        # (megatron_args.UNMODELED_FLAGS: warned about, never written), so not checked here.
        moe = (g.integer("--num-experts") or 0) > 1
        shared = moe and bool(g.integer("--moe-shared-expert-intermediate-size"))
        # A module that acts on no layer of the model does nothing, as autotune's layouts leave
        # it out (NVIDIA's DeepSeek-V3 script names mlp and moe).
        freq = g.text("--moe-layer-freq")
        dense = not moe or (freq is not None and freq.strip() != "1")
        acting = _acting(given, dense_layers=dense, moe_layers=moe, shared_experts=shared)
        if not acting:
            return {"recompute": "none"}  # nothing checkpointed: Megatron-LM's run is this one
        order = [m for m in RECOMPUTE_MODULES if m in acting]
        if "moe" in order and {"moe_act", "shared_experts"} & set(order):
            # moe_layer.py checkpoints the whole layer, a region within it again inside: the
            # pair frees what moe alone does and reruns the inner region twice.
            inner = " and ".join(m for m in order if m in ("moe_act", "shared_experts"))
            raise ConfigError(f"{g.source}: --recompute-modules moe with {inner}: moe "
                              f"recomputes the MoE layer {inner} is part of; autotune models "
                              "one of them (name moe alone, or the other without moe)")
        return {"recompute": granularity, "recompute_modules": "+".join(order)}
    if granularity != "full":
        return {"recompute": granularity}
    # TransformerConfig.__post_init__: full recompute needs a method (uniform or block) and a
    # number of layers.
    method = g.text("--recompute-method")
    layers = g.integer("--recompute-num-layers")
    if method not in ("uniform", "block") or layers is None:
        raise ConfigError(f"{g.source}: --recompute-granularity full needs --recompute-method "
                          "uniform|block and --recompute-num-layers N (megatron-core refuses it "
                          "without them)")
    return {"recompute": "full", "recompute_method": method, "recompute_num_layers": layers}


# ---- worker --------------------------------------------------------------------------------


def _core_config(m: ModelSpec, s: Layout) -> dict[str, dict[str, Any]]:
    # TransformerConfig reads recompute_method and recompute_num_layers only with full
    # recompute (transformer_block.py, _checkpointed_forward), recompute_modules only with
    # selective (attention.py, transformer_layer.py, moe_layer.py); Megatron-LM leaves the
    # unread ones at their defaults (None: core_attn).
    if s.recompute == Recompute.FULL:
        keys = {"recompute_granularity": "full", "recompute_method": str(s.recompute_method),
                "recompute_num_layers": s.recompute_num_layers, "recompute_modules": None}
    elif s.recompute == Recompute.SELECTIVE:
        keys = {"recompute_granularity": "selective", "recompute_method": None,
                "recompute_num_layers": None,
                "recompute_modules": s.recompute_modules.modules}
    else:
        keys = {"recompute_granularity": None, "recompute_method": None,
                "recompute_num_layers": None, "recompute_modules": None}
    return {"transformer": keys}


# ---- memory --------------------------------------------------------------------------------


def _acting(modules: Iterable[str], *, dense_layers: bool, moe_layers: bool,
            shared_experts: bool) -> list[str]:
    """The modules that act on some layer of a model with dense and/or MoE layers, the MoE
    layers with a shared expert or not: transformer_layer.py recomputes `mlp` only `if not
    self.is_moe_layer`; `moe` and `moe_act` exist in MoE layers only (moe_layer.py,
    experts.py), `shared_experts` in MoE layers with a shared expert (moe_layer.py). Attention's
    modules act on every layer (`mla_up_proj` needs Multi-Latent Attention, which megatron-core
    asserts: rule recompute_modules and the read)."""
    return [mod for mod in modules
            if not (mod == "mlp" and not dense_layers)
            and not (mod in ("moe", "moe_act") and not moe_layers)
            and not (mod == "shared_experts" and not (moe_layers and shared_experts))]


def acting_layout(m: ModelSpec, s: Layout) -> Layout:
    """`s` with the selective recompute modules that act on `m`'s layers (a model of one kind
    of layer: ModelSpec.dense_layer_model or moe_layer_model of a mixed model) and no others:
    `mlp` on dense layers only, `moe`, `moe_act` and `shared_experts` on MoE layers only (the
    last with a shared expert: transformer_layer.py, moe_layer.py), `layernorm` not where TE
    fuses both norms into the next GEMM (a dense layer's, gpt_layer_specs.py). No module left:
    no recompute."""
    if s.recompute != Recompute.SELECTIVE:
        return s
    kept = _acting(s.recompute_modules.modules, dense_layers=not m.is_moe,
                   moe_layers=m.is_moe, shared_experts=bool(m.shared_expert_ffn_size))
    if s.impl == Impl.TE and not m.is_moe:
        kept = [mod for mod in kept if mod != "layernorm"]
    if not kept:
        return replace(s, recompute=Recompute.NONE)
    return replace(s, recompute_modules=RecomputeModules("+".join(kept)))


def module_savings(acts: LayerActivations, modules: tuple[str, ...], *, seq: float, tp: int,
                   sequence_parallel: bool, fused_latent_norms: bool = False) -> float:
    """Bytes per token of one layer that selective recompute of `modules` does not store.

    core_attn: Korthikanti et al. 2022 eq. 4 (the 5 a s / h term; with flash attention only the
    log-sum-exp, which is why megatron-core warns that fused attention needs no core_attn
    recompute). The others free what their checkpoint's region saves beyond its input
    (LayerActivations fields). `moe` frees the experts' internals, moe_act's output and the
    shared expert's among them. `mla_up_proj` (multi_latent_attention.py: an output-discarding
    checkpoint of the up projections and RoPE) empties the query, key and value that core
    attention (or its checkpoint) saved, and keeps the latents the up projections saved; where
    Transformer Engine fuses the latent norms into the up projections (`fused_latent_norms`,
    impl te) the norms' statistics and outputs go too. Counted on CPU (sdpa):
    tools/saved_tensors.py --mla --recompute-modules mla_up_proj.
    """
    sp = tp if sequence_parallel else 1
    saved = 0.0
    if "core_attn" in modules:
        saved += seq * acts.per_key + acts.attn_recomputable
    if "layernorm" in modules:
        saved += acts.norm_outputs / sp
    if "mla_up_proj" in modules:
        saved += acts.mla_qkv + (acts.mla_fused_norms / sp if fused_latent_norms else 0.0)
    if "mlp" in modules:
        saved += acts.mlp_internal
    if "moe" in modules:
        saved += acts.moe_replicated / sp + acts.moe_split
    else:
        if "moe_act" in modules:
            saved += acts.moe_act_output
        if "shared_experts" in modules:
            # moe_layer.py: tensor_parallel.checkpoint (te_checkpoint under FP8) of the shared
            # expert keeps its input, the norm's output, which the router keeps anyway.
            saved += acts.shared_replicated / sp + acts.shared_split
    return saved


def module_position_savings(acts: LayerActivations, modules: tuple[str, ...]) -> float:
    """Bytes per position of the local sequence that selective recompute of `modules` does not
    store, whatever the micro-batch size: `mla_up_proj`'s checkpoint holds RoPE's frequencies
    ([s, 1, 1, d] fp32, an input of the region) in place of the bf16 cos and sin that RoPE's
    products saved for the query and the key (rope_table_bytes: 4 x 2 x d): half of those
    tables. Counted on CPU: tools/saved_tensors.py --mla --recompute-modules mla_up_proj."""
    return acts.per_position / 2 if "mla_up_proj" in modules else 0.0


def module_workspace(acts: LayerActivations, modules: tuple[str, ...]) -> float:
    """Bytes per token rebuilt at once in backward: the largest recomputed region of one
    layer (checkpoints rerun one region, then free it)."""
    # Not mla_up_proj's: its checkpoint writes the query, key and value back into their
    # storage when the layer's attention backward starts, after its MLP's backward freed more
    # (measured on an H200: DeepSeek-V2-Lite's dense layers at mbs 4 freed 1.59 GiB, all it
    # stores; results/benchmarks/2026-11-29-cpu-recompute-modules-s24.md).
    regions = [0.0]
    if "mlp" in modules:
        regions.append(acts.mlp_internal)
    if "moe" in modules:
        regions.append(acts.moe_replicated + acts.moe_split)
    elif "shared_experts" in modules:
        regions.append(acts.shared_replicated + acts.shared_split)
    return max(regions)


def recomputed_share(layers: int, *, method: str, num_layers: int) -> float:
    """The share of a chunk's `layers` layers whose forward full recompute runs again.

    megatron/core/transformer/transformer_block.py, _checkpointed_forward: `uniform` checkpoints
    groups of num_layers layers, so every layer is recomputed; `block` checkpoints the first
    num_layers layers of the chunk and runs the rest normally.
    """
    n = max(1, min(num_layers, layers))
    return n / layers if method == "block" else 1.0


def full_recompute_chunk(layers: int, *, method: str, num_layers: int, full: float,
                         layer_input: float) -> tuple[float, float]:
    """(stored, recompute workspace) bytes of one chunk of `layers` layers, one micro-batch.

    megatron/core/transformer/transformer_block.py, _checkpointed_forward: `uniform` checkpoints
    groups of num_layers layers and keeps each group's input; `block` checkpoints the first
    num_layers layers one by one and stores the rest in full. During backward one checkpointed
    unit's activations are rebuilt (the workspace).
    """
    n = max(1, min(num_layers, layers))
    if method == "block":
        return n * layer_input + (layers - n) * full, full
    return math.ceil(layers / n) * layer_input, n * full


def _activations(m: ModelSpec, s: Layout, state: ActivationState) -> ActivationState:
    if s.recompute == Recompute.FULL:
        # Only the layer input survives: 2 s b h, scattered over TP with SP (Section 4.3).
        tsp = s.tp if s.sequence_parallel else 1
        layer_input = state.tokens * 2 * m.hidden_size / tsp
        stored, rebuild = full_recompute_chunk(state.layers, method=s.recompute_method,
                                               num_layers=s.recompute_num_layers,
                                               full=state.layer_bytes, layer_input=layer_input)
        # autotune.predict.memory.BLOCK_MARGIN: every measured full-recompute run had its largest
        # block free at a peak the margin would have ruled out.
        return evolve(state, stored_bytes=stored, workspace_bytes=state.workspace_bytes
                      + rebuild, block_margin=0.0)
    if s.recompute == Recompute.SELECTIVE:
        modules = s.recompute_modules.modules
        freed = module_savings(state.layer, modules, seq=state.seq, tp=s.tp,
                               sequence_parallel=s.sequence_parallel,
                               fused_latent_norms=s.impl == Impl.TE)
        stored = state.layers * layer_bytes(
            state.layer, tokens=state.tokens, seq=state.seq, tp=s.tp,
            sequence_parallel=s.sequence_parallel, freed=freed,
            freed_per_position=module_position_savings(state.layer, modules))
        return evolve(state, stored_bytes=stored, workspace_bytes=state.workspace_bytes
                      + state.tokens * module_workspace(state.layer, modules))
    return state


# ---- cost ----------------------------------------------------------------------------------

_CHECKPOINTS_PER_MODULE = {"core_attn": 1, "layernorm": 2, "mla_up_proj": 1, "mlp": 1,
                           "moe_act": 1, "moe": 1, "shared_experts": 1}
"""Checkpointed regions a module adds to a layer: layernorm is two, the input and pre-MLP norms
(transformer_layer.py); mla_up_proj one, both up projections and RoPE
(multi_latent_attention.py); shared_experts one (moe_layer.py)."""


def checkpoint_calls(s: Layout, chunk: int) -> float:
    """Activation checkpoints per chunk of `chunk` layers and micro-batch.

    transformer_block.py _checkpointed_forward: `uniform` checkpoints each group of
    recompute_num_layers layers, `block` each of its first recompute_num_layers layers;
    selective recompute one region per module and layer (attention.py, transformer_layer.py:
    layernorm is two, the input and pre-MLP norms; experts.py, moe_layer.py).
    """
    if s.recompute == Recompute.FULL:
        n = max(1, min(s.recompute_num_layers, chunk))
        return float(n if s.recompute_method == RecomputeMethod.BLOCK else -(-chunk // n))
    if s.recompute == Recompute.SELECTIVE:
        return float(chunk * sum(_CHECKPOINTS_PER_MODULE[mod]
                                 for mod in s.recompute_modules.modules))
    return 0.0


def _stage_cost(m: ModelSpec, s: Layout, c: ClusterSpec, p: CostParams,
                state: StageState) -> StageState:
    if s.recompute == Recompute.FULL:
        # Full recompute reruns the whole forward of the layers it recomputes (all with
        # uniform, the first recompute_num_layers of each chunk with block).
        full = recomputed_share(state.chunk, method=s.recompute_method,
                                num_layers=s.recompute_num_layers) if state.chunk else 0.0
        return evolve(state, recomputed_forwards=full,
                      checkpoints=checkpoint_calls(s, state.chunk))
    if s.recompute != Recompute.SELECTIVE:
        return state
    # Selective recompute reruns each module's forward (Korthikanti et al. 2022, Section 5,
    # for core_attn): its FLOPs, and its element-wise kernels over the bytes it freed.
    modules = s.recompute_modules.modules
    layer, acts, tokens = state.layer, state.activations, state.tokens
    elementwise, hbm = state.elementwise_bytes, state.hbm_bytes_per_s
    rerun = 0.0
    if "core_attn" in modules:
        rerun += layer.core + layer.dropout  # its dropout's random numbers drawn again
    # The element-wise kernels' forward traffic (autotune.specs.elementwise): a third of their
    # forward + backward bytes.
    traffic = layer_elementwise_bytes(m, s.tp, str(s.impl))
    if "mlp" in modules or "moe" in modules:
        rerun += state.mlp_forward_s + tokens * traffic.mlp * elementwise / 3 / hbm
    if "moe" in modules:
        # moe_layer.py checkpoints routing and the token dispatch too: its all-to-all again.
        rerun += layer.ep / 2 + tokens * (acts.moe_replicated + acts.moe_split) \
            * elementwise / 3 / hbm
    else:
        if "moe_act" in modules:
            rerun += tokens * acts.moe_act_output * elementwise / 3 / hbm
        if "shared_experts" in modules:
            # moe_layer.py shared_experts_compute: the shared expert's forward again (its
            # share of the MoE layer's GEMMs, at their rate) and its activation and gate.
            rerun += state.mlp_forward_s * shared_expert_flops_per_token(m) \
                / mlp_forward_flops_per_token(m) \
                + tokens * (acts.shared_split + acts.shared_replicated) * elementwise / 3 / hbm
    if "mla_up_proj" in modules:
        # multi_latent_attention.py qkv_up_proj_and_rope_apply again: the up projections'
        # GEMMs, RoPE and the copies into the query, key and value (the bytes it freed).
        rerun += state.mla_up_forward_s + tokens * acts.mla_qkv * elementwise / 3 / hbm
    if "layernorm" in modules:
        rerun += tokens * 2 * NORM_BYTES * m.hidden_size / (s.tp if s.sequence_parallel else 1) \
            * elementwise / 3 / hbm
    # Recomputed core attention runs its context-parallel ring again.
    return evolve(state, attention_reruns=1.0 if "core_attn" in modules else 0.0,
                  rerun_s=rerun, checkpoints=checkpoint_calls(s, state.chunk))


# ---- derived counts ------------------------------------------------------------------------


def _block(s: Layout) -> bool:
    return s.recompute == Recompute.FULL and s.recompute_method == RecomputeMethod.BLOCK


def _derived_values(s: Layout, m: ModelSpec) -> tuple[int, ...]:
    if _block(s):
        # transformer_block.py: 1 to the layers of a chunk (rule recompute_layers).
        return tuple(range(1, max(chunk_layers(s, m)) + 1))
    # Uniform groups must divide every chunk's layers, and be 1 with MTP (rule
    # recompute_groups).
    return (1,) if m.mtp_num_layers else common_divisors(chunk_layers(s, m))


LEVER = Lever(
    name="recompute",
    fields=Fields,
    rules=(Rule("recompute_kind", 5, "recompute must be none, selective or full", _kind),
           Rule("recompute_layers", 5, "recompute_num_layers must fit a pipeline chunk",
                _layers),
           Rule("recompute_groups", 5,
                "uniform recompute_num_layers must divide a chunk's layers", _groups),
           Rule("recompute_modules", 5, "selective recompute's modules must act on the model",
                _modules)),
    flag_rows=(FlagRow(name="recompute", part=Part.LAYOUT,
                       flags=(Flag("--recompute-granularity"), Flag("--recompute-method"),
                              Flag("--recompute-num-layers"),
                              Flag("--recompute-activations", takes_value=False),
                              Flag("--recompute-modules", many=True)),
                       emit=_emit, read=_read,
                       reads=("recompute_method", "recompute_num_layers",
                              "recompute_modules")),),
    flag_place=Place.MEMORY,
    core_config=_core_config,
    memory=None,
    activations=_activations,
    cost=None,
    stage_cost=_stage_cost,
    seed=Seed.MEMORY,
    # Without the cost model to rank savings, Alpa's authors would recompute selectively
    # first, then fully.
    fallback=(("recompute", Recompute.SELECTIVE), ("recompute", Recompute.FULL)),
    # The fewest layers of a chunk recomputed that fit (block: memory falls and time rises
    # with each), or the group of least memory (uniform: every layer is recomputed whatever
    # the group).
    derivable=(Derivable(name="recompute_num_layers",
                         applies=lambda s, m: s.recompute == Recompute.FULL,
                         values=_derived_values,
                         monotone=lambda s: s.recompute_method != "uniform", off=1,
                         rules=("recompute_layers", "recompute_groups")),),
    # What _emit and _core_config leave out: TransformerConfig reads recompute_method and
    # recompute_num_layers only with full recompute (transformer_block.py,
    # _checkpointed_forward), recompute_modules only with selective (attention.py,
    # transformer_layer.py, moe_layer.py).
    unread=(Unread(name="recompute_method", when=lambda s: s.recompute != Recompute.FULL,
                   reason="megatron-core reads it only with full recompute",
                   flags=("--recompute-method",)),
            Unread(name="recompute_num_layers", when=lambda s: s.recompute != Recompute.FULL,
                   reason="megatron-core reads it only with full recompute",
                   flags=("--recompute-num-layers",)),
            Unread(name="recompute_modules", when=lambda s: s.recompute != Recompute.SELECTIVE,
                   reason="megatron-core reads it only with selective recompute",
                   flags=("--recompute-modules",))),
)
