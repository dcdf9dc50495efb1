"""Typed description of a fake machine: what the sysfs builder and the fake NVML read.

Every value the generators need is already resolved here (templates merged, ids
derived); :mod:`discovery.fake.loader` builds these from YAML and
:mod:`discovery.fake.ids` derives the ids.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "NVML_FUNCTIONS",
    "AmdGpuSpec",
    "AmdSpec",
    "CacheSpec",
    "CoreSpec",
    "CpuSpec",
    "FabricSpec",
    "MachineSpec",
    "NetSpec",
    "NumaNodeSpec",
    "NvLinkSpec",
    "NvidiaGpuSpec",
    "NvmlSpec",
    "PciDeviceSpec",
    "RdmaPortSpec",
    "RdmaSpec",
    "bdf_key",
]

NVML_FUNCTIONS: tuple[str, ...] = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByPciBusId",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkVersion",
    "nvmlDeviceGetNvLinkRemotePciInfo",
    "nvmlDeviceGetNvLinkRemoteDeviceType",
    "nvmlDeviceGetGpuFabricInfoV",
    "nvmlDeviceGetGpuFabricInfo",
)
"""The pynvml functions the fake implements (the names ``nvml_errors`` may use)."""


@dataclass(frozen=True)
class CoreSpec:
    """One core of an explicit CPU layout: its logical CPUs and the ids sysfs gives them
    (None: the file is absent, as in some dumps)."""

    cpus: tuple[int, ...]
    socket: int | None
    die: int | None
    cluster: int | None
    core: int | None
    core_ids: tuple[int, ...] | None = None
    """Per-CPU ``core_id`` when the siblings' ids differ (AMD Bulldozer modules)."""


@dataclass(frozen=True)
class CacheSpec:
    """One last-level cache of an explicit CPU layout and the CPUs sharing it."""

    cpus: tuple[int, ...]
    level: int
    type: str
    size_bytes: int | None
    id: int | None


@dataclass(frozen=True)
class CpuSpec:
    model: str
    arch: str
    vendor: str
    sockets: int
    cores_per_socket: int
    threads_per_core: int
    numbering: Literal["linear", "interleaved", "socket_interleaved"]
    """``linear``: thread 0 of every core of every socket first, then thread 1 (Intel,
    AMD default on Linux). ``interleaved``: SMT siblings get consecutive ids.
    ``socket_interleaved``: consecutive ids alternate sockets (CPU n on socket n mod S,
    common on HGX boards), thread 0 of every core first."""
    l1d_kb: int
    l2_kb: int
    l3_kb: int
    l2_cores: int
    """Cores sharing one L2 (1 on x86 servers)."""
    l3_cores: int
    """Cores sharing one L3 (a whole socket on Xeon/Grace, one CCD on EPYC)."""
    cores: tuple[CoreSpec, ...] | None = None
    """Explicit layout (captured machines): replaces sockets x cores x threads."""
    caches: tuple[CacheSpec, ...] | None = None
    """Explicit last-level caches (with ``cores``)."""
    cpuinfo: tuple[tuple[str, str], ...] = ()
    """Extra ``key : value`` lines of every ``proc/cpuinfo`` processor block."""
    max_mhz: int | None = None
    """``cpufreq/cpuinfo_max_freq`` of every CPU; None: no cpufreq directory."""

    @property
    def count(self) -> int:
        if self.cores is not None:
            return sum(len(c.cpus) for c in self.cores)
        return self.sockets * self.cores_per_socket * self.threads_per_core

    def ids(self) -> list[int]:
        """Every (online) CPU id, sorted."""
        return sorted(cid for cid, _, _, _ in self.layout())

    @property
    def nr_cpus(self) -> int:
        """Bits in the kernel's CPU masks: one past the highest CPU id."""
        return max(self.ids(), default=-1) + 1

    def cpu_id(self, socket: int, core: int, thread: int) -> int:
        if self.numbering == "linear":
            cores = self.sockets * self.cores_per_socket
            return thread * cores + socket * self.cores_per_socket + core
        if self.numbering == "socket_interleaved":
            cores = self.sockets * self.cores_per_socket
            return thread * cores + core * self.sockets + socket
        return (socket * self.cores_per_socket + core) * self.threads_per_core + thread

    def layout(self) -> Iterator[tuple[int, int, int, int]]:
        """(cpu id, socket, core within socket, thread) for every CPU, by socket/core/thread."""
        if self.cores is not None:
            for i, core in enumerate(self.cores):
                for t, cid in enumerate(core.cpus):
                    yield cid, core.socket if core.socket is not None else 0, i, t
            return
        for s in range(self.sockets):
            for c in range(self.cores_per_socket):
                for t in range(self.threads_per_core):
                    yield self.cpu_id(s, c, t), s, c, t


