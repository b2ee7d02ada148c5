"""Test double of a worker that crashes: an uncaught exception, exit code 1, a traceback."""

from __future__ import annotations


def build_model() -> None:
    raise RuntimeError("shape mismatch in the test double")


print("building the model", flush=True)
build_model()
