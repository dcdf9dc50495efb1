"""A scoring view of one node's ``toposlice.graph/v1`` document.

The graph is the public interface between discovery and every scheduler-side consumer, so the
scorer reads only the graph (never an Inventory): a node's graph may come from a file, from the
node's ``/v1/topology`` endpoint, or (through the CLI) from a fake machine.
The view pre-computes what scoring asks for many times per decision: per-GPU link figures,
PCIe bridge chains, relation classes and the NVLink domain a GPU belongs to.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .request import load_document

GRAPH_SCHEMA = "toposlice.graph/v1"

#: NCCL's per-link, per-direction NVLink model (placement-models.md §1.1, ``TOPO``), by major.
NVLINK_MODEL_GBPS: dict[int, float] = {3: 20.0, 4: 20.6, 5: 40.1}
#: NCCL's PCIe x16 model per direction by generation (placement-models.md §1.2, ``XMLC``).
PCIE_MODEL_X16_GBPS: dict[int, float] = {3: 12.0, 4: 24.0, 5: 48.0, 6: 96.0}
#: RCCL's MI300X xGMI per-link model, per direction (placement-models.md §1.4).
XGMI_LINK_GBPS = 48.0


@dataclass(frozen=True)
class GpuView:
    vid: str
    dra_device: str
    bus_id: str
    label: str
    numa: int | None
    pcie_root: str | None
    chain: tuple[str, ...]
    """Bridge vertex ids from the root complex down to the GPU's own port."""
    pcie_gbps: float
    nvswitch_gbps: float
    """Per-direction NVLink bandwidth into NVSwitches (NCCL model); 0 without switch links."""
    nvlink_domain: str | None
    """GPUs with equal values share one non-blocking NVLink crossbar (may span nodes)."""
    memory_bytes: int | None
    attrs: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    nic_affinity: str | None = None
    """Closest-NIC group id (``toposlice.dev/nicAffinity``; graphs from before it: None)."""
    rail: int | None = None

    @property
    def switch(self) -> str:
        """The PCIe switch (its upstream port) or root complex this GPU hangs off."""
        if len(self.chain) >= 2:
            return self.chain[-2]
        return self.pcie_root or self.vid


@dataclass(frozen=True)
class NicView:
    vid: str
    dra_device: str
    bus_id: str
    label: str
    numa: int | None
    pcie_root: str | None
    gbps: float
    """Port speed per direction in GB/s (Gb/s / 8)."""
    rdma: bool
    nic_affinity: str | None = None
    rail: int | None = None


@dataclass(frozen=True)
class CpuView:
    vid: str
    dra_device: str
    numa: int | None
    cpu_count: int


@dataclass
class NodeTopology:
    name: str
    driver: str
    pool: str
    gpus: tuple[GpuView, ...]
    nics: tuple[NicView, ...]
    cpus: tuple[CpuView, ...]
    relations: dict[tuple[str, str], str]
    """(vertex id, vertex id) -> nvidia-smi class (``NV18``, ``PIX`` … ``SYS``)."""
    direct_gbps: dict[tuple[str, str], float]
    """GPU pairs with direct NVLink/xGMI links -> per-direction bandwidth (both orders)."""
    sys_gbps: float
    """Inter-socket model (NCCL ``*_QPI_BW`` / ``AMD_ZEN*_BW`` / ``ARM_BW``)."""
    intel_p2p: bool
    """PCIe P2P through an Intel root complex pays NCCL's 6/5 overhead."""
    labels: dict[str, str] = field(default_factory=dict)
    graph: dict[str, Any] = field(default_factory=dict, repr=False)
    signature: str = ""
    """Equal signatures = same hardware layout (used to share caches across nodes)."""

    def gpu(self, vid: str) -> GpuView:
        return self._gpu_index[vid]

    def __post_init__(self) -> None:
        self._gpu_index = {g.vid: g for g in self.gpus}
        self.by_device = {g.dra_device: g.vid for g in self.gpus}
        self.by_device.update({n.dra_device: n.vid for n in self.nics})
        self.by_device.update({c.dra_device: c.vid for c in self.cpus})
        self.device_of = {v: k for k, v in self.by_device.items()}
        self.rdma_nics = sum(1 for n in self.nics if n.rdma)
        self.gpu_devices = frozenset(g.dra_device for g in self.gpus)
        if not self.signature:
            self.signature = _signature(self)

    def relation(self, a: str, b: str) -> str:
        return "X" if a == b else self.relations.get((a, b), "SYS")


def _signature(t: NodeTopology) -> str:
    parts = [
        f"{g.bus_id}/{g.numa}/{g.pcie_root}/{'>'.join(g.chain)}/{g.pcie_gbps}/{g.nvswitch_gbps}"
        f"/{'D' if g.nvlink_domain else '-'}/{g.memory_bytes}"
        for g in t.gpus
    ]
    parts += [f"{n.bus_id}/{n.numa}/{n.gbps}/{n.nic_affinity}" for n in t.nics]
    parts += [f"{k[0]}-{k[1]}={v}" for k, v in sorted(t.relations.items())]
    return str(hash(("|".join(parts), t.sys_gbps, t.intel_p2p)))


