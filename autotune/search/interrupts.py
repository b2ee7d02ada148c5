"""Ctrl-C between the writes that belong together.

A search writes its study in steps that must not be split: a trial is asked for and held (or
failed), a record and its state are told together, a plan's trials are inserted in one
transaction. A SIGINT that arrives inside `deferred_interrupts()` is held until the block ends and
then delivered as it would have been (KeyboardInterrupt, with Python's default handler), so a
Ctrl-C lands between steps, never inside one. Keep the blocks short: Ctrl-C waits for them.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["deferred_interrupts"]


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold SIGINT while the block runs; deliver it when the block ends (see the module).

    Outside the main thread (where Python runs signal handlers) this does nothing; nested
    blocks deliver to the outer one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None or previous == signal.SIG_IGN:  # not Python's, or ignored anyway
        yield
        return
    held: list[tuple[int, FrameType | None]] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append((signum, frame))

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            if callable(previous):
                previous(*held[0])  # Python's default handler raises KeyboardInterrupt
            else:  # SIG_DFL: the default action, now
                signal.raise_signal(signal.SIGINT)
