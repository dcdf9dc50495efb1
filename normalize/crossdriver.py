"""Cross-driver normalization: other DRA drivers' devices on this node, checked against the
hardware toposlice discovered.

Several drivers publish the devices of one node (the NVIDIA GPU driver, a NIC driver such as
dranet, the CPU driver). A claim aligns them only through the standard attributes
``resource.kubernetes.io/{pciBusID,pcieRoot,numaNode}``; one driver that leaves them out,
spells them its own way or publishes a wrong value silently breaks every ``matchAttribute``
constraint across drivers. :func:`normalization_report` maps each foreign device to a vertex
of the physical graph (by ``pciBusID``, else GPU UUID, netdev / RDMA name, CPU ids) and says,
per driver, what is missing or disagrees with the hardware. Pure: slices in, report out.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from discovery.model import Inventory, PciDevice
from discovery.readers import parse_cpulist

from .attribute_names import BRIDGE_NUMA
from .attributes import (
    NUMA_NODE,
    PCI_BUS_ID,
    PCI_BUS_ID_RE,
    PCIE_ROOT,
    STANDARD_DOMAIN,
    AttributeDrop,
)
from .cpugroups import cpu_groups, device_numa, local_pcie_roots
from .dialects import BRIDGEABLE, DIALECTS
from .relations import canonical_bus_id
from .snapshot import Snapshot

REPORT_SCHEMA = "toposlice.normalization/v1"

Severity = Literal["error", "warning", "info"]
"""``info``: advice on a driver's documented dialect, never an alarm (``doctor`` does not
fail on it)."""

#: Check names (a bounded set: they are metric labels).
MISSING = "missing-standard-attribute"
DISAGREES = "disagrees-with-hardware"
INVALID = "invalid-standard-value"
LOOK_ALIKE = "look-alike-attribute"
SCALAR_VS_LIST = "scalar-vs-list"
BUSID_NO_ROOT = "pciBusID-without-pcieRoot"
CPU_ROOTS_WIDE = "cpu-pcieRoot-wider-than-pinned"
STALE_DRIVER = "driver-not-on-node"
UNMATCHED = "unmatched-device"
DOUBLE_PUBLISHED = "double-published"
DIALECT = "dialect"
CHECKS = (
    MISSING,
    DISAGREES,
    INVALID,
    LOOK_ALIKE,
    SCALAR_VS_LIST,
    BUSID_NO_ROOT,
    CPU_ROOTS_WIDE,
    STALE_DRIVER,
    UNMATCHED,
    DOUBLE_PUBLISHED,
    DIALECT,
)
_SEVERITY: dict[str, Severity] = {
    MISSING: "warning",
    DISAGREES: "error",
    INVALID: "error",
    LOOK_ALIKE: "warning",
    SCALAR_VS_LIST: "info",
    BUSID_NO_ROOT: "error",
    CPU_ROOTS_WIDE: "error",
    STALE_DRIVER: "error",
    UNMATCHED: "warning",
    DOUBLE_PUBLISHED: "error",
    DIALECT: "info",
}

#: Kubernetes (major, minor) whose kube-scheduler first allocates ``matchAttribute`` over a
#: list and a scalar (the ``DRAListTypeAttributes`` gate, alpha; v1.36's never selects the
#: list-capable allocator: kubernetes#139332).
LIST_MATCH_SINCE = (1, 37)

#: dra-driver-cpu's grouped-mode device names carry the NUMA node: ``cpudevnuma001``.
_CPU_GROUP_NAME = re.compile(r"^cpudevnuma0*(\d+)$")

#: Driver-scoped names that mean a standard attribute (lower-cased identifier part).
LOOK_ALIKES: dict[str, str] = {
    "pciroot": PCIE_ROOT,
    "pcieroot": PCIE_ROOT,
    "pcierootcomplex": PCIE_ROOT,
    "numa": NUMA_NODE,
    "numanode": NUMA_NODE,
    "numanodeid": NUMA_NODE,
    "pciaddress": PCI_BUS_ID,
    "pcibusid": PCI_BUS_ID,
    "pciebusid": PCI_BUS_ID,
    "busid": PCI_BUS_ID,
}
_UUID_KEYS = ("uuid", "gpuuuid")
_NETDEV_KEYS = ("ifname", "netdev", "interface", "interfacename")
_RDMA_KEYS = ("rdmadevice", "rdmaname", "rdmadev", "ibdevice")
_CPU_ID_KEYS = ("cpuid",)
_CPU_LIST_KEYS = ("cpus", "cpulist", "cpuids", "cpuset")


@dataclass(frozen=True)
class DraIdentity:
    """What an allocation result names: ``<driver>/<pool>/<device>``."""

    driver: str
    pool: str
    device: str

    def to_dict(self) -> dict[str, str]:
        return {"driver": self.driver, "pool": self.pool, "device": self.device}


@dataclass(frozen=True)
class Finding:
    driver: str
    check: str
    message: str
    severity: Severity = "warning"
    pool: str | None = None
    device: str | None = None
    attribute: str | None = None
    published: Any = None
    expected: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class DeviceMatch:
    identity: DraIdentity
    vertex: str | None
    """Graph vertex id, or None when nothing on this node matched."""
    by: str | None
    """``pciBusID`` | ``uuid`` | ``netdev`` | ``rdma`` | ``cpus`` | ``numaNode``."""
    bus_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.identity.to_dict(), "vertex": self.vertex}
        if self.by:
            out["matched_by"] = self.by
        if self.bus_id:
            out["bus_id"] = self.bus_id
        return out


@dataclass
class DriverSummary:
    driver: str
    pools: list[str] = field(default_factory=list)
    devices: int = 0
    matched: int = 0
    on_node: bool | None = None
    """False when the driver has slices here but no kubelet registration (None: unknown)."""
    findings: int = 0


@dataclass
class NormalizationReport:
    node: str | None
    drivers: list[DriverSummary]
    matches: list[DeviceMatch]
    findings: list[Finding]
    own_driver: str | None = None
    not_published: tuple[AttributeDrop, ...] = ()
    """toposlice's own attributes not published as discovered (over an API limit): not
    findings about other drivers, but what a claim author on this node must know."""
    withheld: frozenset[str] = frozenset()
    """toposlice's devices left to the other drivers that publish the same hardware
    (``--duplicates yield``): not published, so no vertex carries toposlice's identity for
    them (``attrs.dra`` lists only the drivers that do publish it)."""

    @property
    def errors(self) -> int:
        return sum(1 for f in self.findings if f.severity == "error")

    @property
    def warnings(self) -> int:
        return sum(1 for f in self.findings if f.severity == "warning")

    @property
    def infos(self) -> int:
        return sum(1 for f in self.findings if f.severity == "info")

    def double_published(self) -> dict[str, list[DraIdentity]]:
        """Vertex id -> the devices of two or more drivers published for that hardware."""
        return _shared_hardware(self.matches)

    def identities(self) -> dict[str, list[DraIdentity]]:
        """Vertex id -> the foreign DRA identities matched to it."""
        out: dict[str, list[DraIdentity]] = {}
        for m in self.matches:
            if m.vertex is not None:
                out.setdefault(m.vertex, []).append(m.identity)
        return out

    def finding_counts(self) -> dict[tuple[str, str], int]:
        return dict(Counter((f.driver, f.check) for f in self.findings))

    def device_counts(self) -> dict[tuple[str, str], int]:
        return dict(
            Counter((m.identity.driver, "true" if m.vertex else "false") for m in self.matches)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "node": self.node,
            "summary": {
                "drivers": len(self.drivers),
                "devices": len(self.matches),
                "matched": sum(1 for m in self.matches if m.vertex),
                "errors": self.errors,
                "warnings": self.warnings,
                "infos": self.infos,
                "not_published": len(self.not_published),
            },
            "drivers": [asdict(d) for d in self.drivers],
            "devices": [m.to_dict() for m in self.matches],
            "findings": [f.to_dict() for f in self.findings],
            "not_published": [
                {"driver": self.own_driver, **d.to_dict()} for d in self.not_published
            ],
        }


def empty_report(node: str | None, snap: Snapshot | None = None) -> NormalizationReport:
    """No other driver's slices checked; ``snap``'s own unpublished attributes, if given."""
    return NormalizationReport(
        node=node,
        drivers=[],
        matches=[],
        findings=[],
        own_driver=snap.driver if snap is not None else None,
        not_published=snap.dropped if snap is not None else (),
    )


# ---- slice handling ---------------------------------------------------------------------


def current_slices(slices: Iterable[dict[str, Any]], node: str | None) -> list[dict[str, Any]]:
    """Slices of ``node`` (all when None) at the highest generation of their pool."""
    mine = [s for s in slices if node is None or _slice_node(s) == node]
    best: dict[tuple[str, str], int] = {}
    for s in mine:
        key = _pool_key(s)
        best[key] = max(best.get(key, 0), _generation(s))
    return [s for s in mine if _generation(s) == best[_pool_key(s)]]


def _spec(s: dict[str, Any]) -> dict[str, Any]:
    spec = s.get("spec")
    return spec if isinstance(spec, dict) else {}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _slice_node(s: dict[str, Any]) -> str | None:
    node = _spec(s).get("nodeName")
    return node if isinstance(node, str) else None


def _pool_key(s: dict[str, Any]) -> tuple[str, str]:
    spec = _spec(s)
    return (str(spec.get("driver", "")), str(_dict(spec.get("pool")).get("name", "")))


def _generation(s: dict[str, Any]) -> int:
    pool = _spec(s).get("pool")
    gen = pool.get("generation") if isinstance(pool, dict) else None
    return gen if isinstance(gen, int) else 0


def _qualify(driver: str, name: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


def _ident(name: str) -> str:
    return name.rsplit("/", 1)[-1].lower()


def _value(attr: Any) -> tuple[str | None, Any]:
    """(kind, value) of a DeviceAttribute dict: ``("string", "x")``, ``("ints", [1])``."""
    if not isinstance(attr, dict):
        return None, None
    for kind in ("string", "int", "bool", "version", "strings", "ints", "bools", "versions"):
        if kind in attr:
            return kind, attr[kind]
    return None, None


def _is_list(kind: str | None) -> bool:
    return kind is not None and kind.endswith("s")


# ---- matching ---------------------------------------------------------------------------


@dataclass
class _Hardware:
    """Lookup tables over one inventory."""

    inv: Inventory
    vertex_of_bus: dict[str, str]
    uuid: dict[str, str]
    netdev: dict[str, str]
    rdma: dict[str, str]
    cpu_group_of_cpu: dict[int, str]
    cpu_group_of_numa: dict[int, str]
    cpu_numa: dict[int, int]

    @classmethod
    def of(cls, snap: Snapshot) -> _Hardware:
        inv = snap.inventory
        vertex_of_bus: dict[str, str] = {}
        for g in inv.gpus:
            vertex_of_bus[g.bus_id] = f"gpu:{g.bus_id}"
        for n in inv.nics:
            vertex_of_bus[n.bus_id] = f"nic:{n.bus_id}"
        for s in inv.nvswitches:
            vertex_of_bus[s.bus_id] = f"nvswitch:{s.bus_id}"
        uuid = {g.uuid.lower(): f"gpu:{g.bus_id}" for g in inv.gpus if g.uuid}
        netdev = {d: f"nic:{n.bus_id}" for n in inv.nics for d in n.netdevs}
        rdma = {d: f"nic:{n.bus_id}" for n in inv.nics for d in n.rdma_devices}
        by_cpu: dict[int, str] = {}
        by_numa: dict[int, str] = {}
        for group in cpu_groups(inv, snap.options.cpu_grouping):
            vid = f"cpu_group:{group.name}"
            for c in group.cpus:
                by_cpu.setdefault(c, vid)
            if group.numa_node is not None:
                by_numa.setdefault(group.numa_node, vid)
        cpu_numa = {c.id: c.numa_node for c in inv.cpus if c.numa_node is not None}
        for node in inv.numa_nodes:
            for c in node.cpus:
                cpu_numa.setdefault(c, node.id)
        return cls(inv, vertex_of_bus, uuid, netdev, rdma, by_cpu, by_numa, cpu_numa)


@dataclass
class _Device:
    identity: DraIdentity
    attrs: dict[str, tuple[str | None, Any]]
    """Fully-qualified name -> (kind, value)."""
    multi: bool = False


def _cpu_ids(dev: _Device) -> list[int] | None:
    ids: list[int] = []
    for name, (kind, value) in dev.attrs.items():
        key = _ident(name)
        if key in _CPU_ID_KEYS and kind == "int":
            ids.append(int(value))
        elif key in _CPU_ID_KEYS and kind == "ints":
            ids.extend(int(v) for v in value)
        elif key in _CPU_LIST_KEYS and kind == "string":
            parsed = parse_cpulist(value)
            if parsed:
                ids.extend(parsed)
        elif key in _CPU_LIST_KEYS and kind == "ints":
            ids.extend(int(v) for v in value)
    return sorted(set(ids)) or None


def _named_numa(dev: _Device) -> int | None:
    """The NUMA node a CPU driver's device name states (dra-driver-cpu's grouped mode)."""
    m = _CPU_GROUP_NAME.match(dev.identity.device)
    return int(m.group(1)) if m else None


def _numa_attrs(dev: _Device) -> dict[str, int]:
    """Every attribute that holds the device's NUMA node (the standard one, look-alikes,
    dialect names) -> its (first) value."""
    out: dict[str, int] = {}
    for name, (kind, value) in dev.attrs.items():
        if name != NUMA_NODE and LOOK_ALIKES.get(_ident(name)) != NUMA_NODE:
            continue
        if kind == "int" and isinstance(value, int):
            out[name] = value
        elif kind == "ints" and value and isinstance(value[0], int):
            out[name] = value[0]
    return out


def _dialect_names(driver: str) -> tuple[str, ...]:
    dialect = DIALECTS.get(driver)
    return dialect.names() if dialect is not None else ()


def _looks_cpu(dev: _Device) -> bool:
    if any("cpu" in part for part in dev.identity.driver.split(".")):
        return True
    return any(_ident(n) == "type" and v == "cpu" for n, (_k, v) in dev.attrs.items())


def _match(dev: _Device, hw: _Hardware) -> tuple[str | None, str | None, str | None]:
    """(vertex, by, bus id) for one foreign device."""
    bus_values: list[str] = []
    std = dev.attrs.get(PCI_BUS_ID)
    if std and std[0] == "string":
        bus_values.append(str(std[1]))
    for name, (kind, value) in dev.attrs.items():
        if name != PCI_BUS_ID and LOOK_ALIKES.get(_ident(name)) == PCI_BUS_ID and kind == "string":
            bus_values.append(str(value))
    for raw in bus_values:
        bus = canonical_bus_id(raw)
        if bus and (bus in hw.vertex_of_bus or hw.inv.pci(bus) is not None):
            return hw.vertex_of_bus.get(bus), "pciBusID", bus
    for name, (kind, value) in dev.attrs.items():
        key = _ident(name)
        if kind != "string":
            continue
        if key in _UUID_KEYS and str(value).lower() in hw.uuid:
            vid = hw.uuid[str(value).lower()]
            return vid, "uuid", vid.split(":", 1)[1]
        if key in _NETDEV_KEYS and value in hw.netdev:
            vid = hw.netdev[value]
            return vid, "netdev", vid.split(":", 1)[1]
        if key in _RDMA_KEYS and value in hw.rdma:
            vid = hw.rdma[value]
            return vid, "rdma", vid.split(":", 1)[1]
    if dev.identity.device in hw.netdev:
        vid = hw.netdev[dev.identity.device]
        return vid, "netdev", vid.split(":", 1)[1]
    cpus = _cpu_ids(dev)
    if cpus:
        votes = Counter(hw.cpu_group_of_cpu[c] for c in cpus if c in hw.cpu_group_of_cpu)
        if votes:
            return votes.most_common(1)[0][0], "cpus", None
    if _looks_cpu(dev):
        named = _named_numa(dev)
        if named is not None and named in hw.cpu_group_of_numa:
            return hw.cpu_group_of_numa[named], "name", None
        for node in _numa_attrs(dev).values():
            if node in hw.cpu_group_of_numa:
                return hw.cpu_group_of_numa[node], "numaNode", None
    return None, None, None


# ---- checks -----------------------------------------------------------------------------


class _Checker:
    def __init__(self, hw: _Hardware) -> None:
        self.hw = hw
        self.findings: list[Finding] = []

    def add(self, check: str, dev: _Device | None, driver: str, message: str, **kw: Any) -> None:
        self.findings.append(
            Finding(
                driver=driver,
                check=check,
                message=message,
                severity=_SEVERITY[check],
                pool=dev.identity.pool if dev else None,
                device=dev.identity.device if dev else None,
                **kw,
            )
        )

    def look_alikes(self, dev: _Device) -> None:
        known = _dialect_names(dev.identity.driver)
        for name in dev.attrs:
            if name.startswith(f"{STANDARD_DOMAIN}/") or name in known:
                continue
            standard = LOOK_ALIKES.get(_ident(name))
            if standard is None or standard in dev.attrs:
                continue  # an alias beside the standard name misleads no claim
            self.add(
                LOOK_ALIKE,
                dev,
                dev.identity.driver,
                f"{name} looks like the standard {standard}; "
                f"publish {standard} so claims can align across drivers",
                attribute=name,
                expected=standard,
            )

    def pci_device(self, dev: _Device, pci: PciDevice) -> None:
        drv = dev.identity.driver
        want = {
            PCI_BUS_ID: pci.bus_id,
            PCIE_ROOT: pci.pcie_root,
            NUMA_NODE: pci.numa_node,
        }
        has_bus = PCI_BUS_ID in dev.attrs
        # A known dialect's own name for a standard fact stands in for it (its value is
        # checked below like any look-alike's); the `dialect` note says how to align on it.
        spoken = {LOOK_ALIKES.get(_ident(n)) for n in _dialect_names(drv) if n in dev.attrs}
        for std, expected in want.items():
            got = dev.attrs.get(std)
            if got is None:
                if expected is None or std in spoken:
                    continue
                if std == PCIE_ROOT and has_bus:
                    self.add(
                        BUSID_NO_ROOT,
                        dev,
                        drv,
                        f"publishes {PCI_BUS_ID} but no {PCIE_ROOT}: "
                        "claims cannot align it with devices of the same root",
                        attribute=PCIE_ROOT,
                        expected=expected,
                    )
                else:
                    self.add(
                        MISSING,
                        dev,
                        drv,
                        f"{std} is missing (hardware: {expected})",
                        attribute=std,
                        expected=expected,
                    )
                continue
            self._compare(dev, std, got, expected)
        for name, got in dev.attrs.items():
            if name.startswith(f"{STANDARD_DOMAIN}/"):
                continue
            standard = LOOK_ALIKES.get(_ident(name))
            if standard in want:
                self._compare(dev, name, got, want[standard], standard=standard)

    def _compare(
        self,
        dev: _Device,
        name: str,
        got: tuple[str | None, Any],
        expected: Any,
        standard: str | None = None,
    ) -> None:
        std = standard or name
        kind, value = got
        drv = dev.identity.driver
        if std == NUMA_NODE:
            if kind == "int":
                first = value
            elif kind == "ints" and value:
                first = value[0]
            else:
                if standard is None:
                    self.add(
                        INVALID, dev, drv, f"{name} must be an int", attribute=name, published=value
                    )
                return
            if expected is None:
                self.add(
                    DISAGREES,
                    dev,
                    drv,
                    f"{name} is {value} but the kernel reports no NUMA node for the device",
                    attribute=name,
                    published=value,
                )
            elif first != expected:
                self.add(
                    DISAGREES,
                    dev,
                    drv,
                    f"{name} is {value} but the device is on NUMA node {expected}",
                    attribute=name,
                    published=value,
                    expected=expected,
                )
            return
        if kind != "string":
            if standard is None:
                self.add(
                    INVALID, dev, drv, f"{name} must be a string", attribute=name, published=value
                )
            return
        if std == PCI_BUS_ID:
            if standard is None and not PCI_BUS_ID_RE.match(str(value)):
                self.add(
                    INVALID,
                    dev,
                    drv,
                    f"{name} {value!r} is not a lower-case 4-digit-domain BDF",
                    attribute=name,
                    published=value,
                    expected=expected,
                )
            elif canonical_bus_id(str(value)) != expected:
                self.add(
                    DISAGREES,
                    dev,
                    drv,
                    f"{name} is {value} but the device is {expected}",
                    attribute=name,
                    published=value,
                    expected=expected,
                )
        elif std == PCIE_ROOT and value != expected:
            self.add(
                DISAGREES,
                dev,
                drv,
                f"{name} is {value} but the device's PCIe root is {expected}",
                attribute=name,
                published=value,
                expected=expected,
            )

    def cpu_device(self, dev: _Device) -> None:
        drv = dev.identity.driver
        cpus = _cpu_ids(dev)
        named = _named_numa(dev)
        numa_attrs = _numa_attrs(dev)
        if cpus:
            nodes = sorted({self.hw.cpu_numa[c] for c in cpus if c in self.hw.cpu_numa})
        elif named is not None:
            nodes = [named]
        else:
            nodes = list(numa_attrs.values())[:1]
        if not nodes:
            return
        known = cpus is not None or named is not None
        if NUMA_NODE not in dev.attrs and not set(numa_attrs) & set(_dialect_names(drv)):
            self.add(
                MISSING,
                dev,
                drv,
                f"{NUMA_NODE} is missing (its CPUs are on node(s) {nodes})",
                attribute=NUMA_NODE,
                expected=nodes[0] if len(nodes) == 1 else nodes,
            )
        for name, value in numa_attrs.items():
            if known and value not in nodes:
                self.add(
                    DISAGREES,
                    dev,
                    drv,
                    f"{name} is {value} but its CPUs are on node(s) {nodes}",
                    attribute=name,
                    published=value,
                    expected=nodes[0] if len(nodes) == 1 else nodes,
                )
        self._cpu_counts(dev, nodes, cpus)
        roots_attr = dev.attrs.get(PCIE_ROOT)
        if roots_attr is None:
            return
        kind, value = roots_attr
        published_roots = [value] if kind == "string" else list(value or [])
        pinned: set[str] = set()
        for n in nodes:
            pinned.update(local_pcie_roots(self.hw.inv, n))
        extra = sorted(set(published_roots) - pinned)
        spans = {n for n in (self._root_numa(r) for r in published_roots) if n is not None}
        if extra:
            self.add(
                CPU_ROOTS_WIDE,
                dev,
                drv,
                f"{PCIE_ROOT} lists {', '.join(extra)}, which are not local to the CPUs "
                f"the device pins (NUMA node(s) {nodes})",
                attribute=PCIE_ROOT,
                published=published_roots,
                expected=sorted(pinned),
            )
        elif dev.multi and len(spans) > 1:
            self.add(
                CPU_ROOTS_WIDE,
                dev,
                drv,
                f"{PCIE_ROOT} spans NUMA nodes {sorted(spans)} but a partial allocation of this "
                "shared device pins CPUs of only some of them",
                attribute=PCIE_ROOT,
                published=published_roots,
            )

    def _cpu_counts(self, dev: _Device, nodes: list[int], cpus: list[int] | None) -> None:
        """A grouped CPU device's socket and CPU count against its NUMA node(s)."""
        if cpus is not None:
            return
        inv = self.hw.inv
        members = [c for n in inv.numa_nodes if n.id in nodes for c in n.cpus]
        packages = {n.package for n in inv.numa_nodes if n.id in nodes and n.package is not None}
        for name, (kind, value) in dev.attrs.items():
            key = _ident(name)
            if kind != "int" or not isinstance(value, int):
                continue
            if key in ("socketid", "socket", "package") and packages and value not in packages:
                self.add(
                    DISAGREES,
                    dev,
                    dev.identity.driver,
                    f"{name} is {value} but NUMA node(s) {nodes} are on socket(s) "
                    f"{sorted(packages)}",
                    attribute=name,
                    published=value,
                    expected=sorted(packages),
                )
            elif key in ("numcpus", "cpucount") and members and value != len(members):
                self.add(
                    DISAGREES,
                    dev,
                    dev.identity.driver,
                    f"{name} is {value} but NUMA node(s) {nodes} have {len(members)} CPUs",
                    attribute=name,
                    published=value,
                    expected=len(members),
                )

    def _root_numa(self, root: str) -> int | None:
        for p in self.hw.inv.pci_devices:
            if p.pcie_root == root:
                numa = device_numa(p)
                if numa is not None:
                    return numa
        return None


