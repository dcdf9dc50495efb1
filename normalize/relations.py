"""``nvidia-smi topo -m``-style relation classes between every pair of GPUs and NICs.

The rule (fixtures and captured matrices are compared with it cell for cell):

* ``X`` for a device with itself.
* Two GPUs: ``n`` = active NVLinks of A whose ``remote_bus_id`` is B's bus id, plus
  ``min(#switch links of A, #switch links of B)`` when both have NVSwitch links; ``n > 0`` ⇒
  ``NV<n>``.
* Two AMD GPUs with a direct xGMI link (either lists the other in ``xgmi_peers``) ⇒ ``XGMI``.
* Otherwise PCIe: same known ``pcie_root`` ⇒ ``c`` = common prefix length of the two
  ``upstream_bridges`` chains; ``c == 0`` ⇒ ``PHB``; both tails (``len(chain) - c``) ≤ 1 ⇒
  ``PIX``; else ``PXB``. Different or unknown roots ⇒ ``NODE`` when both have the same NUMA
  identity and PCI domain, else ``SYS``. NUMA identity = ``Gpu.memory_numa_node``, else the
  kernel ``numa_node``, else ``locality_numa_node``; an unknown identity never matches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from discovery.model import Gpu, Inventory, Nic, PciDevice
from discovery.readers import normalize_bdf

from .cpugroups import cpu_list_text, device_numa
from .options import MatrixNics

LEGEND: dict[str, str] = {
    "X": "Self",
    "SYS": "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes "
    "(e.g., QPI/UPI)",
    "NODE": "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges "
    "within a NUMA node",
    "PHB": "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "PXB": "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    "PIX": "Connection traversing at most a single PCIe bridge",
    "NV#": "Connection traversing a bonded set of # NVLinks",
    "XGMI": "Connection traversing AMD xGMI (Infinity Fabric) links",
}


@dataclass
class RelationMatrix:
    labels: list[str]
    """``GPU0``.. then ``NIC0``.."""
    bus_ids: list[str]
    """PCI bus id of each label, same order."""
    legend: dict[str, str]
    """NIC label -> its RDMA device (else netdev, else bus id), as nvidia-smi's NIC legend."""
    matrix: list[list[str]]
    """``matrix[i][j]`` = relation of ``labels[i]`` (A) to ``labels[j]`` (B)."""
    cpu_affinity: list[str | None] = field(default_factory=list)
    numa_affinity: list[int | None] = field(default_factory=list)
    gpu_numa_id: list[int | None] = field(default_factory=list)
    numa_affinity_nodes: list[list[int]] = field(default_factory=list)
    """nvidia-smi's "NUMA Affinity" set: the host node plus its socket's empty placeholder
    nodes (CPU-less, memory-less: GB200 has 28), e.g. ``[0, 3, 4, ..., 17]``."""

    def relation(self, a: str, b: str) -> str:
        return self.matrix[self.labels.index(a)][self.labels.index(b)]

    def to_dict(self) -> dict[str, object]:
        return {"labels": self.labels, "legend": self.legend, "matrix": self.matrix}


def canonical_bus_id(bus_id: str | None) -> str | None:
    """Any spelling of a bus id (NVML's upper-case 8-digit domain) in sysfs form."""
    if bus_id is None:
        return None
    return normalize_bdf(bus_id) or bus_id.strip().lower()


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """``mlx5_2`` < ``mlx5_10``."""
    parts = re.split(r"(\d+)", text)
    # isdecimal, not isdigit: "²" is a digit that int() refuses (a netdev may be named so).
    return tuple((0, int(p)) if p.isdecimal() else (1, p) for p in parts if p)


def ordered_gpus(inv: Inventory) -> list[Gpu]:
    """By ``Gpu.index`` when every GPU has one, else by bus id."""
    if inv.gpus and all(g.index is not None for g in inv.gpus):
        return sorted(inv.gpus, key=lambda g: (g.index, g.bus_id))
    return sorted(inv.gpus, key=lambda g: g.bus_id)


def nic_display_name(nic: Nic) -> str:
    if nic.rdma_devices:
        return nic.rdma_devices[0]
    if nic.netdevs:
        return nic.netdevs[0]
    return nic.bus_id


def ordered_nics(inv: Inventory) -> list[Nic]:
    """Natural sort of the first RDMA device name, else netdev, else bus id."""
    return sorted(inv.nics, key=lambda n: (natural_key(nic_display_name(n)), n.bus_id))


def matrix_nics(inv: Inventory, which: MatrixNics = "rdma") -> list[Nic]:
    """The NICs of the relation matrix, in its order.

    ``rdma`` (default) is ``nvidia-smi topo -m``'s set: physical functions with an RDMA
    device, so ``NIC<n>`` labels match it on hosts that also have an onboard Ethernet
    port or a cloud VM's ENA, and SR-IOV VFs (which inherit their PF's relations) do not
    make the matrix grow as n². ``all`` lists every network function.
    """
    nics = ordered_nics(inv)
    if which == "all":
        return nics
    return [n for n in nics if n.rdma_devices and not n.is_vf]


