"""Issue 25's measurement pieces on the CPU: NVML clocks sampled (a fake pynvml), the garbage
collector held off, the trial's spread and clocks through result.json and the stored record,
and the error band and prune margin that take a trial's own noise off the model's error."""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from autotune.layouts.layout import Layout
from autotune.search.records import Source, TrialRecord, read_record, record_attrs
from autotune.search.stop_rule import PRUNE_MARGIN, error_band, prune_margin
from autotune.trials.trial import ClockSummary, Spread, TrialMetrics, TrialStatus
from autotune.worker.clocks import ClockSampler, reason_names
from autotune.worker.host import GcPauses, HostWatch, gc_held, steal_ticks


class FakeNvml:
    """The pynvml calls the sampler makes, answering from a script of readings."""

    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, reasons: int = 0, fail_power: bool = False) -> None:
        self.reasons = reasons
        self.fail_power = fail_power
        self.shutdowns = 0

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"gpu{index}"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return uuid

    def nvmlDeviceGetClockInfo(self, handle: str, which: int) -> int:
        return 1980 if which == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        if self.fail_power:
            raise RuntimeError("not supported")
        return 650_000

    def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> int:
        return 61

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> Any:
        return SimpleNamespace(gpu=97)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: str) -> int:
        return self.reasons

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1


