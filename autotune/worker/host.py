"""What the host does while a trial's steps run: garbage collection held off, and the host's own
figures on record (CPU time, steal time, GC pauses, threads) for the repeatability check.

Python's cyclic garbage collector runs whenever enough objects were allocated, and a pass over
the heap stalls the thread that issues the GPU's kernels; a warm pool rank also carries every
earlier trial's objects, so its passes are longer than a cold process's. Megatron-LM offers the
same cure as `--manual-gc` (megatron/training/training.py: gc.disable() for the run, gc.collect()
only every --manual-gc-interval iterations): here `gc_held` collects and freezes what the build
made (gc.freeze moves it to the permanent generation, never scanned again), disables the
collector for the steps, and collects once they are done. Without --manual-gc Megatron-LM leaves
the collector on; what a trial measures of a layout (its kernels, its syncs) does not change, only
the host's stalls between them, which are the noise the search cannot tell from a slower layout.

`HostWatch` reads /proc (Linux) and the process's CPU clock at each step's start: cheap reads
(tens of microseconds), from which the timed steps' share is taken once timing has ended.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GcPauses", "HostMark", "HostWatch", "gc_held", "steal_ticks"]


@dataclass
class GcPauses:
    """The collector's passes while installed in gc.callbacks: how many, and their seconds."""

    count: int = 0
    total_s: float = 0.0
    longest_s: float = 0.0
    passes: list[tuple[float, float]] = field(default_factory=list)
    """Each pass's start (time.perf_counter) and seconds: which steps it fell in. Passes in the
    warm-up (first steps: lazy initialisation, compiles) leave the trial's figure alone; only
    the timed steps' ones are noise in it. 2 x H200, 2026-11-27: 0-6 passes per trial with the
    collector off, not known in which steps before this split."""
    _began: float | None = None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif phase == "stop" and self._began is not None:
            pause = time.perf_counter() - self._began
            self.count += 1
            self.total_s += pause
            self.longest_s = max(self.longest_s, pause)
            self.passes.append((self._began, pause))
            self._began = None

    def since(self, start: float) -> tuple[int, float]:
        """The passes that began at or after `start` (a perf_counter time): count, seconds."""
        mine = [s for began, s in self.passes if began >= start]
        return len(mine), sum(mine)


@contextmanager
def gc_held(pauses: GcPauses | None = None) -> Iterator[GcPauses]:
    """Collect and freeze what exists, run the block with the collector off (the module), then
    unfreeze and collect: a warm rank gives back what the trial left. `pauses` counts every pass
    meanwhile (explicit ones included; with the collector off there should be none)."""
    pauses = pauses if pauses is not None else GcPauses()
    gc.collect()
    gc.freeze()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.callbacks.append(pauses)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(pauses)
        if was_enabled:
            gc.enable()
        gc.unfreeze()
        gc.collect()


def steal_ticks(stat_text: str | None = None) -> int | None:
    """The machine's steal time so far, in clock ticks (/proc/stat's `cpu` line, 8th value:
    time a hypervisor ran another guest while this one had work); None off Linux."""
    if stat_text is None:
        try:
            with open("/proc/stat") as f:
                stat_text = f.readline()
        except OSError:
            return None
    fields = stat_text.split()
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    return int(fields[8])


def _threads() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return threading.active_count()


@dataclass(frozen=True, slots=True)
class HostMark:
    """The host's clocks at one instant."""

    wall_s: float
    cpu_s: float
    """This process's CPU time so far (all its threads)."""
    steal_ticks: int | None


@dataclass
class HostWatch:
    """Marks taken at each step's start and at the end (cheap reads: the process's CPU clock
    and /proc/stat's first line); `over(i)` gives the host's figures from step i to the end."""

    marks: list[HostMark] = field(default_factory=list)

    def mark(self) -> None:
        self.marks.append(HostMark(time.perf_counter(), time.process_time(), steal_ticks()))

    def over(self, first: int) -> dict[str, Any]:
        """From mark `first` to the last: wall and CPU seconds of this process, the machine's
        steal seconds (all CPUs together; None off Linux) and this process's threads now."""
        a, b = self.marks[first], self.marks[-1]
        steal = None
        if a.steal_ticks is not None and b.steal_ticks is not None:
            steal = (b.steal_ticks - a.steal_ticks) / os.sysconf("SC_CLK_TCK")
        return {"wall_s": b.wall_s - a.wall_s, "cpu_s": b.cpu_s - a.cpu_s, "steal_s": steal,
                "threads": _threads()}
