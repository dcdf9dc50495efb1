"""Choose a placement by expected job completion time, not by score — and wait when a
better placement is expected soon enough.

A score ranks device sets; what a user waits for is wait + run, and the run follows the
placement (``scorer/slowdown.py``). For one job this module weighs:

* every node's best placement now: expected run × its stretch, plus the cost it imposes
  on the next jobs in the queue (their best completion with these devices taken, minus
  without) — the fragmentation term, in seconds of other jobs' time;
* waiting for a better one: for each node whose hardware would run the job faster, the
  time its running jobs are expected to release enough devices (their remaining time as
  known or estimated; a job ahead in the queue that fits there is served first), plus the
  run there;

and returns the placement with the least expected completion, or a wait, bounded so
nothing starves: a job never waits for a better placement past ``deadline(arrival,
expected run)`` (``WAIT_BOUND`` × its expected run time).

Everything here is a function of its arguments (and the scorer's search caches); the
bench's replay and the kube-scheduler extender's filter call the same decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from .bandwidth import nic_gbps
from .request import Occupancy, Request
from .score import NodeState, Placement, assign_nics, node_eligible, set_busbw
from .search import (
    ClusterPlacement,
    cluster_adjusted,
    domain_placement,
    multi_node_placement,
    node_placements,
    nvlink_domains,
    place,
    pod_network_gbps,
)
from .slowdown import stretch
from .topology import NodeTopology

#: A job waits for a better placement at most this multiple of its expected run time
#: (counted from its arrival): a 5× slower placement is worth up to 4 run times of waiting,
#: so one run time keeps most of the gain and bounds what a wrong estimate can cost.
WAIT_BOUND = 1.0
#: Waiting must beat placing now by this share of the expected completion (estimates are
#: rough; a marginal gain is not worth holding a job back).
WAIT_MARGIN = 0.10
#: Placements within this share of the best expected cost are equal: the score decides
#: (it carries NIC/CPU locality and what the set takes from the node's future blocks).
TIE = 0.02
#: Jobs behind this one whose cost is counted, candidates they are counted for, releases
#: per node looked ahead, jobs ahead considered: the decision's work is bounded.
LOOKAHEAD = 2
CANDIDATES = 3
RELEASES = 4
AHEAD = 8
#: A running job past its expected run time is expected to run this share of its age
#: again: run times are heavy-tailed (Philly p99/p50 ≈ 240, placement-models §3.2), so
#: the longer a job has run, the longer it is likely to run on.
TAIL_SHARE = 0.5


OccKey = tuple[frozenset[str], frozenset[str]]
"""A node's devices in use and those running memory-bound work."""


def occ_key(occ: Occupancy, t: NodeTopology) -> OccKey:
    return frozenset(occ.used(t.pool)), frozenset(occ.busy_memory(t.pool))


_EMPTY_KEY: OccKey = (frozenset(), frozenset())


@dataclass(frozen=True)
class Running:
    """A job holding devices: where, which, and when it is expected to end."""

    node: str
    devices: frozenset[str]
    expected_end: float


@dataclass(frozen=True)
class Queued:
    """A waiting job: its request and expected run time at the best placement."""

    req: Request
    expected_run: float


@dataclass(frozen=True)
class Choice:
    placement: ClusterPlacement | None
    """None: wait."""
    expected_completion: float
    """Seconds from now (wait + expected run)."""
    wait_node: str | None = None
    """The node waited for (None when placing, or when nothing fits)."""
    wait_until: float | None = None
    """When that node is expected to have the devices."""
    reason: str = ""