def numa_identity(pci: PciDevice | None, gpu: Gpu | None = None) -> int | None:
    if gpu is not None and gpu.memory_numa_node is not None:
        return gpu.memory_numa_node
    return None if pci is None else device_numa(pci)


def _switch_links(gpu: Gpu) -> int:
    return sum(1 for link in gpu.nvlinks if link.remote_type == "switch")


def nvlink_count(a: Gpu, b: Gpu) -> int:
    target = canonical_bus_id(b.bus_id)
    n = sum(1 for link in a.nvlinks if canonical_bus_id(link.remote_bus_id) == target)
    sa, sb = _switch_links(a), _switch_links(b)
    if sa and sb:
        n += min(sa, sb)
    return n


def _xgmi(a: Gpu, b: Gpu) -> bool:
    if a.vendor != "amd" or b.vendor != "amd":
        return False
    ca, cb = canonical_bus_id(a.bus_id), canonical_bus_id(b.bus_id)
    return cb in {canonical_bus_id(p) for p in a.xgmi_peers} or ca in {
        canonical_bus_id(p) for p in b.xgmi_peers
    }


def pcie_relation(
    a_bus: str,
    a_pci: PciDevice | None,
    a_numa: int | None,
    b_bus: str,
    b_pci: PciDevice | None,
    b_numa: int | None,
) -> str:
    """PIX / PXB / PHB / NODE / SYS from the PCI facts of two devices."""
    a_root = a_pci.pcie_root if a_pci is not None else None
    b_root = b_pci.pcie_root if b_pci is not None else None
    if a_pci is not None and b_pci is not None and a_root is not None and a_root == b_root:
        ca, cb = a_pci.upstream_bridges, b_pci.upstream_bridges
        c = 0
        while c < len(ca) and c < len(cb) and ca[c] == cb[c]:
            c += 1
        if c == 0:
            return "PHB"
        if len(ca) - c <= 1 and len(cb) - c <= 1:
            return "PIX"
        return "PXB"
    same_domain = a_bus.split(":", 1)[0] == b_bus.split(":", 1)[0]
    if a_numa is not None and a_numa == b_numa and same_domain:
        return "NODE"
    return "SYS"


def relation(inv: Inventory, a: Gpu | Nic, b: Gpu | Nic) -> str:
    """Relation class of A (row) to B (column)."""
    if a is b:
        return "X"
    if isinstance(a, Gpu) and isinstance(b, Gpu):
        n = nvlink_count(a, b)
        if n > 0:
            return f"NV{n}"
        if _xgmi(a, b):
            return "XGMI"
    a_pci, b_pci = inv.pci(a.bus_id), inv.pci(b.bus_id)
    a_numa = numa_identity(a_pci, a if isinstance(a, Gpu) else None)
    b_numa = numa_identity(b_pci, b if isinstance(b, Gpu) else None)
    return pcie_relation(a.bus_id, a_pci, a_numa, b.bus_id, b_pci, b_numa)


def affinity_nodes(inv: Inventory, host_numa: int | None) -> list[int]:
    if host_numa is None:
        return []
    host = inv.numa(host_numa)
    package = host.package if host is not None else None
    placeholders = [
        n.id
        for n in inv.numa_nodes
        if n.id != host_numa
        and not n.cpus
        and not n.memory_bytes
        and n.gpu_bus_id is None
        and package is not None
        and n.package == package
    ]
    return [host_numa, *placeholders]


def relation_matrix(inv: Inventory, nics_shown: MatrixNics = "rdma") -> RelationMatrix:
    """GPUs and the NICs :func:`matrix_nics` picks, every pair classified."""
    gpus = ordered_gpus(inv)
    nics = matrix_nics(inv, nics_shown)
    devices: list[Gpu | Nic] = [*gpus, *nics]
    labels = [f"GPU{i}" for i in range(len(gpus))] + [f"NIC{i}" for i in range(len(nics))]
    legend = {f"NIC{i}": nic_display_name(n) for i, n in enumerate(nics)}
    matrix = [[relation(inv, a, b) for b in devices] for a in devices]
    cpu_aff: list[str | None] = []
    numa_aff: list[int | None] = []
    gpu_numa: list[int | None] = []
    aff_nodes: list[list[int]] = []
    for dev in devices:
        pci = inv.pci(dev.bus_id)
        cpu_aff.append(
            cpu_list_text(pci.local_cpus) if pci is not None and pci.local_cpus else None
        )
        host_numa = None if pci is None else device_numa(pci)
        numa_aff.append(host_numa)
        aff_nodes.append(affinity_nodes(inv, host_numa))
        gpu_numa.append(dev.memory_numa_node if isinstance(dev, Gpu) else None)
    return RelationMatrix(
        labels=labels,
        bus_ids=[d.bus_id for d in devices],
        legend=legend,
        matrix=matrix,
        cpu_affinity=cpu_aff,
        numa_affinity=numa_aff,
        gpu_numa_id=gpu_numa,
        numa_affinity_nodes=aff_nodes,
    )
