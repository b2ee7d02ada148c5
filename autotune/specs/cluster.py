"""A cluster file (`--cluster FILE`, YAML): the GPU type, GPUs per node, links and host memory.

    gpu: h100-80gb            # a type of autotune.specs.hardware.GPUS
    gpus_per_node: 8
    nvlink_gb_per_s: 450      # NVLink bandwidth per GPU, one direction, GB/s
    inter_node_gbit_per_s: 400  # network per GPU (one NIC each), one direction, Gb/s
    host_memory_gib: 2048     # host memory per node

The links replace the GPU table's in the cost model (its inter-node bandwidth is otherwise a
fixed 50 GB/s per GPU). Examples: search_spaces/clusters/. A bad file is one line and exit 2.
This module reads the file; autotune.specs.hardware (`ClusterSpec.make`) looks its GPU up in the
table and gives it the file's links.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import ConfigError

__all__ = ["ClusterFile", "is_cluster_file", "load_cluster_file"]

_REQUIRED = ("gpu", "gpus_per_node", "nvlink_gb_per_s", "inter_node_gbit_per_s")
_OPTIONAL = ("host_memory_gib", "name", "note")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterFile:
    gpu: str
    """A GPU type of the table (autotune.specs.hardware.GPUS)."""
    gpus_per_node: int
    intra_node_bytes_per_s: float
    """NVLink bandwidth per GPU, one direction."""
    inter_node_bytes_per_s: float
    """Network bandwidth per GPU, one direction."""
    host_memory_bytes: float | None


def is_cluster_file(value: str) -> bool:
    return value.endswith((".yaml", ".yml"))


def _positive(path: Path, key: str, value: Any, *, integer: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value) and value > 0 and (not integer or isinstance(value, int))
    if not ok:
        kind = "a positive integer" if integer else "a positive finite number"
        raise ConfigError(f"cluster file {path}: {key} must be {kind}, got {value!r}")
    return float(value)


def load_cluster_file(path: Path | str) -> ClusterFile:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cluster file {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f", line {where.line + 1}" if where is not None else ""
        raise ConfigError(f"cluster file {path}: malformed YAML"
                          f" ({getattr(exc, 'problem', None) or 'unreadable'}{line})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"cluster file {path}: expected a mapping of {', '.join(_REQUIRED)}")
    unknown = sorted(set(data) - set(_REQUIRED) - set(_OPTIONAL))
    missing = [k for k in _REQUIRED if k not in data]
    if unknown or missing:
        what = (f"unknown key(s) {', '.join(map(str, unknown))}" if unknown
                else f"missing {', '.join(missing)}")
        raise ConfigError(f"cluster file {path}: {what}")
    if not isinstance(data["gpu"], str):
        raise ConfigError(f"cluster file {path}: gpu must be a GPU type name, got "
                          f"{data['gpu']!r}")
    per_node = int(_positive(path, "gpus_per_node", data["gpus_per_node"], integer=True))
    nvlink = _positive(path, "nvlink_gb_per_s", data["nvlink_gb_per_s"]) * 1e9
    network = _positive(path, "inter_node_gbit_per_s", data["inter_node_gbit_per_s"]) * 1e9 / 8
    host = data.get("host_memory_gib")
    host_bytes = None if host is None else _positive(path, "host_memory_gib", host) * 2**30
    return ClusterFile(gpu=data["gpu"], gpus_per_node=per_node, intra_node_bytes_per_s=nvlink,
                       inter_node_bytes_per_s=network, host_memory_bytes=host_bytes)
