"""The inventory: everything discovery and the vendor probes learned about one node.

These dataclasses are the boundary between discovery (which reads the host) and
normalize (which turns facts into Kubernetes objects and the topology graph). They
hold *facts as the host reports them* -- raw kernel values next to derived ones --
so that normalize never has to go back to the filesystem. The JSON form
(``Inventory.to_dict``) is a public, versioned interface: see docs/inventory.md and
docs/schema/inventory.schema.json. Add fields; never rename or repurpose one
without bumping ``INVENTORY_SCHEMA``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

INVENTORY_SCHEMA = "toposlice.inventory/v1"

ProbeState = Literal["ok", "unavailable", "error"]


def _fields(obj: Any) -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(obj)


class Record:
    """Shared ``__eq__``/``__repr__`` for the inventory dataclasses, instead of one
    generated pair per class (start-up cost: docs/performance.md)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in _fields(self))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        args = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in _fields(self))
        return f"{type(self).__name__}({args})"


@dataclass(eq=False, repr=False)
class NumaNode(Record):
    """A NUMA node: its online CPUs, memory and SLIT row."""

    id: int
    cpus: list[int] = field(default_factory=list)
    """Online CPUs whose kernel NUMA node is this one (empty for memory-only nodes)."""
    distances: dict[int, int] = field(default_factory=dict)
    """SLIT row: other node id -> distance (10 = local)."""
    memory_bytes: int | None = None
    package: int | None = None
    """Socket of the node's CPUs; for a CPU-less node the socket of its nearest CPU node."""
    memory_only: bool = False
    gpu_bus_id: str | None = None
    """Set when the node is a GPU's own memory (coherent platforms: GB200, POWER9+V100)."""


@dataclass(eq=False, repr=False)
class Cpu(Record):
    """One online logical CPU and where it sits (package, die, cluster, core, cache)."""

    id: int
    package: int | None = None
    die: int | None = None
    cluster: int | None = None
    core: int | None = None
    numa_node: int | None = None
    siblings: list[int] = field(default_factory=list)
    """SMT siblings, this CPU included."""
    l3: int | None = None
    """Index into ``Inventory.caches`` of the last-level cache this CPU shares."""


@dataclass(eq=False, repr=False)
class CacheGroup(Record):
    """CPUs sharing one last-level cache (an L3 / CCX / LLC domain)."""

    level: int
    cpus: list[int]
    id: int | None = None
    size_bytes: int | None = None
    type: str = "Unified"


@dataclass(eq=False, repr=False)
class PciLink(Record):
    """PCIe link state of a function: current and maximum speed (GT/s) and width."""

    current_speed_gts: float | None = None
    current_width: int | None = None
    max_speed_gts: float | None = None
    max_width: int | None = None


@dataclass(eq=False, repr=False)
class PciDevice(Record):
    """One PCI function (endpoint or bridge) with its place in the PCIe tree."""

    bus_id: str
    """``dddd:bb:dd.f``, lower-case, as in sysfs (domains wider than 16 bits keep all digits)."""
    class_code: str | None = None
    """``0x0302``: base class + subclass."""
    prog_if: str | None = None
    vendor: str | None = None
    device: str | None = None
    subsystem_vendor: str | None = None
    subsystem_device: str | None = None
    vendor_name: str | None = None
    """From udev's hardware database on a live host (e.g. ``Mellanox Technologies``)."""
    device_name: str | None = None
    """From udev's hardware database on a live host (e.g. ``MT2910 Family [ConnectX-7]``)."""
    numa_node: int | None = None
    """The kernel's ``numa_node``; None when it says -1 or has no file."""
    locality_numa_node: int | None = None
    """hwloc-style locality: the one NUMA node whose CPUs ``local_cpus`` points at
    (single-node machines: 0 even when the kernel says -1); None when ambiguous."""
    local_cpus: list[int] = field(default_factory=list)
    pcie_root: str | None = None
    """``pciDDDD:BB`` from the resolved sysfs path (Kubernetes ``pcieRoot`` semantics)."""
    upstream_bridges: list[str] = field(default_factory=list)
    """PCI functions between the root and the device, root side first."""
    is_bridge: bool = False
    link: PciLink = field(default_factory=PciLink)
    driver: str | None = None
    iommu_group: int | None = None
    physfn: str | None = None
    virtfns: list[str] = field(default_factory=list)
    sriov_totalvfs: int | None = None
    sriov_numvfs: int | None = None
    net: list[str] = field(default_factory=list)
    rdma: list[str] = field(default_factory=list)


