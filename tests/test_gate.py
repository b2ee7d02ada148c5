"""MemoryGate: invalid and predicted-OOM layouts are never launched; real OOMs teach it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import cluster

from autotune.layouts.layout import Layout
from autotune.predict.gate import MEMORY_ERROR_BAND, MemoryGate, mbs_family
from autotune.predict.memory import estimate_memory
from autotune.specs.hardware import ClusterSpec
from autotune.specs.presets import load_model
from autotune.trials.trial import TrialStatus
from tests.conftest import another_value

H100_BAND = MEMORY_ERROR_BAND["h100-80gb"]

GPT2_XL = load_model("gpt2-xl")
GPT2_MEDIUM = load_model("gpt2-medium")
GIB = 2**30


def layout(**fields: object) -> Layout:
    values: dict[str, object] = {"gbs": 64, "dp": 8, "distributed_optimizer": True,
                                 "overlap_grad_reduce": True, "impl": "sdpa"}
    return Layout(**{**values, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize(("model", "c", "s", "status", "reason"), [
    (GPT2_XL, cluster(8), layout(tp=2, dp=4), TrialStatus.INVALID,
     "tp=2 must divide num_attention_heads=25"),
    (GPT2_XL, cluster(8), layout(tp=1, dp=2, pp=2), TrialStatus.INVALID,
     "must equal the 8 GPUs"),
    (GPT2_XL, cluster(8), layout(mbs=8), None, "predicted to fit"),
    (GPT2_XL, cluster(8, gpu="a100-40gb"), layout(mbs=8, dp=8, distributed_optimizer=False),
     TrialStatus.PREDICTED_OOM, "over the capacity of 40.0 GiB"),
    (GPT2_MEDIUM, cluster(8), layout(mbs=8), None, "predicted to fit"),
])
def test_decide(model: object, c: ClusterSpec, s: Layout, status: TrialStatus | None,
                reason: str) -> None:
    decision = MemoryGate(model, c).decide(s)  # type: ignore[arg-type]
    assert decision.status is status
    assert decision.launch == (status is None)
    assert reason in decision.reason
    if status is TrialStatus.INVALID:
        assert decision.memory is None and decision.constraint > 0
    else:
        assert decision.memory is not None
        assert (decision.constraint > 0) == (status is not None)


def test_a_real_oom_prunes_larger_micro_batches_of_its_layout() -> None:
    gate = MemoryGate(GPT2_MEDIUM, cluster(8))
    failed = layout(mbs=4)
    gate.record_oom(failed, None)  # no prediction: only the micro-batch rule is learned
    assert gate.oom_mbs == {mbs_family(failed): 4}
    assert gate.learned_capacity_bytes is None
    for mbs, launch in ((1, True), (2, True), (4, False), (8, False)):
        decision = gate.decide(replace(failed, mbs=mbs))
        assert decision.launch is launch, mbs
        if not launch:
            assert decision.status is TrialStatus.PREDICTED_OOM and decision.constraint > 0
            assert f"mbs={mbs} >= mbs=4, which ran out of memory" in decision.reason
    # Another layout is untouched by the micro-batch rule.
    assert gate.decide(layout(mbs=8, pp=2, dp=4)).launch
    gate.record_oom(replace(failed, mbs=8), None)  # a larger OOM keeps the smallest
    assert gate.oom_mbs == {mbs_family(failed): 4}
    gate.record_oom(replace(failed, mbs=2), None)
    assert gate.oom_mbs == {mbs_family(failed): 2}


def test_a_real_oom_lowers_the_capacity_to_its_prediction() -> None:
    c = cluster(8)
    gate = MemoryGate(GPT2_MEDIUM, c)
    failed = layout(mbs=4, pp=2, dp=4)
    peak = estimate_memory(GPT2_MEDIUM, failed, c).peak_bytes
    gate.record_oom(failed, peak)
    assert gate.learned_capacity_bytes == peak == gate.capacity_bytes()

    bigger = layout(mbs=8)  # another layout predicted to need more
    smaller = layout(mbs=1)
    same = replace(failed, overlap_param_gather=True)  # priced the same by the model
    assert estimate_memory(GPT2_MEDIUM, bigger, c).peak_bytes > peak
    assert estimate_memory(GPT2_MEDIUM, same, c).peak_bytes == peak
    assert estimate_memory(GPT2_MEDIUM, smaller, c).peak_bytes < peak
    for s, launch in ((bigger, False), (same, False), (smaller, True)):
        decision = gate.decide(s)
        assert decision.launch is launch, s.describe()
        if not launch:
            assert "learned capacity" in decision.reason and decision.constraint > 0

    gate.record_oom(layout(mbs=16), peak * 2)  # a larger prediction never raises it
    assert gate.learned_capacity_bytes == peak
    gate.record_oom(smaller, peak / 2)
    assert gate.learned_capacity_bytes == peak / 2


# Layouts of gpt2-medium on 8 H100s by predicted peak: A (8.3 GiB) < B = B_TE (15.1 GiB, the
# model does not price the attention implementation) < C (24.1 GiB). A, B and C differ only in
# micro-batch, so an OOM of A also teaches the micro-batch rule for B and C.
NOISE = {"A": layout(mbs=2, gbs=128), "B": layout(mbs=8, gbs=128),
         "B_TE": layout(mbs=8, gbs=128, impl="te"), "C": layout(mbs=16, gbs=128)}


@pytest.mark.parametrize(("events", "capacity", "launches", "noise"), [
    # The H100 study: trial 0 fit, a layout predicted at or below it ran out of memory (a warm
    # worker's leftovers): nothing predicted up to the fit, nor above it, is ruled out.
    ([("fit", "B"), ("oom", "A")], None, {"A": True, "B": True, "B_TE": True, "C": True},
     {"A": True}),
    ([("fit", "B"), ("oom", "B_TE")], None, {"A": True, "B": True, "B_TE": True, "C": True},
     {"B_TE": True}),
    # No fit contradicts the OOM: the gate tightens as before.
    ([("oom", "B")], "B", {"A": True, "B": False, "B_TE": False, "C": False}, {"B": False}),
    ([("fit", "A"), ("oom", "B")], "B", {"A": True, "B": False, "B_TE": False, "C": False},
     {"B": False}),
    # A fit measured after an OOM predicted no higher sets that OOM aside.
    ([("oom", "B"), ("fit", "C")], None, {"A": True, "B": True, "B_TE": True, "C": True},
     {"B": False}),
    ([("oom", "A"), ("oom", "C"), ("fit", "B")], "C",
     {"A": True, "B": True, "B_TE": True, "C": False}, {"A": False, "C": False}),
    # A fit below the OOM leaves it as it was.
    ([("oom", "C"), ("fit", "A")], "C", {"A": True, "B": True, "B_TE": True, "C": False},
     {"C": False}),
])
def test_an_oom_contradicted_by_a_fit_does_not_tighten_the_gate(
        events: list[tuple[str, str]], capacity: str | None, launches: dict[str, bool],
        noise: dict[str, bool]) -> None:
    c = cluster(8)
    gate = MemoryGate(GPT2_MEDIUM, c)
    peak = {name: estimate_memory(GPT2_MEDIUM, s, c).peak_bytes for name, s in NOISE.items()}
    assert peak["A"] < peak["B"] == peak["B_TE"] < peak["C"] < c.gpu.memory_bytes * 0.9
    notes: dict[str, str] = {}
    for number, (kind, name) in enumerate(events):
        if kind == "fit":
            gate.record_fit(peak[name], f"trial {number}")
        else:
            notes[name] = gate.record_oom(NOISE[name], peak[name])
    assert gate.learned_capacity_bytes == (None if capacity is None else peak[capacity])
    for name, launch in launches.items():
        decision = gate.decide(NOISE[name])
        assert decision.launch is launch, (name, decision.reason)
        assert (decision.status is TrialStatus.PREDICTED_OOM) is not launch
    # The note is the one for the moment of the OOM: a fit measured later sets it aside anyway.
    assert {name: bool(note) for name, note in notes.items()} == noise
    for name, note in notes.items():
        if note:
            fit = next(n for n, (kind, _) in enumerate(events) if kind == "fit")
            assert note.startswith(f"OOM at {peak[name] / GIB:.2f} GiB predicted is at or "
                                   f"below trial {fit}'s")
            assert note.endswith("GiB that fit: not used to tighten the gate")
    # Every OOM is remembered, contradicted or not.
    assert [s for s, _ in gate.ooms] == [NOISE[n] for kind, n in events if kind == "oom"]


def test_a_fit_unblocks_larger_micro_batches_of_an_oom_it_contradicts() -> None:
    c = cluster(8)
    gate = MemoryGate(GPT2_MEDIUM, c)
    gate.record_oom(NOISE["A"], estimate_memory(GPT2_MEDIUM, NOISE["A"], c).peak_bytes)
    assert not gate.decide(NOISE["C"]).launch  # mbs=16 >= mbs=2, which ran out of memory
    assert gate.record_fit(estimate_memory(GPT2_MEDIUM, NOISE["B"], c).peak_bytes, "trial 3")
    assert gate.oom_mbs == {} and gate.decide(NOISE["C"]).launch
    # An OOM without a prediction still teaches the micro-batch rule, but rules out nothing
    # predicted to need no more than the fit.
    gate.record_oom(NOISE["A"], None)
    assert gate.oom_mbs == {mbs_family(NOISE["A"]): 2}
    assert gate.decide(NOISE["B"]).launch and not gate.decide(NOISE["C"]).launch


def _tight(fraction: float) -> tuple[ClusterSpec, Layout, float]:
    """A cluster whose GPU holds `layout(mbs=8)`'s prediction at `fraction` of its memory."""
    s, c = layout(mbs=8), cluster(8)
    peak = estimate_memory(GPT2_XL, s, c).peak_bytes
    return replace(c, gpu=replace(c.gpu, memory_bytes=int(peak / fraction))), s, peak


