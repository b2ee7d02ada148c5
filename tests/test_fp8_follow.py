"""What the search measures right after a lead: the leader's FP8 variant after a bf16 lead, its
variants in the levers the cost model does not price (the NaN checks); and the loss guard's twin
length."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from autotune.layouts.layout import Layout
from autotune.levers.fp8 import Fp8, Fp8Recipe
from autotune.predict.gate import GateDecision
from autotune.search.execution import TrialExecutor
from autotune.search.ledger import LayoutQueue
from autotune.search.loss_guard import GUARD_STEPS, long_enough, twin
from autotune.search.records import SearchResult, Source, TrialRecord
from autotune.specs.presets import load_model
from autotune.trials.trial import TrialMetrics, TrialSpec, TrialStatus

XL = load_model("gpt2-xl")
BF16 = Layout(mbs=8, gbs=64, impl="te")
DELAYED = replace(BF16, fp8=Fp8.HYBRID)
TENSORWISE = replace(DELAYED, fp8_recipe=Fp8Recipe.TENSORWISE)
OTHER = replace(BF16, mbs=4)
"""A bf16 layout with no FP8 variant in the space below."""
SPACE = [BF16, DELAYED, TENSORWISE, OTHER]
UNCHECKED = replace(BF16, nan_checks=False)
"""BF16 without the NaN checks: a variant the cost model predicts as fast (no_cost)."""
LOSSES = (10.9, 9.1, 7.4, 6.0, 5.1, 4.6, 4.3, 4.1)


class _Backend:
    predicted = False

    def __init__(self) -> None:
        self.ran: list[TrialSpec] = []

    def run(self, spec: TrialSpec, trial_dir: Path, timeout: float) -> TrialMetrics:
        self.ran.append(spec)
        return TrialMetrics(status=TrialStatus.OK, tokens_per_s=1e5, step_time_s=0.5,
                            losses=LOSSES[:spec.train_steps])


def _executor(tmp: Path, *, speeds: dict[Layout, float], best: float,
              records: list[TrialRecord] | None = None, fits: bool = True,
              tried: frozenset[Layout] = frozenset(),
              space: list[Layout] = SPACE) -> tuple[TrialExecutor, LayoutQueue, _Backend]:
    backend = _Backend()
    cfg = SimpleNamespace(results_dir=tmp, backend=backend, model=XL, train_steps=10,
                          trial_timeout_s=None, warmup_steps=3, seed=1234, stable_cv=0.01,
                          cluster=SimpleNamespace(gpu=SimpleNamespace(
                              peak_bf16_flops=989e12, name="h100-80gb")))
    result = SearchResult(study_name="s", storage="sqlite://", records=records or [])
    knowledge = SimpleNamespace(predicted_tokens=lambda s: speeds[s], fits=lambda s: fits,
                                predict=lambda s: SimpleNamespace(step_time_s=0.5),
                                gate=SimpleNamespace(decide=lambda s: GateDecision(
                                    status=None, reason="", memory=None, constraint=-1.0)))
    ledger = SimpleNamespace(result=result, best_tokens=best, tried=lambda s: s in tried)
    queue = LayoutQueue()
    parts: Any = SimpleNamespace(cfg=cfg, store=SimpleNamespace(name="s"), knowledge=knowledge,
                                 ledger=ledger, queue=queue,
                                 layouts=SimpleNamespace(valid=space))
    return TrialExecutor(parts), queue, backend


def _record(layout: Layout, tokens: float, *, steps: int = 4, cv: float = 0.0,
            number: int = 1, status: TrialStatus = TrialStatus.OK) -> TrialRecord:
    metrics = TrialMetrics(status=status, tokens_per_s=tokens, step_time_s=0.5,
                           step_time_cv=cv, losses=LOSSES[:steps])
    return TrialRecord(number=number, layout=layout, status=status,
                       source=Source.ALPA, metrics=metrics)


SPEEDS = {BF16: 100.0, DELAYED: 130.0, TENSORWISE: 125.0, OTHER: 90.0}


@pytest.mark.parametrize(("case", "record", "speeds", "best", "fits", "tried", "queued"), [
    ("the leader's fastest FP8 variant", _record(BF16, 100.0), SPEEDS, 100.0, True, (),
     DELAYED),
    ("one recipe tried: the other", _record(BF16, 100.0), SPEEDS, 100.0, True, (DELAYED,),
     TENSORWISE),
    ("within its own noise of the best", _record(BF16, 97.0, cv=0.05), SPEEDS, 100.0, True,
     (), DELAYED),
    ("below the best by more than its noise", _record(BF16, 90.0, cv=0.01), SPEEDS, 100.0,
     True, (), None),
    ("FP8 predicted slower", _record(BF16, 100.0), {**SPEEDS, DELAYED: 95.0, TENSORWISE: 90.0},
     100.0, True, (), None),
    ("FP8 predicted not to fit", _record(BF16, 100.0), SPEEDS, 100.0, False, (), None),
    ("no FP8 variant in the space", _record(OTHER, 100.0), SPEEDS, 100.0, True, (), None),
    ("an FP8 trial leads: nothing to follow", _record(DELAYED, 130.0), SPEEDS, 130.0, True,
     (), None),
])
def test_a_bf16_leader_is_followed_by_its_fp8_variant(
        tmp_path: Path, case: str, record: TrialRecord, speeds: dict[Layout, float],
        best: float, fits: bool, tried: tuple[Layout, ...], queued: Layout | None) -> None:
    executor, queue, _ = _executor(tmp_path, speeds=speeds, best=best, fits=fits,
                                   tried=frozenset(tried))
    executor.follow_with_fp8(record)
    if queued is None:
        assert not queue, case
    else:
        assert queue.pop() == (queued, Source.PRECISION), case
        assert not queue


def test_the_variant_goes_before_what_was_queued(tmp_path: Path) -> None:
    executor, queue, _ = _executor(tmp_path, speeds=SPEEDS, best=100.0)
    queue.push(OTHER, Source.ALPA)
    executor.follow_with_fp8(_record(BF16, 100.0))
    assert [queue.pop()[0], queue.pop()[0]] == [DELAYED, OTHER]


@pytest.mark.parametrize(("case", "record", "best", "fits", "tried", "space", "queued"), [
    ("the leader's unchecked variant", _record(BF16, 100.0), 100.0, True, (),
     [BF16, UNCHECKED, OTHER], UNCHECKED),
    ("an unchecked leader: its checked variant", _record(UNCHECKED, 100.0), 100.0, True, (),
     [BF16, UNCHECKED, OTHER], BF16),
    ("within its own noise of the best", _record(BF16, 97.0, cv=0.05), 100.0, True, (),
     [BF16, UNCHECKED], UNCHECKED),
    ("below the best by more than its noise", _record(BF16, 90.0, cv=0.01), 100.0, True, (),
     [BF16, UNCHECKED], None),
    ("the variant tried", _record(BF16, 100.0), 100.0, True, (UNCHECKED,),
     [BF16, UNCHECKED], None),
    ("the variant predicted not to fit", _record(BF16, 100.0), 100.0, False, (),
     [BF16, UNCHECKED], None),
    ("the space lists the checks one way", _record(BF16, 100.0), 100.0, True, (),
     [BF16, OTHER], None),
    ("not measured", _record(BF16, 100.0, status=TrialStatus.OOM), 100.0, True, (),
     [BF16, UNCHECKED], None),
])
def test_a_leader_is_followed_by_its_unpriced_variants(
        tmp_path: Path, case: str, record: TrialRecord, best: float, fits: bool,
        tried: tuple[Layout, ...], space: list[Layout], queued: Layout | None) -> None:
    speeds = {s: 100.0 for s in space}  # the model ranks them alike: why they are measured
    executor, queue, _ = _executor(tmp_path, speeds=speeds, best=best, fits=fits,
                                   tried=frozenset(tried), space=space)
    executor.follow_unpriced(record)
    if queued is None:
        assert not queue, case
    else:
        assert queue.pop() == (queued, Source.UNPRICED), case
        assert not queue


def test_the_search_measures_the_leaders_unchecked_variant(tmp_path: Path) -> None:
    """The whole loop over a scripted backend whose unchecked runs are 5% faster, which the
    model cannot see, with the model's stop rule on (on 2 x H200 its echo rule skipped the
    variant): the trial after the leading seed is its unchecked variant, and it is the search's
    best."""
    from doubles.fake_backend import FakeBackend, default_tokens, small_space

    from autotune.search import SearchConfig, run_search
    from autotune.specs.hardware import ClusterSpec

    cluster = ClusterSpec.make(4, gpu="h200")

    def tokens(s: Layout) -> float:
        return default_tokens(s) * (1.0 if s.nan_checks else 1.05)

    backend = FakeBackend(cluster, tokens=tokens)
    space = small_space(impl=["sdpa"], tp=[1, 2], pp=[1], mbs=[1, 2], nan_checks=[True, False])
    result = run_search(SearchConfig(model=XL, cluster=cluster, space=space, backend=backend,
                                     results_dir=tmp_path, study_name="s", sampler="tpe",
                                     finalists=0, n_trials=2))
    first, second = (r for r in result.records if r.launched)
    assert first.source == Source.ALPA and first.layout.nan_checks
    assert second.source == Source.UNPRICED
    assert second.layout == replace(first.layout, nan_checks=False)
    assert result.best(1)[0].layout == second.layout


@pytest.mark.parametrize(("layout", "min_steps"), [
    (DELAYED, GUARD_STEPS),   # guarded: its series is judged to its end
    (BF16, GUARD_STEPS),      # the twin of FP8 layouts of the space: as long as they are
    (OTHER, 0),               # no FP8 variant: the timing alone decides
])
def test_twins_run_as_many_steps_as_the_guard_judges(tmp_path: Path, layout: Layout,
                                                     min_steps: int) -> None:
    executor, _, _ = _executor(tmp_path, speeds=SPEEDS, best=0.0)
    assert executor.spec(layout, slow_below=None).min_steps == min_steps


@pytest.mark.parametrize(("twin_steps", "fp8_steps", "enough"), [
    (4, 6, False),   # 4 x H200, 2026-11-28: a 4-step twin judged delayed scaling's lag
    (6, 6, True),
    (10, 6, True),
    (3, 3, True),    # a short FP8 series (pruned, failed late): all of it is enough
    (5, 8, False),
])
def test_a_twin_must_reach_the_guarded_steps(twin_steps: int, fp8_steps: int,
                                             enough: bool) -> None:
    assert long_enough(LOSSES[:twin_steps], fp8_steps) is enough


def test_a_short_twin_is_replaced_by_a_reference_run(tmp_path: Path) -> None:
    """The 4 x H200 case: the twin measured 4 steps, the FP8 trial 6 whose first steps lag
    (delayed scaling): judged on steps 2-4 it left the twin; on a 6-step reference it follows."""
    lagging = (LOSSES[0], LOSSES[1] * 1.5, LOSSES[2] * 1.3, *LOSSES[3:6])
    short = _record(twin(DELAYED), 1e5, steps=4)
    executor, _, backend = _executor(tmp_path, speeds=SPEEDS, best=0.0, records=[short])
    fp8 = replace(_record(DELAYED, 1e5, steps=6, number=2),
                  metrics=TrialMetrics(status=TrialStatus.OK, tokens_per_s=1e5,
                                       step_time_s=0.5, losses=lagging))
    judged = executor.guard(fp8, tmp_path / "2")
    assert judged.status is TrialStatus.OK and "reference run" in judged.reason
    (spec,) = backend.ran
    assert spec.layout == twin(DELAYED) and spec.train_steps == 6


def test_the_search_measures_the_leaders_fp8_variant_next(tmp_path: Path) -> None:
    """The whole loop over a scripted backend: llama3-8b on 4 x H200, where the model predicts
    FP8 faster (large GEMMs). Alpa's seeds are bf16 (Megatron practice); the trial after the
    leading seed is its FP8 variant, proposed as `precision`."""
    from doubles.fake_backend import FakeBackend, default_tokens, small_space

    from autotune.search import SearchConfig, run_search
    from autotune.specs.hardware import ClusterSpec

    cluster = ClusterSpec.make(4, gpu="h200")

    def tokens(s: Layout) -> float:
        return default_tokens(s) * (1.3 if s.fp8 != Fp8.OFF else 1.0)

    backend = FakeBackend(cluster, tokens=tokens)
    space = small_space(impl=["te"], fp8=["off", "hybrid"], tp=[1, 2], pp=[1], mbs=[1, 2],
                        distributed_optimizer=[True], overlap_param_gather=[True])
    result = run_search(SearchConfig(model=load_model("llama3-8b"), cluster=cluster,
                                     space=space, backend=backend, results_dir=tmp_path,
                                     study_name="s", sampler="tpe", stop_rule="none",
                                     finalists=0, n_trials=2))
    first, second = (r for r in result.records if r.launched)
    assert first.source == Source.ALPA and first.layout.fp8 == Fp8.OFF
    assert second.source == Source.PRECISION and twin(second.layout) == first.layout