@dataclass(eq=False, repr=False)
class NetInterface(Record):
    """A network interface and the PCI function it hangs off, if any."""

    name: str
    bus_id: str | None = None
    """Nearest PCI function on the interface's device path; None for virtual ones."""
    address: str | None = None
    speed_mbps: int | None = None
    mtu: int | None = None
    operstate: str | None = None
    type: int | None = None


@dataclass(eq=False, repr=False)
class RdmaPort(Record):
    """One port of an RDMA device."""

    port: int
    rate_gbps: float | None = None
    state: str | None = None
    link_layer: str | None = None
    netdev: str | None = None


@dataclass(eq=False, repr=False)
class RdmaDevice(Record):
    """An RDMA device (``/sys/class/infiniband``) and its PCI function."""

    name: str
    bus_id: str | None = None
    node_guid: str | None = None
    sys_image_guid: str | None = None
    fw_ver: str | None = None
    board_id: str | None = None
    ports: list[RdmaPort] = field(default_factory=list)


@dataclass(eq=False, repr=False)
class NvLink(Record):
    """One active NVLink of a GPU."""

    link: int
    version: str | None = None
    """NVLink generation as text (``4.0``), not the NVML enum."""
    remote_bus_id: str | None = None
    remote_type: Literal["gpu", "switch", "npu", "unknown"] = "unknown"
    bandwidth_gbps: float | None = None
    """Per direction, GB/s."""


