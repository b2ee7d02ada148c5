"""How far to trust a prediction: the models' held-out error bands and the measured range.

Every simulated figure carries a band: step time ± STEP_TIME_BAND (the worst held-out median
error of a family with three or more trials in the leave-one-family-out cross-validation,
tools/fit_constants.py, results/benchmarks/2026-11-25-cpu-constants-fit.md) and memory ± the
gate's measured band for the GPU and the allocator (gate.memory_error_band). A prediction for a
model, GPU count, node count, GPU type or MoE outside what tests/data/measured_trials.json ever
ran says so (MEASURED_RANGE; a test recomputes it from the data).
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.predict.gate import memory_error_band
from autotune.predict.memory import MemoryEstimate
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.params import count_parameters

__all__ = ["MEASURED_RANGE", "STEP_TIME_BAND", "MeasuredRange", "in_memory_band", "memory_band",
           "memory_band_depth", "memory_risk", "outside_range", "predicted_rank", "trust_line",
           "within_memory_band"]

STEP_TIME_BAND = 0.084
"""Held-out median step-time error of the worst family with at least three measured trials:
gpt-3.6b on H100, 8.4% (leave-one-family-out over the 235 OK trials, 13 families, session 16's
21 trials among them: results/benchmarks/2026-11-28-cpu-measured-s16-trials-s17.md; 8.3% over
the 214 before, with attention
dropout priced apart, the element-wise traffic counted per architecture feature and the shipped
defaults refitted to all trials: results/benchmarks/2026-11-28-cpu-constants-refit-s15.md, the
bounds of tests/test_calibration.py). wide-8k on H100, two trials, 7.4%. Before that it was
llama-1b on H200, 15.1% (long sequences without attention dropout, priced at the with-dropout
attention rate; 2026-11-27-cpu-constants-cv-s10.md and before)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredRange:
    """What the measured trials span (tests/data/measured_trials.json)."""

    max_params: int
    max_gpus: int
    max_nodes: int
    gpus: tuple[str, ...]
    moe: bool


MEASURED_RANGE = MeasuredRange(max_params=13_015_864_320, max_gpus=4, max_nodes=1,
                               gpus=("h100-80gb", "h200"), moe=False)
"""llama2-13b the largest model (2 x H200, 2026-11-27), 4 GPUs of one node, H100 and H200, no MoE
(test_trust.py)."""


def memory_band(cluster: ClusterSpec, expandable: bool = False) -> float:
    """The memory model's band on the cluster's GPU with the layout's allocator
    (`expandable`: expandable segments; autotune.predict.gate.memory_error_band)."""
    return memory_error_band(cluster.gpu.name, expandable)


def outside_range(model: ModelSpec, cluster: ClusterSpec,
                  measured: MeasuredRange = MEASURED_RANGE) -> list[str]:
    """Why a prediction lies outside what was ever measured (empty: inside)."""
    notes = []
    params = count_parameters(model)
    if params > measured.max_params:
        notes.append(f"{params / 1e9:.1f}B parameters (measured up to "
                     f"{measured.max_params / 1e9:.1f}B)")
    if cluster.num_gpus > measured.max_gpus:
        notes.append(f"{cluster.num_gpus} GPUs (measured up to {measured.max_gpus})")
    if cluster.num_nodes > measured.max_nodes:
        notes.append(f"{cluster.num_nodes} nodes (measured on {measured.max_nodes})")
    if cluster.gpu.name not in measured.gpus:
        notes.append(f"{cluster.gpu.name} never measured"
                     + ("" if cluster.gpu.measured else " (datasheet only)"))
    if model.is_moe and not measured.moe:
        # 21 MoE trials on one H200 kind (tests/data/measured_moe_trials.json) set the MoE
        # host terms, 2 more held out; they are outside the bands' data: step time within 47%
        # there.
        notes.append("MoE measured on one host kind only (step time within 47% there)")
    if model.multi_latent_attention:
        # Counted against megatron-core on CPU (parameters, saved activations: results/
        # benchmarks/2026-11-29-cpu-mla-s23.md), then seven trials of DeepSeek-V2-Lite's layers
        # on one H200 (tests/data/measured_mla_trials.json: step time -4.5..+10.6% on its
        # dense layer, +34% on its MoE layer; peak allocated within 1%).
        notes.append("Multi-Latent Attention measured on one model's layers only (step time "
                     "within 11% there, 34% with MoE)")
    if model.has_dense_layers:
        # Priced per kind of layer from the two kinds' own terms (autotune.predict.memory
        # _mixed_estimate and estimate_cost, through pipeline_split.mix_kinds); counted against
        # megatron-core on CPU, then DeepSeek-V2-Lite's first dense and five MoE layers on one
        # H200 (results/benchmarks/2026-11-29-h200-allocator-mixed-s24.md: device memory
        # +0.4..+2.0%, step time 22-34% slow, the MoE layer's host terms), at pp 1 only.
        notes.append("dense layers among MoE layers measured on one model at pp 1 only (step "
                     "time up to 34% slow there)")
    if model.mtp_num_layers:
        # Counted against megatron-core's MTP block on CPU (a training step there), priced on
        # the last stage (autotune.predict.memory, cost); one dense model at pp 1 on one H200
        # (results/benchmarks/2026-11-29-h200-mtp-s24.md: step -1.9%, memory -0.6%).
        notes.append("Multi-Token Prediction measured on one dense model at pp 1 only")
    return notes