@dataclass
class Context:
    """What a decision may read: the cluster, what is in use, what runs, and the queue."""

    nodes: Sequence[NodeTopology]
    occ: Occupancy
    now: float
    running: Sequence[Running] = ()
    ahead: Sequence[Queued] = ()
    behind: Sequence[Queued] = ()
    future: Sequence[tuple[Queued, float]] = ()
    """Jobs still to come: a representative of each shape, with its arrival rate (/s)."""
    _by_name: dict[str, NodeTopology] = field(default_factory=dict)
    _memo: dict[tuple[object, ...], dict[str, float]] = field(default_factory=dict)
    _on: dict[str, list[Running]] | None = None
    _keys: dict[str, OccKey] = field(default_factory=dict)
    _largest: int | None = None
    _refs: dict[tuple[object, ...], tuple[float, float | None]] = field(default_factory=dict)
    _layouts: tuple[str, ...] | None = None
    _names: tuple[object, ...] | None = None

    def occ_key(self, t: NodeTopology) -> OccKey:
        """``t``'s devices in use and memory-bound in ``occ`` (computed once per decision:
        the search results cached on it carry over between decisions while ``t`` is
        unchanged, so a job starting or ending re-searches only its own nodes)."""
        hit = self._keys.get(t.name)
        if hit is None:
            hit = self._keys[t.name] = occ_key(self.occ, t)
        return hit

    def largest(self) -> int:
        """The most GPUs on one node."""
        if self._largest is None:
            self._largest = max((len(t.gpus) for t in self.nodes), default=0)
        return self._largest

    def running_on(self, name: str) -> list[Running]:
        if self._on is None:
            self._on = {}
            for r in self.running:
                self._on.setdefault(r.node, []).append(r)
        return self._on.get(name, [])

    def node(self, name: str) -> NodeTopology:
        if not self._by_name:
            self._by_name = {t.name: t for t in self.nodes}
        return self._by_name[name]


def deadline(arrival: float, expected_run: float) -> float:
    """The latest time a job may still wait for a better placement."""
    return arrival + WAIT_BOUND * expected_run


def expected_remaining(expected_run: float, age: float) -> float:
    """Expected remaining run time of a job that has run ``age`` seconds."""
    return max(expected_run - age, TAIL_SHARE * age, 1.0)


# ------------------------------------------------------------------ run-time of a placement


def placement_busbw(ctx: Context, cp: ClusterPlacement) -> float:
    """The job's collective busbw: one node's ring, one NVLink domain's crossbar, or the
    slowest pod's network path."""
    pods = cp.pods
    if len(pods) == 1:
        t = ctx.node(pods[0].node)
        return set_busbw(t, [t.gpu(v) for v in pods[0].gpus])
    gpus = [ctx.node(p.node).gpu(v) for p in pods for v in p.gpus]
    domains = {g.nvlink_domain or "" for g in gpus}
    if len(domains) == 1 and next(iter(domains)).startswith("clique:"):
        return min(g.nvswitch_gbps for g in gpus)
    return min(pod_network_gbps(ctx.node(p.node), p) for p in pods)


