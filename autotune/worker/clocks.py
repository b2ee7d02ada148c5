"""The GPU's clocks on record: NVML sampled in a background thread while a trial's steps run.

A figure measured while the GPU held lower clocks (power cap, heat, a hardware slowdown) is not
the layout's: issue 25 saw Megatron-LM's later iterations run 3-8% slower than its first ones,
and nothing recorded the clocks. Each rank samples its own GPU every CLOCK_SAMPLE_S: SM and
memory clocks, power, temperature, utilization and the clock event reasons (NVML's
nvmlDeviceGetCurrentClocksEventReasons, called ThrottleReasons before CUDA 12.2's NVML). The
trial keeps the samples of its timed steps only (`ClockSampler.summary(since=...)`).

This is the worker's one module that imports pynvml (autotune.specs.hardware is the
orchestrator's): the clocks, and the device memory a rank's result reports
(`nvml_device_used_bytes`). Without pynvml or an NVIDIA driver the sampler samples nothing and the
trial's clocks are None: CPU tests and machines without NVML run as before. One NVML query costs
tens of microseconds of a thread that sleeps in between, so sampling takes nothing measurable from
the host.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from autotune.trials.clock_reasons import reason_names
from autotune.trials.trial import ClockSummary, Spread

__all__ = ["CLOCK_SAMPLE_S", "ClockSample", "ClockSampler", "device_handle", "load_nvml",
           "nvml_device_used_bytes", "reason_names"]

CLOCK_SAMPLE_S = 0.1
"""Seconds between samples: several per step of even the fastest layouts (steps of 0.3 s and
more), few enough that the thread never competes with the trial's host work."""


@dataclass(frozen=True, slots=True)
class ClockSample:
    """One NVML reading of one GPU (None: NVML could not read that quantity)."""

    at: float
    """time.perf_counter() when it was taken (the clock the trial's steps are timed with)."""
    sm_mhz: float | None
    mem_mhz: float | None
    power_w: float | None
    temperature_c: float | None
    utilization: float | None
    reasons: int | None
    """The clock event reasons' bit mask."""


def load_nvml() -> ModuleType | None:
    """pynvml, initialised; None without it or without a driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError and its many subclasses: no driver, no GPU
        return None
    module: ModuleType = pynvml
    return module


def device_handle(nvml: ModuleType, device_index: int) -> Any:
    """NVML's handle of CUDA device `device_index`, found by UUID so that CUDA_VISIBLE_DEVICES
    remapping does not matter (by index where torch cannot say the UUID)."""
    uuid = ""
    with contextlib.suppress(Exception):
        import torch

        uuid = str(getattr(torch.cuda.get_device_properties(device_index), "uuid", ""))
    if uuid:
        return nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    return nvml.nvmlDeviceGetHandleByIndex(device_index)


def nvml_device_used_bytes(device_index: int) -> int | None:
    """Memory in use on this rank's GPU as NVML sees it (all processes, CUDA context included)."""
    nvml = load_nvml()
    if nvml is None:
        return None
    try:
        return int(nvml.nvmlDeviceGetMemoryInfo(device_handle(nvml, device_index)).used)
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _read(nvml: ModuleType, handle: Any) -> ClockSample:
    def get(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception:  # a quantity this GPU or driver does not report
            return None

    reasons_call = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    power_mw = get(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
    util = get(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    return ClockSample(
        at=time.perf_counter(),
        sm_mhz=get(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
        mem_mhz=get(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)),
        power_w=None if power_mw is None else power_mw / 1000.0,
        temperature_c=get(lambda: nvml.nvmlDeviceGetTemperature(handle,
                                                                nvml.NVML_TEMPERATURE_GPU)),
        utilization=None if util is None else util.gpu / 100.0,
        reasons=get(lambda: int(reasons_call(handle))))


@dataclass
class ClockSampler:
    """Samples GPU `index` every `period_s` between start() and stop() (a context manager).

    `nvml` is the pynvml module (load_nvml(); tests give a fake); None samples nothing."""

    index: int
    nvml: ModuleType | None = None
    period_s: float = CLOCK_SAMPLE_S
    samples: list[ClockSample] = field(default_factory=list)
    owns_nvml: bool = False
    """Whether stop() shuts NVML down (for_device initialised it)."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @classmethod
    def for_device(cls, index: int) -> ClockSampler:
        """A sampler of CUDA device `index` with NVML loaded here (nothing sampled without)."""
        nvml = load_nvml()
        return cls(index, nvml, owns_nvml=nvml is not None)

    def start(self) -> ClockSampler:
        if self.nvml is None:
            return self
        try:
            handle = device_handle(self.nvml, self.index)
        except Exception:
            return self
        self._stop.clear()
        # A daemon: a trial that fails in its steps never waits for the sampler to exit.
        self._thread = threading.Thread(target=self._loop, args=(handle,), daemon=True,
                                        name="autotune-clocks")
        self._thread.start()
        return self

    def _loop(self, handle: Any) -> None:
        assert self.nvml is not None
        while True:
            with contextlib.suppress(Exception):
                self.samples.append(_read(self.nvml, handle))
            if self._stop.wait(self.period_s):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.period_s + 1.0)
            self._thread = None
        if self.owns_nvml and self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()
            self.owns_nvml = False

    def __enter__(self) -> ClockSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def summary(self, since: float | None = None) -> ClockSummary:
        """The samples taken at or after `since` (perf_counter; None: all), summarised."""
        taken = [s for s in self.samples if since is None or s.at >= since]

        def spread(name: str) -> Spread | None:
            return Spread.of([v for s in taken if (v := getattr(s, name)) is not None])

        masks = [s.reasons for s in taken if s.reasons is not None]
        union = 0
        for mask in masks:
            union |= mask
        return ClockSummary(samples=len(taken), sm_mhz=spread("sm_mhz"),
                            mem_mhz=spread("mem_mhz"), power_w=spread("power_w"),
                            temperature_c=spread("temperature_c"),
                            utilization=spread("utilization"),
                            reasons=tuple(sorted(reason_names(union))))
