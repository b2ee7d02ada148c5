"""The memory gate: which layouts are never launched, and what real OOMs teach.

A layout is launched only when the memory model predicts it fits. A real OOM teaches two
things (both remembered for the rest of the study): every larger micro-batch of the same layout
runs out of memory too, and so does every layout the model predicts to need at least as much
memory as the one that failed — the model underestimated, so its prediction for the failed
layout becomes the effective capacity.

Measured fits bound what an OOM teaches: an OOM predicted at or below the largest prediction
that measured OK contradicts that fit (the model's prediction is the only scale the gate
compares layouts on), so it is noise for the gate — a warm worker's leftovers still holding
memory, seen on an H100: trial 0 (76.09 GiB predicted) fit, trial 18 (76.01 GiB) ran out of
memory in the warm pool and fit in a fresh process. The trial keeps its OOM status, but it
teaches neither rule (a fit measured later sets an earlier OOM aside too): the learned capacity
stays above every prediction that fit, and no OOM rules out a layout predicted to need no more
than one that fit.

Measured fits also teach the model's bias on this machine: NVML's device memory in use against
the prediction. The worst under-prediction widens the error band (which layouts run as a risk,
after the safe ones); once MIN_BIAS_FITS fits agree on a bias, a risky layout whose prediction,
corrected by the median bias, is over the device memory is not launched. On 2 x H200
(results/benchmarks/2026-11-27-h200x2-pool-and-llama3-8b.md) seven fits of llama3-8b all
measured 0.8-2.6% above their predictions (median 1.7%), then a layout predicted at 98.9% of
the device ran out of memory, 42 s lost.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from autotune.layouts.layout import Layout, check, with_fields
from autotune.predict.memory import MemoryEstimate, MemoryParams
from autotune.predict.memory_memo import MemoryMemo
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.trials.trial import TrialStatus

__all__ = ["DEFAULT_ERROR_BAND", "EXPANDABLE_ERROR_BAND", "MEMORY_ERROR_BAND",
           "MIN_BIAS_FITS", "GateDecision", "MemoryGate", "mbs_family", "memory_error_band"]

MEMORY_ERROR_BAND: dict[str, float] = {
    # The memory model's worst under-prediction of NVML's device memory in use, as a fraction,
    # over the OK trials of tests/data/measured_trials.json (megatron-core 0.16.1, with and
    # without TE 2.11), with the caching allocator's default segments. A band, not a fit;
    # tests/test_memory_options.py recomputes it from the data. Both GPUs' worst is the
    # allocator's reserve over its allocated peak, which no term of the layout predicts: it
    # repeats for a layout but follows the order of the step's allocations (one 6.14 GiB
    # logits block left 0.46 to 7.54 GiB across recompute counts)
    # (results/benchmarks/2026-11-27-cpu-memory-reserve.md). Expandable segments take that
    # reserve away (EXPANDABLE_ERROR_BAND).
    # - h100-80gb 8.4%: s13-dropout/1. 9.3% before the precision-aware optimizer's step copies
    #   of its moments joined the model (autotune.levers.precision_optimizer, 2026-11-29: the
    #   step's peak was what Llama-3.2-3B at mbs 2 with FP8 and that optimizer allocated), 11.1%
    #   before the fused attention's bf16 output joined the activations
    #   (AttentionBytes.saves_output, 2026-11-28), 11.2% before the query, key and value a RoPE
    #   layer keeps joined them (autotune.specs.activations.qkv_extra, 2026-11-27), 5.7% before
    #   the FP8 trials joined, 5.0% before 2026-11-25.
    # - h200 8.5%: s10-long/l1b-16384/1, llama-1b at seq 16384, mbs 1 (62.7 GiB used, 57.4
    #   predicted, 9.9 GiB of it beyond the allocated peak). 9.7% before the optimizer's step
    #   copies (s18-l3b-grid-levers/1), 11.4% before the attention output above, 11.2% before
    #   qkv_extra, 6.7% before the 2026-11-27 long-sequence trials.
    "h100-80gb": 0.084,
    "h200": 0.085,
}
DEFAULT_ERROR_BAND = max(MEMORY_ERROR_BAND.values())
"""For a GPU without measured trials: the widest band measured anywhere."""
EXPANDABLE_ERROR_BAND = 0.045
"""The band with expandable segments (autotune.levers.allocator), on the GPUs of
MEMORY_ERROR_BAND: what is left of the device memory's error without the default segments'
reserve. Two measured parts, added (tests/test_allocator.py recomputes both):
- the allocated peak (torch.cuda.max_memory_allocated, which the allocator's segments do not
  change) is under-predicted by at most 2.8% over the 310 OK trials of
  tests/data/measured_trials.json that recorded it (H100 and H200, 1-4 GPUs; s3-x4-vpp/2);
