"""Score one candidate device set on one node, with every part explained.

A score is 0..100: the weighted mean of parts that are each 0..1 (1 = best), with weights
set by the request's communication pattern and bound class. Parts:

* ``bandwidth`` — collective busbw of the GPU set (``bandwidth.busbw_gbps``) on a log scale
  up to the best per-GPU figure of any fabric the scorer knows (NVLink 5, 721.8 GB/s), so
  nodes compare on one absolute scale and PCIe paths still differ;
* ``nic_locality`` — the assigned NICs' GPU↔NIC path (PIX best … SYS worst), as the fraction
  of line rate a GPU gets through it;
* ``cpu_locality`` — GPUs whose NUMA node holds the chosen CPUs (or, without CPUs, the share
  of GPUs on the set's main NUMA node: host-side staging stays local);
* ``contention`` — chosen GPUs behind a PCIe switch (or root complex) that already carries
  memory-bound work;
* ``fragmentation`` — how much the node's best well-connected blocks for future 2/4/8-GPU jobs
  shrink (absolute busbw, weighted by the multi-GPU size mix), so a 1-GPU job does not break
  an NVSwitch board when a PCIe pair would do.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .bandwidth import NIC_PATH_DERATE, busbw_gbps, crossbar_gbps
from .request import Occupancy, Request
from .topology import CpuView, GpuView, NicView, NodeTopology

#: The best per-GPU busbw of any fabric modelled (NVLink 5, 18 × 40.1 GB/s).
REF_GBPS = 721.8
#: Future multi-GPU demand by size (share of multi-GPU jobs in bench/placement.py's mix).
FUTURE_SIZES: dict[int, float] = {2: 0.3, 4: 0.3, 8: 0.4}
#: Contention weight for memory-bound work (compute/communication-bound: 0.1).
MEMORY_CONTENTION = 0.3
#: Share of a free block's worth that comes from its existence rather than its speed.
COUNT_SHARE = 0.2
#: Least NIC-locality weight of a request that asks for GPUDirect NICs: asking for them
#: means the job drives them, whatever its in-node pattern.
NIC_FLOOR = 0.45
#: Weight of the ``fragmentation`` part: what a set takes from the node's future blocks.
#: 0.01-0.25 give the mixed-cluster bench the same figures within 0.015x busbw
#: (bench/scorer_levers.py); at 0 the scorer breaks whole boards and loses long 8-GPU jobs.
FRAGMENTATION_WEIGHT = 0.25
#: Above this many subsets, a node's best block is estimated greedily.
ENUM_LIMIT = 3000

_PATTERN_WEIGHTS: dict[str, tuple[float, float, float]] = {
    # bandwidth, nic_locality, cpu_locality
    "tensor-parallel": (0.55, 0.05, 0.10),
    "data-parallel": (0.35, 0.25, 0.10),
    "pipeline-parallel": (0.20, 0.25, 0.15),
    "inference-prefill": (0.25, 0.10, 0.20),
    "inference-decode": (0.40, 0.05, 0.15),
    "independent": (0.0, 0.15, 0.35),
}


def bandwidth_part(busbw: float) -> float:
    """Log scale: a PCIe pair at 24 vs 20 GB/s still matters next to NVLink's 370-722."""
    return min(1.0, math.log1p(max(0.0, busbw)) / math.log1p(REF_GBPS))


def weights(req: Request) -> dict[str, float]:
    bw, nic, cpu = _PATTERN_WEIGHTS[req.pattern]
    contention = 0.1
    if req.bound == "communication":
        bw *= 1.5
    elif req.bound == "memory":
        contention = MEMORY_CONTENTION
    else:
        cpu *= 1.3
    return {
        "bandwidth": bw if req.gpus > 1 else 0.0,
        "nic_locality": max(nic, NIC_FLOOR) if req.nics_per_gpu > 0 else 0.0,
        "cpu_locality": cpu,
        "contention": contention,
        "fragmentation": FRAGMENTATION_WEIGHT,
    }


@dataclass(frozen=True)
class Placement:
    node: str
    gpus: tuple[str, ...]
    """Graph vertex ids."""
    nics: tuple[str, ...]
    cpus: tuple[str, ...]
    devices: tuple[str, ...]
    """DRA device names (GPUs, NICs, CPU groups)."""
    score: float
    parts: dict[str, float] = field(default_factory=dict, compare=False)
    explain: tuple[str, ...] = field(default=(), compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "devices": list(self.devices),
            "score": round(self.score, 3),
            "parts": {k: round(v, 4) for k, v in self.parts.items()},
            "explain": list(self.explain),
        }


