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

from dataclasses import dataclass
from pathlib import Path

from autotune.errors import ConfigError
from autotune.inputs.bounds import Count, Positive, Text
from autotune.inputs.documents import parse_yaml
from autotune.inputs.files import MAX_YAML_BYTES, read_text

__all__ = ["ClusterFile", "is_cluster_file", "load_cluster_file"]


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


@dataclass(frozen=True, slots=True, kw_only=True)
class _Document:
    """The file's fields as written, with their types and ranges (checked by
    autotune.inputs.schema: a file is read the way every input file is)."""

    gpu: Text
    gpus_per_node: Count
    nvlink_gb_per_s: Positive
    inter_node_gbit_per_s: Positive
    host_memory_gib: Positive | None = None
    name: Text | None = None
    note: Text | None = None


def is_cluster_file(value: str) -> bool:
    return value.endswith((".yaml", ".yml"))


def shipped_clusters() -> dict[str, str]:
    """The cluster files autotune ships (search_spaces/clusters/NAME.yaml), by NAME."""
    from autotune.specs.presets import shipped_yaml  # the package data, when asked

    return {name: str(f) for name, f in shipped_yaml("clusters").items()}


def shipped_cluster_file(name: str) -> str | None:
    """The shipped cluster file `name` names (`--cluster dgx-h100`, as `--space one-node`
    names a shipped space), or None."""
    return shipped_clusters().get(name)


def load_cluster_file(path: Path | str) -> ClusterFile:
    """The cluster file at `path`, or ConfigError in one line naming the file and the field."""
    from autotune.inputs.schema import build  # pydantic: imported when a file is read

    source = f"cluster file {path}"
    data = parse_yaml(read_text(path, "cluster file", max_bytes=MAX_YAML_BYTES), source)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of gpu, gpus_per_node, "
                          "nvlink_gb_per_s, inter_node_gbit_per_s")
    doc = build(_Document, data, source, what="cluster")
    host = doc.host_memory_gib
    return ClusterFile(gpu=doc.gpu, gpus_per_node=doc.gpus_per_node,
                       intra_node_bytes_per_s=doc.nvlink_gb_per_s * 1e9,
                       inter_node_bytes_per_s=doc.inter_node_gbit_per_s * 1e9 / 8,
                       host_memory_bytes=None if host is None else host * 2**30)
