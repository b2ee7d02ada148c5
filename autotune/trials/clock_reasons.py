"""NVML's clock event reasons by the names autotune's records keep: the one table the worker,
the orchestrator and the GPU tools (tools/gemm_sweep.py) share. Standard library only, so that a
tool can import it on a GPU machine with nothing installed."""

from __future__ import annotations

__all__ = ["THROTTLE_REASONS", "THROTTLING", "reason_names"]

THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle", 0x2: "app_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
    0x100: "display_clocks"}
"""NVML's clock event reasons (nvmlDeviceGetCurrentClocksEventReasons, formerly
ThrottleReasons; nvml.h's nvmlClocksEventReason* bits) by the names a record keeps. The worker
writes the names, the orchestrator reads them: both sides spell them here."""
THROTTLING = frozenset({"hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})
"""The reasons that slow a busy GPU below the clocks it holds in sustained training (heat, a
hardware slowdown or power brake). `sw_power_cap` is recorded but is not throttling: an H100 at
its 700 W limit runs heavy GEMMs at 1560-1950 MHz under it in every long run (measured on
2026-11-25 in every gpt2-xl trial of micro-batch 8 and up, the search's winners among them), so a
trial capped by power measures what training sustains. An idle GPU, application clocks or sync
boost are settings."""


def reason_names(mask: int) -> tuple[str, ...]:
    """The names of the bits set in an NVML clock event reason mask (unknown bits as hex)."""
    known = tuple(name for bit, name in THROTTLE_REASONS.items() if mask & bit)
    rest = mask & ~sum(THROTTLE_REASONS)
    return (*known, f"0x{rest:x}") if rest else known
