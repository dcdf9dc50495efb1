"""NCCL topology XML (``NCCL_TOPO_FILE``) for exactly the GPUs and NICs of one claim.

Inside a container whose sysfs is virtualized or flattened, NCCL sees every device
straight off a CPU and turns P2P and GPUDirect RDMA off. The file gives it the host's
real tree back: one ``cpu`` per NUMA node, one ``pci`` per PCIe switch (upstream port BDF,
as NCCL's own sysfs walk records switches), the endpoints below, and ``nvlink`` children
for NVLinks among the claim's GPUs and to NVSwitches (../shared/reference/nccl-topology.md).

NCCL reads this with its own small parser, not a real XML one: no ``<?xml?>`` line, space
indentation, every tag on one line, ``key="value"`` with no spaces and no space before
``/>``. The serializer below writes exactly that.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from xml.sax.saxutils import quoteattr

from discovery.model import Gpu, Inventory, Nic, PciDevice
from discovery.readers import normalize_bdf
from normalize.device_refs import resolve_refs
from normalize.options import MatrixNics
from normalize.relations import matrix_nics, ordered_gpus

_NCCL_SPEEDS = {
    2.5: "2.5 GT/s PCIe",
    5.0: "5.0 GT/s PCIe",
    8.0: "8.0 GT/s PCIe",
    16.0: "16.0 GT/s PCIe",
    32.0: "32.0 GT/s PCIe",
    64.0: "64.0 GT/s PCIe",
}
_CPU_VENDORS = {"intel": "GenuineIntel", "amd": "AuthenticAMD", "centaur": "CentaurHauls"}
_ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}
_ARCHES.update({"ppc64le": "ppc64", "ppc64": "ppc64"})
_BUSID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
CLASS_SWITCH = "0x060400"
CLASS_NVSWITCH = "0x068000"


@dataclass
class _Element:
    tag: str
    attrs: dict[str, str]
    children: list[_Element] = field(default_factory=list)


def nccl_bus_id(bus_id: str) -> str | None:
    """NCCL's spelling: 12 characters, lowercase, 4-digit domain; None if it has none."""
    bdf = normalize_bdf(bus_id)
    return bdf if bdf is not None and _BUSID.match(bdf) else None


def nic_bus_id(bus_id: str, is_vf: bool) -> str:
    """NCCL looks IB NICs up with function 0 (and device 00 for VFs, NCCL_IB_MERGE_VFS)."""
    head, _, _ = bus_id.rpartition(".")
    if is_vf:
        head = head.rpartition(":")[0] + ":00"
    return f"{head}.0"


def cpumap(cpus: list[int]) -> str:
    """CPU ids -> Linux ``cpumap`` text: 32-bit hex words, most significant first."""
    if not cpus:
        return ""
    mask = 0
    for c in cpus:
        mask |= 1 << c
    words = max(cpus) // 32 + 1
    return ",".join(f"{(mask >> (32 * i)) & 0xFFFFFFFF:08x}" for i in reversed(range(words)))


def _pci_class(pci: PciDevice | None, fallback: str) -> str:
    if pci is None or not pci.class_code:
        return fallback
    prog_if = (pci.prog_if or "0x00").removeprefix("0x")
    return f"0x{pci.class_code.removeprefix('0x')}{prog_if:0>2}"[:8]


def _pci_attrs(busid: str, pci: PciDevice | None, fallback_class: str) -> dict[str, str]:
    attrs = {"busid": busid, "class": _pci_class(pci, fallback_class)}
    if pci is None:
        return attrs
    speed = pci.link.max_speed_gts or pci.link.current_speed_gts
    width = pci.link.max_width or pci.link.current_width
    if speed in _NCCL_SPEEDS:
        attrs["link_speed"] = _NCCL_SPEEDS[speed]
    if width:
        attrs["link_width"] = str(width)
    for key in ("vendor", "device", "subsystem_vendor", "subsystem_device"):
        value = getattr(pci, key)
        if value:
            attrs[key] = value
    return attrs


def _numa(pci: PciDevice | None) -> int:
    if pci is None:
        return -1
    node = pci.numa_node if pci.numa_node is not None else pci.locality_numa_node
    return -1 if node is None else node


def _switch_chain(pci: PciDevice | None) -> list[str]:
    """Upstream ports of the switches above a device, root side first.

    ``upstream_bridges`` lists root port, then (upstream, downstream) pairs per switch;
    NCCL climbs two sysfs levels per step from the endpoint, so it records the bridge two
    above each step: the upstream ports, counted back from the device."""
    if pci is None:
        return []
    bridges = pci.upstream_bridges
    return [bridges[i] for i in range(len(bridges) - 2, 0, -2)][::-1]