- the expandable reserve beyond the allocated peak is at most 2.7% of it where the model
  prices 1% (MemoryParams.expandable_fragmentation): 1.7% more, over the 16 trials with
  expandable segments of tests/data/measured_allocator_trials.json (one H200, near the capacity
  included; results/benchmarks/2026-11-29-h200-xseg-band-s25.md).
Those 16 trials' own worst under-prediction of the device memory in use is 2.1%. A band, not a
fit: a study's own measured peaks still widen it (MemoryGate.error_band)."""


def memory_error_band(gpu_name: str, expandable: bool = False) -> float:
    """The memory model's measured error band on `gpu_name`: MEMORY_ERROR_BAND, or with
    expandable segments EXPANDABLE_ERROR_BAND where the GPU has measured trials (elsewhere the
    default band: the allocated peak's error was measured on those GPUs only)."""
    if gpu_name not in MEMORY_ERROR_BAND:
        return DEFAULT_ERROR_BAND
    return EXPANDABLE_ERROR_BAND if expandable else MEMORY_ERROR_BAND[gpu_name]


MIN_BIAS_FITS = 3
"""Measured fits before their median bias corrects risky predictions: one trial's peak can be a
warm worker's leftovers (see above); three that agree are the machine's."""


def mbs_family(layout: Layout) -> Layout:
    """The layout's micro-batch family: the layout at mbs 1, which the layouts that differ from
    it only in micro-batch share."""
    return with_fields(layout, mbs=1)  # the layout itself when its mbs is 1 already


@dataclass(frozen=True, slots=True, kw_only=True)
class GateDecision:
    """`status` None means launch; otherwise the status to record instead, with the reason."""

    status: TrialStatus | None
    reason: str
    memory: MemoryEstimate | None
    constraint: float
    """Optuna constraint value: predicted peak over the usable capacity, in GiB (> 0 means
    infeasible)."""
    risky: bool = False
    """Predicted to fit, but within the model's measured error band of the capacity: launched,
    after the layouts predicted to fit with a margin (heuristics.alpa_seeds orders seeds so)."""

    @property
    def launch(self) -> bool:
        return self.status is None