def _devices(slices: Sequence[dict[str, Any]]) -> list[_Device]:
    out: list[_Device] = []
    for s in slices:
        spec = _spec(s)
        driver = str(spec.get("driver", ""))
        pool_name = str(_dict(spec.get("pool")).get("name", ""))
        for dev in spec.get("devices") or []:
            if not isinstance(dev, dict) or not isinstance(dev.get("name"), str):
                continue
            raw = _dict(dev.get("attributes"))
            attrs = {_qualify(driver, str(k)): _value(v) for k, v in raw.items()}
            out.append(
                _Device(
                    DraIdentity(driver, pool_name, dev["name"]),
                    attrs,
                    multi=bool(dev.get("allowMultipleAllocations")),
                )
            )
    return out


def normalization_report(
    snap: Snapshot,
    slices: Sequence[dict[str, Any]],
    node: str | None = None,
    drivers_on_node: Iterable[str] | None = None,
    server_version: tuple[int, int] | None = None,
) -> NormalizationReport:
    """Match the devices of ``slices`` (any drivers, API JSON form) to ``snap``'s graph and
    check their standard attributes. ``node`` filters slices by ``spec.nodeName`` (default:
    the snapshot's node); ``drivers_on_node`` (registered kubelet plugins) flags slices of
    drivers that are gone; ``server_version`` (the cluster's Kubernetes (major, minor))
    makes the advice on list attributes true for that scheduler (None: both cases). Older
    pool generations are ignored, as the scheduler does."""
    node = node if node is not None else snap.node_name
    live = current_slices(slices, node)
    hw = _Hardware.of(snap)
    checker = _Checker(hw)
    devices = _devices(live)
    matches: list[DeviceMatch] = []
    for dev in devices:
        checker.look_alikes(dev)
        vertex, by, bus = _match(dev, hw)
        matches.append(DeviceMatch(dev.identity, vertex, by, bus))
        pci = hw.inv.pci(bus) if bus else None
        if pci is not None:
            checker.pci_device(dev, pci)
        elif vertex is not None and vertex.startswith("cpu_group:"):
            checker.cpu_device(dev)
        elif vertex is None:
            checker.add(
                UNMATCHED,
                dev,
                dev.identity.driver,
                "matches no device of this node by pciBusID, GPU UUID, netdev/RDMA name or CPU ids",
            )
    _scalar_vs_list(devices, checker, server_version)
    _dialects(devices, checker)
    _double_published(matches, checker)
    on_node = set(drivers_on_node) if drivers_on_node is not None else None
    summaries: dict[str, DriverSummary] = {}
    for s in live:
        drv, pool = _pool_key(s)
        summary = summaries.setdefault(drv, DriverSummary(drv))
        if pool not in summary.pools:
            summary.pools.append(pool)
    for m in matches:
        summary = summaries.setdefault(m.identity.driver, DriverSummary(m.identity.driver))
        summary.devices += 1
        summary.matched += 1 if m.vertex else 0
    for drv, summary in sorted(summaries.items()):
        if on_node is None:
            continue
        summary.on_node = drv in on_node
        if not summary.on_node:
            checker.add(
                STALE_DRIVER,
                None,
                drv,
                f"{drv} has {summary.devices} device(s) in ResourceSlices of this node but is not "
                "registered with the kubelet: nothing can prepare them",
            )
    counts = Counter(f.driver for f in checker.findings)
    for drv, summary in summaries.items():
        summary.findings = counts.get(drv, 0)
    return NormalizationReport(
        node=node,
        drivers=[summaries[d] for d in sorted(summaries)],
        matches=matches,
        findings=checker.findings,
        own_driver=snap.driver,
        not_published=snap.dropped,
    )