@pytest.mark.parametrize(("reasons", "names", "throttled"), [
    (0x0, (), False),
    (0x1, ("gpu_idle",), False),            # idle is not throttling
    (0x2 | 0x10, ("app_clocks", "sync_boost"), False),
    (0x4, ("sw_power_cap",), False),        # the sustained state at the power limit
    (0x80, ("hw_power_brake",), True),
    (0x20 | 0x40, ("hw_thermal", "sw_thermal"), True),
    (0x8 | 0x1000, ("0x1000", "hw_slowdown"), True),   # an unknown bit kept as hex
])
def test_clocks_are_sampled_and_throttling_told_apart(reasons: int, names: tuple[str, ...],
                                                      throttled: bool) -> None:
    nvml = FakeNvml(reasons=reasons)
    sampler = ClockSampler(0, nvml, period_s=0.005, owns_nvml=True)  # type: ignore[arg-type]
    with sampler:
        deadline = time.monotonic() + 5
        while len(sampler.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
    summary = sampler.summary()
    assert summary.samples >= 3 and nvml.shutdowns == 1
    assert summary.sm_mhz == Spread(min=1980, median=1980, max=1980)
    assert summary.power_w is not None and summary.power_w.median == 650.0
    assert summary.utilization is not None and summary.utilization.median == 0.97
    assert summary.reasons == tuple(sorted(names)) and summary.throttled is throttled
    assert reason_names(reasons) == tuple(n for n in reason_names(reasons))


def test_without_nvml_nothing_is_sampled_and_a_quantity_nvml_lacks_is_none() -> None:
    with ClockSampler(0, None) as sampler:
        pass
    assert sampler.summary().samples == 0
    later = time.perf_counter() + 3600
    with ClockSampler(0, FakeNvml(fail_power=True), period_s=0.005) as sampler:  # type: ignore[arg-type]
        time.sleep(0.02)
    assert sampler.summary().power_w is None and sampler.summary(since=later).samples == 0


def test_clocks_merge_over_ranks_and_round_trip_through_the_metrics() -> None:
    a = ClockSummary(samples=4, sm_mhz=Spread(min=1700, median=1900, max=1980),
                     reasons=("gpu_idle",))
    b = ClockSummary(samples=2, sm_mhz=Spread(min=1800, median=1950, max=1990),
                     reasons=("sw_thermal",))
    merged = ClockSummary.merge([a, b, ClockSummary(samples=0)])
    assert merged is not None and merged.samples == 6 and merged.throttled
    assert merged.sm_mhz == Spread(min=1700, median=1925, max=1990)
    metrics = TrialMetrics(status=TrialStatus.OK, tokens_per_s=1.0, step_time_cv=0.02,
                           clocks=merged)
    again = TrialMetrics.from_dict(metrics.to_dict())
    assert again == metrics and again.noise == 0.02 and again.throttled
    record = TrialRecord(number=7, layout=Layout(mbs=2, gbs=8), status=TrialStatus.OK,
                         source=Source.FINALIST, metrics=metrics, repeat_of=3)
    back = read_record(7, record_attrs(record))
    assert back == record and back is not None and back.repeat_of == 3 and not back.rankable
    # A record of an earlier version: no spread, no clocks, no repeat.
    old = record_attrs(TrialRecord(number=1, layout=Layout(), status=TrialStatus.OK,
                                   source=Source.SAMPLER,
                                   metrics=TrialMetrics(status=TrialStatus.OK)))
    for key in ("step_time_cv", "clocks"):
        del old["metrics"][key]
    read = read_record(1, old)
    assert read is not None and read.metrics is not None and read.metrics.clocks is None \
        and read.noise == 0.0 and read.repeat_of is None


def test_gc_is_held_off_during_the_steps_and_given_back_after() -> None:
    was = gc.isenabled()
    with gc_held() as pauses:
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        cycles = []
        for _ in range(20000):  # enough allocations for several passes were it on
            node: list[Any] = []
            node.append(node)
            cycles.append(node)
        assert pauses.count == 0
        gc.collect()  # an explicit pass still counts
        assert pauses.count == 1 and pauses.total_s > 0
    assert gc.isenabled() is was and gc.get_freeze_count() == 0
    assert pauses not in gc.callbacks


def test_gc_pauses_count_each_pass() -> None:
    pauses = GcPauses()
    pauses("start", {})
    pauses("stop", {})
    pauses("stop", {})  # a stop without a start is not a pass
    assert pauses.count == 1 and pauses.longest_s >= 0


def test_gc_pauses_split_at_the_first_timed_step() -> None:
    pauses = GcPauses(passes=[(1.0, 0.02), (2.0, 0.01), (5.0, 0.004)])
    assert pauses.since(0.0) == (3, pytest.approx(0.034))
    assert pauses.since(2.0) == (2, pytest.approx(0.014))
    assert pauses.since(6.0) == (0, 0)


@pytest.mark.parametrize(("line", "ticks"), [
    ("cpu  10 0 20 300 4 0 1 7 0 0", 7),
    ("cpu  10 0 20", None),
    ("intr 5", None),
])
def test_steal_ticks(line: str, ticks: int | None) -> None:
    assert steal_ticks(line) == ticks


def test_the_host_watch_splits_at_the_first_timed_step() -> None:
    watch = HostWatch()
    for _ in range(3):
        watch.mark()
    figures = watch.over(1)
    assert figures["wall_s"] >= 0 and figures["cpu_s"] >= 0 and figures["threads"] >= 1


def _measured(number: int, tokens: float, predicted: float, cv: float) -> TrialRecord:
    return TrialRecord(number=number, layout=Layout(mbs=2 ** number, gbs=64),
                       status=TrialStatus.OK, source=Source.SAMPLER,
                       predicted_tokens_per_s=predicted,
                       metrics=TrialMetrics(status=TrialStatus.OK, tokens_per_s=tokens,
                                            step_time_cv=cv))


@pytest.mark.parametrize(("cv", "error"), [
    (0.0, 0.20),     # a quiet trial: its miss is the model's
    (0.05, 0.15),    # 5% of it is the trial's own noise
    (0.30, 0.0),     # noisier than the miss: the model is not blamed at all
])
def test_the_error_band_takes_each_trials_noise_off_its_miss(cv: float, error: float) -> None:
    records = [_measured(i, 120.0, 100.0, cv) for i in range(5)]
    band = error_band(records, predict=lambda s: 100.0, fitted_after=4)
    assert band.fitted and band.error == pytest.approx(error)
    assert band.band == pytest.approx(max(0.05, error))


def test_repeats_do_not_count_in_the_error_band() -> None:
    records = [_measured(i, 100.0, 100.0, 0.0) for i in range(5)]
    records.append(TrialRecord(number=9, layout=records[0].layout, status=TrialStatus.OK,
                               source=Source.FINALIST, predicted_tokens_per_s=100.0,
                               repeat_of=0, metrics=TrialMetrics(status=TrialStatus.OK,
                                                                 tokens_per_s=300.0)))
    band = error_band(records, predict=lambda s: 100.0, fitted_after=4)
    assert band.error == 0.0 and band.trials == 5


@pytest.mark.parametrize(("cv", "margin"), [(0.0, PRUNE_MARGIN), (0.02, PRUNE_MARGIN),
                                            (0.08, 0.16)])
def test_the_prune_margin_is_at_least_twice_the_bests_noise(cv: float, margin: float) -> None:
    assert prune_margin(_measured(0, 100.0, 100.0, cv)) == pytest.approx(margin)


def test_the_host_watch_names_the_threads_that_used_cpu_and_the_main_threads_switches() -> None:
    import threading as th

    stop = th.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    watch = HostWatch()
    watch.mark()
    worker = th.Thread(target=spin, name="spinner")
    worker.start()
    time.sleep(0.3)
    watch.mark()
    stop.set()
    worker.join()
    figures = watch.over(0)
    assert 0 <= figures["main_cpu_s"] <= figures["cpu_s"] + 0.01
    if sys.platform == "linux":
        assert figures["main_ctx_voluntary"] >= 1  # the sleep gave the core away
        assert figures["main_ctx_involuntary"] >= 0 and figures["main_last_cpu"] >= 0
        assert any(row[2] > 0 for row in figures["busy_threads"])  # the spinner
        assert figures["other_threads_cpu_s"] > 0 and figures["cpus_allowed"] >= 1
        assert sum(figures["thread_names"].values()) >= 2


def test_thread_stat_lines_with_spaces_and_parentheses_in_the_name(tmp_path: Path) -> None:
    from autotune.worker.host import busy_threads, main_thread_counters, thread_table

    tick = os.sysconf("SC_CLK_TCK")
    task = tmp_path / "task"
    rest = " ".join(["S"] + ["0"] * 10 + [str(3 * tick), str(tick)] + ["0"] * 23 + ["5"])
    for tid, name in ((11, "pt_main_thread"), (12, "NCCL (watch) x")):
        (task / str(tid)).mkdir(parents=True)
        (task / str(tid) / "stat").write_text(f"{tid} ({name}) {rest}\n")
    (task / "13").mkdir()  # a thread that ended between the listing and the read
    table = thread_table(str(task))
    assert table == {11: ("pt_main_thread", 4.0), 12: ("NCCL (watch) x", 4.0)}
    later = {**table, 12: ("NCCL (watch) x", 6.5), 14: ("new", 0.5)}
    assert busy_threads(table, later, skip=11) == [["NCCL (watch) x", 12, 2.5], ["new", 14, 0.5]]
    me = tmp_path / "me"
    me.mkdir()
    (me / "status").write_text("Name:\tx\nvoluntary_ctxt_switches:\t7\n"
                               "nonvoluntary_ctxt_switches:\t2\n")
    (me / "stat").write_text(f"11 (pt main) {rest}\n")
    assert main_thread_counters(str(me)) == (7, 2, 5)
    assert main_thread_counters(str(tmp_path / "absent")) is None
