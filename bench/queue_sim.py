"""Replay a job stream through a FIFO queue with bounded EASY backfill, run times stretched
by placement (``scorer/slowdown.py``), and report what users wait for.

The queue (the rule, as in EASY backfilling — Lifka 1995; Mu'alem & Feitelson 2001):

* jobs queue in arrival order; at every arrival, departure or expired wait the queue is
  scanned from the head;
* the head starts when its policy places it. When it does not (nothing fits, or the policy
  waits for a better node), it gets a reservation: the node — the one its policy waits for,
  else the node where its GPUs and NICs are expected to free first (running jobs released
  in order of their expected end) — and the time;
* up to ``BACKFILL_DEPTH`` jobs behind the head may start out of order, each only on
  other nodes than the head's reserved one or when it is expected to end before the
  reservation (a job larger than a node reserves every node);
* expected ends are what the scheduler can know: the run-time estimator's figure (hint, or
  learned from completed jobs) × the placement's stretch, and a job past it is expected to
  run ``completion.TAIL_SHARE`` of its age again.

A started job's run time is its base time × the stretch of its placement given the
memory-bound work beside it at that moment (fixed for the run: jobs that start later do not
re-time it). The metrics: JCT = end − arrival (mean, p95), wait = start − arrival, useful
utilisation = Σ base GPU-seconds / (cluster GPUs × makespan), makespan = last end − first
arrival; busbw and NIC locality of the placements as diagnostics.

``bench/placement.py`` drives this module and shares its pieces (``occupy``, ``release``,
``nic_locality``, ``scorer_decision``); this module never imports it back
(``tests/test_bench_placement.py`` checks there is no import cycle).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scorer.bandwidth import NIC_PATH_DERATE
from scorer.completion import (
    Context,
    Queued,
    Running,
    deadline,
    decide,
    expected_remaining,
    placement_busbw,
    placement_stretch,
)
from scorer.estimate import RunEstimator
from scorer.request import Occupancy, Request
from scorer.score import Placement, assign_nics
from scorer.search import ClusterPlacement
from scorer.topology import NodeTopology

#: Jobs behind the head that may be started out of order per scan.
BACKFILL_DEPTH = 16


@dataclass(frozen=True)
class SimJob:
    id: int
    arrival: float
    base: float
    """Run time on the cluster's best placement for it, seconds."""
    req: Request
    hint: float | None = None
    """What the workload states (an upper bound, as Kueue's maximum execution time is)."""


@dataclass(frozen=True)
class Decision:
    placement: ClusterPlacement | None
    wait_node: str | None = None
    """The node a waiting policy holds out for (the head's reservation)."""
    deadline: float | None = None
    """When a waiting job must be looked at again even if nothing else changes."""


@dataclass
class Started:
    job: SimJob
    cp: ClusterPlacement
    start: float
    end: float
    stretch: float
    expected_run: float
    """The estimator's run at the best placement × the stretch (what the scheduler knows)."""


@dataclass
class View:
    """What a policy sees when deciding one job."""

    nodes: Sequence[NodeTopology]
    occ: Occupancy
    now: float
    index: int
    queue: list[SimJob]
    running: list[Started]
    estimator: RunEstimator
    hints: bool

    def expected(self, job: SimJob) -> float:
        return self.estimator.expected(job.req, job.hint if self.hints else None)

    def context(self) -> Context:
        run = [
            Running(
                p.node,
                frozenset(p.devices),
                self.now + expected_remaining(s.expected_run, self.now - s.start),
            )
            for s in self.running
            for p in s.cp.pods
        ]
        ahead = [Queued(j.req, self.expected(j)) for j in self.queue[: self.index]]
        behind = [Queued(j.req, self.expected(j)) for j in self.queue[self.index + 1 :][:4]]
        future = [
            (Queued(r, self.estimator.expected(r)), rate) for r, rate in self.estimator.rates()
        ]
        return Context(self.nodes, self.occ, self.now, run, ahead, behind, future)


Policy = Callable[[SimJob, View], Decision]


def scorer_decision(job: SimJob, view: View) -> Decision:
    """The scorer's expected-completion policy: place now, or hold out for the node it
    waits on until the job's deadline (scorer/completion.py)."""
    expected = view.expected(job)
    choice = decide(view.context(), job.req, expected, deadline(job.arrival, expected))
    if choice.placement is None and choice.wait_node is not None:
        return Decision(None, choice.wait_node, deadline(job.arrival, expected))
    return Decision(choice.placement)


def occupy(
    occ: Occupancy, by_name: Mapping[str, NodeTopology], req: Request, cp: ClusterPlacement
) -> None:
    """Mark CP's devices allocated in OCC (and memory-bound when REQ is)."""
    memory = req.bound == "memory"
    for p in cp.pods:
        pool = by_name[p.node].pool
        occ.allocated.setdefault(pool, set()).update(p.devices)
        if memory:
            occ.memory_bound.setdefault(pool, set()).update(p.devices)


