"""Find the best device sets: on one node, in one NVLink domain, or across nodes.

* A node whose free-GPU subsets of the wanted size are few (every node up to 8 GPUs, and
  more) is searched exhaustively: the chosen set is the optimum of ``score.score_set``.
* A larger node (a 72-GPU single-graph NVLink domain) is searched by structure: candidate
  sets grown from one seed per PCIe switch group plus best-fit group filling, then improved
  by single swaps — a few hundred scorings instead of C(72, k).
* A multi-node NVLink domain (NVL72 rack of 4-GPU trays): each tray's best pod for every
  count comes from the exact node search; a knapsack DP picks the counts per tray that
  maximise the GPU-weighted pod score, less a per-pod penalty. Exact for that objective.
* Jobs larger than any domain: one whole-node pod per node, on the nodes whose pods score
  best (GPU↔NIC paths, in-node busbw), at the NIC-bound collective.
Results for a node are cached on (hardware signature, free set, busy set, request), so
identical nodes in identical states are searched once.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .bandwidth import nic_gbps
from .request import Occupancy, Request
from .score import NodeState, Placement, node_eligible, score_set, set_busbw, weights
from .topology import GpuView, NodeTopology

EXACT_LIMIT = 5000
#: Score points a multi-node placement pays per extra pod (more processes, more failure
#: domains, more claims).
POD_PENALTY = 1.0


@dataclass(frozen=True)
class ClusterPlacement:
    pods: tuple[Placement, ...]
    score: float
    parts: dict[str, float] = field(default_factory=dict, compare=False)
    kind: str = "node"
    """``node``, ``nvlink-domain`` or ``multi-node``."""

    @property
    def gpus(self) -> int:
        return sum(len(p.gpus) for p in self.pods)

    def to_dicts(self) -> list[dict[str, Any]]:
        """One ``{node, devices, score, parts}`` per pod (the CLI's JSON shape)."""
        out = []
        for p in self.pods:
            d = p.to_dict()
            d["score"] = round(self.score, 3)
            d["parts"] = {**d["parts"], **{k: round(v, 4) for k, v in self.parts.items()}}
            if len(self.pods) > 1:
                d["pod_score"] = round(p.score, 3)
                d["placement"] = self.kind
            out.append(d)
        return out


_NODE_CACHE: dict[tuple[Any, ...], list[Placement]] = {}


def _cache_key(state: NodeState, req: Request, override: float | None) -> tuple[Any, ...]:
    return (state.key, req.key(), override)


def node_placements(
    topo: NodeTopology,
    occ: Occupancy | None,
    req: Request,
    top: int = 5,
    busbw_override: float | None = None,
    state: NodeState | None = None,
) -> list[Placement]:
    """The best ``top`` placements of ``req`` on one node, best first (ties: lower bus ids)."""
    if not node_eligible(topo, req):
        return []
    state = state or NodeState(topo, occ, req)
    if len(state.free_gpus) < req.gpus:
        return []
    key = _cache_key(state, req, busbw_override)
    cached = _NODE_CACHE.get(key)
    if cached is None:
        cached = _search_node(state, req, busbw_override)
        if len(_NODE_CACHE) > 50_000:
            _NODE_CACHE.clear()
        _NODE_CACHE[key] = cached
    # Cached results are in signature terms; map vertex ids are equal across same-layout nodes
    # but the node name is not.
    return [_renamed(p, topo.name) for p in cached[:top]]


def _renamed(p: Placement, node: str) -> Placement:
    if p.node == node:
        return p
    return Placement(node, p.gpus, p.nics, p.cpus, p.devices, p.score, p.parts, p.explain)


def _rank(ps: list[Placement]) -> list[Placement]:
    return sorted(ps, key=lambda p: (-round(p.score, 9), p.devices))


def _search_node(state: NodeState, req: Request, override: float | None) -> list[Placement]:
    free, k = state.free_gpus, req.gpus
    if math.comb(len(free), k) <= EXACT_LIMIT:
        found = [score_set(state, req, list(c), override) for c in itertools.combinations(free, k)]
        return _rank([p for p in found if p is not None])[:16]
    return _structured(state, req, override)


def _structured(state: NodeState, req: Request, override: float | None) -> list[Placement]:
    topo, free, k = state.topo, list(state.free_gpus), req.gpus
    candidates: list[list[GpuView]] = []
    # Best-fit group filling at each level of the hierarchy.
    for level in (
        lambda g: g.switch,
        lambda g: g.pcie_root,
        lambda g: g.numa,
        lambda g: g.nvlink_domain,
    ):
        groups: dict[Any, list[GpuView]] = {}
        for g in free:
            groups.setdefault(level(g), []).append(g)
        fitting = sorted((v for v in groups.values() if len(v) >= k), key=len)
        if fitting:
            candidates.append(sorted(fitting[0], key=lambda g: g.bus_id)[:k])
        chosen: list[GpuView] = []
        for grp in sorted(groups.values(), key=lambda v: (-len(v), v[0].bus_id)):
            chosen += sorted(grp, key=lambda g: g.bus_id)[: k - len(chosen)]
            if len(chosen) == k:
                break
        candidates.append(chosen)
    from .score import greedy_sets

    candidates += greedy_sets(topo, free, k, seeds=16)
    scored = [score_set(state, req, c, override) for c in candidates]
    best = _rank([p for p in scored if p is not None])[:4]
    # Single swaps on the best few, two rounds.
    for _ in range(2):
        improved: list[Placement] = []
        for p in best:
            inside = [topo.gpu(v) for v in p.gpus]
            outside = [g for g in free if g.vid not in p.gpus]
            options = sorted({g.switch: g for g in outside}.values(), key=lambda g: g.bus_id)
            for i in range(len(inside)):
                for g in options:
                    trial = [*inside[:i], g, *inside[i + 1 :]]
                    q = score_set(state, req, trial, override)
                    if q is not None and q.score > p.score + 1e-9:
                        improved.append(q)
        if not improved:
            break
        best = _rank(best + improved)[:4]
    return _rank(best)


# ---------------------------------------------------------------- multi-node


def nvlink_domains(nodes: Sequence[NodeTopology]) -> dict[str, list[NodeTopology]]:
    """Domains that span nodes (fabric cliques), with their member nodes."""
    key = tuple(id(t) for t in nodes)
    hit = _DOMAINS_CACHE.get(key)
    if hit is not None:
        return hit
    found = _nvlink_domains(nodes)
    _DOMAINS_CACHE.clear()
    _DOMAINS_CACHE[key] = found
    return found


_DOMAINS_CACHE: dict[tuple[int, ...], dict[str, list[NodeTopology]]] = {}


def _nvlink_domains(nodes: Sequence[NodeTopology]) -> dict[str, list[NodeTopology]]:
    out: dict[str, list[NodeTopology]] = {}
    for t in nodes:
        doms = {g.nvlink_domain for g in t.gpus if g.nvlink_domain}
        for d in doms:
            if d.startswith("clique:"):
                out.setdefault(d, []).append(t)
    return {d: ns for d, ns in out.items() if len(ns) > 1}


def _pod_term(p: Placement, req: Request, k: int) -> float:
    """A pod's additive share of a multi-pod score: its GPUs' share of the per-GPU parts,
    minus its whole capacity loss, minus the per-pod penalty."""
    w = weights(req)
    total = sum(w.values()) or 1.0
    per_gpu = sum(w[x] * p.parts[x] for x in ("nic_locality", "cpu_locality", "contention"))
    c = len(p.gpus)
    return 100.0 * (per_gpu * c / k - w["fragmentation"] * p.parts["capacity_loss"]) / total - (
        POD_PENALTY
    )


def _combine(pods: Sequence[Placement], req: Request, busbw: float, kind: str) -> ClusterPlacement:
    """Score of a multi-pod placement: the job's collective, GPU-weighted locality parts, the
    summed capacity loss of every node it touches, and the pod penalty (one pod = the node
    score exactly)."""
    from .score import bandwidth_part

    k = sum(len(p.gpus) for p in pods)
    w = weights(req)
    total = sum(w.values()) or 1.0
    base = 100.0 * (w["bandwidth"] * bandwidth_part(busbw) + w["fragmentation"]) / total
    score = base + POD_PENALTY + sum(_pod_term(p, req, k) for p in pods)
    parts = {
        "busbw_gbps": busbw,
        "pods": float(len(pods)),
        "capacity_loss": sum(p.parts["capacity_loss"] for p in pods),
    }
    return ClusterPlacement(tuple(pods), score, parts, kind)


def domain_placement(
    members: Sequence[NodeTopology],
    occ: Occupancy | None,
    req: Request,
    states: dict[str, NodeState] | None = None,
) -> ClusterPlacement | None:
    """Best placement of ``req`` inside one multi-node NVLink domain (DP over its nodes)."""
    states_in = states or {}
    states = None
    live = [
        states_in.get(t.name) or NodeState(t, occ, req) for t in members if node_eligible(t, req)
    ]
    if sum(len(s.free_gpus) for s in live) < req.gpus:
        return None
    bw = min((g.nvswitch_gbps for s in live for g in s.free_gpus), default=0.0)
    k = req.gpus
    # options[i][c] = best pod with c GPUs on node i.
    options: list[dict[int, Placement]] = []
    for s in live:
        opt: dict[int, Placement] = {}
        for c in range(1, min(len(s.free_gpus), k) + 1):
            found = node_placements(s.topo, occ, req.with_gpus(c), 1, bw, state=s)
            if found:
                opt[c] = found[0]
        options.append(opt)
    # dp[j] = (value, pods) over the nodes so far with j GPUs placed; value = Σ pod terms.
    neg = -math.inf
    empty: tuple[Placement, ...] = ()
    dp: list[tuple[float, tuple[Placement, ...]]] = [(0.0, empty)] + [(neg, empty)] * k
    for opt in options:
        nxt = list(dp)
        for j in range(k + 1):
            if dp[j][0] == neg:
                continue
            for c, p in opt.items():
                if j + c > k:
                    continue
                val = dp[j][0] + _pod_term(p, req, k)
                if val > nxt[j + c][0] + 1e-9:
                    nxt[j + c] = (val, (*dp[j][1], p))
        dp = nxt
    if dp[k][0] == neg:
        return None
    return _combine(dp[k][1], req, bw, "nvlink-domain")


#: Pod sizes a job larger than a node may be cut into (equal pods, one per node).
POD_SIZES = (8, 4, 2)


def multi_node_placement(
    nodes: Sequence[NodeTopology],
    occ: Occupancy | None,
    req: Request,
    states: dict[str, NodeState] | None = None,
) -> ClusterPlacement | None:
    """Equal pods over the NICs, one per node: the job's collective runs at its slowest pod
    (in-node ring, or its GPUs' derated NIC bandwidth). Pod sizes are tried largest first;
    among nodes the fastest pods win, then the best pod terms (locality, capacity lost)."""
    best: ClusterPlacement | None = None
    given = states or {}
    live = [
        given.get(t.name) or NodeState(t, occ, req)
        for t in nodes
        if t.gpus and node_eligible(t, req)
    ]
    for n in POD_SIZES:
        need = req.gpus // n
        if req.gpus % n or need < 2:
            continue
        pods: list[tuple[float, float, Placement]] = []
        for st in live:
            if len(st.free_gpus) < n or len(st.topo.gpus) < n:
                continue
            found = node_placements(st.topo, occ, req.with_gpus(n), 1, state=st)
            if found:
                p = found[0]
                pods.append((pod_network_gbps(st.topo, p), _pod_term(p, req, req.gpus), p))
        if len(pods) < need:
            continue
        pods.sort(key=lambda x: (-round(x[0], 6), -x[1], x[2].node))
        chosen = pods[:need]
        bw = min(b for b, _, _ in chosen)
        cand = _combine([p for _, _, p in chosen], req, bw, "multi-node")
        if best is None or cand.score > best.score:
            best = cand
    return best


_NET_CACHE: dict[tuple[str, tuple[str, ...], tuple[str, ...]], float] = {}


def pod_network_gbps(t: NodeTopology, p: Placement) -> float:
    key = (t.signature, p.gpus, p.nics)
    bw = _NET_CACHE.get(key)
    if bw is None:
        if len(_NET_CACHE) > 100_000:
            _NET_CACHE.clear()
        bw = _NET_CACHE[key] = _pod_network_gbps(t, p)
    return bw


def _pod_network_gbps(t: NodeTopology, p: Placement) -> float:
    """A pod's share of a NIC-bound collective: its in-node ring, or its slowest GPU's NIC
    path. Like NCCL, each GPU uses the closest of the pod's NICs; with fewer NICs than GPUs
    they share them (a pod without NICs gets the node's fastest one, shared)."""
    from .score import assign_nics

    gpus = [t.gpu(v) for v in p.gpus]
    intra = set_busbw(t, gpus)
    nics = [n for n in t.nics if n.vid in p.nics] or sorted(t.nics, key=lambda n: -n.gbps)[:1]
    if not nics or not gpus:
        return 0.0
    if len(nics) >= len(gpus):
        per = len(nics) // len(gpus)
        pairs = assign_nics(t, gpus, nics, per) or []
        got: dict[str, float] = {}
        for g, n in pairs:
            got[g.vid] = got.get(g.vid, 0.0) + nic_gbps(t, g, n)
        return min(intra, min(got.values()))
    best = {g.vid: max(nics, key=lambda n: (nic_gbps(t, g, n), n.gbps, n.bus_id)) for g in gpus}
    users = Counter(n.vid for n in best.values())
    return min(intra, min(nic_gbps(t, g, best[g.vid], users[best[g.vid].vid]) for g in gpus))


#: Future jobs only a multi-node NVLink domain serves at NVLink speed, by size (the >8-GPU
#: part of bench/placement.py's mix, on the same scale as ``score.FUTURE_SIZES``).
DOMAIN_SIZES: dict[int, float] = {16: 0.2, 32: 0.15, 64: 0.1}


#: Every free GPU of a multi-node domain is worth this much (× its block worth) to the
#: domain-sized jobs to come, on top of the whole blocks: a smooth pull toward other nodes.
DOMAIN_PER_GPU = 0.3


def _domain_value(free: int, bw: float) -> float:
    from .score import REF_GBPS, block_worth

    worth = block_worth(bw)
    blocks = sum(w * (free // s) * s for s, w in DOMAIN_SIZES.items())
    return (blocks + DOMAIN_PER_GPU * free) * worth / (REF_GBPS * 8)


@dataclass(frozen=True)
class _DomainInfo:
    free: int
    bw: float


def _domain_adjusted(
    c: ClusterPlacement,
    node_domain: dict[str, str],
    info: dict[str, _DomainInfo],
    req: Request,
) -> ClusterPlacement:
    """Charge a placement for the big blocks it takes out of multi-node NVLink domains (a
    node-local view cannot see that a tray's last free GPUs complete a rack's 64-GPU block).
    The charge is the same for every set of equal size on one node, so it only re-ranks
    nodes and placement kinds."""
    taken: dict[str, int] = {}
    for p in c.pods:
        d = node_domain.get(p.node)
        if d is not None:
            taken[d] = taken.get(d, 0) + len(p.gpus)
    loss = sum(
        _domain_value(info[d].free, info[d].bw) - _domain_value(info[d].free - k, info[d].bw)
        for d, k in taken.items()
    )
    if loss <= 0:
        return c
    w = weights(req)
    penalty = 100.0 * w["fragmentation"] * loss / (sum(w.values()) or 1.0)
    parts = {**c.parts, "domain_capacity_loss": loss}
    return ClusterPlacement(c.pods, c.score - penalty, parts, c.kind)


#: Charge (in 8-GPU boards at REF) for breaking a whole free network-ready node, scaled by
#: scarcity: ``WHOLE_NODE × (1 − whole free nodes / nodes)`` of that hardware layout.
WHOLE_NODE = 1.0


def _whole_node_adjusted(
    out: list[ClusterPlacement],
    nodes: Sequence[NodeTopology],
    states: dict[str, NodeState],
    req: Request,
) -> list[ClusterPlacement]:
    """Charge placements that break a whole free node that could be a pod of a job larger
    than a node — more when few such nodes are left. The charge is equal for every set on
    one node, so it re-ranks nodes only, never the sets within a node."""
    from .score import network_ready

    whole: dict[str, int] = {}
    layout: dict[str, int] = {}
    for t in nodes:
        st = states.get(t.name)
        if st is not None and t.gpus and network_ready(t):
            layout[t.signature] = layout.get(t.signature, 0) + 1
            if len(st.all_free_gpus) == len(t.gpus):
                whole[t.signature] = whole.get(t.signature, 0) + 1
    if not whole:
        return out
    by_name = {t.name: t for t in nodes}
    w = weights(req)
    unit = 100.0 * w["fragmentation"] / (sum(w.values()) or 1.0)
    adjusted = []
    for c in out:
        charge = 0.0
        for p in c.pods:
            t = by_name[p.node]
            n = whole.get(t.signature, 0)
            st = states.get(t.name)
            if n and st is not None and len(st.all_free_gpus) == len(t.gpus):
                scarcity = 1.0 - n / layout[t.signature]
                charge += WHOLE_NODE * len(t.gpus) / 8 * scarcity
        if charge > 0:
            parts = {**c.parts, "whole_node_loss": charge}
            c = ClusterPlacement(c.pods, c.score - unit * charge, parts, c.kind)
        adjusted.append(c)
    return adjusted


def place(
    nodes: Sequence[NodeTopology], occ: Occupancy | None, req: Request, top: int = 5
) -> list[ClusterPlacement]:
    """Ranked placements of ``req`` over ``nodes``: single-node ones, one NVLink domain when
    the job is larger than its nodes, and (beyond the largest node) equal
    pods over the NICs — all on one score, with domain capacity charged."""
    states = {t.name: NodeState(t, occ, req) for t in nodes if node_eligible(t, req)}
    out: list[ClusterPlacement] = []
    for t in nodes:
        st = states.get(t.name)
        if st is None:
            continue
        for p in node_placements(t, occ, req, top, state=st):
            out.append(
                ClusterPlacement((p,), p.score, {"busbw_gbps": p.parts["busbw_gbps"]}, "node")
            )
    max_node = max((len(t.gpus) for t in nodes), default=0)
    domains = nvlink_domains(nodes)
    for members in domains.values():
        per_node = max(len(t.gpus) for t in members)
        if req.gpus > per_node:
            cand = domain_placement(members, occ, req, states)
            if cand is not None:
                out.append(cand)
    if req.gpus > max_node:
        # Beyond a node. A job that fits in one node is placed in one node or not at all:
        # split over NICs it would run at NIC speed and hold GPUs on two nodes.
        cand = multi_node_placement(nodes, occ, req, states)
        if cand is not None:
            out.append(cand)
    out = cluster_adjusted(out, nodes, states, req)
    out.sort(key=lambda c: (-round(c.score, 9), c.pods[0].node, c.pods[0].devices))
    return out[:top]


def cluster_adjusted(
    out: list[ClusterPlacement],
    nodes: Sequence[NodeTopology],
    states: dict[str, NodeState],
    req: Request,
) -> list[ClusterPlacement]:
    """``out`` with the cluster-wide charges a node-local score cannot see: breaking a
    whole network-ready node, taking blocks out of multi-node NVLink domains."""
    out = _whole_node_adjusted(out, nodes, states, req)
    domains = nvlink_domains(nodes)
    if domains and out:
        node_domain = {t.name: d for d, members in domains.items() for t in members}
        info = {
            d: _DomainInfo(
                sum(len(states[t.name].all_free_gpus) if t.name in states else 0 for t in ms),
                min(g.nvswitch_gbps for t in ms for g in t.gpus),
            )
            for d, ms in domains.items()
        }
        out = [_domain_adjusted(c, node_domain, info, req) for c in out]
    return out
