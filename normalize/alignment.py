"""GPU↔NIC alignment ids that plain claims can ``matchAttribute`` on.

``resource.kubernetes.io/pcieRoot`` ties a GPU to a NIC only where both hang off one root
complex; on many machines none does (MI300X: every GPU and NIC has its own root), or two
GPUs behind one switch share one NIC. Two driver-domain attributes say it instead:

* ``nicAffinity`` — the GPU's *closest NIC group*. A GPU's closest NICs are the RDMA NICs
  at its best PCIe path class (PIX < PXB < PHB < NODE; a NIC only reachable across sockets
  (SYS) is not close). GPUs and NICs linked by "is closest to" form groups (connected
  components); every member of a group carries the same id, the bus id of the group's
  first NIC. A NIC that is no GPU's closest (a storage NIC) carries none.
* ``rail`` — an index for multi-node jobs: the group NICs (physical functions) numbered
  in bus-id order; within a group, GPU *j* of *g* (bus-id order) takes the rail of NIC
  ``j × n // g`` of its *n*, so on identical nodes GPU *i* and NIC *i* of each node share
  rail *i*, and GPUs that share one NIC share its rail. SR-IOV VFs carry their PF's ids.

Pure: computed from the inventory's PCIe facts with the relation rule of
:mod:`normalize.relations` (the relation matrix and the graph use the same rule).
"""

from __future__ import annotations

from dataclasses import dataclass

from discovery.model import Gpu, Inventory, Nic

from .relations import relation

#: Path classes close enough to align on, best first.
CLOSE = ("PIX", "PXB", "PHB", "NODE")


@dataclass(frozen=True)
class Alignment:
    nic_affinity: dict[str, str]
    """Bus id (GPU or NIC) -> group id."""
    rail: dict[str, int]
    """Bus id (GPU or NIC) -> rail index."""


def _candidates(inv: Inventory) -> list[Nic]:
    rdma = [n for n in inv.nics if n.rdma_devices]
    return sorted(rdma or inv.nics, key=lambda n: n.bus_id)


def _physfn(inv: Inventory, nic: Nic) -> str | None:
    pci = inv.pci(nic.bus_id)
    return pci.physfn if nic.is_vf and pci is not None and pci.physfn else None


def alignment(inv: Inventory) -> Alignment:
    """Group ids and rails of every GPU and NIC that has one."""
    nics = _candidates(inv)
    # VFs share their PF's location: classify PFs (and PF-less NICs) only.
    pfs = [n for n in nics if _physfn(inv, n) is None]
    gpus = sorted(inv.gpus, key=lambda g: g.bus_id)
    closest: dict[str, list[Nic]] = {}
    for g in gpus:
        ranked: dict[int, list[Nic]] = {}
        for n in pfs:
            rel = relation(inv, g, n)
            if rel in CLOSE:
                ranked.setdefault(CLOSE.index(rel), []).append(n)
        if ranked:
            closest[g.bus_id] = ranked[min(ranked)]
    # Union-find over GPUs and their closest NICs.
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for bus, close in closest.items():
        for n in close:
            parent[find(bus)] = find(n.bus_id)
    groups: dict[str, tuple[list[Gpu], list[Nic]]] = {}
    for g in gpus:
        if g.bus_id in closest:
            groups.setdefault(find(g.bus_id), ([], []))[0].append(g)
    for n in pfs:
        if n.bus_id in parent:
            groups.setdefault(find(n.bus_id), ([], []))[1].append(n)
    affinity: dict[str, str] = {}
    rail: dict[str, int] = {}
    grouped_pfs = sorted((n for _, ns in groups.values() for n in ns), key=lambda n: n.bus_id)
    rail_of = {n.bus_id: i for i, n in enumerate(grouped_pfs)}
    for members_gpus, members_nics in groups.values():
        gid = members_nics[0].bus_id
        for n in members_nics:
            affinity[n.bus_id] = gid
            rail[n.bus_id] = rail_of[n.bus_id]
        for j, g in enumerate(members_gpus):
            affinity[g.bus_id] = gid
            nic = members_nics[j * len(members_nics) // len(members_gpus)]
            rail[g.bus_id] = rail_of[nic.bus_id]
    for n in nics:
        pf = _physfn(inv, n)
        if pf is not None and pf in affinity:
            affinity[n.bus_id] = affinity[pf]
            rail[n.bus_id] = rail[pf]
    return Alignment(affinity, rail)