def release(occ: Occupancy, by_name: Mapping[str, NodeTopology], cp: ClusterPlacement) -> None:
    """Free CP's devices in OCC, memory-bound marks included (a device is marked only while
    the memory-bound job that holds it runs, so nothing else's mark is lost)."""
    for p in cp.pods:
        pool = by_name[p.node].pool
        occ.allocated.get(pool, set()).difference_update(p.devices)
        occ.memory_bound.get(pool, set()).difference_update(p.devices)


def nic_locality(t: NodeTopology, p: Placement) -> float | None:
    """Mean GPU↔NIC path of a pod's best pairing of its own NICs (as NCCL picks the closest),
    as a fraction of the PIX figure; None without NICs."""
    if not p.nics:
        return None
    gpus = [t.gpu(v) for v in p.gpus]
    nics = [n for n in t.nics if n.vid in p.nics]
    per = len(nics) // len(gpus)
    pairs = assign_nics(t, gpus, nics, per) or []
    sys_rank = NIC_PATH_DERATE["SYS"]
    ranks = [NIC_PATH_DERATE.get(t.relation(g.vid, n.vid), sys_rank) for g, n in pairs]
    return sum(ranks) / len(ranks) / NIC_PATH_DERATE["PIX"] if ranks else None


@dataclass
class Result:
    started: list[Started] = field(default_factory=list)
    decisions_ms: list[float] = field(default_factory=list)
    unplaced: int = 0


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def simulate(
    nodes: Sequence[NodeTopology],
    jobs: Sequence[SimJob],
    policy: Policy,
    hints: bool,
    backfill: int = BACKFILL_DEPTH,
) -> Result:
    by_name = {t.name: t for t in nodes}
    ctx0 = Context(nodes, Occupancy(), 0.0)
    occ = Occupancy()
    estimator = RunEstimator(use_hints=hints)
    pending = sorted(jobs, key=lambda j: (j.arrival, j.id))
    queue: list[SimJob] = []
    running: dict[int, Started] = {}
    departures: list[tuple[float, int]] = []
    timers: list[float] = []
    free_gpus = {t.name: len(t.gpus) for t in nodes}
    free_nics = {t.name: len(t.nics) for t in nodes}
    gpu_devs = {t.name: {g.dra_device for g in t.gpus} for t in nodes}
    max_node = max(len(t.gpus) for t in nodes)
    res = Result()
    reservation: tuple[frozenset[str] | None, float] | None = None
    nxt = 0

    def count(p_node: str, devices: Sequence[str], sign: int) -> None:
        g = sum(1 for d in devices if d in gpu_devs[p_node])
        free_gpus[p_node] += sign * g
        free_nics[p_node] += sign * (len(devices) - g)

    def fits_somewhere(req: Request) -> bool:
        need_nics = req.gpus * req.nics_per_gpu
        if req.gpus <= max_node:
            return any(free_gpus[n] >= req.gpus and free_nics[n] >= need_nics for n in free_gpus)
        return sum(free_gpus.values()) >= req.gpus

    def view(index: int, now: float) -> View:
        return View(nodes, occ, now, index, queue, list(running.values()), estimator, hints)

    def start(job: SimJob, cp: ClusterPlacement, now: float) -> None:
        s = placement_stretch(ctx0, job.req, cp, occ)
        occupy(occ, by_name, job.req, cp)
        for p in cp.pods:
            count(p.node, p.devices, -1)
        expected = estimator.expected(job.req, job.hint if hints else None) * s
        st = Started(job, cp, now, now + job.base * s, s, expected)
        running[job.id] = st
        res.started.append(st)
        heapq.heappush(departures, (st.end, job.id))

    def expected_ends(now: float) -> list[tuple[float, Started]]:
        ends = [
            (now + expected_remaining(s.expected_run, now - s.start), s) for s in running.values()
        ]
        return sorted(ends, key=lambda x: (x[0], x[1].job.id))

    def reserve(job: SimJob, d: Decision, now: float) -> tuple[frozenset[str] | None, float]:
        req = job.req
        if d.wait_node is not None:
            return frozenset({d.wait_node}), d.deadline or now
        ends = expected_ends(now)
        if req.gpus > max_node:
            free = sum(free_gpus.values())
            for t_end, s in ends:
                free += s.job.req.gpus
                if free >= req.gpus:
                    return None, t_end
            return None, math.inf
        best: tuple[float, str] | None = None
        for t in nodes:
            need_n = req.gpus * req.nics_per_gpu
            if len(t.gpus) < req.gpus or len(t.nics) < need_n:
                continue
            g, n = free_gpus[t.name], free_nics[t.name]
            when = now if g >= req.gpus and n >= need_n else math.inf
            for t_end, s in ends:
                if when < math.inf:
                    break
                for p in s.cp.pods:
                    if p.node == t.name:
                        k = sum(1 for x in p.devices if x in gpu_devs[t.name])
                        g, n = g + k, n + len(p.devices) - k
                if g >= req.gpus and n >= need_n:
                    when = t_end
            if best is None or when < best[0]:
                best = (when, t.name)
        if best is None:
            return None, math.inf
        return frozenset({best[1]}), best[0]

    def decide(job: SimJob, index: int, now: float) -> Decision:
        t0 = time.perf_counter()
        d = policy(job, view(index, now))
        res.decisions_ms.append((time.perf_counter() - t0) * 1000.0)
        if d.placement is None and d.deadline is not None and d.deadline > now:
            heapq.heappush(timers, d.deadline)
        return d

    def scan(now: float, only: set[int] | None) -> None:
        nonlocal reservation
        idx, tried = 0, 0
        if only is not None and reservation is not None and queue and queue[0].id not in only:
            idx = 1
            tried = 0
        else:
            reservation = None
        while idx < len(queue):
            job = queue[idx]
            if reservation is None:
                d = decide(job, idx, now) if fits_somewhere(job.req) else Decision(None)
                if d.placement is not None:
                    start(job, d.placement, now)
                    queue.pop(idx)
                    continue
                reservation = reserve(job, d, now)
                idx += 1
                continue
            if tried >= backfill:
                break
            tried += 1
            if (only is not None and job.id not in only) or not fits_somewhere(job.req):
                idx += 1
                continue
            d = decide(job, idx, now)
            cp = d.placement
            if cp is not None:
                nodes_res, t_res = reservation
                est = estimator.expected(job.req, job.hint if hints else None)
                touches = nodes_res is None or any(p.node in nodes_res for p in cp.pods)
                if not touches or now + est * placement_stretch(ctx0, job.req, cp, occ) <= t_res:
                    start(job, cp, now)
                    queue.pop(idx)
                    continue
            idx += 1

    while nxt < len(pending) or departures or queue:
        t_arr = pending[nxt].arrival if nxt < len(pending) else math.inf
        t_dep = departures[0][0] if departures else math.inf
        t_tim = timers[0] if timers else math.inf
        now = min(t_arr, t_dep, t_tim)
        if now == math.inf:
            res.unplaced = len(queue)
            break
        changed = False
        while departures and departures[0][0] <= now:
            _, jid = heapq.heappop(departures)
            s = running.pop(jid)
            estimator.observe(s.job.req, s.job.base)
            release(occ, by_name, s.cp)
            for p in s.cp.pods:
                count(p.node, p.devices, +1)
            changed = True
        while timers and timers[0] <= now:
            heapq.heappop(timers)
            changed = True
        new: set[int] = set()
        while nxt < len(pending) and pending[nxt].arrival <= now:
            queue.append(pending[nxt])
            new.add(pending[nxt].id)
            estimator.arrived(pending[nxt].req, pending[nxt].arrival)
            nxt += 1
        scan(now, None if changed else new)
    return res