@dataclass(frozen=True)
class NumaNodeSpec:
    id: int
    cpus: tuple[int, ...]
    memory_kb: int
    socket: int
    gpu: str | None = None
    """Bus id of the GPU whose memory this node is (coherent platforms, e.g. GB200)."""


@dataclass(frozen=True)
class NetSpec:
    """An interface; a None field writes no file (written ``null`` in the YAML)."""

    name: str
    address: str | None
    mtu: int | None
    operstate: str | None
    speed: int | None
    """Mb/s; None writes no ``speed`` file (the kernel's read fails)."""
    type: int | None


@dataclass(frozen=True)
class RdmaPortSpec:
    port: int
    rate: str
    state: str
    phys_state: str
    link_layer: str
    netdev: str | None


@dataclass(frozen=True)
class RdmaSpec:
    """An RDMA device; a None field writes no file (written ``null`` in the YAML)."""

    name: str
    node_guid: str | None
    sys_image_guid: str | None
    fw_ver: str | None
    board_id: str | None
    hca_type: str | None
    ports: tuple[RdmaPortSpec, ...]


@dataclass(frozen=True)
class NvLinkSpec:
    link: int
    remote: str
    """Sysfs-form bus id of the peer (a GPU, a local NVSwitch, or a non-local switch id)."""
    remote_type: Literal["gpu", "switch"]
    active: bool = True


@dataclass(frozen=True)
class FabricSpec:
    cluster_uuid: bytes
    clique_id: int
    state: int
    status: int
    health_mask: int
    health_summary: int


@dataclass(frozen=True)
class NvidiaGpuSpec:
    name: str
    memory_bytes: int
    memory_used_bytes: int
    compute_capability: tuple[int, int]
    uuid: str
    minor: int
    mig_mode: tuple[int, int] | None
    """None: MIG not supported (NVML raises NOT_SUPPORTED)."""
    nvlink_version: str | None
    nvlinks: tuple[NvLinkSpec, ...]
    nvml_errors: Mapping[str, int]
    fabric: FabricSpec | None
    numa_memory_node: int | None = None


@dataclass(frozen=True)
class AmdGpuSpec:
    name: str | None
    """Marketing name written to the function's ``product_name`` (amdgpu); None: no file."""
    vram_bytes: int
    simd_count: int
    simd_per_cu: int
    hive_id: int
    unique_id: int
    gfx_target_version: int
    card: int
    render_minor: int


