"""Read a whole host from a filesystem root with the sysfs backends (no vendor probes).

The root is ``/`` on a live node or the top of a dump (hwloc fsroot tarball, a fake
machine's generated tree): every path is read under it, so a dump replays exactly.
"""

from __future__ import annotations

import os

from discovery.cpus import discover_cpus, online_cpus
from discovery.model import Inventory, NumaNode, PciDevice
from discovery.net import discover_net, discover_rdma
from discovery.numa import assign_packages, discover_numa
from discovery.pci import discover_pci
from discovery.readers import read_text
from discovery.root import Root
from discovery.udev import pci_names, udev_db_names
from discovery.warning_log import Warnings


def locality_node(dev: PciDevice, nodes: list[NumaNode]) -> int | None:
    """hwloc-style locality: the single CPU-bearing NUMA node ``local_cpus`` points at.

    A machine with one node gets that node even when the kernel says -1; a device
    whose CPUs span several nodes (or that has no locality at all) gets None.
    """
    cpu_nodes = [n for n in nodes if n.cpus]
    if len(cpu_nodes) == 1:
        return cpu_nodes[0].id
    if not dev.local_cpus:
        return None
    local = set(dev.local_cpus)
    hits = [n.id for n in cpu_nodes if local.intersection(n.cpus)]
    return hits[0] if len(hits) == 1 else None


def discover_host(root: Root | str = "/", live: bool | None = None) -> tuple[Inventory, Warnings]:
    """The sysfs backends' inventory of ``root`` (a :class:`Root`, or a path made into one
    with ``live``), and the warnings they gave."""
    if not isinstance(root, Root):
        root = Root(root, live)
    warn = Warnings()
    inv = Inventory()
    inv.source = {"sysfs_root": root.path}
    if not os.path.isdir(root.sys):
        warn.add(f"no sysfs under {root.path!r}: inventory is empty")

    if root.live:
        import socket

        inv.hostname = socket.gethostname() or None
    else:
        inv.hostname = read_text(root.etc_path("hostname")) or None

    online = online_cpus(root, warn)
    inv.cpus, inv.caches = discover_cpus(root, online, warn)
    inv.numa_nodes = discover_numa(root, online, warn)
    assign_packages(inv.numa_nodes, inv.cpus)

    inv.pci_devices = discover_pci(root, warn)
    if root.live:
        names = pci_names()
    else:
        names = udev_db_names(root.path, [d.bus_id for d in inv.pci_devices])
    for dev in inv.pci_devices:
        dev.locality_numa_node = locality_node(dev, inv.numa_nodes)
        dev.vendor_name, dev.device_name = names.get(dev.bus_id, (None, None))

    inv.net_interfaces = discover_net(root, warn)
    inv.rdma_devices = discover_rdma(root, warn)
    by_bus = {d.bus_id: d for d in inv.pci_devices}
    for iface in inv.net_interfaces:
        if iface.bus_id in by_bus:
            by_bus[iface.bus_id].net.append(iface.name)
    for rdma in inv.rdma_devices:
        if rdma.bus_id in by_bus:
            by_bus[rdma.bus_id].rdma.append(rdma.name)
    return inv, warn