@dataclass(slots=True)
class MemoryGate:
    """Decides per layout, and learns from real OOMs."""

    model: ModelSpec
    cluster: ClusterSpec
    ooms: list[tuple[Layout, float | None]] = field(default_factory=list)
    """Every real OOM, with its predicted peak (None: unknown), contradicted ones included: a
    fit measured later can set one aside, so what they teach is recomputed from all of them."""
    oom_mbs: dict[Layout, int] = field(default_factory=dict)
    """Per micro-batch family (mbs_family), the smallest micro-batch that ran out of memory (OOMs
    that a fit contradicts left out)."""
    learned_capacity_bytes: float | None = None
    """The smallest predicted peak among real OOMs above the largest fit (largest_fit_bytes)."""
    largest_fit_bytes: float | None = None
    """The largest predicted peak among the trials that measured OK (record_fit)."""
    largest_fit_trial: str = ""
    """Which trial that was, for the reasons (e.g. "trial 0")."""
    params: MemoryParams | None = None
    """Fitted memory constants (autotune calibrate); None for the defaults."""
    biases: list[float] = field(default_factory=list)
    """Every measured fit's peak over its prediction, minus one (record_peak)."""
    memo: MemoryMemo | None = field(default=None, repr=False, compare=False)
    """The memory estimates the gate reads (autotune.predict.memory_memo), of its
    model, cluster and constants: the enumeration's (SpaceSummary.memory), whose layouts a
    plan's ranking decides again; a memo of its own where None."""

    def __post_init__(self) -> None:
        if self.memo is None:
            self.memo = MemoryMemo(self.model, self.cluster, self.params)
        elif not self.memo.serves(self.model, self.cluster, self.params):
            raise ValueError(f"the gate of {self.model.name} on {self.cluster.num_gpus} GPUs "
                             f"was given the memory estimates of {self.memo.model.name} on "
                             f"{self.memo.cluster.num_gpus} GPUs, or of other constants")

    def estimate(self, layout: Layout) -> MemoryEstimate:
        """estimate_memory of `layout` with the gate's model, cluster and constants: the memo's
        where it holds one (the enumeration's), else made and kept among its latest only."""
        assert self.memo is not None  # __post_init__
        return self.memo.estimate(layout, keep=False)

    @property
    def observed_under(self) -> float:
        """The worst under-prediction of a measured peak this study has seen (0: none)."""
        return max([0.0, *self.biases])

    def error_band(self, layout: Layout) -> float:
        """The fraction of capacity within which a prediction of `layout` is a risk: the GPU's
        measured band for its allocator (memory_error_band), widened by what this study's own
        trials showed."""
        base = memory_error_band(self.cluster.gpu.name, layout.expandable_segments)
        return max(base, self.observed_under)

    def record_peak(self, predicted_bytes: float, measured_bytes: float) -> bool:
        """Learn from a measured trial: a peak above its prediction widens the band, and every
        peak joins the bias (typical_bias). Return whether decisions may have changed (the band
        or the typical bias moved)."""
        if predicted_bytes <= 0 or measured_bytes <= 0:
            return False
        # The band moves for some layout once the worst miss passes the narrower base band.
        gpu = self.cluster.gpu.name
        least = min(memory_error_band(gpu, False), memory_error_band(gpu, True))
        before = (max(least, self.observed_under), self.typical_bias())
        self.biases.append(measured_bytes / predicted_bytes - 1)
        return (max(least, self.observed_under), self.typical_bias()) != before

    def typical_bias(self) -> float | None:
        """The median measured bias once MIN_BIAS_FITS fits were measured, else None."""
        if len(self.biases) < MIN_BIAS_FITS:
            return None
        return statistics.median(self.biases)

    def capacity_bytes(self) -> float:
        capacity = float(self.cluster.gpu.memory_bytes)
        if self.learned_capacity_bytes is not None:
            capacity = min(capacity, self.learned_capacity_bytes)
        return capacity

    def decide(self, layout: Layout, evidence_bytes: float | None = None, *,
               checked: bool = False) -> GateDecision:
        """Launch, or the status to record instead. `evidence_bytes`: the layout's peak
        extrapolated from a measured trial of the same layout with another count of a derived
        lever (autotune.search.ladder); where given it is judged against the device memory
        instead of the model's prediction, which it corrects. `checked`: the layout is known to
        pass every rule (the space's enumeration checked it), so they are not run again: a plan
        of gpt-1t on 3072 GPUs decides 95k layouts, and the rules were a third of the gate's
        time there (issue 24)."""
        violations = () if checked else check(layout, self.model, self.cluster)
        if violations:
            return GateDecision(status=TrialStatus.INVALID, reason=violations[0].message,
                                memory=None, constraint=1.0)
        memory = self.estimate(layout)
        if evidence_bytes is not None:
            return self._decide_measured(memory, evidence_bytes)
        capacity = self.capacity_bytes()
        constraint = (memory.peak_bytes - capacity) / 2**30
        # No OOM learned (every layout of a plan): no family to build (a Layout copy each).
        smallest_oom = self.oom_mbs.get(mbs_family(layout)) if self.oom_mbs else None
        # Never when a layout predicted to need as much fit (an OOM without a prediction).
        if smallest_oom is not None and layout.mbs >= smallest_oom \
                and not self._fit_at_least(memory.peak_bytes):
            return GateDecision(
                status=TrialStatus.PREDICTED_OOM, memory=memory, constraint=max(constraint, 0.1),
                reason=f"mbs={layout.mbs} >= mbs={smallest_oom}, which ran out of memory "
                       "with this layout")
        learned = capacity < self.cluster.gpu.memory_bytes
        # A layout predicted to need at least as much as one that really ran out of memory
        # runs out too (same prediction, e.g. options the model does not price, included).
        if memory.peak_bytes > capacity or (learned and memory.peak_bytes >= capacity):
            why = (f"predicted {memory.peak_bytes / 2**30:.1f} GiB on the peak stage, over the "
                   f"{'learned ' if learned else ''}capacity of {capacity / 2**30:.1f} GiB")
            return GateDecision(status=TrialStatus.PREDICTED_OOM, reason=why, memory=memory,
                                constraint=max(constraint, 0.1))
        band = self.error_band(layout)
        gib = memory.peak_bytes / 2**30
        if not memory.fits:
            # No free block for the largest allocation (memory.BLOCK_MARGIN, which no longer
            # applies under full recompute: issue 24's Llama-3.2-3B at sequence 8192 ran with
            # its 3.9 GiB logits block at 79.0 GiB of an H100 measured). Every measured OOM
            # agrees with the rule as it stands, but why full recompute differs is not known:
            # a risk, run after the safe layouts (its OOM, if it comes, teaches the gate).
            return GateDecision(
                status=None, memory=memory, constraint=constraint, risky=True,
                reason=f"predicted {gib:.1f} GiB; {memory.explain()}: run as a risk")
        if memory.peak_bytes > capacity * (1 - band):
            bias = self.typical_bias()
            device = float(self.cluster.gpu.memory_bytes)
            if bias is not None and memory.peak_bytes * (1 + bias) > device:
                expected = memory.peak_bytes * (1 + bias)
                return GateDecision(
                    status=TrialStatus.PREDICTED_OOM, memory=memory,
                    constraint=max((expected - device) / 2**30, 0.1),
                    reason=f"predicted {gib:.1f} GiB; this study's {len(self.biases)} measured "
                           f"fits used a median {bias:+.1%} of their predictions: "
                           f"{expected / 2**30:.1f} GiB expected, over the "
                           f"{device / 2**30:.1f} GiB of the {self.cluster.gpu.name}")
            return GateDecision(
                status=None, memory=memory, constraint=constraint, risky=True,
                reason=f"predicted {gib:.1f} GiB, within the memory model's error band "
                       f"({band:.1%} on the {self.cluster.gpu.name}) of the "
                       f"{capacity / 2**30:.1f} GiB capacity: run as a risk")
        return GateDecision(status=None, memory=memory, constraint=constraint,
                            reason=f"predicted to fit: {gib:.1f} GiB, "
                                   f"{(capacity - memory.peak_bytes) / 2**30:.1f} GiB under "
                                   f"the capacity, outside the {band:.1%} error band")

    def _decide_measured(self, memory: MemoryEstimate, evidence_bytes: float) -> GateDecision:
        device = float(self.cluster.gpu.memory_bytes)
        gib = evidence_bytes / 2**30
        constraint = (evidence_bytes - device) / 2**30
        if evidence_bytes > device:
            return GateDecision(
                status=TrialStatus.PREDICTED_OOM, memory=memory, constraint=max(constraint, 0.1),
                reason=f"{gib:.1f} GiB extrapolated from a measured trial of this layout, over "
                       f"the {device / 2**30:.1f} GiB of the {self.cluster.gpu.name}")
        return GateDecision(
            status=None, memory=memory, constraint=constraint, risky=True,
            reason=f"{gib:.1f} GiB extrapolated from a measured trial of this layout "
                   f"(predicted {memory.peak_bytes / 2**30:.1f} GiB): run as a risk")

    def _fit_at_least(self, predicted_bytes: float) -> bool:
        return self.largest_fit_bytes is not None and predicted_bytes <= self.largest_fit_bytes

    def _relearn(self) -> None:
        """oom_mbs and learned_capacity_bytes from the OOMs that no fit contradicts."""
        self.oom_mbs, peaks = {}, []
        for failed, peak in self.ooms:
            if peak is not None and self._fit_at_least(peak):
                continue
            family = mbs_family(failed)
            self.oom_mbs[family] = min(self.oom_mbs.get(family, failed.mbs), failed.mbs)
            if peak is not None:
                peaks.append(peak)
        self.learned_capacity_bytes = min(peaks) if peaks else None

    def contradicted(self, predicted_peak_bytes: float | None) -> str:
        """Why an OOM predicted at `predicted_peak_bytes` does not tighten the gate: it is at or
        below a prediction that measured OK. Empty when it does tighten it."""
        if predicted_peak_bytes is None or not self._fit_at_least(predicted_peak_bytes):
            return ""
        assert self.largest_fit_bytes is not None
        return (f"OOM at {predicted_peak_bytes / 2**30:.2f} GiB predicted is at or below "
                f"{self.largest_fit_trial}'s {self.largest_fit_bytes / 2**30:.2f} GiB that fit: "
                "not used to tighten the gate")

    def record_oom(self, layout: Layout, predicted_peak_bytes: float | None) -> str:
        """Remember a real OOM of `layout`; return contradicted()'s note (empty when the OOM
        teaches the gate)."""
        self.ooms.append((layout, predicted_peak_bytes))
        self._relearn()
        return self.contradicted(predicted_peak_bytes)

    def record_fit(self, predicted_peak_bytes: float | None, trial: str) -> bool:
        """Remember a trial that measured OK (`trial` names it in reasons): a fit above the
        largest so far sets aside the OOMs predicted at or below it. Return whether decisions
        may have changed (a new largest fit while some OOM is known)."""
        if predicted_peak_bytes is None or self._fit_at_least(predicted_peak_bytes):
            return False
        self.largest_fit_bytes, self.largest_fit_trial = predicted_peak_bytes, trial
        self._relearn()
        return bool(self.ooms)