def _dialects(devices: list[_Device], checker: _Checker) -> None:
    """One note per neighbour that names the NUMA node its own way, saying how a claim
    ties its devices to the others'."""
    present = sorted({d.identity.driver for d in devices} & set(BRIDGEABLE))
    bridged = any(BRIDGE_NUMA in d.attrs for d in devices if d.identity.driver not in present)
    for drv in present:
        dialect = DIALECTS[drv]
        names = " and ".join(dialect.numa)
        if dialect.bus_id:
            names += f" (and the PCI address {dialect.bus_id}, not {PCI_BUS_ID})"
        how = (
            f"toposlice's devices carry {BRIDGE_NUMA} too"
            if bridged
            else f"toposlice publishes {BRIDGE_NUMA} with --bridge (run: auto, the default)"
        )
        checker.add(
            DIALECT,
            None,
            drv,
            f"{drv} names the NUMA node {names}, not {NUMA_NODE}: tie its devices to others "
            f"with matchAttribute {BRIDGE_NUMA} ({how})",
            attribute=BRIDGE_NUMA,
        )


def _shared_hardware(matches: Iterable[DeviceMatch]) -> dict[str, list[DraIdentity]]:
    """Vertex id -> the devices matched to it, where two or more drivers publish it."""
    by_vertex: dict[str, list[DraIdentity]] = {}
    for m in matches:
        if m.vertex is not None:
            by_vertex.setdefault(m.vertex, []).append(m.identity)
    return {v: ids for v, ids in by_vertex.items() if len({i.driver for i in ids}) > 1}


