"""The node topology graph (``toposlice.graph/v1``): a versioned public JSON interface.

See docs/graph.md and docs/schema/graph.schema.json. Vertex ids are stable, derived from
hardware identity: ``machine``, ``package:<n>``, ``numa:<n>``, ``pcie_root:<pciDDDD:BB>``,
``bridge:<bdf>``, ``gpu:<bdf>``, ``nic:<bdf>``, ``nvswitch:<bdf>``, ``cpu_group:<device name>``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from discovery.bandwidth import NVLINK_LINK_GBPS, pcie_generation, pcie_link_gbps
from discovery.model import Gpu, Inventory, NvLink, PciDevice

from .alignment import alignment
from .attributes import to_semver
from .cpugroups import cpu_list_text, device_numa
from .names import node_name
from .options import NormalizeOptions
from .pool import PoolPlan, plan_pool
from .relations import (
    ordered_gpus,
    ordered_nics,
    relation_matrix,
)

GRAPH_SCHEMA = "toposlice.graph/v1"


def pcie_bandwidth_gbps(speed_gts: float | None, width: int | None) -> float | None:
    gbps = pcie_link_gbps(pcie_generation(speed_gts), width)
    return None if gbps is None else round(gbps, 3)


def nvlink_link_gbps(link: NvLink) -> float | None:
    if link.bandwidth_gbps:
        return float(link.bandwidth_gbps)
    if link.version is None:
        return None
    parts = link.version.split(".")
    key = ".".join([*parts, "0"][:2])
    return NVLINK_LINK_GBPS.get(key)


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None and v != [] and v != {}}


class _Builder:
    def __init__(self) -> None:
        self.vertices: dict[str, dict[str, Any]] = {}
        self.edges: list[dict[str, Any]] = []
        self._edge_keys: set[tuple[str, str, str]] = set()

    def vertex(self, vid: str, kind: str, attrs: dict[str, Any], label: str | None = None) -> None:
        if vid in self.vertices:
            self.vertices[vid]["attrs"].update(_clean(attrs))
            if label and "label" not in self.vertices[vid]:
                self.vertices[vid]["label"] = label
            return
        v: dict[str, Any] = {"id": vid, "kind": kind}
        if label:
            v["label"] = label
        v["attrs"] = _clean(attrs)
        self.vertices[vid] = v

    def edge(self, source: str, target: str, kind: str, attrs: dict[str, Any]) -> None:
        key = (source, target, kind)
        if key in self._edge_keys or source == target:
            return
        self._edge_keys.add(key)
        self.edges.append(
            {"source": source, "target": target, "kind": kind, "attrs": _clean(attrs)}
        )


def _root_numa(inv: Inventory) -> dict[str, int]:
    """Each PCIe root's NUMA node: the most common kernel (else locality) node of its devices."""
    votes: dict[str, Counter[int]] = {}
    for p in inv.pci_devices:
        numa = device_numa(p)
        if p.pcie_root and numa is not None:
            votes.setdefault(p.pcie_root, Counter())[numa] += 1
    return {root: c.most_common(1)[0][0] for root, c in votes.items()}


def _link_attrs(pci: PciDevice | None) -> dict[str, Any]:
    if pci is None:
        return {}
    link = pci.link
    return {
        "gen": pcie_generation(link.current_speed_gts),
        "width": link.current_width,
        "bandwidth_gbps": pcie_bandwidth_gbps(link.current_speed_gts, link.current_width),
        "max_gen": pcie_generation(link.max_speed_gts),
        "max_width": link.max_width,
        "max_bandwidth_gbps": pcie_bandwidth_gbps(link.max_speed_gts, link.max_width),
    }


def _pci_attrs(pci: PciDevice | None) -> dict[str, Any]:
    if pci is None:
        return {}
    return {
        "pcie_root": pci.pcie_root,
        "numa_node": pci.numa_node,
        "locality_numa_node": pci.locality_numa_node,
        "vendor_id": pci.vendor,
        "device_id": pci.device,
        "class_code": pci.class_code,
        "driver": pci.driver,
    }


