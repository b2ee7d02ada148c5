"""GPUs and clusters: a table of GPU types and the `ClusterSpec` a search runs against (from CLI
values or a cluster file, autotune.specs.cluster).

pynvml is imported here only when asked to detect the local GPU; the worker imports it too
(autotune.worker.report, a rank's device memory as NVML sees it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autotune.errors import ConfigError
from autotune.specs.cluster import (
    is_cluster_file,
    load_cluster_file,
    shipped_cluster_file,
    shipped_clusters,
)

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
    allocatable_bytes: int | None = None
    """What CUDA lets a process allocate (cudaMemGetInfo's total, torch's "total capacity" in an
    OOM message), below nvidia-smi's total by what the driver keeps; None: memory_bytes."""
    hbm_bytes_per_s: float = 2.0e12
    """HBM bandwidth, datasheet."""
    pcie_bytes_per_s: float = 32e9
    """Host link per direction, datasheet (CPU offloading moves activations over it)."""
    measured: bool = True
    """False for a GPU known only from its datasheet: no trial ever ran on it."""
    compute_capability: tuple[int, int]
    """CUDA compute capability (sm_XY): what decides which of Transformer Engine's FP8 recipes
    run on it (autotune.levers.fp8.RECIPE_MIN_CAPABILITY)."""
    peak_fp8_flops: float | None = None
    """Dense FP8 tensor-core peak, datasheet; None where the tensor cores have no FP8 (before
    sm_89)."""
    int32_ops_per_s: float
    """32-bit integer instructions per second over all SMs (SMs x results per clock per SM x
    boost clock): the rate of the work the tensor cores do not do, such as the random numbers
    of attention dropout (autotune.levers.transformer_impl.Constants.
    attention_dropout_ops_per_score)."""

    @property
    def usable_bytes(self) -> int:
        return self.allocatable_bytes if self.allocatable_bytes is not None else self.memory_bytes

    def fp8_peak_share(self, flops_per_s: float) -> float | None:
        """`flops_per_s` as a share of the dense FP8 peak (an FP8 layout's MFU against its own
        limit; MFU itself stays against the bf16 peak); None without FP8 tensor cores."""
        return None if self.peak_fp8_flops is None else flops_per_s / self.peak_fp8_flops