def _double_published(matches: list[DeviceMatch], checker: _Checker) -> None:
    """The same hardware published by two drivers: a pod can be given it twice."""
    for vertex, ids in sorted(_shared_hardware(matches).items()):
        drivers = sorted({i.driver for i in ids})
        names = ", ".join(f"{i.device} ({i.driver})" for i in ids)
        for drv in drivers:
            mine = [i for i in ids if i.driver == drv]
            checker.findings.append(
                Finding(
                    driver=drv,
                    check=DOUBLE_PUBLISHED,
                    severity=_SEVERITY[DOUBLE_PUBLISHED],
                    pool=mine[0].pool,
                    device=mine[0].device,
                    message=f"{vertex} is published by {len(drivers)} drivers ({names}): a pod "
                    "can be given the same hardware twice; publish it from one (toposlice "
                    "yields by default, --duplicates yield)",
                )
            )


def _list_advice(server_version: tuple[int, int] | None) -> str:
    fixed = f"{LIST_MATCH_SINCE[0]}.{LIST_MATCH_SINCE[1]}"
    old = (
        "never allocates on this cluster's scheduler (it does not select the list-capable "
        "allocator before " + fixed + ", kubernetes#139332): align on "
        f"{BRIDGE_NUMA} or with CEL selectors"
    )
    new = "needs the DRAListTypeAttributes gate (alpha) on kube-apiserver and kube-scheduler"
    if server_version is None:
        return (
            f"matchAttribute across them never allocates before Kubernetes {fixed} "
            f"(kubernetes#139332; align on {BRIDGE_NUMA} or with CEL selectors) and from "
            f"{fixed} {new}"
        )
    return f"matchAttribute across them {new if server_version >= LIST_MATCH_SINCE else old}"