def build_graph(
    inv: Inventory,
    opts: NormalizeOptions | None = None,
    plan: PoolPlan | None = None,
    node_name: str | None = None,
) -> dict[str, Any]:
    """The ``toposlice.graph/v1`` JSON document for ``inv`` (see docs/graph.md); ``plan``
    is the pool plan when the caller already has it. ``node_name``: the Kubernetes node name,
    which is also the pool's name (as ``toposlice slices --node-name`` publishes it);
    default: the inventory's host name."""
    opts = opts or NormalizeOptions()
    plan = plan or plan_pool(inv, opts)
    b = _Builder()
    names = plan.names
    rel = relation_matrix(inv, opts.matrix_nics)
    labels = dict(zip(rel.bus_ids, rel.labels, strict=True))
    host = inv.hostname

    b.vertex("machine", "machine", {"hostname": host, **dict(sorted(inv.host.items()))})
    for pkg in sorted({n.package for n in inv.numa_nodes if n.package is not None}):
        cpus = sorted(c.id for c in inv.cpus if c.package == pkg)
        b.vertex(f"package:{pkg}", "package", {"cpus": cpu_list_text(cpus) or None})
        b.edge("machine", f"package:{pkg}", "contains", {})
    for node in sorted(inv.numa_nodes, key=lambda n: n.id):
        vid = f"numa:{node.id}"
        b.vertex(
            vid,
            "numa",
            {
                "cpus": cpu_list_text(node.cpus) or None,
                "memory_bytes": node.memory_bytes,
                "package": node.package,
                "memory_only": node.memory_only or None,
                "gpu_bus_id": node.gpu_bus_id,
            },
        )
        parent = f"package:{node.package}" if node.package is not None else "machine"
        b.edge(parent, vid, "contains", {})
    nodes = {n.id: n for n in inv.numa_nodes}
    for i in sorted(nodes):
        for j in sorted(nodes):
            if j <= i:
                continue
            d_ij = nodes[i].distances.get(j)
            d_ji = nodes[j].distances.get(i)
            if d_ij is None and d_ji is None:
                continue
            attrs: dict[str, Any] = {"distance": d_ij if d_ij is not None else d_ji}
            if d_ij is not None and d_ji is not None and d_ij != d_ji:
                attrs["reverse_distance"] = d_ji
            b.edge(f"numa:{i}", f"numa:{j}", "numa_distance", attrs)

    # Endpoints and the PCIe paths that lead to them.
    root_numa = _root_numa(inv)
    endpoints: list[tuple[str, str]] = []
    align = alignment(inv)
    for gpu in ordered_gpus(inv):
        vid = f"gpu:{gpu.bus_id}"
        pci = inv.pci(gpu.bus_id)
        b.vertex(
            vid,
            "gpu",
            {
                "bus_id": gpu.bus_id,
                "dra_device": names.get(vid),
                "vendor": gpu.vendor,
                "model": gpu.model,
                "uuid": gpu.uuid,
                "index": gpu.index,
                "memory_bytes": gpu.memory_bytes,
                "memory_numa_node": gpu.memory_numa_node,
                "compute_capability": gpu.compute_capability,
                "nvlink_clique": gpu.fabric.clique if gpu.fabric is not None else None,
                "xgmi_hive_id": gpu.xgmi_hive_id,
                "nic_affinity": align.nic_affinity.get(gpu.bus_id),
                "rail": align.rail.get(gpu.bus_id),
                **_pci_attrs(pci),
            },
            labels.get(gpu.bus_id),
        )
        endpoints.append((vid, gpu.bus_id))
        if gpu.memory_numa_node is not None and gpu.memory_numa_node in nodes:
            b.edge(vid, f"numa:{gpu.memory_numa_node}", "memory", {})
    for nic in ordered_nics(inv):
        vid = f"nic:{nic.bus_id}"
        pci = inv.pci(nic.bus_id)
        b.vertex(
            vid,
            "nic",
            {
                "bus_id": nic.bus_id,
                "dra_device": names.get(vid),
                "vendor": nic.vendor,
                "model": nic.model,
                "netdevs": list(nic.netdevs),
                "rdma_devices": list(nic.rdma_devices),
                "speed_mbps": nic.speed_mbps,
                "link_layer": nic.link_layer,
                "is_vf": nic.is_vf or None,
                "nic_affinity": align.nic_affinity.get(nic.bus_id),
                "rail": align.rail.get(nic.bus_id),
                **_pci_attrs(pci),
            },
            labels.get(nic.bus_id),
        )
        endpoints.append((vid, nic.bus_id))
    for sw in sorted(inv.nvswitches, key=lambda s: s.bus_id):
        vid = f"nvswitch:{sw.bus_id}"
        b.vertex(
            vid,
            "nvswitch",
            {"bus_id": sw.bus_id, "vendor": sw.vendor, "model": sw.model},
        )
        endpoints.append((vid, sw.bus_id))

    for vid, bus in endpoints:
        pci = inv.pci(bus)
        if pci is None or not pci.pcie_root:
            continue
        root_id = f"pcie_root:{pci.pcie_root}"
        b.vertex(root_id, "pcie_root", {"numa_node": root_numa.get(pci.pcie_root)})
        numa = root_numa.get(pci.pcie_root)
        if numa is not None and numa in nodes:
            b.edge(root_id, f"numa:{numa}", "attach", {})
        parent = root_id
        for bridge in pci.upstream_bridges:
            bpci = inv.pci(bridge)
            bid = f"bridge:{bridge}"
            b.vertex(bid, "bridge", {"bus_id": bridge, **_pci_attrs(bpci)})
            b.edge(parent, bid, "pcie", _link_attrs(bpci))
            parent = bid
        b.edge(parent, vid, "pcie", _link_attrs(pci))

    _nvlink_edges(b, inv)
    _xgmi_edges(b, inv)

    for group in plan.cpu_groups:
        vid = f"cpu_group:{group.name}"
        b.vertex(
            vid,
            "cpu_group",
            {
                "dra_device": names.get(vid),
                "grouping": group.kind,
                "cpus": cpu_list_text(group.cpus),
                "cpu_count": len(group.cpus),
                "numa_node": group.numa_node,
                "package": group.package,
                "l3_id": group.l3_id,
                "core": group.core,
                "pcie_roots": list(group.pcie_roots),
            },
        )
        if group.numa_node is not None and group.numa_node in nodes:
            b.edge(f"numa:{group.numa_node}", vid, "contains", {})

    devices = []
    for i, (label, bus) in enumerate(zip(rel.labels, rel.bus_ids, strict=True)):
        kind = "gpu" if label.startswith("GPU") else "nic"
        vid = f"{kind}:{bus}"
        devices.append(
            _clean(
                {
                    "label": label,
                    "id": vid,
                    "kind": kind,
                    "bus_id": bus,
                    "dra_device": names.get(vid),
                    "name": rel.legend.get(label),
                    "cpu_affinity": rel.cpu_affinity[i],
                    "numa_affinity": rel.numa_affinity[i],
                    "numa_affinity_nodes": rel.numa_affinity_nodes[i],
                    "gpu_numa_id": rel.gpu_numa_id[i],
                }
            )
        )
    return {
        "schema": GRAPH_SCHEMA,
        "node": node_name or host,
        "dra": {"driver": opts.driver, "pool": node_name or _pool(host)},
        "vertices": list(b.vertices.values()),
        "edges": b.edges,
        "devices": devices,
        "relations": rel.to_dict(),
    }


