"""Multi-Token Prediction on a model with two kinds of layer: its MTP layers' share of the last
pipeline stage, added to that stage's terms once the kinds are mixed.

A mixed model's stages are priced from a model of each kind of layer alone, weighted by the
stage's shares of each (autotune.levers.pipeline_split.mix_kinds), where every term is the
same fixed part in both plus the layers' sum. The MTP layers are one kind only, the model's
last layer's (ModelSpec.mtp_layer_model): a share of each would misprice them. So the kinds
are priced without MTP (ModelSpec.dense_layer_model and moe_layer_model have none) and the
last stage gains what MTP adds to a model of its layer's kind alone: that model's last stage
with its MTP layers less the same without (`mtp_model`, `add_difference`).
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, TypeVar

from autotune.levers.pipeline_split import term_names
from autotune.specs.model import ModelSpec

__all__ = ["add_difference", "mtp_model"]

_T = TypeVar("_T")


@functools.lru_cache(maxsize=64)
def mtp_model(model: ModelSpec) -> ModelSpec:
    """A model of `model`'s MTP layer's kind alone (every layer that kind) with its MTP
    layers; its estimate less that of ModelSpec.mtp_layer_model is what they add. Remembered:
    the memory and cost models ask it of every estimate, and building a ModelSpec checks
    every field (157k times, 10% of DeepSeek-V3's enumeration on 1,024 GPUs)."""
    return replace(model.mtp_layer_model, mtp_num_layers=model.mtp_num_layers,
                   mtp_loss_scaling_factor=model.mtp_loss_scaling_factor)


def add_difference(base: _T, plus: _T, minus: _T, **same: Any) -> _T:
    """`base`'s terms (a dataclass of floats) plus `plus`'s less `minus`'s; `same` the fields
    taken as they are."""
    kind: type = type(base)
    return kind(**same, **{  # type: ignore[no-any-return]
        name: getattr(base, name) + getattr(plus, name) - getattr(minus, name)
        for name in term_names(kind) if name not in same})
