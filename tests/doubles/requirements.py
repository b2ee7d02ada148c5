"""What a test that builds megatron-core modules on CPU needs installed."""

from __future__ import annotations

import importlib.util
import os

import pytest


def require_torch_and_megatron_core() -> None:
    """Skip without torch or megatron-core, except in CI (CI=true), which installs both: there a
    missing one is a failure, so that a broken install cannot pass as skipped tests."""
    for module in ("torch", "megatron.core"):
        if importlib.util.find_spec(module) is None:
            if os.environ.get("CI"):
                raise AssertionError(f"CI installs {module}")
            pytest.skip(f"needs {module}")