@dataclass(eq=False, repr=False)
class XgmiLink(Record):
    """One direct xGMI link as AMD's KFD topology reports it."""

    peer_bus_id: str
    weight: int | None = None
    """KFD link weight: 15 per xGMI hop (what ``amd-smi topology`` prints as WEIGHT)."""
    min_bandwidth_mbps: int | None = None
    max_bandwidth_mbps: int | None = None

    @property
    def hops(self) -> int | None:
        return None if self.weight is None else max(1, self.weight // 15)


@dataclass(eq=False, repr=False)
class Fabric(Record):
    """GPU fabric (multi-node NVLink) membership as NVML reports it."""

    cluster_uuid: str | None = None
    clique_id: int | None = None
    state: str | None = None
    """``not_supported`` | ``not_started`` | ``in_progress`` | ``completed``."""
    health: str | None = None
    status: int | None = None
    """NVML return code of the registration; only 0 (success) makes the clique usable."""

    @property
    def clique(self) -> str | None:
        """``<clusterUUID>.<cliqueId>``, the NVIDIA DRA driver's clique string, when ready."""
        if self.state != "completed" or not self.cluster_uuid or self.clique_id is None:
            return None
        if self.status not in (None, 0):
            return None
        if set(self.cluster_uuid.replace("-", "")) <= {"0"}:
            return None
        return f"{self.cluster_uuid}.{self.clique_id}"


@dataclass(eq=False, repr=False)
class Gpu(Record):
    """A GPU or other accelerator, keyed by PCI bus id."""

    bus_id: str
    vendor: str
    """``nvidia`` | ``amd`` | ``intel`` | other lower-case vendor word."""
    probe: str
    index: int | None = None
    """Vendor library index (NVML / amd-smi), only for display: never for identity."""
    uuid: str | None = None
    model: str | None = None
    memory_bytes: int | None = None
    memory_numa_node: int | None = None
    minor: int | None = None
    compute_capability: str | None = None
    architecture: str | None = None
    driver_version: str | None = None
    mig_mode: bool | None = None
    nvlinks: list[NvLink] = field(default_factory=list)
    xgmi_hive_id: str | None = None
    xgmi_peers: list[str] = field(default_factory=list)
    """Bus ids of GPUs with a direct xGMI link."""
    xgmi_links: list[XgmiLink] = field(default_factory=list)
    fabric: Fabric | None = None


@dataclass(eq=False, repr=False)
class Nic(Record):
    """A network PCI function with its netdevs and RDMA devices."""

    bus_id: str
    probe: str
    vendor: str | None = None
    model: str | None = None
    netdevs: list[str] = field(default_factory=list)
    rdma_devices: list[str] = field(default_factory=list)
    speed_mbps: int | None = None
    rate_gbps: float | None = None
    link_layer: str | None = None
    node_guid: str | None = None
    is_vf: bool = False


@dataclass(eq=False, repr=False)
class NvSwitch(Record):
    """An NVSwitch visible as a PCI device on this host."""

    bus_id: str
    probe: str
    vendor: str = "nvidia"
    model: str | None = None


@dataclass(eq=False, repr=False)
class ProbeStatus(Record):
    """How a vendor probe ended: ``ok``, ``unavailable`` (no library/hardware) or ``error``."""

    name: str
    state: ProbeState
    detail: str = ""


@dataclass(eq=False, repr=False)
class Inventory(Record):
    """Everything known about one node; the JSON form is a public, versioned interface."""

    schema: str = INVENTORY_SCHEMA
    hostname: str | None = None
    source: dict[str, str] = field(default_factory=dict)
    """Where the facts came from: ``sysfs_root``, ``fake`` (machine name), ..."""
    host: dict[str, str] = field(default_factory=dict)
    """Free-form host facts from probes: ``cpu_model``, ``cpu_vendor``, ``arch``, ..."""
    numa_nodes: list[NumaNode] = field(default_factory=list)
    cpus: list[Cpu] = field(default_factory=list)
    caches: list[CacheGroup] = field(default_factory=list)
    pci_devices: list[PciDevice] = field(default_factory=list)
    net_interfaces: list[NetInterface] = field(default_factory=list)
    rdma_devices: list[RdmaDevice] = field(default_factory=list)
    gpus: list[Gpu] = field(default_factory=list)
    nics: list[Nic] = field(default_factory=list)
    nvswitches: list[NvSwitch] = field(default_factory=list)
    probes: list[ProbeStatus] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def pci(self, bus_id: str) -> PciDevice | None:
        # normalize/ looks devices up once per device pair (relation matrix, graph): keep an
        # index, rebuilt whenever the list object or its length changes.
        key = (id(self.pci_devices), len(self.pci_devices))
        cached = self.__dict__.get("_pci_index")
        if cached is None or cached[0] != key:
            cached = (key, {dev.bus_id: dev for dev in reversed(self.pci_devices)})
            self.__dict__["_pci_index"] = cached
        index: dict[str, PciDevice] = cached[1]
        return index.get(bus_id)

    def numa(self, node_id: int) -> NumaNode | None:
        for node in self.numa_nodes:
            if node.id == node_id:
                return node
        return None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = _to_jsonable(self)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Inventory:
        schema = data.get("schema", INVENTORY_SCHEMA)
        if schema != INVENTORY_SCHEMA:
            raise ValueError(f"unsupported inventory schema {schema!r} (want {INVENTORY_SCHEMA})")
        return _from_jsonable(cls, data)


def _to_jsonable(obj: Any) -> Any:
    if isinstance(obj, Record):
        # Every field is an instance attribute set by the generated __init__, in field
        # order: walking __dict__ is several times faster than dataclasses.fields().
        return {k: _to_jsonable(v) for k, v in vars(obj).items() if not k.startswith("_")}
    if isinstance(obj, dict):
        # JSON object keys are strings; NUMA distances use int keys in memory.
        return {str(k): _to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_jsonable(v) for v in obj]
    return obj


T = TypeVar("T")
_HINTS: dict[type, dict[str, Any]] = {}


def _from_jsonable(cls: type[T], data: dict[str, Any]) -> T:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name])
    return cls(**kwargs)


def _convert(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value) if len(inner) == 1 else value
    if origin is list:
        return [_convert(args[0], v) for v in value]
    if origin is dict:
        return {_convert(args[0], k): _convert(args[1], v) for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _from_jsonable(tp, value)
    if tp is int and isinstance(value, str):
        return int(value)
    return value