def _nvlink_edges(b: _Builder, inv: Inventory) -> None:
    gpus = {g.bus_id: g for g in inv.gpus}
    switches = {s.bus_id for s in inv.nvswitches}
    pairs: dict[tuple[str, str], list[NvLink]] = {}
    for gpu in sorted(inv.gpus, key=lambda g: g.bus_id):
        for link in gpu.nvlinks:
            if link.remote_type == "switch":
                target = f"nvswitch:{link.remote_bus_id or 'fabric'}"
                if link.remote_bus_id not in switches:
                    b.vertex(target, "nvswitch", {"bus_id": link.remote_bus_id, "inferred": True})
                pairs.setdefault((f"gpu:{gpu.bus_id}", target), []).append(link)
            elif link.remote_bus_id in gpus:
                pairs.setdefault((f"gpu:{gpu.bus_id}", f"gpu:{link.remote_bus_id}"), []).append(
                    link
                )
    done: set[frozenset[str]] = set()
    for (src, dst), links in pairs.items():
        key = frozenset((src, dst))
        if key in done:
            continue
        done.add(key)
        back = pairs.get((dst, src), [])
        use = links if len(links) >= len(back) else back
        per = [nvlink_link_gbps(link) for link in use]
        total = round(sum(p for p in per if p is not None), 3) if any(per) else None
        versions = Counter(link.version for link in use if link.version)
        version = versions.most_common(1)[0][0] if versions else None
        b.edge(
            src,
            dst,
            "nvlink",
            {
                "links": len(use),
                "version": to_semver(version) if version else None,
                "bandwidth_gbps": total,
            },
        )


def _xgmi_edges(b: _Builder, inv: Inventory) -> None:
    gpus = {g.bus_id: g for g in inv.gpus}
    seen: set[frozenset[str]] = set()
    for gpu in sorted(inv.gpus, key=lambda g: g.bus_id):
        for peer in sorted(gpu.xgmi_peers):
            if peer not in gpus or peer == gpu.bus_id:
                continue
            key = frozenset((gpu.bus_id, peer))
            if key in seen:
                continue
            seen.add(key)
            a, c = sorted(key)
            attrs: dict[str, Any] = {"hive_id": _hive(gpus[a])}
            link = next((x for x in gpu.xgmi_links if x.peer_bus_id == peer), None)
            if link is not None:
                attrs.update(
                    weight=link.weight,
                    hops=link.hops,
                    min_bandwidth_mbps=link.min_bandwidth_mbps,
                    max_bandwidth_mbps=link.max_bandwidth_mbps,
                )
            b.edge(f"gpu:{a}", f"gpu:{c}", "xgmi", attrs)


def _hive(gpu: Gpu) -> str | None:
    return gpu.xgmi_hive_id or None


def _pool(host: str | None) -> str | None:
    """The pool a node publishes: its node name (the host name lower-cased, as the kubelet
    derives it); the host name as it is when it cannot be one."""
    if host is None:
        return None
    try:
        return node_name(host)
    except ValueError:
        return host