_EMPTY: dict[str, int] = {}
_EMPTY_ROOTS: dict[str | None, int] = {}


class NodeState:
    """A node's graph view plus what is free on it for one request (any GPU count: the
    filters depend on memory and attributes only, so one state serves every count)."""

    def __init__(self, topo: NodeTopology, occ: Occupancy | None, req: Request) -> None:
        occ = occ or Occupancy()
        used = occ.used(topo.pool)
        busy = occ.busy_memory(topo.pool)
        self.topo = topo
        if used:
            self.all_free_gpus = tuple(g for g in topo.gpus if g.dra_device not in used)
            self.free_nics = tuple(n for n in topo.nics if n.dra_device not in used)
            self.free_cpus = tuple(c for c in topo.cpus if c.dra_device not in used)
        else:
            self.all_free_gpus, self.free_nics, self.free_cpus = topo.gpus, topo.nics, topo.cpus
        filtered = req.min_gpu_memory or req.gpu_attributes
        self.free_gpus = (
            tuple(g for g in self.all_free_gpus if gpu_eligible(g, req))
            if filtered
            else self.all_free_gpus
        )
        self.busy_switches: dict[str, int] = _EMPTY
        self.busy_roots: dict[str | None, int] = _EMPTY_ROOTS
        if busy:
            busy_gpus = [g for g in topo.gpus if g.dra_device in busy]
            self.busy_switches = Counter(g.switch for g in busy_gpus)
            self.busy_roots = Counter(g.pcie_root for g in busy_gpus)
        self.key = (
            topo.signature,
            frozenset(used),
            frozenset(busy),
            tuple(g.vid for g in self.free_gpus) if filtered else None,
        )
        self._frag_before: float | None = None
        self.free_rdma = sum(1 for n in self.free_nics if n.rdma)

    @property
    def frag_before(self) -> float:
        if self._frag_before is None:
            self._frag_before = block_value(self.topo, self.all_free_gpus, self.free_rdma)
        return self._frag_before


def gpu_eligible(g: GpuView, req: Request) -> bool:
    if req.min_gpu_memory and (g.memory_bytes or 0) < req.min_gpu_memory:
        return False
    return all(str(g.attrs.get(k)) == v for k, v in req.gpu_attributes.items())


def node_eligible(topo: NodeTopology, req: Request) -> bool:
    """Hard constraints (node labels) — applied before any scoring."""
    return all(topo.labels.get(k) == v for k, v in req.node_labels.items())


_BUSBW_CACHE: dict[tuple[str, frozenset[str]], float] = {}
_BLOCK_CACHE: dict[tuple[str, frozenset[str], int | None], float] = {}


def set_busbw(topo: NodeTopology, gpus: Sequence[GpuView]) -> float:
    key = (topo.signature, frozenset(g.vid for g in gpus))
    bw = _BUSBW_CACHE.get(key)
    if bw is None:
        bw = busbw_gbps(topo, gpus)
        if len(_BUSBW_CACHE) > 200_000:
            _BUSBW_CACHE.clear()
        _BUSBW_CACHE[key] = bw
    return bw


def greedy_sets(
    topo: NodeTopology, free: Sequence[GpuView], size: int, seeds: int = 16
) -> list[list[GpuView]]:
    """Grow sets from one seed per PCIe switch group, adding the GPU that keeps busbw highest
    (ties: same switch, then same NUMA node as the seed)."""
    groups: dict[str, GpuView] = {}
    for g in free:
        groups.setdefault(g.switch, g)
    out: list[list[GpuView]] = []
    for seed in list(groups.values())[:seeds]:
        chosen = [seed]
        rest = [g for g in free if g.vid != seed.vid]
        while len(chosen) < size and rest:
            best = max(
                rest,
                key=lambda g: (
                    set_busbw(topo, [*chosen, g]),
                    g.switch == seed.switch,
                    g.numa == seed.numa,
                    g.bus_id == min(x.bus_id for x in rest),
                ),
            )
            chosen.append(best)
            rest.remove(best)
        out.append(chosen)
    return out


