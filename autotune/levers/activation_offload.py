"""Layer-level CPU offloading of activations (Transformer Engine's, through megatron-core).

megatron-core 0.16.1 (model_parallel_config.py `cpu_offloading`, `cpu_offloading_num_layers`;
transformer_block.py get_cpu_offload_context) wraps the layers in Transformer Engine's offload
context, which copies the activations of the first `cpu_offloading_num_layers` layers to pinned
host memory in forward and back in backward; Megatron-LM spells it
`--cpu-offloading-num-layers N` (arguments.py: validate_args turns cpu_offloading on for N > 0).
Activations only: the weights stay (cpu_offloading_weights off).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.dimensions import Impl, Recompute, dimension, unless_default
from autotune.levers.base import ActivationState, Derivable, Lever, Rule, Seed, StageState, evolve
from autotune.levers.flags import Part, Place, value

if TYPE_CHECKING:
    from autotune.layouts.layout import Layout
    from autotune.predict.cost import CostParams
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.model import ModelSpec

__all__ = ["LEVER", "Fields", "offloaded_layers"]


@dataclass(frozen=True, kw_only=True)
class Fields:
    __slots__ = ()
    offload_layers: int = dimension(0, level=5, label=unless_default("offload", 0), minimum=0,
                                    help=(
        "Layers whose activations are offloaded to CPU memory (`--cpu-offloading-num-layers`, "
        "Transformer Engine's offload); 0: none."))


def offloaded_layers(layers: int, offload_layers: int) -> tuple[int, int]:
    """(offloaded, kept on the GPU) layers of a chunk with TE's layer-level CPU offload.

    Transformer Engine's double-buffered offload (transformer_engine/pytorch/cpu_offload.py,
    AsyncDoubleBufferGroupOffloadHandler, which megatron-core's get_cpu_offload_context wraps)
    copies a layer's saved tensors to pinned host memory while the next layer runs and frees
    them once the copy is done, and in backward reloads a layer while the one after it runs:
    one offloaded layer's tensors are on the GPU at a time besides the layers it keeps.
    """
    offloaded = min(offload_layers, layers)
    return offloaded, layers - offloaded + (1 if offloaded else 0)


def _rule(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    if not s.offload_layers:
        return None
    if s.impl != Impl.TE:
        # transformer_block.py: without Transformer Engine `get_cpu_offload_context` is None
        # and "CPU Offloading is enabled when TE is not present" is asserted.
        return f"offload_layers={s.offload_layers} needs impl=te (TE's CPU offload), " \
               f"got impl={s.impl}"
    if s.pp > 1:
        # TransformerConfig.__post_init__: "Currently there is no support for Pipeline
        # parallelism with CPU offloading".
        return f"offload_layers={s.offload_layers} needs pp=1, got pp={s.pp}"
    if s.recompute != Recompute.NONE:
        # TransformerConfig.__post_init__: "CPU offloading does not work when activation
        # recomputation is enabled".
        return f"offload_layers={s.offload_layers} does not work with recompute={s.recompute}"
    if s.offload_layers >= m.num_layers:
        # TransformerConfig.__post_init__: "CPU offloading can be done only for layers less
        # than num_layers".
        return (f"offload_layers={s.offload_layers} must be less than "
                f"num_layers={m.num_layers}")
    return None


def _core_config(m: ModelSpec, s: Layout) -> dict[str, dict[str, Any]]:
    # Transformer Engine's layer-level offload of activations (model_parallel_config.py
    # cpu_offloading*; transformer_block.py get_cpu_offload_context), as Megatron-LM sets it
    # from --cpu-offloading-num-layers: activations only, not weights.
    return {"transformer": {"cpu_offloading": s.offload_layers > 0,
                            "cpu_offloading_num_layers": s.offload_layers}}


def _activations(m: ModelSpec, s: Layout, state: ActivationState) -> ActivationState:
    # TransformerConfig refuses offloading with recompute (rule offload); a layout that asks
    # for both is priced by its recompute alone (autotune.levers.recompute runs first).
    if s.recompute != Recompute.NONE:
        return state
    offloaded, kept = offloaded_layers(state.layers, s.offload_layers)
    if not offloaded:
        return state
    return evolve(state, stored_bytes=kept * state.layer_bytes)


def _stage_cost(m: ModelSpec, s: Layout, c: ClusterSpec, p: CostParams,
                state: StageState) -> StageState:
    offloaded, _ = offloaded_layers(state.chunk, s.offload_layers)
    if not offloaded:
        return state
    # Each offloaded layer's saved tensors go to the host during the next layer's forward
    # and come back during the backward of the layer after it (offloaded_layers): what
    # the link does not finish within that window is exposed.
    pcie = c.gpu.pcie_bytes_per_s * p.pcie_efficiency
    copy = state.layer_bytes / pcie
    layer = state.layer
    fwd = layer.gemm + layer.core + layer.elem + layer.dropout
    return evolve(state, offload_s=s.vpp * offloaded * (max(0.0, copy - fwd)
                                                        + max(0.0, copy - 2 * fwd)))


def _derive_applies(s: Layout, m: ModelSpec) -> bool:
    # The rule `offload`: TE's offload, pp 1, no recompute.
    return s.impl == Impl.TE and s.pp == 1 and s.recompute == Recompute.NONE


LEVER = Lever(
    name="activation_offload",
    fields=Fields,
    rules=(Rule("offload", 5, "CPU offloading needs TE, pp=1, no recompute, < num_layers "
                "layers", _rule),),
    # TransformerConfig.cpu_offloading_num_layers as a flag; validate_args turns cpu_offloading
    # on when it is > 0 (arguments.py, core_v0.16.1). Layout rules keep it apart from recompute
    # and pipelines, which TransformerConfig refuses with it.
    flag_rows=(value("--cpu-offloading-num-layers", "offload_layers", Part.LAYOUT, default=0,
                     omit_at=0),),
    flag_place=Place.MEMORY,
    core_config=_core_config,
    memory=None,
    activations=_activations,
    cost=None,
    stage_cost=_stage_cost,
    seed=Seed.MEMORY,
    # The fewest offloaded layers that fit: each costs host-link time. TransformerConfig.
    # __post_init__: fewer than num_layers; 0 first, so that a layout that fits without
    # offloading is not made to offload.
    derivable=(Derivable(name="offload_layers", applies=_derive_applies,
                         values=lambda s, m: tuple(range(0, m.num_layers)),
                         monotone=lambda s: True, off=0, rules=("offload",)),),
)
