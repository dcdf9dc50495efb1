"""NICs: every network-class PCI function, with its netdevs and RDMA devices.

Built entirely from what sysfs discovery found (``pci_devices``, ``net_interfaces``,
``rdma_devices``); works the same on a live host and on a replayed dump.
"""

from __future__ import annotations

from discovery.model import Inventory, NetInterface, Nic, PciDevice, RdmaDevice, RdmaPort
from discovery.pci_ids import class_code, parse_id, vendor_word
from discovery.words import plural
from plugins.base import ProbeContext, ProbeReport, ProbeUnavailable

__all__ = ["NIC_MODELS", "RdmaProbe"]

NIC_MODELS: dict[tuple[int, int], str] = {
    # NVIDIA networking (Mellanox)
    (0x15B3, 0x1013): "ConnectX-4",
    (0x15B3, 0x1015): "ConnectX-4 Lx",
    (0x15B3, 0x1017): "ConnectX-5",
    (0x15B3, 0x1018): "ConnectX-5 VF",
    (0x15B3, 0x1019): "ConnectX-5 Ex",
    (0x15B3, 0x101B): "ConnectX-6",
    (0x15B3, 0x101C): "ConnectX-6 VF",
    (0x15B3, 0x101D): "ConnectX-6 Dx",
    (0x15B3, 0x101E): "ConnectX VF",
    (0x15B3, 0x101F): "ConnectX-6 Lx",
    (0x15B3, 0x1021): "ConnectX-7",
    (0x15B3, 0x1023): "ConnectX-8",
    (0x15B3, 0xA2D6): "BlueField-2",
    (0x15B3, 0xA2DC): "BlueField-3",
    # Intel
    (0x8086, 0x1591): "E810",
    (0x8086, 0x1592): "E810",
    (0x8086, 0x1593): "E810",
    (0x8086, 0x159B): "E810",
    (0x8086, 0x1889): "Adaptive VF",
    (0x8086, 0x1572): "X710",
    (0x8086, 0x1583): "XL710",
    (0x8086, 0x158B): "XXV710",
    # Broadcom
    (0x14E4, 0x1750): "BCM57508",
    # Amazon
    (0x1D0F, 0xEC20): "ENA",
    (0x1D0F, 0xEC21): "ENA",
    (0x1D0F, 0xEFA0): "EFA",
    (0x1D0F, 0xEFA1): "EFA",
    (0x1D0F, 0xEFA2): "EFA",
    # Google
    (0x1AE0, 0x0042): "gVNIC",
    # virtio
    (0x1AF4, 0x1000): "virtio-net",
    (0x1AF4, 0x1041): "virtio-net",
}


def is_network(dev: PciDevice) -> bool:
    cls = class_code(dev)
    return cls is not None and cls >> 8 == 0x02


def _active(port: RdmaPort) -> bool:
    return port.state is not None and "ACTIVE" in port.state.upper()


def _best_port(devices: list[RdmaDevice]) -> tuple[RdmaDevice, RdmaPort | None] | None:
    """The first RDMA device/port that is active, else the first device's first port."""
    for rd in devices:
        for port in sorted(rd.ports, key=lambda p: p.port):
            if _active(port):
                return rd, port
    if not devices:
        return None
    first = devices[0]
    ports = sorted(first.ports, key=lambda p: p.port)
    return first, (ports[0] if ports else None)


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


class _HostIndex:
    """The host's netdevs and RDMA devices by bus id and by name, built once per probe run
    so that each NIC costs the same whatever the number of functions (SR-IOV hosts have
    thousands)."""

    def __init__(self, host: Inventory) -> None:
        self.net_by_bus: dict[str | None, list[NetInterface]] = {}
        for n in host.net_interfaces:
            self.net_by_bus.setdefault(n.bus_id, []).append(n)
        self.rdma_by_bus: dict[str | None, list[RdmaDevice]] = {}
        for r in host.rdma_devices:
            self.rdma_by_bus.setdefault(r.bus_id, []).append(r)
        self.net_by_name = {n.name: n for n in host.net_interfaces}
        self.rdma_by_name = {r.name: r for r in host.rdma_devices}


def _nic(dev: PciDevice, index: _HostIndex, probe: str) -> Nic:
    vendor = parse_id(dev.vendor)
    device = parse_id(dev.device)
    model = NIC_MODELS.get((vendor, device)) if vendor is not None and device is not None else None
    model = model or dev.device_name
    netdevs = _unique(list(dev.net) + [n.name for n in index.net_by_bus.get(dev.bus_id, [])])
    rdma_names = _unique(list(dev.rdma) + [r.name for r in index.rdma_by_bus.get(dev.bus_id, [])])
    nic = Nic(
        bus_id=dev.bus_id,
        probe=probe,
        vendor=vendor_word(vendor) if vendor is not None else None,
        model=model,
        netdevs=netdevs,
        rdma_devices=rdma_names,
        is_vf=dev.physfn is not None,
    )
    ifaces = [index.net_by_name[name] for name in netdevs if name in index.net_by_name]
    speeds = [n.speed_mbps for n in ifaces if n.speed_mbps is not None and n.speed_mbps > 0]
    nic.speed_mbps = max(speeds) if speeds else None
    by_name = index.rdma_by_name
    best = _best_port([by_name[name] for name in rdma_names if name in by_name])
    if best is not None:
        rd, port = best
        nic.node_guid = rd.node_guid
        if port is not None:
            nic.rate_gbps = port.rate_gbps
            nic.link_layer = port.link_layer
    return nic


class RdmaProbe:
    name = "rdma"

    def probe(self, ctx: ProbeContext) -> ProbeReport:
        nics: dict[str, Nic] = {}
        index = _HostIndex(ctx.host)
        for dev in ctx.host.pci_devices:
            if is_network(dev) and dev.bus_id not in nics:
                nics[dev.bus_id] = _nic(dev, index, self.name)
        if not nics:
            raise ProbeUnavailable("no network-class PCI functions")
        report = ProbeReport(nics=sorted(nics.values(), key=lambda n: n.bus_id))
        rdma = sum(1 for n in report.nics if n.rdma_devices)
        vfs = sum(1 for n in report.nics if n.is_vf)
        report.detail = f"{plural(len(report.nics), 'NIC')} ({rdma} with RDMA, {plural(vfs, 'VF')})"
        return report