def _scalar_vs_list(
    devices: list[_Device], checker: _Checker, server_version: tuple[int, int] | None = None
) -> None:
    forms: dict[str, dict[str, set[str]]] = {}
    for dev in devices:
        for name, (kind, _value) in dev.attrs.items():
            if kind is None:
                continue
            form = "list" if _is_list(kind) else "scalar"
            forms.setdefault(name, {}).setdefault(form, set()).add(dev.identity.driver)
    for name, by_form in sorted(forms.items()):
        if len(by_form) < 2:
            continue
        scalar = sorted(by_form["scalar"])
        listed = sorted(by_form["list"])
        if set(scalar) == set(listed) == {scalar[0]}:
            continue  # one driver's own mix (its list gate is its business): not across drivers
        for drv in sorted(set(scalar) | set(listed)):
            checker.add(
                SCALAR_VS_LIST,
                None,
                drv,
                f"{name} is a scalar for {', '.join(scalar)} but a list for {', '.join(listed)}: "
                + _list_advice(server_version),
                attribute=name,
            )


def registered_driver(socket_name: str) -> str | None:
    """Driver name from a kubelet registration socket file name, when it shows one:
    ``<driver>-reg.sock`` or ``<driver>-<pod UID>-reg.sock`` (hashed names give None)."""
    m = re.match(
        r"^(?P<driver>.+?)(-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})?-reg\.sock$",
        socket_name,
    )
    if m is None or socket_name.startswith("."):
        return None
    driver = m.group("driver")
    if driver.startswith("dra-") and "." not in driver:
        return None
    return driver


