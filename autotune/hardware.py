"""GPUs and clusters: a table of GPU types and the `ClusterSpec` a search runs against.

pynvml is imported here only when asked to detect the local GPU; the worker imports it too
(autotune.worker.report, a rank's device memory as NVML sees it).
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.errors import ConfigError

__all__ = ["GPUS", "ClusterSpec", "GpuSpec", "detect_gpu", "gpu_spec", "local_gpu_count"]

_GIB = 1024**3


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One GPU type. Peak rates are the vendor's dense (no sparsity) datasheet numbers."""

    name: str
    memory_bytes: int
    """Memory a process can allocate (what nvidia-smi reports as total)."""
    peak_bf16_flops: float
    intra_node_bytes_per_s: float
    """NVLink bandwidth per GPU, one direction."""
    inter_node_bytes_per_s: float
    """Network bandwidth per GPU (one NIC per GPU), one direction."""
    nvml_patterns: tuple[str, ...]
    """Substrings of the NVML device name that identify this GPU, more specific first."""


# Sources: NVIDIA H100 / H200 / A100 datasheets (dense BF16 tensor-core peak; NVLink 4 = 900 GB/s
# and NVLink 3 = 600 GB/s bidirectional per GPU; one 400 Gb/s (H100/H200) or 200 Gb/s (A100)
# InfiniBand NIC per GPU as in DGX H100 / DGX A100). Memory is what nvidia-smi shows as total.
GPUS: dict[str, GpuSpec] = {
    "h200": GpuSpec(name="h200", memory_bytes=143771 * 1024**2, peak_bf16_flops=989e12,
                    intra_node_bytes_per_s=450e9, inter_node_bytes_per_s=50e9,
                    nvml_patterns=("H200",)),
    "h100-80gb": GpuSpec(name="h100-80gb", memory_bytes=81559 * 1024**2,
                         peak_bf16_flops=989e12, intra_node_bytes_per_s=450e9,
                         inter_node_bytes_per_s=50e9, nvml_patterns=("H100",)),
    "a100-80gb": GpuSpec(name="a100-80gb", memory_bytes=81920 * 1024**2,
                         peak_bf16_flops=312e12, intra_node_bytes_per_s=300e9,
                         inter_node_bytes_per_s=25e9, nvml_patterns=("A100-SXM4-80GB",
                                                                     "A100 80GB")),
    "a100-40gb": GpuSpec(name="a100-40gb", memory_bytes=40960 * 1024**2,
                         peak_bf16_flops=312e12, intra_node_bytes_per_s=300e9,
                         inter_node_bytes_per_s=25e9, nvml_patterns=("A100",)),
}

DEFAULT_GPU = "h100-80gb"


def gpu_spec(name: str) -> GpuSpec:
    """The table entry for `name` (`h100-80gb`, `h200`, ...)."""
    try:
        return GPUS[name]
    except KeyError:
        raise ConfigError(f"unknown GPU {name!r}; choose one of {', '.join(GPUS)}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """The GPUs a job runs on: how many, how many share a node, and what type they are."""

    num_gpus: int
    gpus_per_node: int
    gpu: GpuSpec

    def __post_init__(self) -> None:
        for name in ("num_gpus", "gpus_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, "
                                  f"got {value!r}")
        if self.num_gpus > self.gpus_per_node and self.num_gpus % self.gpus_per_node:
            raise ConfigError(f"--gpus={self.num_gpus} must be a multiple of "
                              f"--gpus-per-node={self.gpus_per_node} across several nodes")

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)

    @classmethod
    def make(cls, num_gpus: int, gpus_per_node: int | None = None,
             gpu: str | None = None) -> ClusterSpec:
        """A cluster from CLI values: 8 GPUs per node by default, the local GPU type if known."""
        per_node = gpus_per_node if gpus_per_node is not None else min(8, num_gpus)
        name = gpu or detect_gpu() or DEFAULT_GPU
        return cls(num_gpus=num_gpus, gpus_per_node=per_node, gpu=gpu_spec(name))


def _nvml_names() -> list[str]:
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver or no GPU: NVML raises its own error types
        return []
    try:
        names = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        return names
    finally:
        pynvml.nvmlShutdown()


def local_gpu_count() -> int:
    """CUDA GPUs visible on this machine through NVML (0 without a driver)."""
    return len(_nvml_names())


def detect_gpu() -> str | None:
    """The table name of the first local GPU, or None when there is none or it is unknown."""
    names = _nvml_names()
    if not names:
        return None
    for spec in GPUS.values():  # ordered more specific first
        if any(pattern in names[0] for pattern in spec.nvml_patterns):
            return spec.name
    return None