@pytest.mark.parametrize(("biases", "status", "reason"), [
    # No fit measured yet, or too few to be the machine's: a risk, launched after the safe ones.
    ((), None, "within the memory model's error band"),
    ((0.022, 0.025), None, "within the memory model's error band"),
    # Issue 30's llama3-8b study: seven fits 0.8-2.5% over their predictions, then an OOM at
    # 98.9% predicted. Corrected by the median, it is over the device: not launched.
    ((0.017, 0.022, 0.008, 0.011, 0.011, 0.025, 0.023), TrialStatus.PREDICTED_OOM,
     "measured fits used a median +1.7% of their predictions"),
    # The model over-predicts here: the correction never blocks, the layout stays a risk.
    ((-0.03, -0.02, -0.04), None, "within the memory model's error band"),
    # One outlier (a warm worker's leftovers) does not move the median.
    ((0.001, 0.15, 0.002), None, "within the memory model's error band"),
])
def test_measured_fits_correct_risky_predictions(biases: tuple[float, ...],
                                                 status: TrialStatus | None, reason: str) -> None:
    c, s, peak = _tight(0.989)
    gate = MemoryGate(GPT2_XL, c)
    for bias in biases:
        gate.record_peak(peak, peak * (1 + bias))
    decision = gate.decide(s)
    assert decision.status is status
    assert reason in decision.reason
    assert (decision.constraint > 0) == (status is not None)
    if status is None:
        assert decision.risky