def pod_nic_gbps(t: NodeTopology, p: Placement) -> float | None:
    """The slowest GPU's bandwidth to the pod's own NICs (each GPU on its closest, paired
    optimally as NCCL would use them), or None for a pod without NICs."""
    if not p.nics or not p.gpus:
        return None
    gpus = [t.gpu(v) for v in p.gpus]
    nics = [n for n in t.nics if n.vid in p.nics]
    per = max(1, len(nics) // len(gpus))
    pairs = assign_nics(t, gpus, nics, per) or []
    got: dict[str, float] = {}
    for g, n in pairs:
        got[g.vid] = got.get(g.vid, 0.0) + nic_gbps(t, g, n)
    return min(got.values()) if len(got) == len(gpus) else None


def placement_nic_gbps(ctx: Context, cp: ClusterPlacement) -> float | None:
    found = [pod_nic_gbps(ctx.node(p.node), p) for p in cp.pods]
    vals = [v for v in found if v is not None]
    return min(vals) if vals else None


def memory_sharing(t: NodeTopology, occ: Occupancy, p: Placement) -> float:
    """Memory-bound GPUs beside the pod's GPUs: behind the same PCIe switch (1 each) or only
    the same root complex (½ each); the worst GPU's figure."""
    busy = occ.busy_memory(t.pool) - set(p.devices)
    if not busy:
        return 0.0
    others = [g for g in t.gpus if g.dra_device in busy]
    worst = 0.0
    for v in p.gpus:
        g = t.gpu(v)
        sw = sum(1 for o in others if o.switch == g.switch)
        root = sum(1 for o in others if o.pcie_root == g.pcie_root and o.switch != g.switch)
        worst = max(worst, sw + 0.5 * root)
    return worst


_REFERENCE: dict[tuple[tuple[str, ...], tuple[object, ...]], tuple[float, float | None]] = {}


def reference(ctx: Context, req: Request) -> tuple[float, float | None]:
    """(busbw, NIC path) of the best placement of ``req`` the cluster offers when empty:
    the yardstick a placement's stretch is measured against."""
    rk = req.key()
    hit = ctx._refs.get(rk)
    if hit is not None:
        return hit
    if ctx._layouts is None:
        ctx._layouts = tuple(sorted({t.signature for t in ctx.nodes}))
    key = (ctx._layouts, rk)
    hit = _REFERENCE.get(key)
    if hit is None:
        empty = Context(ctx.nodes, Occupancy(), 0.0)
        found = place(ctx.nodes, empty.occ, req, top=50)
        bws = [placement_busbw(empty, c) for c in found]
        nics = [n for c in found if (n := placement_nic_gbps(empty, c)) is not None]
        hit = (max(bws, default=0.0), max(nics) if nics else None)
        if len(_REFERENCE) > 10_000:
            _REFERENCE.clear()
        _REFERENCE[key] = hit
    ctx._refs[rk] = hit
    return hit


def placement_stretch(ctx: Context, req: Request, cp: ClusterPlacement, occ: Occupancy) -> float:
    """Expected run time on ``cp`` ÷ run time on the cluster's best placement for ``req``,
    with the memory-bound work in ``occ`` beside it."""
    best_bw, best_nic = reference(ctx, req)
    share = 0.0
    if req.bound == "memory" or req.pattern == "inference-decode":
        share = max(memory_sharing(ctx.node(p.node), occ, p) for p in cp.pods)
    # The bandwidths depend on the pods' devices and their nodes' layouts only.
    key = tuple((ctx.node(p.node).signature, p.gpus, p.nics) for p in cp.pods)
    bws = _BANDWIDTHS.get(key)
    if bws is None:
        if len(_BANDWIDTHS) > 100_000:
            _BANDWIDTHS.clear()
        bws = _BANDWIDTHS[key] = (placement_busbw(ctx, cp), placement_nic_gbps(ctx, cp))
    return stretch(
        req.pattern,
        req.gpus,
        bws[0],
        best_bw,
        bws[1] if req.nics_per_gpu else None,
        best_nic if req.nics_per_gpu else None,
        share,
    )


_BANDWIDTHS: dict[
    tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...], tuple[float, float | None]
] = {}


# ------------------------------------------------------------------ options

#: (layout, the node's devices in use and memory-bound, request, the cluster's reference)
#: → the request's best-scoring set on such a node (``node_placements``' first, named for
#: the node that searched it) and its stretch; None where it does not fit. Identical nodes
#: in identical states share one entry, and a node's entry stays valid until a job starts
#: or ends on it, so a decision searches only what changed since the last one.
_BEST: dict[tuple[object, ...], tuple[Placement, float] | None] = {}
_EMPTY_OCC = Occupancy()


def _best(
    ctx: Context, t: NodeTopology, req: Request, occ: Occupancy | None, key: OccKey | None
) -> tuple[Placement, float] | None:
    """``node_best`` with the placement as cached (possibly named for another node of the
    same layout in the same state)."""
    if req.node_labels and not node_eligible(t, req):
        return None
    if occ is None or occ is ctx.occ:
        occ, key = ctx.occ, ctx.occ_key(t)
    elif key is None:
        key = occ_key(occ, t)
    rk = req.key()
    ref = ctx._refs.get(rk) or reference(ctx, req)
    ck = (t.signature, key, rk, ref)
    hit = _BEST.get(ck)
    if hit is None and ck not in _BEST:
        found = node_placements(t, occ, req, 1)
        if found:
            cp = ClusterPlacement((found[0],), found[0].score)
            hit = (found[0], placement_stretch(ctx, req, cp, occ))
        if len(_BEST) > 200_000:
            _BEST.clear()
        _BEST[ck] = hit
    return hit


def node_best(
    ctx: Context,
    t: NodeTopology,
    req: Request,
    occ: Occupancy | None = None,
    key: OccKey | None = None,
) -> tuple[Placement, float] | None:
    """``req``'s best-scoring placement on ``t`` with what ``occ`` (default ``ctx.occ``;
    ``key``: its ``occ_key`` for ``t``) leaves free, and the placement's stretch; None
    where it does not fit."""
    hit = _best(ctx, t, req, occ, key)
    if hit is not None and hit[0].node != t.name:
        return replace(hit[0], node=t.name), hit[1]
    return hit


