"""The node's ``NodeResourceTopology`` (``topology.node.k8s.io/v1alpha2``) from the inventory.

The object the scheduler-plugins NodeResourceTopology plugin and KAI's NUMA plugin read:
one per node (cluster scoped, named after the node), one zone per NUMA node that has CPUs,
memory or devices (the empty placeholder nodes of GB200-like hosts are left out), each
with:

- resources ``cpu`` (logical CPUs) and ``memory`` (bytes). Capacity, allocatable and
  available are equal: the plugin compares them with containers' requests, and its
  cached mode subtracts the pods it placed itself. GPUs and NICs are not zone resources:
  they are DRA devices, never a container's request, so the plugin could only refuse a
  pod asking for them ("Insufficient") or ignore them; their NUMA node is the devices'
  ``numaNode`` attribute in the ResourceSlices, where DRA's allocator reads it;
- costs: the SLIT distance to every other zone (the kernel's ``distance`` file);
- attributes: ``memory-of-gpu`` on a GPU's own memory node (GB200, MI300A-like hosts).

Object attributes carry the kubelet's Topology Manager policy and scope
(``topologyManagerPolicy`` / ``topologyManagerScope``, the names NFD's topology updater
uses) when given, and the pods fingerprint (normalize/pod_fingerprint.py) when given, which
the plugin's cached mode needs. The deprecated ``topologyPolicies`` list is written only
when asked for (``topology_policies``), for readers of older versions of the API: the
plugin logs two deprecation lines per node and Filter call when it is there. Pure
function: no I/O.
"""

from __future__ import annotations

from typing import Any

from discovery.model import Inventory

from .pod_fingerprint import ATTRIBUTE as FINGERPRINT_ATTRIBUTE

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


def _resource(name: str, amount: int) -> dict[str, Any]:
    text = str(amount)
    return {"name": name, "capacity": text, "allocatable": text, "available": text}


def build_nrt(
    inv: Inventory,
    node_name: str,
    *,
    policy: str | None = None,
    scope: str | None = None,
    pods_fingerprint: str | None = None,
    topology_policies: bool = False,
) -> dict[str, Any]:
    """The NodeResourceTopology object for ``node_name`` (no ownerReferences: the writer
    adds the Node's UID)."""
    if policy is not None and policy not in POLICIES:
        raise ValueError(f"topology manager policy {policy!r}: want one of {', '.join(POLICIES)}")
    if scope is not None and scope not in SCOPES:
        raise ValueError(f"topology manager scope {scope!r}: want one of {', '.join(SCOPES)}")
    memory_of = {g.memory_numa_node: g.bus_id for g in inv.gpus if g.memory_numa_node is not None}
    kept = [n for n in sorted(inv.numa_nodes, key=lambda n: n.id) if n.cpus or n.memory_bytes]
    kept_ids = {n.id for n in kept}
    zones: list[dict[str, Any]] = []
    for node in kept:
        resources = [_resource("cpu", len(node.cpus))]
        if node.memory_bytes:
            resources.append(_resource("memory", node.memory_bytes))
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
    if pods_fingerprint is not None:
        attributes.append({"name": FINGERPRINT_ATTRIBUTE, "value": pods_fingerprint})
    if attributes:
        obj["attributes"] = attributes
    if policy is not None and topology_policies:
        obj["topologyPolicies"] = [topology_policy(policy, scope or "container")]
    return obj