def trust_line(model: ModelSpec, cluster: ClusterSpec, expandable: bool = False) -> str:
    """One line for tables, reports and export headers: the bands, and the range note."""
    line = (f"prediction bands (held-out error): step time ±{STEP_TIME_BAND:.1%}, "
            f"memory ±{memory_band(cluster, expandable):.1%}")
    notes = outside_range(model, cluster)
    if notes:
        line += "; OUTSIDE the measured range: " + ", ".join(notes)
    return line


def within_memory_band(peak_bytes: float, cluster: ClusterSpec,
                       expandable: bool = False) -> bool:
    """A predicted peak under the GPU's memory but within the memory band below it."""
    capacity = cluster.gpu.memory_bytes
    return capacity * (1 - memory_band(cluster, expandable)) < peak_bytes <= capacity


def memory_band_depth(peak_bytes: float, cluster: ClusterSpec,
                      expandable: bool = False) -> float:
    """How far into the memory band below the capacity a predicted peak lies: 0 outside it
    (within_memory_band), rising to 1 at the capacity."""
    if not within_memory_band(peak_bytes, cluster, expandable):
        return 0.0
    capacity = cluster.gpu.memory_bytes
    low = capacity * (1 - memory_band(cluster, expandable))
    return (peak_bytes - low) / (capacity - low)


def predicted_rank(tokens_per_s: float, peak_bytes: float | None, cluster: ClusterSpec,
                   expandable: bool = False) -> float:
    """The figure a predicted (simulated) layout is ranked by: its predicted tokens/s, less up to
    STEP_TIME_BAND the deeper its predicted peak lies in the memory band (memory_band_depth).
    Two predictions within STEP_TIME_BAND of each other are the same to the cost model, and
    the memory model's own band says the one near the capacity may not fit: within the step
    time band, the margin wins (a layout at 99.99% of the memory ranks after one 0.003% slower
    with 4% to spare), while one faster by more than the band keeps its place. Proportional
    to the depth rather than all or nothing, so a peak just inside the band edge is not ranked
    a whole band below one just outside it. Measured figures are ranked as measured: a layout
    that ran has shown whether it fits."""
    if not peak_bytes:
        return tokens_per_s
    return tokens_per_s / (1 + STEP_TIME_BAND * memory_band_depth(peak_bytes, cluster,
                                                                  expandable))


def in_memory_band(memory: MemoryEstimate, cluster: ClusterSpec,
                   expandable: bool = False) -> bool:
    """Predicted to fit, but within the memory band of the capacity: a risky pick."""
    return memory.fits and within_memory_band(memory.peak_bytes, cluster, expandable)


def memory_risk(predicted_peak_bytes: float | None, cluster: ClusterSpec,
                expandable: bool = False) -> str:
    """The warning a predicted pick carries in the report and the export header when it is
    predicted within the memory band of the GPU (in_memory_band's test on a record's figure);
    empty otherwise. A measured pick ran and needs none."""
    if not predicted_peak_bytes or not within_memory_band(predicted_peak_bytes, cluster,
                                                          expandable):
        return ""
    return (f"predicted at {predicted_peak_bytes / 2**30:.1f} GiB of the "
            f"{cluster.gpu.memory_bytes / 2**30:.1f} GiB of the {cluster.gpu.name}, inside the "
            f"memory model's ±{memory_band(cluster, expandable):.1%} band: it may not fit; "
            "measure it before a long run")