def test_the_bias_leaves_layouts_outside_the_band_alone() -> None:
    c, s, peak = _tight(0.80)
    gate = MemoryGate(GPT2_XL, c)
    for _ in range(5):
        gate.record_peak(peak, peak * 1.04)  # 4% more than predicted, 20% free: still fits
    decision = gate.decide(s)
    assert decision.launch and not decision.risky


@pytest.mark.parametrize(("biases", "changed"), [
    # (earlier fits' biases, the new one): does the gate say its decisions may have moved?
    (((), -0.02), False),            # under the band, fewer than MIN_BIAS_FITS: nothing moves
    (((), H100_BAND + 0.03), True),  # over the H100's band: the band widens
    (((-0.01, -0.02), -0.03), True),  # the third fit: a typical bias exists now
    (((0.01, 0.02, 0.03), 0.02), False),  # the median stays 2%, the band stays
])
def test_record_peak_says_when_decisions_may_move(biases: tuple[tuple[float, ...], float],
                                                  changed: bool) -> None:
    earlier, new = biases
    gate = MemoryGate(GPT2_XL, cluster(8))
    for bias in earlier:
        gate.record_peak(100.0, 100.0 * (1 + bias))
    assert gate.record_peak(100.0, 100.0 * (1 + new)) is changed