def block_value(topo: NodeTopology, free: Sequence[GpuView], free_rdma: int | None = None) -> float:
    """The node's worth to future multi-GPU jobs: for each future size, pack disjoint best
    blocks greedily and add GPUs × block worth (``block_worth``), weighted by the size mix,
    in units of a full 8-GPU board at ``REF_GBPS``. With ``free_rdma`` (free RDMA NICs), a
    block beyond those NICs (one per GPU, best blocks first) is worth ``NO_NIC_SHARE`` of
    that: it can host an in-node job, not a job that needs its GPUDirect NICs."""
    key = (topo.signature, frozenset(g.vid for g in free), free_rdma)
    value = _BLOCK_CACHE.get(key)
    if value is None:
        value = 0.0
        for size, weight in FUTURE_SIZES.items():
            value += weight * _packed_gbps(topo, list(free), size, free_rdma)
        value /= REF_GBPS * 8
        if len(_BLOCK_CACHE) > 200_000:
            _BLOCK_CACHE.clear()
        _BLOCK_CACHE[key] = value
    return value


#: Worth of a free block that its node has no free RDMA NICs left for.
NO_NIC_SHARE = 0.3


def network_ready(topo: NodeTopology) -> bool:
    """A node that can hold a pod of a multi-node job: an RDMA NIC per GPU."""
    return topo.rdma_nics >= len(topo.gpus) > 0


def block_worth(bw: float) -> float:
    """A block's worth per GPU, in GB/s: half for being a block at all (it admits a job),
    half for how fast it is (it should go to the job that needs the speed)."""
    return COUNT_SHARE * REF_GBPS + (1.0 - COUNT_SHARE) * bw


