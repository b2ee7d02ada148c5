"""What passes between the search, the runner and the worker: a trial's spec and its metrics.

Both travel as JSON files (trial.json in, result.json out) so the worker process, the only one
that imports torch, shares nothing with the orchestrator but these shapes.
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError
from autotune.inputs.bounds import Bytes, NonNegative, NonNegativeInt, Positive, Text
from autotune.inputs.documents import parse_json
from autotune.inputs.files import read_text
from autotune.inputs.untrusted import shown
from autotune.layouts.layout import DIMENSIONS, Layout
from autotune.specs.model import ModelSpec, model_from_mapping
from autotune.trials.clock_reasons import THROTTLE_REASONS, THROTTLING

__all__ = ["DEFAULT_STABLE_CV", "THROTTLE_REASONS", "THROTTLING", "ClockSummary", "RankResult",
           "Spread", "StopReason", "TrialMetrics", "TrialSpec", "TrialStatus"]

DEFAULT_STABLE_CV = 0.01
"""A search's TrialSpec.stable_cv unless told otherwise (SearchConfig.stable_cv, --stable-cv):
timing ends once the mean step time is known to within 1% (issue 15)."""


class TrialStatus(enum.StrEnum):
    """How a trial ended. Expected outcomes (OOM, timeout) are data, not exceptions."""

    OK = "OK"
    OOM = "OOM"
    TIMEOUT = "TIMEOUT"
    CRASH = "CRASH"
    NCCL_ERROR = "NCCL_ERROR"
    DIVERGED = "DIVERGED"
    """Ran, but its loss left its bf16 twin's on the same data by more than the FP8 loss
    guard's tolerance (autotune.search.loss_guard): failed, its reason holding the numbers,
    never the best."""
    PREDICTED_OOM = "PREDICTED_OOM"
    PREDICTED_SLOW = "PREDICTED_SLOW"
    """Not launched: even its optimistic prediction (the model's error band added) is below
    the best measured tokens/s (autotune.search.stop_rule; told PRUNED, as PREDICTED_OOM)."""
    INVALID = "INVALID"
    DUPLICATE = "DUPLICATE"
    """Not launched: another worker of a shared study was running the same layout (told FAIL,
    and queued again in case that worker dies)."""
    INTERRUPTED = "INTERRUPTED"
    """Stopped by Ctrl-C while it ran (told FAIL; --resume runs it again)."""


class StopReason(enum.StrEnum):
    """Why a measured trial stopped timing (TrialMetrics.stop_reason)."""

    FIXED = "fixed"
    """It ran its fixed number of timed steps (TrialSpec.stable_cv 0)."""
    STABLE = "stable"
    """The step time was stable (TrialSpec.stable_cv) before the most steps allowed."""
    MAX_STEPS = "max-steps"
    """It ran the most timed steps allowed without the step time becoming stable."""
    SLOW = "slow"
    """Pruned slow: its measured steps showed it could not reach
    TrialSpec.slow_below_tokens_per_s."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialSpec:
    """Everything a worker needs to run one trial."""

    model: ModelSpec
    layout: Layout
    train_steps: int = 10
    """Timed training steps after warm-up: exactly these when stable_cv is 0, else at most
    these (timing ends once the step time is stable)."""
    warmup_steps: int = 3
    """Untimed warm-up steps: exactly these when stable_cv is 0, else at most these (warm-up
    ends once the step time stops falling)."""
    stable_cv: float = 0.0
    """Timing ends once the mean of the last timed steps is known to within this fraction
    (their relative standard error, autotune.worker.timing); 0: fixed step counts."""
    slow_below_tokens_per_s: float | None = None
    """Stop timing, pruned slow, once the measured steps show the trial cannot reach this."""
    min_steps: int = 0
    """The fewest steps, warm-up included, before the step time may be called stable
    (autotune.worker.timing): what reads the trial's losses may need a longer series than its
    timing (autotune.search.loss_guard.GUARD_STEPS). A trial pruned slow stops at its own
    count."""
    seed: int = 1234
    gpu_peak_bf16_flops: float = 989e12
    """Peak of the GPU the trial runs on, for MFU."""
    gpu_name: str | None = None
    """The GPU table entry the trial was planned for (autotune calibrate reads it back)."""

    def to_json(self) -> str:
        # The layout's key is "strategy": trial.json is the worker's wire format and the key
        # predates the name; from_json reads the same key, so old trial.json files still load.
        return json.dumps({"model": asdict(self.model), "strategy": asdict(self.layout),
                           "train_steps": self.train_steps, "warmup_steps": self.warmup_steps,
                           "seed": self.seed, "gpu_peak_bf16_flops": self.gpu_peak_bf16_flops,
                           "gpu_name": self.gpu_name, "stable_cv": self.stable_cv,
                           "slow_below_tokens_per_s": self.slow_below_tokens_per_s,
                           "min_steps": self.min_steps},
                          indent=2)

    @classmethod
    def from_json(cls, text: str, source: str = "trial spec") -> TrialSpec:
        """The spec in trial.json's text, every value checked (one ConfigError line)."""
        data = parse_json(text, source)
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object")
        missing = [k for k in ("model", "strategy", "train_steps", "warmup_steps", "seed",
                               "gpu_peak_bf16_flops") if k not in data]
        if missing:
            raise ConfigError(f"malformed trial spec {source}: no {', '.join(missing)}")
        stored = data["strategy"]
        if not isinstance(stored, dict) or set(stored) - set(DIMENSIONS):
            raise ConfigError(f"{source}: strategy must be a mapping of layout fields")
        for key, value in stored.items():
            problem = DIMENSIONS[key].check(value)
            if problem is not None:
                raise ConfigError(f"{source}: strategy.{key} must be {problem}, got "
                                  f"{shown(value)}")
        gpu_name = data.get("gpu_name")
        if gpu_name is not None and not isinstance(gpu_name, str):
            raise ConfigError(f"{source}: gpu_name must be a string, got {shown(gpu_name)}")
        slow = data.get("slow_below_tokens_per_s")
        try:
            return cls(model=model_from_mapping(data["model"], f"{source}: model"),
                       layout=Layout(**stored),
                       train_steps=_whole(data, "train_steps", source),
                       warmup_steps=_whole(data, "warmup_steps", source, low=0),
                       seed=_whole(data, "seed", source, low=0),
                       gpu_peak_bf16_flops=_real(data["gpu_peak_bf16_flops"],
                                                 "gpu_peak_bf16_flops", source),
                       gpu_name=gpu_name,
                       stable_cv=_real(data.get("stable_cv", 0.0), "stable_cv", source, low=0),
                       slow_below_tokens_per_s=None if slow is None else _real(
                           slow, "slow_below_tokens_per_s", source, low=0),
                       # Written since the timing's early window; older specs have none.
                       min_steps=(_whole(data, "min_steps", source, low=0)
                                  if "min_steps" in data else 0))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"malformed trial spec {source}: {exc}") from exc

    @classmethod
    def read(cls, path: Path) -> TrialSpec:
        """The spec of a trial.json file (autotune.inputs: a regular file, bounded, checked)."""
        return cls.from_json(read_text(path, "trial spec"), str(path))

    def write(self, path: Path) -> None:
        path.write_text(self.to_json())