@pytest.mark.parametrize(("preset", "gpus"), [("gpt2-xl", 8), ("mixtral-8x7b", 8)])
def test_a_checked_layout_is_decided_as_an_unchecked_one(preset: str, gpus: int) -> None:
    """The search tells the gate which layouts the enumeration checked (LayoutMap.checked), and
    the gate skips their rules (issue 24): each passes every rule, so the decision is the same."""
    from autotune.layouts.layout import check
    from autotune.search.space import enumerate_space, load_space

    model = load_model(preset)
    on = ClusterSpec.make(gpus, gpu="h100-80gb", gpus_per_node=8)
    valid = enumerate_space(load_space(), model, on).valid
    gate = MemoryGate(model, on)
    for s in valid[::5]:
        assert check(s, model, on) == []
        assert gate.decide(s, checked=True) == gate.decide(s)


# Layouts of gpt2-xl on 8 H100s the memory model prices differently (and the same up to a
# MEMORY_BLIND field): the gate's remembered estimates must be the estimates themselves.
ESTIMATED = [
    layout(),
    layout(mbs=4),
    layout(mbs=4, overlap_param_gather=True),
    layout(mbs=4, overlap_grad_reduce=False),
    layout(mbs=4, distributed_optimizer=False),
    layout(pp=2, dp=4, mbs=2),
    layout(pp=2, dp=4, vpp=2, mbs=2, recompute="full", recompute_method="block",
           recompute_num_layers=3),
    layout(pp=4, dp=2, mbs=1, recompute="selective"),
    layout(tp=8, dp=1, mbs=8, sequence_parallel=True, impl="te", fp8="hybrid"),
    layout(tp=8, dp=1, mbs=8, sequence_parallel=True, impl="te", fp8="hybrid",
           overlap_param_gather=True),
    layout(mbs=2, impl="te", offload_layers=4),
]


@pytest.mark.parametrize("s", ESTIMATED, ids=lambda s: s.describe())
def test_the_gates_remembered_estimate_is_the_estimate(s: Layout) -> None:
    c = cluster(8)
    gate = MemoryGate(GPT2_XL, c)
    for other in ESTIMATED:  # the memo holds the others, some with the same memory_key
        gate.estimate(other)
    assert gate.estimate(s) == estimate_memory(GPT2_XL, s, c)
    assert gate.decide(s, checked=True) == MemoryGate(GPT2_XL, c).decide(s, checked=True)


def test_memory_key_reads_every_field_but_the_memory_blind_ones() -> None:
    from autotune.layouts.layout import DIMENSIONS, LAYOUT_DEFAULTS, with_fields
    from autotune.predict.memory import MEMORY_BLIND, memory_key

    base = Layout()
    for name, default in LAYOUT_DEFAULTS.items():
        other = with_fields(base, **{name: another_value(name, default)})
        assert (memory_key(other) == memory_key(base)) == (name in MEMORY_BLIND), name
    assert MEMORY_BLIND and MEMORY_BLIND.issubset(DIMENSIONS)




def test_the_gates_memo_stays_right_across_a_space() -> None:
    """The gate's estimates (autotune.predict.memory_memo, its latest kept), in the
    enumeration's order and again backwards: each the estimate itself."""
    from autotune.predict.memory import memory_key
    from autotune.search.space import enumerate_space, load_space

    c = cluster(8)
    valid = enumerate_space(load_space(), GPT2_XL, c).valid
    gate = MemoryGate(GPT2_XL, c)
    asked = [*valid, *reversed(valid)][:: max(1, len(valid) // 600)]
    for s in asked:
        assert gate.estimate(s) == estimate_memory(GPT2_XL, s, c)
    # The gate's own estimates are not kept for good (MemoryMemo.estimate's keep).
    assert gate.memo is not None and len(gate.memo) == 0 < len({memory_key(s) for s in asked})
