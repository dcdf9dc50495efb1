"""Collective bus bandwidth of a GPU set, from the node's links (placement-models.md §2).

The model is NCCL's: ``busbw`` is comparable to the per-rank hardware bottleneck, and a ring
runs at the speed of its slowest edge, where a physical link carrying k concurrent ring
edges in one direction gives each bw/k.

* One non-blocking NVLink crossbar (NVSwitch baseboard, NVL72 domain): every subset is
  equivalent, busbw = the smallest per-GPU NVLink bandwidth.
* Direct-link cliques (xGMI full mesh, NVLink bridges): NCCL/RCCL run one channel per link,
  so a GPU's bandwidth is the sum of its links to the other members.
* Otherwise a ring in PCIe-tree order (the order that keeps each switch's members adjacent),
  each edge at its path's model: direct link; PCIe P2P below a switch; through the CPU root
  complex (Intel pays NCCL's 6/5 overhead); across sockets at the SMP model.
* Across nodes: each GPU reaches the network through its NIC, derated by the GPU↔NIC path
  (GPUDirect RDMA off across NUMA: dranet measured ~25 vs ~46 GB/s, placement-models §2.4).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from .topology import GpuView, NicView, NodeTopology

#: Fraction of a NIC's line rate a GPU gets, by GPU↔NIC relation (dranet, §2.4: a NUMA-local
#: NIC reaches ~92 % of line rate, a cross-NUMA one about half of the local figure).
NIC_PATH_DERATE: dict[str, float] = {
    "PIX": 0.92,
    "PXB": 0.92,
    "PHB": 0.80,
    "NODE": 0.75,
    "SYS": 0.45,
}


def ring_order(gpus: Sequence[GpuView]) -> list[GpuView]:
    """PCIe-tree (DFS) order: members of one switch, root and socket stay adjacent."""
    return sorted(gpus, key=lambda g: (g.numa if g.numa is not None else -1, g.chain, g.bus_id))


def crossbar_gbps(gpus: Sequence[GpuView]) -> float | None:
    """busbw when all GPUs sit on one NVLink crossbar, else None."""
    domains = {g.nvlink_domain for g in gpus}
    if len(domains) != 1 or None in domains:
        return None
    return min(g.nvswitch_gbps for g in gpus)


def _pcie_edge(topo: NodeTopology, a: GpuView, b: GpuView) -> float:
    rel = topo.relation(a.vid, b.vid)
    base = min(a.pcie_gbps, b.pcie_gbps)
    if rel in ("PIX", "PXB"):
        return base
    if rel in ("PHB", "NODE"):
        return base / 1.2 if topo.intel_p2p else base
    return min(base, topo.sys_gbps)


def busbw_gbps(topo: NodeTopology, gpus: Sequence[GpuView]) -> float:
    """Estimated collective busbw (GB/s per rank) of ``gpus`` inside one node; 0 for n < 2."""
    n = len(gpus)
    if n < 2:
        return 0.0
    xbar = crossbar_gbps(gpus)
    if xbar is not None:
        return xbar
    vids = [g.vid for g in gpus]
    direct = topo.direct_gbps
    if direct and all((a, b) in direct for i, a in enumerate(vids) for b in vids[i + 1 :]):
        return min(sum(direct[(a, b)] for b in vids if b != a) for a in vids)
    ring = ring_order(gpus)
    # Directed link loads: the PCIe link above a bridge/GPU, per direction, and the socket
    # interconnect per direction.
    loads: Counter[tuple[str, str]] = Counter()
    paths: list[tuple[float, list[tuple[str, str]]]] = []
    for i in range(n):
        a, b = ring[i], ring[(i + 1) % n]
        if (a.vid, b.vid) in direct:
            paths.append((direct[(a.vid, b.vid)], []))
            continue
        ca, cb = (*a.chain, a.vid), (*b.chain, b.vid)
        c = 0
        if a.pcie_root == b.pcie_root:
            while c < min(len(ca), len(cb)) and ca[c] == cb[c]:
                c += 1
        used = [(x, "up") for x in ca[c:]] + [(x, "down") for x in cb[c:]]
        if a.numa != b.numa:
            used.append((f"smp:{a.numa}>{b.numa}", "x"))
        loads.update(used)
        paths.append((_pcie_edge(topo, a, b), used))
    return min(bw / max((loads[u] for u in used), default=1) for bw, used in paths)


def nic_gbps(topo: NodeTopology, gpu: GpuView, nic: NicView, sharing: int = 1) -> float:
    """What one GPU gets from ``nic`` toward the network."""
    rel = topo.relation(gpu.vid, nic.vid)
    derate = NIC_PATH_DERATE.get(rel, NIC_PATH_DERATE["SYS"])
    return min(nic.gbps * derate, gpu.pcie_gbps) / max(1, sharing)
