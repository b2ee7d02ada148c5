"""The MoE layer's fused kernels: the token permutation (`--moe-permute-fusion`) and the router
(`--moe-router-fusion`), Transformer Engine's.

megatron-core 0.16.1 permutes each MoE layer's tokens to their experts and back with a sort
and a dozen index kernels (moe/moe_utils.py permute / unpermute, sort_chunks_by_idxs), and
routes them with softmax, top-k and the auxiliary loss's kernels (moe/router.py); with
`moe_permute_fusion` TE's fused permutation kernels replace the first (TransformerConfig checks
they exist: TE >= 2.1), with `moe_router_fusion` TE's fused top-k and aux-loss kernels the second
(TE >= 2.7). Both are off by default in Megatron-LM; NVIDIA's MoE performance recipes turn both
on (Megatron-Bridge 0.1.0rc3 changelog: "Fusion of operators in router function", "Global
permutation fusion with A2A dispatcher"). What they save is host time: the MoE layer's steps are
host-bound where the dispatcher synchronizes (autotune.predict.cost: moe_layer_launch_s); each
constant below is the host time per MoE layer and micro-batch its fusion was measured to save.
Numerically the same computation (no search space leaves it out for numerics); the default
space lists neither: a changed default space renames every default study (issue of `--resume`),
so a space lists them (`moe_permute_fusion: [false, true]`) and `--from-megatron` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.dimensions import Impl, dimension, flag_label
from autotune.levers.base import CostState, Lever, Rule, Seed, evolve
from autotune.levers.flags import Part, switch

if TYPE_CHECKING:
    from autotune.layouts.layout import Layout
    from autotune.predict.cost import CostParams
    from autotune.specs.hardware import ClusterSpec
    from autotune.specs.model import ModelSpec

__all__ = ["LEVER", "Constants", "Fields"]


@dataclass(frozen=True, kw_only=True)
class Fields:
    __slots__ = ()
    moe_permute_fusion: bool = dimension(False, level=6, label=flag_label("permfuse"), help=(
        "Transformer Engine's fused MoE token permutation (`--moe-permute-fusion`): fewer "
        "kernels the host issues per MoE layer; MoE models with impl te."))
    moe_router_fusion: bool = dimension(False, level=6, label=flag_label("routefuse"), help=(
        "Transformer Engine's fused MoE router, top-k and auxiliary loss "
        "(`--moe-router-fusion`); MoE models with impl te."))


@dataclass(frozen=True, kw_only=True)
class Constants:
    __slots__ = ()
    moe_permute_fusion_saved_s: float = 0.0
    """Host seconds per MoE layer and micro-batch (forward + backward) that the fused
    permutation saves of CostParams.moe_layer_launch_s."""
    moe_router_fusion_saved_s: float = 0.0
    """The same for the fused router."""


def _dense(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # Megatron builds no MoE layer for a dense model: the flags change nothing (one run).
    if (s.moe_permute_fusion or s.moe_router_fusion) and not m.is_moe:
        return "moe_permute_fusion / moe_router_fusion mean nothing without experts (one run)"
    return None


def _needs_te(s: Layout, m: ModelSpec, c: ClusterSpec) -> str | None:
    # The fused kernels are Transformer Engine's (megatron-core moe_utils imports them from
    # transformer_engine.pytorch); autotune measures them where TE builds the layer.
    if (s.moe_permute_fusion or s.moe_router_fusion) and s.impl != Impl.TE:
        return (f"moe_permute_fusion / moe_router_fusion are Transformer Engine's kernels: "
                f"impl te, got impl={s.impl}")
    return None


def _core_config(m: ModelSpec, s: Layout) -> dict[str, dict[str, Any]]:
    # Only where set: the run keys of every layout before the lever stay as they were.
    config = {name: True for name in ("moe_permute_fusion", "moe_router_fusion")
              if getattr(s, name)}
    return {"transformer": config} if config else {}


def _cost(m: ModelSpec, s: Layout, c: ClusterSpec, p: CostParams,
          state: CostState) -> CostState:
    saved = (p.moe_permute_fusion_saved_s if s.moe_permute_fusion else 0.0) \
        + (p.moe_router_fusion_saved_s if s.moe_router_fusion else 0.0)
    if not saved or not m.is_moe:
        return state
    return evolve(state, moe_layer_host_saved_s=state.moe_layer_host_saved_s + saved)


LEVER = Lever(
    name="moe_fusion",
    fields=Fields,
    rules=(Rule("moe_fusion_dense", 6, "the MoE fusions need experts", _dense),
           Rule("moe_fusion_te", 6, "the MoE fusions are Transformer Engine's (impl te)",
                _needs_te)),
    flag_rows=(switch("--moe-permute-fusion", "moe_permute_fusion", Part.LAYOUT),
               switch("--moe-router-fusion", "moe_router_fusion", Part.LAYOUT)),
    core_config=_core_config,
    memory=None,
    no_memory=("the fused kernels keep what the unfused ones keep for the backward, within "
               "0.1 GiB on the measured MoE trials (2026-11-29-h200-moe-fusion-s22.md)"),
    cost=_cost,
    seed=Seed.PRACTICE,
    # Megatron-LM's default is off.
    practice=lambda s, impl: {"moe_permute_fusion": False, "moe_router_fusion": False},
    constants=Constants,
)