def _sys_model(machine: dict[str, Any]) -> tuple[float, bool]:
    """NCCL's inter-socket bandwidth for the host CPU (placement-models.md §1.4)."""
    model = str(machine.get("cpu_model") or "")
    vendor = str(machine.get("cpu_vendor") or "").lower()
    arch = str(machine.get("arch") or "")
    if vendor == "intel" or "Xeon" in model:
        if any(tag in model for tag in ("Platinum 85", "Gold 65", "Silver 45")):
            return 40.0, True  # Emerald Rapids
        if any(tag in model for tag in ("Platinum 84", "Gold 64", "Silver 44", "Max 94")):
            return 22.0, True  # Sapphire Rapids
        return 10.0, True  # Skylake .. Ice Lake
    if vendor == "amd" or "EPYC" in model:
        if " 9" in model and "9005" in model:
            return 32.0, False
        return 24.0, False
    if arch == "aarch64" or vendor == "arm" or "Neoverse" in model or "Grace" in model:
        return 6.0, False
    return 10.0, False


def _nvlink_major(version: str | None) -> int | None:
    if not version:
        return None
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


def _pcie_model(edge: dict[str, Any] | None) -> float:
    if not edge:
        return PCIE_MODEL_X16_GBPS[3]
    gen, width = edge.get("gen"), edge.get("width") or 16
    if gen in PCIE_MODEL_X16_GBPS:
        return PCIE_MODEL_X16_GBPS[gen] * min(width, 16) / 16
    raw = edge.get("bandwidth_gbps")
    return float(raw) * 0.76 if raw else PCIE_MODEL_X16_GBPS[3]


def from_graph(graph: dict[str, Any], labels: dict[str, str] | None = None) -> NodeTopology:
    """The scoring view of one graph document; ``ValueError`` when it is not a graph."""
    if not isinstance(graph, dict) or graph.get("schema") != GRAPH_SCHEMA:
        raise ValueError(f"not a {GRAPH_SCHEMA} document (schema={graph.get('schema')!r})")
    verts = {v["id"]: v for v in graph.get("vertices", [])}
    parent: dict[str, str] = {}
    pcie_in: dict[str, dict[str, Any]] = {}
    nv_switch: dict[str, list[dict[str, Any]]] = {}
    direct: dict[tuple[str, str], float] = {}
    for e in graph.get("edges", []):
        kind, src, dst, attrs = e["kind"], e["source"], e["target"], e.get("attrs", {})
        if kind == "pcie":
            parent[dst] = src
            pcie_in[dst] = attrs
        elif kind == "nvlink":
            links = int(attrs.get("links") or 0)
            major = _nvlink_major(attrs.get("version"))
            per = NVLINK_MODEL_GBPS.get(major or 0)
            gbps = links * per if per else float(attrs.get("bandwidth_gbps") or 0.0) * 0.82
            if dst.startswith("nvswitch:"):
                nv_switch.setdefault(src, []).append({"gbps": gbps})
            elif dst.startswith("gpu:"):
                direct[(src, dst)] = direct[(dst, src)] = direct.get((src, dst), 0.0) + gbps
        elif kind == "xgmi":
            direct[(src, dst)] = direct[(dst, src)] = XGMI_LINK_GBPS
    node = str(graph.get("node") or "node")
    dra = graph.get("dra") or {}
    driver, pool = str(dra.get("driver") or "toposlice.dev"), str(dra.get("pool") or node)

    def chain_of(vid: str) -> tuple[str, ...]:
        out: list[str] = []
        cur = parent.get(vid)
        while cur is not None and cur.startswith("bridge:"):
            out.append(cur)
            cur = parent.get(cur)
        return tuple(reversed(out))

    devices = graph.get("devices") or []
    numa_of = {d["id"]: d.get("numa_affinity") for d in devices}
    label_of = {d["id"]: d.get("label", d["id"]) for d in devices}
    gpus: list[GpuView] = []
    nics: list[NicView] = []
    cpus: list[CpuView] = []
    for v in graph.get("vertices", []):
        a = v.get("attrs", {})
        vid = v["id"]
        if v["kind"] == "gpu":
            clique = a.get("nvlink_clique")
            switch_gbps = sum(x["gbps"] for x in nv_switch.get(vid, []))
            domain = (
                f"clique:{clique}"
                if clique and switch_gbps
                else (f"{node}:nvswitch" if switch_gbps else None)
            )
            numa = numa_of.get(vid, a.get("numa_node"))
            gpus.append(
                GpuView(
                    vid=vid,
                    dra_device=str(a.get("dra_device") or vid),
                    bus_id=str(a.get("bus_id") or vid),
                    label=str(label_of.get(vid, v.get("label", vid))),
                    numa=numa if isinstance(numa, int) else None,
                    pcie_root=a.get("pcie_root"),
                    chain=chain_of(vid),
                    pcie_gbps=_pcie_model(pcie_in.get(vid)),
                    nvswitch_gbps=round(switch_gbps, 3),
                    nvlink_domain=domain,
                    memory_bytes=a.get("memory_bytes"),
                    attrs=a,
                    nic_affinity=_str_or_none(a.get("nic_affinity")),
                    rail=_int_or_none(a.get("rail")),
                )
            )
        elif v["kind"] == "nic":
            numa = numa_of.get(vid, a.get("numa_node"))
            nics.append(
                NicView(
                    vid=vid,
                    dra_device=str(a.get("dra_device") or vid),
                    bus_id=str(a.get("bus_id") or vid),
                    label=str(label_of.get(vid, vid)),
                    numa=numa if isinstance(numa, int) else None,
                    pcie_root=a.get("pcie_root"),
                    gbps=float(a.get("speed_mbps") or 0) / 8000.0,
                    rdma=bool(a.get("rdma_devices")),
                    nic_affinity=_str_or_none(a.get("nic_affinity")),
                    rail=_int_or_none(a.get("rail")),
                )
            )
        elif v["kind"] == "cpu_group" and a.get("dra_device"):
            cpus.append(
                CpuView(
                    vid=vid,
                    dra_device=str(a["dra_device"]),
                    numa=a.get("numa_node"),
                    cpu_count=int(a.get("cpu_count") or 0),
                )
            )
    gpus.sort(key=lambda g: g.bus_id)
    nics.sort(key=lambda n: n.bus_id)
    rel = graph.get("relations") or {}
    rel_labels = list(rel.get("labels") or [])
    vid_of_label = {d.get("label"): d["id"] for d in devices}
    relations: dict[tuple[str, str], str] = {}
    for i, row in enumerate(rel.get("matrix") or []):
        for j, cls in enumerate(row):
            a_vid, b_vid = vid_of_label.get(rel_labels[i]), vid_of_label.get(rel_labels[j])
            if a_vid and b_vid:
                relations[(a_vid, b_vid)] = cls
    sys_gbps, intel = _sys_model(verts.get("machine", {}).get("attrs", {}))
    return NodeTopology(
        name=node,
        driver=driver,
        pool=pool,
        gpus=tuple(gpus),
        nics=tuple(nics),
        cpus=tuple(cpus),
        relations=relations,
        direct_gbps=direct,
        sys_gbps=sys_gbps,
        intel_p2p=intel,
        labels=dict(labels or {}),
        graph=graph,
    )


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def read_graph_file(path: str | Path) -> dict[str, Any]:
    """A graph document from a JSON or YAML file, with a clear error."""
    data = load_document(path)
    if not isinstance(data, dict) or data.get("schema") != GRAPH_SCHEMA:
        raise ValueError(f"{path}: not a {GRAPH_SCHEMA} document")
    return data


