"""The node's ``NodeResourceTopology`` (``topology.node.k8s.io/v1alpha2``) from the inventory.

The object the scheduler-plugins NodeResourceTopology plugin and KAI's NUMA plugin read:
one per node (cluster scoped, named after the node), one zone per NUMA node that has CPUs,
memory or devices (the empty placeholder nodes of GB200-like hosts are left out), each
with:

- resources ``cpu`` (logical CPUs), ``memory`` (bytes), and ``<driver>/gpu`` and
  ``<driver>/nic`` (devices whose kernel NUMA node is the zone; SR-IOV VFs are not
  counted: they follow their PF). Capacity, allocatable and available are equal: DRA
  allocations live in ResourceClaims, not here, so a claim never rewrites the object;
- costs: the SLIT distance to every other zone (the kernel's ``distance`` file);
- attributes: ``memory-of-gpu`` on a GPU's own memory node (GB200, MI300A-like hosts).

Object attributes carry the kubelet's Topology Manager policy and scope
(``topologyManagerPolicy`` / ``topologyManagerScope``, the names NFD's topology updater
uses) when given; the deprecated ``topologyPolicies`` list is filled from them too, for
readers of older versions of the API. Pure function: no I/O.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from discovery.model import Gpu, Inventory

from .cpugroups import device_numa

API_VERSION = "topology.node.k8s.io/v1alpha2"
KIND = "NodeResourceTopology"
PLURAL = "noderesourcetopologies"
ZONE_TYPE = "Node"
MANAGED_BY = "toposlice"

#: kubelet ``--topology-manager-policy`` values.
POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
#: kubelet ``--topology-manager-scope`` values.
SCOPES = ("container", "pod")

_POLICY_WORDS = {
    "none": "None",
    "best-effort": "BestEffort",
    "restricted": "Restricted",
    "single-numa-node": "SingleNUMANode",
}


def zone_name(numa: int) -> str:
    return f"node-{numa}"


def topology_policy(policy: str, scope: str) -> str:
    """The v1alpha1 ``topologyPolicies`` word, e.g. ``SingleNUMANodeContainerLevel``."""
    if policy == "none":
        return "None"
    level = "PodLevel" if scope == "pod" else "ContainerLevel"
    return f"{_POLICY_WORDS[policy]}{level}"


def _gpu_numa(inv: Inventory, gpu: Gpu) -> int | None:
    pci = inv.pci(gpu.bus_id)
    return None if pci is None else device_numa(pci)


def device_counts(inv: Inventory) -> dict[int, Counter[str]]:
    """NUMA node -> {"gpu": n, "nic": m}; devices of unknown NUMA node are left out."""
    out: dict[int, Counter[str]] = {}
    for gpu in inv.gpus:
        numa = _gpu_numa(inv, gpu)
        if numa is not None:
            out.setdefault(numa, Counter())["gpu"] += 1
    for nic in inv.nics:
        if nic.is_vf:
            continue
        pci = inv.pci(nic.bus_id)
        numa = None if pci is None else device_numa(pci)
        if numa is not None:
            out.setdefault(numa, Counter())["nic"] += 1
    return out


def _resource(name: str, amount: int) -> dict[str, Any]:
    text = str(amount)
    return {"name": name, "capacity": text, "allocatable": text, "available": text}


def build_nrt(
    inv: Inventory,
    node_name: str,
    *,
    driver: str = "toposlice.dev",
    policy: str | None = None,
    scope: str | None = None,
) -> dict[str, Any]:
    """The NodeResourceTopology object for ``node_name`` (no ownerReferences: the writer
    adds the Node's UID)."""
    if policy is not None and policy not in POLICIES:
        raise ValueError(f"topology manager policy {policy!r}: want one of {', '.join(POLICIES)}")
    if scope is not None and scope not in SCOPES:
        raise ValueError(f"topology manager scope {scope!r}: want one of {', '.join(SCOPES)}")
    counts = device_counts(inv)
    memory_of = {g.memory_numa_node: g.bus_id for g in inv.gpus if g.memory_numa_node is not None}
    kept = [
        n
        for n in sorted(inv.numa_nodes, key=lambda n: n.id)
        if n.cpus or n.memory_bytes or counts.get(n.id)
    ]
    kept_ids = {n.id for n in kept}
    zones: list[dict[str, Any]] = []
    for node in kept:
        resources = [_resource("cpu", len(node.cpus))]
        if node.memory_bytes:
            resources.append(_resource("memory", node.memory_bytes))
        for kind in ("gpu", "nic"):
            n = counts.get(node.id, Counter())[kind]
            if n:
                resources.append(_resource(f"{driver}/{kind}", n))
        zone: dict[str, Any] = {
            "name": zone_name(node.id),
            "type": ZONE_TYPE,
            "resources": resources,
        }
        costs = [
            {"name": zone_name(other), "value": int(dist)}
            for other, dist in sorted(node.distances.items())
            if other in kept_ids
        ]
        if costs:
            zone["costs"] = costs
        if node.id in memory_of:
            zone["attributes"] = [{"name": "memory-of-gpu", "value": memory_of[node.id]}]
        zones.append(zone)
    obj: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": node_name,
            "labels": {"app.kubernetes.io/managed-by": MANAGED_BY},
        },
        "zones": zones,
    }
    attributes = []
    if policy is not None:
        attributes.append({"name": "topologyManagerPolicy", "value": policy})
    if scope is not None:
        attributes.append({"name": "topologyManagerScope", "value": scope})
    if attributes:
        obj["attributes"] = attributes
    if policy is not None:
        obj["topologyPolicies"] = [topology_policy(policy, scope or "container")]
    return obj