def node_stretch(
    ctx: Context,
    t: NodeTopology,
    req: Request,
    occ: Occupancy | None = None,
    key: OccKey | None = None,
) -> float | None:
    """The stretch of ``node_best``'s placement (None: ``req`` does not fit)."""
    hit = _best(ctx, t, req, occ, key)
    return hit[1] if hit is not None else None


def _per_node(found: Sequence[ClusterPlacement]) -> list[ClusterPlacement]:
    """The best placement per first node (place() ranks all of them together)."""
    seen: set[str] = set()
    out = []
    for c in found:
        if c.pods[0].node not in seen:
            seen.add(c.pods[0].node)
            out.append(c)
    return out


_STATES: dict[tuple[object, ...], NodeState] = {}


def _state(ctx: Context, t: NodeTopology, req: Request) -> NodeState:
    """``NodeState(t, ctx.occ, req)``, kept while ``t`` is unchanged: it depends on the
    node, what is in use and memory-bound there, and the request's GPU filters only."""
    key = (t.name, t.signature, ctx.occ_key(t), req.min_gpu_memory, req.key()[-1])
    hit = _STATES.get(key)
    if hit is None or hit.topo is not t:
        if len(_STATES) > 20_000:
            _STATES.clear()
        hit = _STATES[key] = NodeState(t, ctx.occ, req)
    return hit


_BEYOND: dict[tuple[object, ...], list[ClusterPlacement]] = {}


def _beyond_a_node(ctx: Context, req: Request) -> list[ClusterPlacement]:
    """``search.place(ctx.nodes, ctx.occ, req)`` for a job larger than every node (no
    single-node candidate: one per multi-node NVLink domain, one over the NICs), ranked the
    same way, on the node states kept between decisions; the answer is kept for the
    cluster's state."""
    if ctx._names is None:
        ctx._names = tuple(
            (t.name, t.signature, tuple(sorted(t.labels.items()))) for t in ctx.nodes
        )
    key = (
        ctx._names,
        tuple(ctx.occ_key(t) for t in ctx.nodes),
        req.key(),
        tuple(sorted(req.node_labels.items())),
    )
    hit = _BEYOND.get(key)
    if hit is not None:
        return hit
    states = {t.name: _state(ctx, t, req) for t in ctx.nodes if node_eligible(t, req)}
    out: list[ClusterPlacement] = []
    for members in nvlink_domains(ctx.nodes).values():
        if req.gpus > max(len(t.gpus) for t in members):
            cand = domain_placement(members, ctx.occ, req, states)
            if cand is not None:
                out.append(cand)
    cand = multi_node_placement(ctx.nodes, ctx.occ, req, states)
    if cand is not None:
        out.append(cand)
    out = cluster_adjusted(out, ctx.nodes, states, req)
    out.sort(key=lambda c: (-round(c.score, 9), c.pods[0].node, c.pods[0].devices))
    if len(_BEYOND) > 2_000:
        _BEYOND.clear()
    _BEYOND[key] = out
    return out


def options_now(ctx: Context, req: Request) -> list[tuple[float, ClusterPlacement]]:
    """(stretch, placement): the best placement per node now. A job that fits in a node
    is searched node by node (the cluster-wide whole-node and domain charges of
    ``search.place`` only re-rank nodes, which the expected completion does here); a
    larger one through ``place``."""
    if req.gpus > ctx.largest():
        found = _per_node(_beyond_a_node(ctx, req))
        return [(placement_stretch(ctx, req, c, ctx.occ), c) for c in found]
    states = {t.name: _state(ctx, t, req) for t in ctx.nodes if node_eligible(t, req)}
    out: list[ClusterPlacement] = []
    runs: list[float] = []
    for t in ctx.nodes:
        if t.name not in states:
            continue
        best = node_best(ctx, t, req)
        if best is not None:
            out.append(ClusterPlacement((best[0],), best[0].score))
            runs.append(best[1])
    # the same cluster-wide charges as search.place (they break ties between nodes; they
    # change scores only, in order)
    return list(zip(runs, cluster_adjusted(out, ctx.nodes, states, req), strict=True))