class _Tree:
    def __init__(self, inv: Inventory, name: str) -> None:
        self.inv = inv
        self.system = _Element("system", {"version": "1", "name": name})
        self.cpus: dict[int, _Element] = {}
        self.pcis: dict[str, _Element] = {}

    def cpu(self, numa: int) -> _Element:
        if numa in self.cpus:
            return self.cpus[numa]
        attrs = {"numaid": str(numa)}
        node = self.inv.numa(numa) if numa >= 0 else None
        if node is not None and node.cpus:
            attrs["affinity"] = cpumap(node.cpus)
        arch = _ARCHES.get((self.inv.host.get("arch") or "").lower())
        if arch:
            attrs["arch"] = arch
        vendor = _CPU_VENDORS.get((self.inv.host.get("cpu_vendor") or "").lower())
        if vendor and arch == "x86_64":
            attrs["vendor"] = vendor
        for key, host_key in (("familyid", "cpu_family"), ("modelid", "cpu_model_id")):
            if self.inv.host.get(host_key):
                attrs[key] = self.inv.host[host_key]
        el = _Element("cpu", attrs)
        self.cpus[numa] = el
        self.system.children.append(el)
        return el

    def endpoint(self, pci: PciDevice | None, busid: str, fallback_class: str) -> _Element:
        """The endpoint element, with the switch elements above it (shared when present)."""
        if busid in self.pcis:
            return self.pcis[busid]
        parent = self.cpu(_numa(pci))
        for sw in _switch_chain(pci):
            sw_id = nccl_bus_id(sw)
            if sw_id is None:
                continue
            if sw_id not in self.pcis:
                el = _Element("pci", _pci_attrs(sw_id, self.inv.pci(sw), CLASS_SWITCH))
                el.attrs["class"] = CLASS_SWITCH
                parent.children.append(el)
                self.pcis[sw_id] = el
            parent = self.pcis[sw_id]
        el = _Element("pci", _pci_attrs(busid, pci, fallback_class))
        parent.children.append(el)
        self.pcis[busid] = el
        return el


def _sm(gpu: Gpu) -> str | None:
    cc = gpu.compute_capability
    if not cc or gpu.vendor != "nvidia":
        return None
    major, _, minor = cc.partition(".")
    if not major.isdigit() or not (minor or "0").isdigit():
        return None
    return str(int(major) * 10 + int(minor or "0"))


def _gpu_child(inv: Inventory, gpu: Gpu, claim_gpus: set[str]) -> _Element | None:
    """``<gpu>`` with NVLinks to NVSwitches and to other GPUs of the claim."""
    counts: Counter[tuple[str, str]] = Counter()
    for link in gpu.nvlinks:
        target = nccl_bus_id(link.remote_bus_id or "")
        if target is None:
            continue
        if link.remote_type == "switch":
            counts[(target, CLASS_NVSWITCH)] += 1
        elif link.remote_type == "gpu" and target in claim_gpus:
            counts[(target, _pci_class(inv.pci(target), "0x030200"))] += 1
    sm = _sm(gpu)
    if not counts and sm is None:
        return None
    el = _Element("gpu", {"sm": sm} if sm else {})
    for (target, tclass), count in sorted(counts.items()):
        el.children.append(
            _Element("nvlink", {"target": target, "count": str(count), "tclass": tclass})
        )
    return el


def build_topology(inv: Inventory, gpus: list[Gpu], nics: list[Nic], name: str) -> str:
    """The XML text for these devices (a subset of ``inv``)."""
    tree = _Tree(inv, name)
    claim_gpus = {b for b in (nccl_bus_id(g.bus_id) for g in gpus) if b}
    for gpu in sorted(gpus, key=lambda g: g.bus_id):
        busid = nccl_bus_id(gpu.bus_id)
        if busid is None:
            continue  # an Intel VMD domain cannot be written in NCCL's 12-character form
        el = tree.endpoint(inv.pci(gpu.bus_id), busid, "0x030200")
        child = _gpu_child(inv, gpu, claim_gpus)
        if child is not None and not el.children:
            el.children.append(child)
    for nic in sorted(nics, key=lambda n: n.bus_id):
        busid = nccl_bus_id(nic.bus_id)
        if busid is None:
            continue
        busid = nic_bus_id(busid, nic.is_vf)
        tree.endpoint(inv.pci(busid) or inv.pci(nic.bus_id), busid, "0x020000")
    return serialize(tree.system)


def serialize(root: _Element) -> str:
    lines: list[str] = []
    _write(root, 0, lines)
    return "\n".join(lines) + "\n"


def _write(el: _Element, depth: int, out: list[str]) -> None:
    attrs = "".join(f" {k}={quoteattr(v)}" for k, v in el.attrs.items())
    pad = "  " * depth
    if not el.children:
        out.append(f"{pad}<{el.tag}{attrs}/>")
        return
    out.append(f"{pad}<{el.tag}{attrs}>")
    for child in el.children:
        _write(child, depth + 1, out)
    out.append(f"{pad}</{el.tag}>")


def resolve_devices(
    inv: Inventory,
    tokens: list[str],
    device_names: dict[str, str],
    matrix: MatrixNics = "rdma",
) -> tuple[list[Gpu], list[Nic]]:
    """GPUs and NICs named by ``tokens``: the relation matrix's ``GPU<n>``/``NIC<n>`` labels
    (as ``toposlice graph`` prints them), DRA device names (``device_names``: graph vertex
    id -> device name, the snapshot's), or PCI bus ids in any spelling. An empty list means
    every GPU and every NIC of the node. ValueError names a token that matches nothing."""
    if not tokens:
        return list(inv.gpus), list(inv.nics)
    gpus, nics = ordered_gpus(inv), matrix_nics(inv, matrix)
    by_label: dict[str, Gpu | Nic] = {f"GPU{i}": g for i, g in enumerate(gpus)}
    by_label.update({f"NIC{i}": n for i, n in enumerate(nics)})
    by_bus: dict[str, Gpu | Nic] = {g.bus_id: g for g in inv.gpus}
    by_bus.update({n.bus_id: n for n in inv.nics})
    by_name: dict[str, Gpu | Nic] = {}
    for vertex, name in device_names.items():
        kind, _, bus = vertex.partition(":")
        if kind in ("gpu", "nic") and bus in by_bus:
            by_name[name] = by_bus[bus]
    chosen = resolve_refs(tokens, labels=by_label, names=by_name, buses=by_bus)
    return [d for d in chosen if isinstance(d, Gpu)], [d for d in chosen if isinstance(d, Nic)]
