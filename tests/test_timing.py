"""When a trial has answered (autotune.worker.timing): fixed counts, stable timing, the end of
warm-up, the early stop of a slow trial, and the most steps a trial may take."""

from __future__ import annotations

import pytest

from autotune.layouts.layout import Layout
from autotune.specs.model import ModelSpec
from autotune.trials.trial import StopReason, TrialSpec
from autotune.worker.timing import SLOW_AFTER, STABLE_WINDOW, StepJudge, Timing, drifting


def _feed(judge: StepJudge, times: list[float]) -> tuple[Timing | None, int]:
    """Feed steps until the judge answers: its answer and how many steps it took."""
    for n, t in enumerate(times, 1):
        timing = judge.add(t)
        if timing is not None:
            return timing, n
    return None, len(times)


STEADY = [5.0] + [1.0] * 30
FALLING = [5.0, 2.0, 1.5, 1.2, 1.1, 1.05] + [1.0] * 30
NOISY = [5.0] + [1.0, 1.2] * 20


@pytest.mark.parametrize(("times", "warmup", "train", "cv", "slow_s", "steps", "reason",
                          "timed"), [
    # stable_cv 0 and no slow threshold: exactly warmup + train steps, as before.
    (STEADY, 3, 10, 0.0, None, 13, StopReason.FIXED, 10),
    # Stable: the first step is warm-up, then one window of agreeing steps.
    (STEADY, 3, 10, 0.01, None, 1 + STABLE_WINDOW, StopReason.STABLE, STABLE_WINDOW),
    # Falling: warm-up lasts until a window is steady (1.1, 1.05, 1, 1, 1: a 1.8 % standard
    # error; 1.05, 1, 1, 1, 1: 0.9 %).
    (FALLING, 10, 10, 0.01, None, 5 + STABLE_WINDOW, StopReason.STABLE, STABLE_WINDOW),
    # Never stable: the most steps run, the last train_steps of them timed.
    (NOISY, 3, 10, 0.01, None, 13, StopReason.MAX_STEPS, 10),
    # Slow: SLOW_AFTER steps after the first, all slower than the threshold.
    (STEADY, 3, 10, 0.01, 0.8, 1 + SLOW_AFTER, StopReason.SLOW, SLOW_AFTER),
    # Not slow: the fastest step reaches the threshold, so the trial runs on to stability.
    (STEADY, 3, 10, 0.01, 1.0, 1 + STABLE_WINDOW, StopReason.STABLE, STABLE_WINDOW),
    # Fewer timed steps than the window: the window shrinks to train_steps.
    (STEADY, 3, 2, 0.01, None, 3, StopReason.STABLE, 2),
])
def test_the_judge(times: list[float], warmup: int, train: int, cv: float,
                   slow_s: float | None, steps: int, reason: StopReason, timed: int) -> None:
    judge = StepJudge(warmup_steps=warmup, train_steps=train, stable_cv=cv, slow_step_s=slow_s)
    timing, n = _feed(judge, times)
    assert timing is not None and n == steps
    assert timing.reason is reason and len(timing.timed_s) == timed
    assert timing.warmup_s + timing.timed_s == tuple(times[:steps])


def test_the_first_step_is_never_timed_when_adaptive() -> None:
    judge = StepJudge(warmup_steps=0, train_steps=1, stable_cv=0.5)
    timing, n = _feed(judge, [9.0, 1.0, 1.0])
    assert timing is not None and n == 2 and timing.warmup_s == (9.0,)


def test_phase_names_what_the_next_step_is_run_as() -> None:
    fixed = StepJudge(warmup_steps=2, train_steps=2)
    phases = []
    for t in (1.0, 1.0, 1.0, 1.0):
        phases.append(fixed.phase())
        fixed.add(t)
    assert phases == ["warmup", "warmup", "timed", "timed"]
    adaptive = StepJudge(warmup_steps=2, train_steps=5, stable_cv=0.01)
    assert adaptive.phase() == "warmup"
    adaptive.add(3.0)
    assert adaptive.phase() == "timed"


def test_for_spec_turns_the_threshold_into_a_step_time() -> None:
    model = ModelSpec(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4,
                      vocab_size=1000, seq_length=128, global_batch_size=8)
    spec = TrialSpec(model=model, layout=Layout(gbs=8), stable_cv=0.01,
                     slow_below_tokens_per_s=512.0)
    judge = StepJudge.for_spec(spec)
    assert judge.slow_step_s == pytest.approx(8 * 128 / 512.0)
    assert StepJudge.for_spec(TrialSpec(model=model, layout=Layout(gbs=8))).adaptive is False


@pytest.mark.parametrize(("warmup", "train"), [(3, 0), (-1, 5)])
def test_bad_counts_are_refused(warmup: int, train: int) -> None:
    with pytest.raises(ValueError, match="train_steps"):
        StepJudge(warmup_steps=warmup, train_steps=train)


# A slow drift whose window still has a small standard error: 0.6 % per step, so any window of
# five has a relative standard error below 1 % but rises by 2.4 % across it (clocks coming
# down under sustained load, the issue-25 suspicion).
DRIFTING = [5.0] + [1.0 * 1.006 ** i for i in range(40)]


def test_a_drifting_window_is_not_stable() -> None:
    judge = StepJudge(warmup_steps=3, train_steps=10, stable_cv=0.01)
    timing, n = _feed(judge, DRIFTING)
    assert timing is not None and timing.reason is StopReason.MAX_STEPS and n == 13


@pytest.mark.parametrize(("values", "tolerance", "drift"), [
    ([1.0, 1.0, 1.0, 1.0, 1.0], 0.01, False),               # flat
    ([1.0, 1.01, 1.02, 1.03, 1.04], 0.01, True),            # rising steadily, 4 % over the window
    ([1.04, 1.03, 1.02, 1.01, 1.0], 0.01, True),            # still falling: warm-up not over
    ([1.0, 1.002, 1.004, 1.006, 1.008], 0.01, False),       # a trend, but within the tolerance
    ([1.0, 1.05, 0.98, 1.06, 1.03], 0.01, False),           # noise: the slope is not significant
    ([1.0, 1.0], 0.01, False),                              # too few to tell a trend
])
def test_drifting(values: list[float], tolerance: float, drift: bool) -> None:
    assert drifting(values, tolerance) is drift
