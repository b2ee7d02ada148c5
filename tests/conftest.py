"""Shared fixtures: GPU detection for the `gpu` marker, and small model/cluster builders."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from autotune.hardware import ClusterSpec, gpu_spec


def _has_cuda() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        probe = subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=10)
        return probe.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


HAS_CUDA = _has_cuda()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)


def cluster(num_gpus: int, gpus_per_node: int | None = None,
            gpu: str = "h100-80gb") -> ClusterSpec:
    """A cluster of a known GPU type (never the local one, so tests do not depend on it)."""
    per_node = gpus_per_node if gpus_per_node is not None else min(8, num_gpus)
    return ClusterSpec(num_gpus=num_gpus, gpus_per_node=per_node, gpu=gpu_spec(gpu))