def _packed_gbps(
    topo: NodeTopology, free: list[GpuView], size: int, free_rdma: int | None = None
) -> float:
    nics = math.inf if free_rdma is None else free_rdma

    def worth(bw: float) -> float:
        nonlocal nics
        w = size * block_worth(bw)
        if nics >= size:
            nics -= size
            return w
        return w * NO_NIC_SHARE

    xbar = crossbar_gbps(free) if free else None
    if xbar is not None:
        return sum(worth(xbar) for _ in range(len(free) // size))
    total = 0.0
    while len(free) >= size:
        if math.comb(len(free), size) <= ENUM_LIMIT:
            block: tuple[GpuView, ...] = max(
                itertools.combinations(free, size), key=lambda c: set_busbw(topo, c)
            )
        else:
            sets = greedy_sets(topo, free, size, 8)
            block = tuple(sets[max(range(len(sets)), key=lambda i: set_busbw(topo, sets[i]))])
        bw = set_busbw(topo, block)
        if bw <= 0:
            break
        total += worth(bw)
        taken = {g.vid for g in block}
        free = [g for g in free if g.vid not in taken]
    return total


def assign_nics(
    topo: NodeTopology, gpus: Sequence[GpuView], free_nics: Sequence[NicView], per_gpu: int
) -> list[tuple[GpuView, NicView]] | None:
    """Each GPU its own ``per_gpu`` NICs, as an optimal assignment: the sum of the pairs'
    path ranks is the largest possible (then RDMA NICs, faster NICs, lower bus ids); None
    when there are too few NICs. Exact (Hungarian method), so a GPU never takes the only
    close NIC of another GPU that had a second option."""
    if per_gpu == 0:
        return []
    if len(free_nics) < per_gpu * len(gpus):
        return None
    key = (
        topo.signature,
        tuple(g.vid for g in gpus),
        tuple(n.vid for n in free_nics),
        per_gpu,
    )
    hit = _ASSIGN_CACHE.get(key)
    if hit is None:
        slots = [g for g in gpus for _ in range(per_gpu)]
        hit = tuple(optimal_assignment(_pair_costs(topo, slots, free_nics)))
        if len(_ASSIGN_CACHE) > 100_000:
            _ASSIGN_CACHE.clear()
        _ASSIGN_CACHE[key] = hit
    slots = [g for g in gpus for _ in range(per_gpu)]
    return [(slots[i], free_nics[j]) for i, j in enumerate(hit)]


_ASSIGN_CACHE: dict[tuple[Any, ...], tuple[int, ...]] = {}


def _pair_costs(
    topo: NodeTopology, slots: Sequence[GpuView], nics: Sequence[NicView]
) -> list[list[int]]:
    """Integer costs whose minimum sum is lexicographically best: path rank, then RDMA,
    then NIC speed, then lower NIC index (each term cannot outweigh the one before)."""
    rows, cols = len(slots), len(nics)
    s_idx = rows * cols + 1
    s_speed = (rows * 10_000 + 1) * s_idx
    s_rdma = (rows + 1) * s_speed
    s_rank = (rows + 1) * s_rdma
    out = []
    for g in slots:
        row = []
        for j, n in enumerate(nics):
            rank = round(_nic_rank(topo, g, n) * 100)
            speed = min(9_999, max(0, int(n.gbps)))
            row.append(-(rank * s_rank + int(n.rdma) * s_rdma + speed * s_speed) + j)
        out.append(row)
    return out


def optimal_assignment(cost: Sequence[Sequence[int]]) -> list[int]:
    """Rows to distinct columns at the least total cost (rows <= columns): the column of
    each row. Hungarian method with potentials, O(rows² × columns), exact on integers."""
    n = len(cost)
    if n == 0:
        return []
    m = len(cost[0])
    if m < n:
        raise ValueError("fewer columns than rows")
    inf = sum(max(abs(x) for x in row) for row in cost) * 2 + 1
    u = [0] * (n + 1)
    v = [0] * (m + 1)
    p = [0] * (m + 1)  # p[j] = row (1-based) matched to column j
    way = [0] * (m + 1)
    for i in range(1, n + 1):
        p[0] = i
        j0 = 0
        minv = [inf] * (m + 1)
        used = [False] * (m + 1)
        while True:
            used[j0] = True
            i0 = p[j0]
            delta = inf
            j1 = 0
            row = cost[i0 - 1]
            for j in range(1, m + 1):
                if not used[j]:
                    cur = row[j - 1] - u[i0] - v[j]
                    if cur < minv[j]:
                        minv[j] = cur
                        way[j] = j0
                    if minv[j] < delta:
                        delta = minv[j]
                        j1 = j
            for j in range(m + 1):
                if used[j]:
                    u[p[j]] += delta
                    v[j] -= delta
                else:
                    minv[j] -= delta
            j0 = j1
            if p[j0] == 0:
                break
        while True:
            j1 = way[j0]
            p[j0] = p[j1]
            j0 = j1
            if j0 == 0:
                break
    col = [0] * n
    for j in range(1, m + 1):
        if p[j]:
            col[p[j] - 1] = j - 1
    return col


def _nic_rank(topo: NodeTopology, gpu: GpuView, nic: NicView) -> float:
    return NIC_PATH_DERATE.get(topo.relation(gpu.vid, nic.vid), NIC_PATH_DERATE["SYS"])


def choose_cpus(
    gpus: Sequence[GpuView], free_cpus: Sequence[CpuView], cpus: int
) -> list[CpuView] | None:
    """CPU groups on the GPUs' NUMA nodes first (most GPUs first) until ``cpus`` are covered."""
    if cpus == 0:
        return []
    numa_votes = Counter(g.numa for g in gpus)
    ranked = sorted(free_cpus, key=lambda c: (-numa_votes.get(c.numa, 0), c.numa or 0, c.vid))
    chosen: list[CpuView] = []
    total = 0
    for c in ranked:
        if total >= cpus:
            break
        chosen.append(c)
        total += c.cpu_count
    return chosen if total >= cpus else None


def score_set(
    state: NodeState,
    req: Request,
    gpus: Sequence[GpuView],
    busbw_override: float | None = None,
    nics: Sequence[NicView] | None = None,
    cpus: Sequence[CpuView] | None = None,
) -> Placement | None:
    """The placement of ``gpus`` (+ NICs and CPUs chosen for them); None if infeasible.

    ``busbw_override`` replaces the in-node collective figure for a pod of a multi-node job
    whose collective runs over a larger fabric (an NVLink domain, the NICs). ``nics`` fixes
    the NICs (and ``cpus`` the CPU groups) instead of choosing them.
    """
    topo = state.topo
    if nics is not None:
        per = len(nics) // len(gpus) if gpus and len(nics) % len(gpus) == 0 else 0
        pairs = assign_nics(topo, gpus, nics, per) if per else None
        if pairs is None and nics:
            raise ValueError(f"{len(nics)} NICs cannot be shared evenly by {len(gpus)} GPUs")
    else:
        pairs = assign_nics(topo, gpus, state.free_nics, req.nics_per_gpu)
    if pairs is None:
        return None
    cpu_groups = list(cpus) if cpus is not None else choose_cpus(gpus, state.free_cpus, req.cpus)
    if cpu_groups is None:
        return None
    n = len(gpus)
    busbw = set_busbw(topo, gpus) if busbw_override is None else busbw_override
    parts: dict[str, float] = {"busbw_gbps": busbw, "bandwidth": bandwidth_part(busbw)}
    explain = [f"busbw {busbw:.1f} GB/s over {n} GPUs" if n > 1 else "1 GPU: no collective"]
    if pairs:
        ranks = [_nic_rank(topo, g, nic) for g, nic in pairs]
        parts["nic_locality"] = sum(ranks) / len(ranks) / NIC_PATH_DERATE["PIX"]
        paths = Counter(topo.relation(g.vid, nic.vid) for g, nic in pairs)
        explain.append("GPU↔NIC " + ", ".join(f"{k}×{v}" for k, v in sorted(paths.items())))
    else:
        parts["nic_locality"] = 1.0
    if cpu_groups:
        local = {c.numa for c in cpu_groups}
        parts["cpu_locality"] = sum(1 for g in gpus if g.numa in local) / n
        explain.append(f"CPUs on NUMA {sorted(x for x in local if x is not None)}")
    else:
        main = Counter(g.numa for g in gpus).most_common(1)[0][1] if gpus else 0
        parts["cpu_locality"] = main / n if n else 1.0
    shared = sum(
        1.0
        if state.busy_switches.get(g.switch)
        else 0.5
        if state.busy_roots.get(g.pcie_root)
        else 0
        for g in gpus
    )
    parts["contention"] = 1.0 - shared / n if n else 1.0
    if shared:
        explain.append(f"{shared:g} GPU(s) share a PCIe switch/root with memory-bound work")
    chosen = {g.vid for g in gpus}
    after = [g for g in state.all_free_gpus if g.vid not in chosen]
    rdma_left = state.free_rdma - sum(1 for _, nic in pairs if nic.rdma)
    loss = max(0.0, state.frag_before - block_value(topo, after, rdma_left))
    parts["capacity_loss"] = loss
    parts["fragmentation"] = 1.0 - loss
    if loss > 1e-9:
        explain.append(f"well-connected capacity −{loss:.3f}")
    w = weights(req)
    total = sum(w.values())
    score = 100.0 * sum(w[k] * parts[k] for k in w) / total if total else 0.0
    nic_views = [nic for _, nic in pairs]
    devices = (
        *(g.dra_device for g in gpus),
        *(nic.dra_device for nic in nic_views),
        *(c.dra_device for c in cpu_groups),
    )
    return Placement(
        node=topo.name,
        gpus=tuple(g.vid for g in gpus),
        nics=tuple(nic.vid for nic in nic_views),
        cpus=tuple(c.vid for c in cpu_groups),
        devices=devices,
        score=score,
        parts=parts,
        explain=tuple(explain),
    )


def score_devices(
    topo: NodeTopology, occ: Occupancy | None, req: Request, devices: Iterable[str]
) -> Placement:
    """Score a given device set (``toposlice score --devices``); GPUs are required, NICs and
    CPU groups given are used as they are, else chosen."""
    state = NodeState(topo, occ, req)
    names = list(devices)
    unknown = [d for d in names if d not in topo.by_device]
    if unknown:
        raise ValueError(f"{topo.name}: no device named {unknown[0]!r}")
    vids = [topo.by_device[d] for d in names]
    gpus = [topo.gpu(v) for v in vids if v.startswith("gpu:")]
    nics = [n for n in topo.nics if n.vid in vids]
    cpus = [c for c in topo.cpus if c.vid in vids]
    if not gpus:
        raise ValueError("--devices must name at least one GPU")
    req = req.with_gpus(len(gpus))
    p = score_set(state, req, gpus, nics=nics or None, cpus=cpus or None)
    if p is None:
        raise ValueError(f"{topo.name}: not enough free NICs or CPUs for these GPUs")
    return p