def _with(occ: Occupancy, cp: ClusterPlacement, ctx: Context, memory: bool) -> Occupancy:
    allocated = dict(occ.allocated)
    busy = dict(occ.memory_bound)
    for p in cp.pods:
        pool = ctx.node(p.node).pool
        allocated[pool] = allocated.get(pool, set()) | set(p.devices)
        if memory:
            busy[pool] = busy.get(pool, set()) | set(p.devices)
    return Occupancy(allocated, busy)


def _without(occ: Occupancy, pool: str, devices: frozenset[str]) -> Occupancy:
    allocated = dict(occ.allocated)
    allocated[pool] = occ.used(pool) - devices
    busy = dict(occ.memory_bound)
    if pool in busy:
        busy[pool] = busy[pool] - devices
    return Occupancy(allocated, busy)


def queue_cost(ctx: Context, cp: ClusterPlacement, memory: bool) -> float:
    """Seconds the next ``LOOKAHEAD`` queued jobs lose if ``cp`` is taken: each one's best
    expected run with those devices gone minus without; a job that would no longer fit
    loses the time until the soonest expected release. Only ``cp``'s nodes are searched
    again."""
    if not ctx.behind:
        return 0.0
    after = _with(ctx.occ, cp, ctx, memory)
    changed = {p.node for p in cp.pods}
    soonest = min((r.expected_end - ctx.now for r in ctx.running), default=0.0)
    total = 0.0
    for job in ctx.behind[:LOOKAHEAD]:
        if job.req.gpus > ctx.largest():
            continue  # a multi-node job's search spans the cluster: not counted here
        memo = _node_stretches(ctx, job.req)
        if not memo:
            continue
        before = job.expected_run * min(memo.values())
        per = {n: v for n, v in memo.items() if n not in changed}
        for name in changed:
            s = node_stretch(ctx, ctx.node(name), job.req, after)
            if s is not None:
                per[name] = s
        if not per:
            total += max(0.0, soonest)
        else:
            total += max(0.0, job.expected_run * min(per.values()) - before)
    return total


def _node_stretches(ctx: Context, req: Request) -> dict[str, float]:
    """Node → the stretch of ``req``'s best placement there now (nodes where it fits),
    memoized on the context (one decision)."""
    key = ("stretches", req.key())
    hit = ctx._memo.get(key)
    if hit is None:
        hit = ctx._memo[key] = {
            t.name: s for t in ctx.nodes if (s := node_stretch(ctx, t, req)) is not None
        }
    return hit


def hardware_stretch(ctx: Context, t: NodeTopology, req: Request) -> float | None:
    """The stretch of ``req``'s best placement on ``t`` when ``t`` is empty (None: never
    fits there)."""
    return node_stretch(ctx, t, req, _EMPTY_OCC, _EMPTY_KEY)


_HARDWARE: dict[tuple[object, ...], dict[str, float | None]] = {}


def _hardware(ctx: Context, req: Request) -> dict[str, float | None]:
    """Node → ``hardware_stretch``: it depends on the nodes (names, layouts, labels) and
    the request only, so it is kept across decisions."""
    if ctx._names is None:
        ctx._names = tuple(
            (t.name, t.signature, tuple(sorted(t.labels.items()))) for t in ctx.nodes
        )
    key = (ctx._names, req.key(), tuple(sorted(req.node_labels.items())))
    hit = _HARDWARE.get(key)
    if hit is None:
        if len(_HARDWARE) > 10_000:
            _HARDWARE.clear()
        hit = _HARDWARE[key] = {n.name: hardware_stretch(ctx, n, req) for n in ctx.nodes}
    return hit


def _fit_time(
    ctx: Context, t: NodeTopology, req: Request, held: tuple[frozenset[str], float] | None
) -> float:
    """When ``req`` is expected to fit on ``t`` by count (GPUs, NICs), from what runs there
    (and ``held``: devices kept until a time)."""
    memo_key = ("fit", t.name, req.gpus, req.nics_per_gpu)
    if held is None:
        hit = ctx._memo.get(memo_key)
        if hit is not None:
            return hit[""]
    gpu_devs = {g.dra_device for g in t.gpus}
    used = set(ctx.occ.used(t.pool))
    ends = [(r.expected_end, r.devices) for r in ctx.running_on(t.name)]
    if held is not None:
        used |= held[0]
        ends.append((held[1], held[0]))
    need_nics = req.gpus * req.nics_per_gpu

    def fits(u: set[str]) -> bool:
        g = len(gpu_devs - u)
        return g >= req.gpus and len(t.nics) - len(u - gpu_devs) >= need_nics

    when = ctx.now
    if not fits(used):
        for end, devs in sorted(ends, key=lambda x: x[0]):
            used -= devs
            if fits(used):
                when = max(end, ctx.now)
                break
    if held is None:
        ctx._memo[memo_key] = {"": when}
    return when