def metrics(res: Result, nodes: Sequence[NodeTopology]) -> dict[str, Any]:
    by_name = {t.name: t for t in nodes}
    total = sum(len(t.gpus) for t in nodes)
    s = res.started
    jct = [x.end - x.job.arrival for x in s]
    wait = [x.start - x.job.arrival for x in s]
    first = min((x.job.arrival for x in s), default=0.0)
    makespan = max((x.end for x in s), default=0.0) - first
    useful = sum(x.job.base * x.job.req.gpus for x in s)
    ctx = Context(nodes, Occupancy(), 0.0)
    bws = [placement_busbw(ctx, x.cp) for x in s if x.job.req.gpus > 1]
    locs = [
        loc for x in s for p in x.cp.pods if (loc := nic_locality(by_name[p.node], p)) is not None
    ]
    return {
        "jobs": len(s),
        "mean_jct_s": round(sum(jct) / len(jct), 1) if jct else 0.0,
        "p95_jct_s": round(_pct(jct, 0.95), 1),
        "mean_wait_s": round(sum(wait) / len(wait), 1) if wait else 0.0,
        "useful_utilisation": round(useful / (total * makespan), 4) if makespan else 0.0,
        "makespan_h": round(makespan / 3600.0, 2),
        "mean_stretch": round(sum(x.stretch for x in s) / len(s), 3) if s else 0.0,
        "mean_busbw_gbps": round(sum(bws) / len(bws), 1) if bws else 0.0,
        "nic_locality": round(sum(locs) / len(locs), 4) if locs else 1.0,
        "p99_decision_ms": round(_pct(res.decisions_ms, 0.99), 3),
        "unplaced": res.unplaced,
    }
