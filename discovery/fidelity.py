"""Inventory -> the ``topology-fidelity/v1`` schema of the hwloc truth fixtures.

Lets tests and ``hack/fidelity.py`` score discovery against lstopo's view of real
machines with the fixtures' own scorer.
"""

from __future__ import annotations

from typing import Any

from discovery.model import Inventory


def to_fidelity(inv: Inventory, case: str = "") -> dict[str, Any]:
    cores = {tuple(c.siblings) for c in inv.cpus}
    packages = {c.package for c in inv.cpus if c.package is not None}
    return {
        "schema": "topology-fidelity/v1",
        "case": case,
        "numa_nodes": [
            {
                "id": n.id,
                "cpus": n.cpus,
                "distances": {str(k): v for k, v in n.distances.items()},
            }
            for n in inv.numa_nodes
        ],
        "packages": len(packages) or None,
        "cores": len(cores) or None,
        "pus": len(inv.cpus),
        "pci_devices": [
            {
                "bus_id": d.bus_id,
                "class": d.class_code,
                "vendor": d.vendor,
                "device": d.device,
                "is_bridge": d.is_bridge,
                "numa_node": d.locality_numa_node,
                "sysfs_numa_node": -1 if d.numa_node is None else d.numa_node,
                "pcie_root": d.pcie_root,
                "upstream_bridges": d.upstream_bridges,
            }
            for d in inv.pci_devices
        ],
        "net_interfaces": [
            {"name": i.name, "bus_id": i.bus_id} for i in inv.net_interfaces if i.bus_id
        ],
        "infiniband": [{"name": r.name, "bus_id": r.bus_id} for r in inv.rdma_devices if r.bus_id],
        "gpus": [
            {"bus_id": d.bus_id}
            for d in inv.pci_devices
            if d.class_code and d.class_code.startswith("0x03")
        ],
    }