def _whole(data: dict[str, Any], key: str, source: str, low: int = 1) -> int:
    value = data[key]
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < 2**63:
        raise ConfigError(f"{source}: {key} must be an integer of at least {low}, got "
                          f"{shown(value)}")
    return value


def _real(value: Any, key: str, source: str, low: float = 1e-300) -> float:
    # parse_json has refused NaN and Infinity already; a number below `low` is refused here.
    if not isinstance(value, int | float) or isinstance(value, bool) or not low <= value:
        raise ConfigError(f"{source}: {key} must be a number of at least {low:g}, got "
                          f"{shown(value)}")
    return float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class RankResult:
    """One rank's measurements."""

    rank: NonNegativeInt
    peak_allocated_bytes: Bytes
    peak_reserved_bytes: Bytes
    device_used_bytes: Bytes | None = None
    """Device memory in use as NVML reports it (includes the CUDA context and NCCL)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Spread:
    """min, median and max of one quantity sampled during a trial's timed steps."""

    min: float
    median: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> Spread | None:
        if not values:
            return None
        ordered = sorted(values)
        mid = len(ordered) // 2
        median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
        return cls(min=ordered[0], median=median, max=ordered[-1])

    @classmethod
    def merge(cls, spreads: list[Spread]) -> Spread | None:
        """Over ranks: the lowest min, the median of medians, the highest max."""
        if not spreads:
            return None
        middle = cls.of([s.median for s in spreads])
        assert middle is not None
        return cls(min=min(s.min for s in spreads), median=middle.median,
                   max=max(s.max for s in spreads))