def _utilisation(ctx: Context) -> float:
    """The share of the cluster's GPUs in use (memoized on the context)."""
    hit = ctx._memo.get(("utilisation",))
    if hit is None:
        total = sum(len(n.gpus) for n in ctx.nodes) or 1
        used = sum(len(ctx.occ.used(n.pool) & {g.dra_device for g in n.gpus}) for n in ctx.nodes)
        hit = ctx._memo[("utilisation",)] = {"": used / total}
    return hit[""]


def future_cost(
    ctx: Context, req: Request, cp: ClusterPlacement, own_run: float, memory: bool
) -> float:
    """Seconds the jobs still to come lose while ``cp`` holds its devices for ``own_run``
    — the fragmentation term, in seconds. For each larger shape whose best class of
    hardware this node is: how much later the node can take such a job with ``cp`` on it
    than without (``extension``); the arrivals expected meanwhile (rate × extension), the
    share of them that find every other such node busy too (utilisation ^ those free now),
    each waiting about half of the extension or running slower on the next class, whichever
    costs less."""
    if not ctx.future or len(cp.pods) != 1:
        return 0.0
    t = ctx.node(cp.pods[0].node)
    held = (frozenset(cp.pods[0].devices), ctx.now + own_run)
    util = _utilisation(ctx)
    total = 0.0
    for q, rate in ctx.future:
        if q.req.gpus <= req.gpus:
            continue
        hw = _hardware(ctx, q.req)
        known = [v for v in hw.values() if v is not None]
        mine = hw.get(t.name)
        if mine is None or not known:
            continue
        best = min(known)
        if mine > best * (1.0 + TIE):
            continue
        extension = _fit_time(ctx, t, q.req, held) - _fit_time(ctx, t, q.req, None)
        if extension <= 0:
            continue
        fit_at = [
            _fit_time(ctx, n, q.req, None)
            for n in ctx.nodes
            if n.name != t.name and (v := hw[n.name]) is not None and v <= best * (1.0 + TIE)
        ]
        others = [x for x in fit_at if x <= ctx.now]
        rest = [v for v in known if v > best * (1.0 + TIE)]
        delay = extension / 2.0
        if fit_at and not others:
            # blocked arrivals wait at most until another node of the class frees
            delay = min(delay, min(fit_at) - ctx.now)
        if rest:
            delay = min(delay, q.expected_run * (min(rest) - best))
        total += rate * extension * delay * util ** len(others)
    return total


def _wait_options(
    ctx: Context, req: Request, expected_run: float, beat: float
) -> list[tuple[float, float, str]]:
    """(expected completion, expected start, node) of waiting for each node whose placement
    after its next releases is expected to complete sooner than ``beat`` (seconds)."""
    if req.gpus > ctx.largest():
        return []
    out = []
    for t in ctx.nodes:
        if len(t.gpus) < req.gpus or len(t.nics) < req.gpus * req.nics_per_gpu:
            continue
        releases = sorted(ctx.running_on(t.name), key=lambda r: r.expected_end)[:RELEASES]
        occ = ctx.occ
        for r in releases:
            start = max(r.expected_end, ctx.now)
            if start - ctx.now + expected_run >= beat:
                break  # no stretch is under 1: waiting for this release cannot beat ``beat``
            occ = _without(occ, t.pool, r.devices)
            key = occ_key(occ, t)
            s = node_stretch(ctx, t, req, occ, key)
            if s is None:
                continue
            # A job ahead in the queue that fits the freed devices is served first.
            free_gpus = len(t.gpus) - len([d for d in occ.used(t.pool) if d.startswith("gpu")])
            for a in ctx.ahead[:AHEAD]:
                if a.req.gpus <= free_gpus and node_stretch(ctx, t, a.req, occ, key) is not None:
                    start += a.expected_run
                    break
            done = start - ctx.now + expected_run * s
            if done < beat:
                out.append((done, start, t.name))
            break
    return sorted(out)