def with_dra_identities(
    graph: dict[str, Any],
    own: Mapping[str, str] | None = None,
    foreign: Mapping[str, Sequence[DraIdentity]] | None = None,
) -> dict[str, Any]:
    """A copy of ``graph`` whose device vertices carry ``attrs.dra``: every DRA identity
    (``{driver, pool, device}``) published for that hardware — toposlice's own (``own``:
    vertex id -> device name, under ``graph["dra"]``) and other drivers' (``foreign``) — so
    an allocation result maps straight to a vertex. The input graph is not modified."""
    dra = graph.get("dra") or {}
    driver, pool = str(dra.get("driver", "")), str(dra.get("pool") or "")
    vertices = []
    for v in graph.get("vertices", []):
        ids: list[dict[str, str]] = []
        if own and v["id"] in own:
            ids.append(DraIdentity(driver, pool, own[v["id"]]).to_dict())
        for ident in (foreign or {}).get(v["id"], ()):
            ids.append(ident.to_dict())
        if ids:
            v = {**v, "attrs": {**v["attrs"], "dra": ids}}
        vertices.append(v)
    return {**graph, "vertices": vertices}


@dataclass(frozen=True)
class Neighbourhood:
    """What the other drivers on this node mean for what toposlice publishes."""

    drivers: tuple[str, ...] = ()
    """Other drivers with current slices here (registered with the kubelet, when known)."""
    bridges: tuple[str, ...] = ()
    """Of those, the ones whose NUMA dialect toposlice can speak (normalize/dialects.py)."""
    taken: Mapping[str, tuple[DraIdentity, ...]] = field(default_factory=dict)
    """toposlice device name -> the other drivers' devices for the same hardware."""

    def message(self, yielding: bool = True) -> str:
        """One line on the devices others publish too ('' when none): left to them
        (``yielding``) or kept (``--duplicates publish``)."""
        if not self.taken:
            return ""
        by_driver: dict[str, list[str]] = {}
        for name, ids in sorted(self.taken.items()):
            for drv in sorted({i.driver for i in ids}):
                by_driver.setdefault(drv, []).append(name)
        parts = [
            f"{len(names)} device(s) published by {drv} too ({', '.join(names[:4])}"
            + (", ..." if len(names) > 4 else "")
            + ")"
            for drv, names in sorted(by_driver.items())
        ]
        said = "; ".join(parts) + ": a pod could be given them twice"
        if yielding:
            return f"not publishing {said}"
        return f"publishing (--duplicates publish) {said}; toposlice doctor reports it"