@dataclass(frozen=True)
class PciDeviceSpec:
    bdf: str
    parent: str | None
    class_code: int
    vendor: int | None
    """None (``vendor: null``): no file, as in dumps that lack it."""
    device: int | None
    subsystem_vendor: int | None
    subsystem_device: int | None
    revision: int
    driver: str | None
    numa_node: int
    link_speed: float | None
    link_width: int | None
    max_link_speed: float | None
    max_link_width: int | None
    sriov_totalvfs: int | None
    sriov_numvfs: int | None
    physfn: str | None
    net: tuple[NetSpec, ...]
    rdma: tuple[RdmaSpec, ...]
    nvidia: NvidiaGpuSpec | None
    amd: AmdGpuSpec | None
    iommu_group: int | None = None
    """``iommu_group`` link to ``kernel/iommu_groups/<n>``; None: no IOMMU (no link)."""
    local_cpus: tuple[int, ...] | None = None
    """``local_cpus``/``local_cpulist``; None: the NUMA node's CPUs (all when -1)."""
    udev_names: tuple[str | None, str | None] | None = None
    """(vendor, device) names for ``run/udev/data/+pci:<bdf>`` (udev's hwdb names)."""

    @property
    def domain(self) -> int:
        return int(self.bdf.split(":")[0], 16)

    @property
    def bus(self) -> int:
        return int(self.bdf.split(":")[1], 16)

    @property
    def dev(self) -> int:
        return int(self.bdf.split(":")[2].split(".")[0], 16)

    @property
    def fn(self) -> int:
        return int(self.bdf.rsplit(".", 1)[1], 16)

    @property
    def is_bridge(self) -> bool:
        return self.class_code >> 8 == 0x0604


@dataclass(frozen=True)
class NvmlSpec:
    driver_version: str
    cuda_driver_version: int
    nvml_errors: Mapping[str, int]
    fabric: FabricSpec | None


@dataclass(frozen=True)
class AmdSpec:
    xgmi: Literal["fully_connected", "none"]
    xgmi_bandwidth_mbps: tuple[int, int]
    pcie_bandwidth_mbps: tuple[int, int]


@dataclass(frozen=True)
class MachineSpec:
    name: str
    hostname: str
    source: str
    cpu: CpuSpec
    numa_nodes: tuple[NumaNodeSpec, ...]
    distances: tuple[tuple[int, ...], ...]
    """SLIT: ``distances[i][j]`` between ``numa_nodes[i]`` and ``numa_nodes[j]``."""
    pci: tuple[PciDeviceSpec, ...]
    nvml: NvmlSpec | None
    amd: AmdSpec | None
    net: tuple[NetSpec, ...] | None = None
    """Interfaces on no PCI function (``devices/virtual/net``); None: just ``lo``."""
    rdma: tuple[RdmaSpec, ...] = ()
    """RDMA devices on no PCI function (``devices/virtual/infiniband``)."""
    _by_bdf: dict[str, PciDeviceSpec] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_bdf.update({d.bdf: d for d in self.pci})

    def device(self, bdf: str) -> PciDeviceSpec | None:
        return self._by_bdf.get(bdf)

    def ancestors(self, bdf: str) -> list[PciDeviceSpec]:
        """Bridges between the root complex and ``bdf``, root side first."""
        chain: list[PciDeviceSpec] = []
        dev = self._by_bdf[bdf]
        while dev.parent is not None:
            dev = self._by_bdf[dev.parent]
            chain.append(dev)
        chain.reverse()
        return chain

    def pcie_root(self, bdf: str) -> str:
        """``pciDDDD:BB`` of the root complex above ``bdf``."""
        chain = self.ancestors(bdf)
        top = chain[0] if chain else self._by_bdf[bdf]
        dom, bus, _ = top.bdf.split(":", 2)
        return f"pci{dom}:{bus}"

    def nvidia_gpus(self) -> list[PciDeviceSpec]:
        """NVIDIA GPUs in NVML index order (bus order)."""
        return sorted((d for d in self.pci if d.nvidia is not None), key=bdf_key)

    def amd_gpus(self) -> list[PciDeviceSpec]:
        return sorted((d for d in self.pci if d.amd is not None), key=bdf_key)


# --------------------------------------------------------------------------- helpers


def bdf_key(dev: PciDeviceSpec) -> tuple[int, int, int, int]:
    return (dev.domain, dev.bus, dev.dev, dev.fn)
