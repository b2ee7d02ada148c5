"""Test double of a worker that hangs (a collective that never completes): sleeps forever."""

from __future__ import annotations

import time

print("waiting for a collective that never completes", flush=True)
while True:
    time.sleep(3600)
