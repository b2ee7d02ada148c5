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

import contextlib
import gc
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GcPauses", "HostMark", "HostWatch", "gc_held", "main_thread_counters", "steal_ticks",
           "thread_table"]


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


def _stat_fields(text: str) -> tuple[str, list[str]] | None:
    """A /proc/<pid>/task/<tid>/stat line: the thread's name (comm, which may hold spaces and
    parentheses) and the fields after it (state first: field 3 of proc(5) is [0])."""
    left, right = text.find("("), text.rfind(")")
    if left < 0 or right < left:
        return None
    return text[left + 1:right], text[right + 2:].split()


def thread_table(task_dir: str = "/proc/self/task") -> dict[int, tuple[str, float]]:
    """Every thread of this process now: tid -> (name, CPU seconds so far: user + system);
    {} off Linux. One read of each thread's stat file (tens of microseconds each), taken
    between steps, never inside one."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"{task_dir}/{tid}/stat") as f:
                parsed = _stat_fields(f.read())
        except OSError:  # the thread ended meanwhile
            continue
        if parsed is None or not tid.isdigit():
            continue
        name, rest = parsed
        try:
            # proc(5): utime and stime are fields 14 and 15; rest[0] is field 3.
            out[int(tid)] = (name, (int(rest[11]) + int(rest[12])) / tick)
        except (IndexError, ValueError):
            continue
    return out


def main_thread_counters(thread_dir: str = "/proc/thread-self") -> tuple[int, int, int] | None:
    """The calling thread's voluntary and involuntary context switches so far, and the CPU it
    last ran on; None off Linux. Involuntary switches are the scheduler taking the core away
    (another thread or process wanted it): a host-bound step's main thread should see few."""
    try:
        with open(f"{thread_dir}/status") as f:
            status = f.read()
        with open(f"{thread_dir}/stat") as f:
            parsed = _stat_fields(f.read())
    except OSError:
        return None
    counts = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
            counts[key] = int(value.split()[0])
    if parsed is None or len(counts) < 2:
        return None
    try:
        processor = int(parsed[1][36])  # proc(5) field 39
    except (IndexError, ValueError):
        processor = -1
    return counts["voluntary_ctxt_switches"], counts["nonvoluntary_ctxt_switches"], processor


def _cpu_used(a: dict[int, tuple[str, float]], b: dict[int, tuple[str, float]],
              skip: int | None) -> list[tuple[float, str, int]]:
    """(CPU seconds, name, tid) of each thread that used CPU between two thread_table()
    snapshots, `skip` left out. A thread born in between counts from zero; one that ended in
    between is not seen."""
    rows = [(cpu - a.get(tid, (name, 0.0))[1], name, tid) for tid, (name, cpu) in b.items()
            if tid != skip]
    return [row for row in rows if row[0] > 0]


def busy_threads(a: dict[int, tuple[str, float]], b: dict[int, tuple[str, float]],
                 skip: int | None = None, top: int = 8) -> list[list[Any]]:
    """The threads that used CPU between two thread_table() snapshots, the busiest first:
    [name, tid, CPU seconds]; `skip` (the main thread) left out (_cpu_used)."""
    rows = sorted(((round(used, 3), name, tid) for used, name, tid in _cpu_used(a, b, skip)),
                  key=lambda r: -r[0])
    return [[name, tid, used] for used, name, tid in rows[:top]]


def thread_names(table: dict[int, tuple[str, float]]) -> dict[str, int]:
    """How many threads carry each name (NCCL's, torch's watchdogs, pt_autograd_*, ...)."""
    names: dict[str, int] = {}
    for name, _ in table.values():
        names[name] = names.get(name, 0) + 1
    return dict(sorted(names.items()))


@dataclass(frozen=True)
class HostMark:
    """The host's clocks at one instant."""

    wall_s: float
    cpu_s: float
    """This process's CPU time so far (all its threads)."""
    steal_ticks: int | None
    main_cpu_s: float = 0.0
    """The marking (main, kernel-issuing) thread's own CPU time so far."""
    main: tuple[int, int, int] | None = None
    """main_thread_counters(): voluntary and involuntary context switches, last CPU."""
    tasks: dict[int, tuple[str, float]] = field(default_factory=dict)
    """thread_table(): every thread's name and CPU seconds."""


@dataclass
class HostWatch:
    """Marks taken at each step's start and at the end (cheap reads: the process's CPU clock
    and /proc/stat's first line); `over(i)` gives the host's figures from step i to the end."""

    marks: list[HostMark] = field(default_factory=list)

    def mark(self) -> None:
        """The clocks first (the step's own figures), then the per-thread reads (a millisecond
        with ~60 threads): taken before a step's clock starts, so never inside a timed step."""
        wall, cpu, main_cpu = time.perf_counter(), time.process_time(), time.thread_time()
        self.marks.append(HostMark(wall, cpu, steal_ticks(), main_cpu, main_thread_counters(),
                                   thread_table()))

    def over(self, first: int) -> dict[str, Any]:
        """From mark `first` to the last: wall and CPU seconds of this process, the machine's
        steal seconds (all CPUs together; None off Linux) and this process's threads now; the
        main thread's own CPU seconds and context switches, the CPUs it may run on, and the
        other threads that used CPU meanwhile (issue 30: does a warm rank carry busy threads,
        or lose its core, where a cold one does not?)."""
        a, b = self.marks[first], self.marks[-1]
        steal = None
        if a.steal_ticks is not None and b.steal_ticks is not None:
            steal = (b.steal_ticks - a.steal_ticks) / os.sysconf("SC_CLK_TCK")
        out: dict[str, Any] = {"wall_s": b.wall_s - a.wall_s, "cpu_s": b.cpu_s - a.cpu_s,
                               "steal_s": steal, "threads": _threads(),
                               "main_cpu_s": b.main_cpu_s - a.main_cpu_s}
        if a.main is not None and b.main is not None:
            out.update(main_ctx_voluntary=b.main[0] - a.main[0],
                       main_ctx_involuntary=b.main[1] - a.main[1], main_last_cpu=b.main[2])
        if b.tasks:
            main_tid = threading.get_native_id()
            out["busy_threads"] = busy_threads(a.tasks, b.tasks, skip=main_tid)
            out["other_threads_cpu_s"] = round(
                sum(used for used, _, _ in _cpu_used(a.tasks, b.tasks, main_tid)), 3)
            out["thread_names"] = thread_names(b.tasks)
        with contextlib.suppress(AttributeError, OSError):
            out["cpus_allowed"] = len(os.sched_getaffinity(0))
        return out