@dataclass(frozen=True, slots=True, kw_only=True)
class ClockSummary:
    """What NVML said about the GPUs during a trial's timed steps (autotune.worker.clocks
    samples it every CLOCK_SAMPLE_S), over every rank's GPU."""

    samples: NonNegativeInt
    sm_mhz: Spread | None = None
    mem_mhz: Spread | None = None
    power_w: Spread | None = None
    temperature_c: Spread | None = None
    utilization: Spread | None = None
    """NVML's GPU utilization (0-1): the fraction of each sample period a kernel ran; below 1,
    the GPU waited for the host."""
    reasons: tuple[Text, ...] = ()
    """The union of the clock event reasons seen (THROTTLE_REASONS' names), sorted."""

    @property
    def throttled(self) -> bool:
        """A reason in THROTTLING was seen: the figure may be below what the layout does."""
        return bool(THROTTLING.intersection(self.reasons))

    def describe(self) -> str:
        """`sm 1755-1980 MHz, 640-700 W, 61-74 C, throttled: sw_power_cap`."""
        parts = []
        if self.sm_mhz:
            parts.append(f"sm {self.sm_mhz.min:.0f}-{self.sm_mhz.max:.0f} MHz")
        if self.power_w:
            parts.append(f"{self.power_w.min:.0f}-{self.power_w.max:.0f} W")
        if self.temperature_c:
            parts.append(f"{self.temperature_c.min:.0f}-{self.temperature_c.max:.0f} C")
        throttling = sorted(THROTTLING.intersection(self.reasons))
        if throttling:
            parts.append("throttled: " + "+".join(throttling))
        return ", ".join(parts) or f"{self.samples} samples"

    @classmethod
    def merge(cls, summaries: list[ClockSummary]) -> ClockSummary | None:
        """Over ranks (each samples its own GPU); None when no rank could sample."""
        got = [c for c in summaries if c.samples]
        if not got:
            return None

        def spread(name: str) -> Spread | None:
            return Spread.merge([v for c in got if (v := getattr(c, name)) is not None])

        return cls(samples=sum(c.samples for c in got), sm_mhz=spread("sm_mhz"),
                   mem_mhz=spread("mem_mhz"), power_w=spread("power_w"),
                   temperature_c=spread("temperature_c"), utilization=spread("utilization"),
                   reasons=tuple(sorted({r for c in got for r in c.reasons})))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClockSummary:
        spreads = {k: Spread(**v) for k in ("sm_mhz", "mem_mhz", "power_w", "temperature_c",
                                            "utilization")
                   if isinstance(v := data.get(k), dict)}
        return cls(samples=int(data.get("samples", 0)), **spreads,
                   reasons=tuple(str(r) for r in data.get("reasons", ())))


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialMetrics:
    """The outcome of a trial, measured or predicted."""

    status: TrialStatus
    step_time_s: Positive | None = None
    """Median step time over the timed steps."""
    step_time_p90_s: Positive | None = None
    tokens_per_s: Positive | None = None
    """Whole-job throughput: gbs * seq_length / step time."""
    tflops_per_gpu: NonNegative | None = None
    mfu: NonNegative | None = None
    peak_allocated_bytes: Bytes | None = None
    """Largest peak allocated over ranks."""
    peak_reserved_bytes: Bytes | None = None
    device_used_bytes: Bytes | None = None
    loss_finite: bool | None = None
    ranks: tuple[RankResult, ...] = field(default_factory=tuple)
    error: Text | None = None
    """Last lines of the log or the exception, for failed trials."""
    wall_time_s: NonNegative | None = None
    """Seconds from launch to exit, launch overhead included."""
    predicted: bool = False
    """True when the figures come from the analytical models, not a run."""
    timed_steps: NonNegativeInt | None = None
    """How many steps were timed (the median is over them)."""
    warmup_s: NonNegative | None = None
    """Seconds of untimed warm-up steps."""
    timed_s: NonNegative | None = None
    """Seconds of timed steps (their sum)."""
    stop_reason: StopReason | None = None
    """Why timing ended; None for predictions and failures."""
    warm: bool | None = None
    """True when the trial ran in a warm worker pool, False in a launch of its own."""
    launch_failed: bool = False
    """True when no rank ever started (torchrun's rendezvous failed): a CRASH that says
    nothing about the layout, so a search launches it once more."""
    step_time_cv: NonNegative | None = None
    """The timed steps' relative standard deviation (pstdev / mean): the trial's own noise,
    which the search tells apart from the model's error (autotune.search.stop_rule)."""
    clocks: ClockSummary | None = None
    """NVML's clocks, power, temperature and clock event reasons during the timed steps; None
    where NVML could not be read (no GPU, no pynvml) and for predictions."""
    losses: tuple[float | None, ...] = ()
    """The mean per-token loss of every step, warm-up and timed, in order (None: not finite):
    what the FP8 loss guard compares with a bf16 twin's (autotune.search.loss_guard). Empty for
    predictions and for results written before it was recorded."""

    @property
    def noise(self) -> float:
        """The figure's relative noise: the timed steps' spread (0 where not measured)."""
        return self.step_time_cv or 0.0

    @property
    def throttled(self) -> bool:
        return self.clocks is not None and self.clocks.throttled

    @property
    def peak_bytes(self) -> int | None:
        """Peak memory per GPU: reserved (what the allocator holds, what an OOM is about), else
        allocated where reserved was not measured. The one place that chooses between them."""
        return self.peak_reserved_bytes or self.peak_allocated_bytes

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        data["stop_reason"] = None if self.stop_reason is None else self.stop_reason.value
        data["clocks"] = None if self.clocks is None else self.clocks.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: object, source: str = "trial result") -> TrialMetrics:
        """The metrics of a result.json (or a stored record's) mapping, every value checked
        (autotune.inputs.schema: finite, in range, of its type), or ConfigError in one line.
        Keys this version does not know (a later version's) are left out."""
        from autotune.inputs.schema import build

        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a mapping of result fields, got "
                              f"{type(data).__name__}")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        return build(cls, values, source, what="result")

    @classmethod
    def read(cls, path: Path) -> TrialMetrics:
        """The metrics of a result.json file (a regular file, bounded, checked)."""
        return cls.from_dict(parse_json(read_text(path, "trial result"), str(path)), str(path))