def rename_graph(graph: dict[str, Any], node_name: str) -> dict[str, Any]:
    """A copy of ``graph`` published by another node (the pool is the node name)."""
    out = dict(graph)
    out["node"] = node_name
    out["dra"] = {**(graph.get("dra") or {}), "pool": node_name}
    return out


@dataclass
class _CacheEntry:
    etag: str | None
    graph: dict[str, Any]


class GraphFetcher:
    """Node graphs from ``http://<node>/v1/topology``, cached and revalidated by ETag.

    A fetch failure keeps serving the last good graph (stale beats none for ranking) and
    raises only when there is nothing cached.
    """

    def __init__(self, timeout_s: float = 2.0) -> None:
        self.timeout_s = timeout_s
        self._cache: dict[str, _CacheEntry] = {}

    def get(self, url: str) -> dict[str, Any]:
        entry = self._cache.get(url)
        req = urllib.request.Request(url, headers={"Accept": "application/json"})
        if entry is not None and entry.etag:
            req.add_header("If-None-Match", entry.etag)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                graph = json.loads(resp.read().decode("utf-8"))
                if not isinstance(graph, dict) or graph.get("schema") != GRAPH_SCHEMA:
                    raise ValueError(f"{url}: not a {GRAPH_SCHEMA} document")
                self._cache[url] = _CacheEntry(resp.headers.get("ETag"), graph)
                return graph
        except urllib.error.HTTPError as exc:
            if exc.code == 304 and entry is not None:
                return entry.graph
            if entry is not None:
                return entry.graph
            raise ValueError(f"{url}: HTTP {exc.code}") from exc
        except (OSError, ValueError) as exc:
            if entry is not None:
                return entry.graph
            raise ValueError(f"{url}: {exc}") from exc


def load_graphs(
    files: list[str] | None = None, urls: list[str] | None = None
) -> list[NodeTopology]:
    """Views of graph files and node endpoints (fake machines: the CLI discovers them)."""
    out = [from_graph(read_graph_file(f)) for f in files or []]
    fetcher = GraphFetcher()
    out += [from_graph(fetcher.get(u)) for u in urls or []]
    return out