def neighbourhood(
    snap: Snapshot,
    slices: Sequence[dict[str, Any]],
    drivers_on_node: Iterable[str] | None = None,
) -> Neighbourhood:
    """The other drivers of ``snap``'s node in ``slices`` and which of ``snap``'s devices
    they publish too (matched to the hardware as :func:`normalization_report` does, by the
    facts each driver publishes). A driver whose slices outlived it (not registered, when
    ``drivers_on_node`` is known) is not counted: nothing could allocate its devices."""
    on_node = set(drivers_on_node) if drivers_on_node is not None else None
    live = [
        s
        for s in current_slices(slices, snap.node_name)
        if _pool_key(s)[0] != snap.driver and (on_node is None or _pool_key(s)[0] in on_node)
    ]
    hw = _Hardware.of(snap)
    taken: dict[str, set[DraIdentity]] = {}
    for dev in _devices(live):
        vertex, _by, _bus = _match(dev, hw)
        vertices = {vertex} if vertex else set()
        if vertex and vertex.startswith("cpu_group:"):
            vertices |= _cpu_vertices(dev, hw)  # every group its CPUs overlap
        for v in vertices:
            name = snap.vertex_devices.get(v)
            if name is not None:
                taken.setdefault(name, set()).add(dev.identity)
    drivers = tuple(sorted({_pool_key(s)[0] for s in live}))
    return Neighbourhood(
        drivers=drivers,
        bridges=tuple(d for d in drivers if d in BRIDGEABLE),
        taken={
            n: tuple(sorted(ids, key=lambda i: (i.driver, i.device)))
            for n, ids in sorted(taken.items())
        },
    )


def _cpu_vertices(dev: _Device, hw: _Hardware) -> set[str]:
    """The CPU-group vertices a CPU driver's device overlaps: by its CPU ids, else by the
    CPUs of the NUMA node it names."""
    cpus = _cpu_ids(dev)
    if not cpus:
        numa = _named_numa(dev)
        if numa is None:
            numa = next(iter(_numa_attrs(dev).values()), None)
        cpus = [c for c, n in hw.cpu_numa.items() if n == numa] if numa is not None else []
    return {hw.cpu_group_of_cpu[c] for c in cpus if c in hw.cpu_group_of_cpu}