# Sources: NVIDIA H100 / H200 / A100 / B200 datasheets (dense BF16 tensor-core peak; NVLink 5 =
# 1.8 TB/s, NVLink 4 = 900 GB/s and NVLink 3 = 600 GB/s bidirectional per GPU; one 400 Gb/s
# (H100/H200/B200) or 200 Gb/s (A100) InfiniBand NIC per GPU as in DGX B200 / H100 / A100; HBM:
# H100 SXM 3.35 TB/s, H200 4.8 TB/s, A100 80GB 2.0 TB/s, A100 40GB 1.555 TB/s, B200 8 TB/s; host
# link: PCIe Gen5 x16 (64 GB/s) on H100 SXM, H200 and B200, Gen4 x16 (32 GB/s) on A100). Memory
# is what nvidia-smi shows as total; the H100's allocatable 79.19 GiB is torch's "total capacity"
# in its OOM messages on the H100s these trials ran on (tests/doubles/oom.py quotes one).
# A cluster file (autotune.specs.cluster) may override the links of any of them.
# Dense FP8 peaks (datasheets, half the "with sparsity" figures): H100 SXM and H200 3,958
# TFLOP/s sparse = 1,979 dense, twice their dense BF16; B200 9 PFLOP/s sparse = 4.5 dense. A100
# (sm_80) has no FP8 tensor cores. Compute capabilities: CUDA C++ Programming Guide, "Compute
# Capabilities" (Hopper 9.0, Ampere A100 8.0, Blackwell B200 10.0). Integer rate: the same
# guide's "Arithmetic Instructions" table, 64 results per clock per SM for 32-bit integer add,
# multiply(-add), compare and bitwise operations on compute capability 8.0 and 9.0 (taken as the
# same on 10.0), times SMs and boost clock from the datasheets and whitepapers: H100 SXM and H200
# 132 SMs at 1,980 MHz, A100 108 at 1,410 MHz, B200 148 at 1,965 MHz (datasheet only).
_INT32_PER_CLOCK_SM = 64
GPUS: dict[str, GpuSpec] = {
    "h200": GpuSpec(name="h200", memory_bytes=143771 * 1024**2, peak_bf16_flops=989e12,
                    intra_node_bytes_per_s=450e9, inter_node_bytes_per_s=50e9,
                    nvml_patterns=("H200",), hbm_bytes_per_s=4.8e12, pcie_bytes_per_s=64e9,
                    compute_capability=(9, 0), peak_fp8_flops=1979e12,
                    int32_ops_per_s=132 * _INT32_PER_CLOCK_SM * 1.98e9),
    "h100-80gb": GpuSpec(name="h100-80gb", memory_bytes=81559 * 1024**2,
                         peak_bf16_flops=989e12, intra_node_bytes_per_s=450e9,
                         inter_node_bytes_per_s=50e9, nvml_patterns=("H100",),
                         allocatable_bytes=int(79.19 * _GIB), hbm_bytes_per_s=3.35e12,
                         pcie_bytes_per_s=64e9, compute_capability=(9, 0),
                         peak_fp8_flops=1979e12,
                         int32_ops_per_s=132 * _INT32_PER_CLOCK_SM * 1.98e9),
    "a100-80gb": GpuSpec(name="a100-80gb", memory_bytes=81920 * 1024**2,
                         peak_bf16_flops=312e12, intra_node_bytes_per_s=300e9,
                         inter_node_bytes_per_s=25e9, nvml_patterns=("A100-SXM4-80GB",
                                                                     "A100 80GB"),
                         hbm_bytes_per_s=2.0e12, compute_capability=(8, 0),
                         int32_ops_per_s=108 * _INT32_PER_CLOCK_SM * 1.41e9),
    "a100-40gb": GpuSpec(name="a100-40gb", memory_bytes=40960 * 1024**2,
                         peak_bf16_flops=312e12, intra_node_bytes_per_s=300e9,
                         inter_node_bytes_per_s=25e9, nvml_patterns=("A100",),
                         hbm_bytes_per_s=1.555e12, compute_capability=(8, 0),
                         int32_ops_per_s=108 * _INT32_PER_CLOCK_SM * 1.41e9),
    # Datasheet only (DGX B200: 8 x B200 with 1,440 GB HBM3e, 72 PFLOP/s dense FP8 training =
    # 2.25 PFLOP/s dense BF16 per GPU): never measured, so the models' constants are not known
    # to hold on it; predictions say so.
    "b200": GpuSpec(name="b200", memory_bytes=180 * 10**9, peak_bf16_flops=2.25e15,
                    intra_node_bytes_per_s=900e9, inter_node_bytes_per_s=50e9,
                    nvml_patterns=("B200",), hbm_bytes_per_s=8.0e12, pcie_bytes_per_s=64e9,
                    measured=False, compute_capability=(10, 0), peak_fp8_flops=4.5e15,
                    int32_ops_per_s=148 * _INT32_PER_CLOCK_SM * 1.965e9),
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
    host_memory_bytes: float | None = None
    """Host (CPU) memory per node, from a cluster file's host_memory_gib; None: not known, and
    what the levers keep there (an offloaded optimizer) is not checked against it."""

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
        """A cluster from CLI values: 8 GPUs per node by default, the local GPU type if known;
        `gpu` may be a cluster file (`--cluster FILE`, autotune.specs.cluster) or a shipped
        cluster's name (`--cluster dgx-h100`)."""
        if gpu is not None and gpu not in GPUS and not is_cluster_file(gpu):
            gpu = shipped_cluster_file(gpu) or gpu
        if gpu is not None and is_cluster_file(gpu):  # --cluster FILE
            file = load_cluster_file(gpu)
            try:
                table = gpu_spec(file.gpu)
            except ConfigError as exc:
                raise ConfigError(f"cluster file {gpu}: {exc}") from None
            spec = replace(table, intra_node_bytes_per_s=file.intra_node_bytes_per_s,
                           inter_node_bytes_per_s=file.inter_node_bytes_per_s)
            if gpus_per_node is not None and gpus_per_node > file.gpus_per_node:
                # A node cannot hold more GPUs than the file says it has; fewer is a job using
                # part of each node.
                raise ConfigError(f"--gpus-per-node {gpus_per_node} is more than the "
                                  f"{file.gpus_per_node} GPUs per node of cluster file {gpu}")
            per_node = gpus_per_node if gpus_per_node is not None else min(file.gpus_per_node,
                                                                           num_gpus)
            if gpus_per_node is None:
                _check_default_per_node(num_gpus, per_node, f"of cluster file {gpu}")
            return cls(num_gpus=num_gpus, gpus_per_node=per_node, gpu=spec,
                       host_memory_bytes=file.host_memory_bytes)
        per_node = gpus_per_node if gpus_per_node is not None else min(8, num_gpus)
        if gpus_per_node is None:
            _check_default_per_node(num_gpus, per_node, "(the default --gpus-per-node)")
        # `--gpu ""` (an unset variable in a job script) is refused, not taken for the default.
        name = gpu if gpu is not None else detect_gpu() or DEFAULT_GPU
        try:
            spec = gpu_spec(name)
        except ConfigError as exc:
            raise ConfigError(f"{exc}; or a cluster: {', '.join(sorted(shipped_clusters()))} "
                              "(search_spaces/clusters), or a cluster YAML file") from None
        return cls(num_gpus=num_gpus, gpus_per_node=per_node, gpu=spec)


def _check_default_per_node(num_gpus: int, per_node: int, whence: str) -> None:
    """A GPU count the default node size does not divide (12 GPUs, 8 a node) is one line that
    says where the 8 came from and which --gpus-per-node would do: ClusterSpec's own message
    names an option the user never typed."""
    if num_gpus <= per_node or num_gpus % per_node == 0 or num_gpus <= 0 or per_node <= 0:
        return
    fits = [str(n) for n in range(per_node - 1, 0, -1) if num_gpus % n == 0]
    choices = fits[0] if len(fits) == 1 else f"{', '.join(fits[:-1])} or {fits[-1]}"
    raise ConfigError(f"--gpus {num_gpus} does not fill nodes of {per_node} GPUs {whence}: "
                      f"give --gpus-per-node {choices}, the GPUs that share a node")


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
