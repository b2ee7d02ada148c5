"""A rendezvous port for torchrun's c10d store: free now, and unlikely to be taken before torchrun
binds it."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]

_PORT_FLOOR = 20000
"""Lowest rendezvous port tried: above the well-known and most registered service ports."""
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_range(default: tuple[int, int] = (32768, 60999)) -> tuple[int, int]:
    try:
        low, high = (int(x) for x in _EPHEMERAL_RANGE.read_text().split()[:2])
    except (OSError, ValueError):
        return default
    return low, high


def _rendezvous_ranges() -> list[tuple[int, int]]:
    """Port ranges outside the ephemeral range: below it (from 20000), else above it."""
    low, high = _ephemeral_range()
    ranges = [(_PORT_FLOOR, low)] if low - _PORT_FLOOR > 1 else []
    if high < 65535:
        ranges.append((high + 1, 65536))
    return ranges


def _bindable(host: str, port: int) -> bool:
    # TCPStore listens on every address, so check the wildcard address (with SO_REUSEADDR, as
    # TCPStore sets it), not only `host`: a listener on another local address would block it.
    for address in ("", host):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address, port))
            except OSError:
                return False
    return True


def free_port(host: str = "127.0.0.1", *, rng: random.Random | None = None,
              attempts: int = 64) -> int:
    """A TCP port free now on `host` for the rendezvous, outside the kernel's ephemeral range.

    A port from the ephemeral range (what binding port 0 returns) is also what the kernel hands
    out as the source port of any outgoing connection, so it can be taken between this check
    and torchrun's bind. Seen on 4 x H200: torchrun found its store port taken, waited 60 s as
    a client of nobody, and the trial ended as a TIMEOUT. A random port outside the range is
    only ever taken by an explicit bind; random, so several autotune workers rarely collide.
    """
    rng = rng or random.Random()
    ranges = _rendezvous_ranges()
    for _ in range(attempts if ranges else 0):
        lo, hi = rng.choice(ranges)
        port = rng.randrange(lo, hi)
        if _bindable(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        fallback: int = sock.getsockname()[1]
        return fallback