def decide(ctx: Context, req: Request, expected_run: float, wait_deadline: float) -> Choice:
    """The placement of ``req`` with the least expected completion (plus what it costs the
    next queued jobs), or a wait for a better node while ``ctx.now`` < ``wait_deadline``."""
    memory = req.bound == "memory"
    scored = [(expected_run * s, c) for s, c in options_now(ctx, req)]
    scored.sort(key=lambda x: x[0])
    ranked = []
    for run, c in scored[:CANDIDATES]:
        extra = queue_cost(ctx, c, memory) + future_cost(ctx, req, c, run, memory)
        ranked.append((run + extra, run, c))
    ranked += [(run, run, c) for run, c in scored[CANDIDATES:]]
    best_now = min((x[0] for x in ranked), default=None)
    can_wait = ctx.now < wait_deadline
    if best_now is None:
        return Choice(None, float("inf"), reason="no placement fits the free devices")
    if can_wait:
        waits = _wait_options(ctx, req, expected_run, best_now * (1.0 - WAIT_MARGIN))
        waits = [w for w in waits if w[1] <= wait_deadline]
        if waits:
            done, start, node = waits[0]
            return Choice(
                None,
                done,
                node,
                start,
                f"waiting for {node} (expected free in {start - ctx.now:.0f} s, completion "
                f"{done:.0f} s vs {best_now:.0f} s now)",
            )
    # Equal costs (within TIE): the best score wins.
    near = [x for x in ranked if x[0] <= best_now * (1.0 + TIE) + 1e-9]
    _, run, c = max(near, key=lambda x: (round(x[2].score, 9), -x[0]))
    return Choice(c, run, reason=f"expected run {run:.0f} s")


# ------------------------------------------------------------------ Kubernetes: the filter


def wait_filter(
    stretches: dict[str, float],
    possible: dict[str, float],
    expected_run: float,
    waited: float,
) -> dict[str, str]:
    """Nodes to keep a pod off for now, with the reason (an extender's ``FailedNodes``).

    ``stretches``: node → the run-time stretch of the pod's best placement there now (nodes
    where it fits); ``possible``: node → the stretch its hardware offers when the devices
    free (every candidate node, free or not); ``waited``: seconds since the pod was
    created. Without the remaining time of what runs on the better nodes, the wait is
    taken at its worst — the rest of the bound: a node is refused only while even waiting
    all of it for the best hardware completes sooner than running here now. Past the
    bound nothing is refused, so no pod waits longer than ``WAIT_BOUND`` × its run time."""
    bound = WAIT_BOUND * expected_run
    left = bound - waited
    if left <= 0 or not stretches or not possible:
        return {}
    best_node, best = min(possible.items(), key=lambda x: (x[1], x[0]))
    if best_node in stretches and stretches[best_node] <= best * (1.0 + TIE):
        return {}
    refused = {}
    for node, s in stretches.items():
        now = expected_run * s
        later = left + expected_run * best
        if later < now * (1.0 - WAIT_MARGIN):
            refused[node] = (
                f"waiting up to {left:.0f} s more for a faster placement: x{s:.2f} run time "
                f"here, x{best:.2f} on {best_node} (bound {bound:.0f} s = "
                f"{WAIT_BOUND:g} x expected run {expected_run:.0f} s)"
            )
    return refused


def filter_waits(
    topos: Sequence[NodeTopology],
    fits: set[str],
    occ: Occupancy,
    req: Request,
    expected_run: float,
    waited: float,
) -> dict[str, str]:
    """``wait_filter`` over node topologies: ``fits`` names the nodes where ``req`` fits
    now; every node of ``topos`` offers its hardware's best (the yardstick is the best of
    these nodes, not of the whole cluster)."""
    ctx = Context(topos, occ, 0.0)
    stretches: dict[str, float] = {}
    possible: dict[str, float] = {}
    for t in topos:
        hw = hardware_stretch(ctx, t, req)
        if hw is not None:
            possible[t.name] = hw
        if t.name in fits and (s := node_stretch(ctx, t, req)) is not None:
            stretches[t.name] = s
    return wait_filter(stretches, possible, expected_run, waited)
