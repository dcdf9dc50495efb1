#!/usr/bin/env python3
"""Why each claim kind costs the scheduler what it costs: the upstream allocator's work on
one node, counted (issue #22).

kube-scheduler's DynamicResources Filter runs the structured allocator
(k8s.io/dynamic-resource-allocation/structured, the v1.36 search) once per node and pod:
requests in claim order, a ``firstAvailable`` request's sub-requests in order, and for
each device wanted a loop over every device of the node's pool in slice order — skip it
if in use, else check the DeviceClass's and the request's CEL selectors (the result is
cached per (sub-)request and device, within that one node's run), then add it to every
constraint (matchAttribute), and recurse; on a dead end, back off and try the next
device. This script repeats that search move for move and counts:

  cel     CEL selector evaluations (each converts the device's attributes and runs the
          program; the part that grows with sub-requests x devices)
  tries   devices offered to the constraints (the backtracking)

per claim kind, on a free dgx-h100 and pcie-8gpu node and on nodes with 1 or 2 GPUs
free, for the claims this tree writes and the frozen ones from
bench/data/cluster_scale_old_claims.json (``-``: the kind's pod node affinity refuses the
node, so DynamicResources never runs there). A second table puts that per pod on an N-node
cluster (half dgx-h100, half pcie-8gpu) as kube-scheduler spends it: nodes are filtered
until its default adaptive percentageOfNodesToScore found enough feasible ones (420 of
1,000; all of them when fewer fit), so a kind that fits half the nodes filters twice as
many; a node the pod's node affinity refuses (the labels NFD gives it,
bench/cluster_scale.node_labels) fails NodeAffinity, which runs first, and costs the
allocator nothing; empty, and at bench/cluster_scale.py's 90 % fill mix. It needs no cluster;
bench/cluster_scale.py measures the same kinds on the real scheduler, and
docs/performance.md puts the two side by side.

``--cpu-group-at K`` models a different device order: each NUMA node's CPU group moved to
position K among that node's devices (0: first; toposlice puts it behind the node's GPUs and
their NICs), to weigh what a CPU-aligned claim would gain against what every GPU request
passing it would pay.

Usage: python3 bench/allocator_cost.py [--claims old|new|both] [--kinds a,b] [--nodes N]
  [--extra FILE] [--cpu-group-at K]
"""

from __future__ import annotations

import sys
from pathlib import Path

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.cluster_scale import (  # noqa: E402
    DRIVER,
    FILL_MIX,
    MACHINES,
    example_affinities,
    gpu_names,
    gpus_of,
    new_claims,
    node_labels,
    node_slices,
    old_affinities,
    old_claims,
    plain_spec,
)
from normalize.attributes import NUMA_NODE  # noqa: E402
from normalize.deviceclasses import device_classes  # noqa: E402
from normalize.node_feature import admits  # noqa: E402
from scorer.cel import device_env, evaluate  # noqa: E402

#: Give up counting past this many tries (the real search would go on: reported as ">").
MAX_TRIES = 2_000_000


@dataclass
class Cost:
    cel: int = 0
    tries: int = 0
    calls: int = 0
    """allocateOne invocations: upstream's own measure of the search's work."""
    scans: int = 0
    """Devices looked at (in use, selectable): the loop that runs inside each call."""
    ok: bool = False
    capped: bool = False


class _Cap(Exception):
    pass


def search_cost(
    spec: Mapping[str, Any],
    slices: Sequence[Mapping[str, Any]],
    in_use: set[str],
    classes: Mapping[str, Mapping[str, Any]],
    shared_cache: bool = False,
    max_tries: int = MAX_TRIES,
) -> Cost:
    """The upstream search on one node's pool, counted. ``shared_cache``: CEL results
    cached per selector list and device instead of per (sub-)request and device (not what
    v1.36 does: what sub-requests with the same class and selectors would cost if they
    shared their results). Within one request the search walks combinations, not
    permutations: the next device of the same request is looked for after the last one
    taken (upstream's ``startLocation``); every new request starts at the first device.
    ``max_tries``: give up past this many allocateOne calls or constraint tries."""
    devs = [d for s in slices for d in s["spec"]["devices"]]
    # Each device under its own slice's driver: a vendor's GPUs beside toposlice's NICs.
    envs = [
        device_env(d, s["spec"].get("driver") or DRIVER)
        for s in slices
        for d in s["spec"]["devices"]
    ]
    attrs = [e.attributes for e in envs]
    reqs = []  # per request: list of (result name, class selectors, selectors, mode, count)
    for r in spec["devices"]["requests"]:
        alts = r.get("firstAvailable") or [dict(r["exactly"], name="")]
        out = []
        for a in alts:
            cls = classes[a["deviceClassName"]]
            csel = [x["cel"]["expression"] for x in cls["spec"].get("selectors") or []]
            sel = [x["cel"]["expression"] for x in a.get("selectors") or []]
            name = f"{r['name']}/{a['name']}" if a.get("name") else r["name"]
            out.append((name, csel, sel, a.get("allocationMode", "ExactCount"), a.get("count", 1)))
        reqs.append(out)
    cons = []
    for c in spec["devices"].get("constraints") or []:
        refs = set(c.get("requests") or [r["name"] for r in spec["devices"]["requests"]])
        distinct = "distinctAttribute" in c
        cons.append((refs, c["distinctAttribute"] if distinct else c["matchAttribute"], distinct))
    cost = Cost()
    cache: dict[tuple[Any, ...], bool] = {}
    used = set(in_use)
    members: list[list[Any]] = [[] for _ in cons]  # per constraint: values of added devices

    def selectable(ri: int, si: int, di: int) -> bool:
        _, csel, sel, _, _ = reqs[ri][si]
        key: tuple[Any, ...] = (ri, si, di)
        if shared_cache:
            key = (tuple(csel), tuple(sel), di)
        if key not in cache:
            ok = True
            for e in csel + sel:  # class selectors first, then the request's; stop at false
                cost.cel += 1
                if not evaluate(e, envs[di]):
                    ok = False
                    break
            cache[key] = ok
        return cache[key]

    def add(name: str, di: int) -> bool:
        cost.tries += 1
        if cost.tries > max_tries:
            raise _Cap
        base = name.split("/", 1)[0]
        done: list[int] = []
        for ci, (refs, attr, distinct) in enumerate(cons):
            if name not in refs and base not in refs:
                continue
            val = attrs[di].get(attr)
            clash = val in members[ci] if distinct else bool(members[ci]) and members[ci][0] != val
            if val is None or clash:
                for cj in done:
                    members[cj].pop()
                return False
            members[ci].append(val)
            done.append(ci)
        removals.append(done)
        return True

    removals: list[list[int]] = []

    def remove() -> None:
        for ci in removals.pop():
            members[ci].pop()

    def one(ri: int, si: int, k: int, start: int = 0) -> bool:
        cost.calls += 1
        if cost.calls > max_tries:
            raise _Cap
        if ri == len(reqs):
            return True
        name, _, _, mode, count = reqs[ri][si]
        if mode == "All":
            picked = every[(ri, si)]
            if not picked or any(devs[di]["name"] in used for di in picked):
                return False
            n = 0
            for di in picked:
                if not add(name, di):
                    break
                used.add(devs[di]["name"])
                n += 1
            if n == len(picked) and request(ri + 1):
                return True
            for di in picked[:n]:
                used.discard(devs[di]["name"])
                remove()
            return False
        if k == count:
            return request(ri + 1)
        for di in range(start, len(devs)):
            d = devs[di]
            cost.scans += 1
            if d["name"] in used or not selectable(ri, si, di):
                continue
            if not add(name, di):
                continue
            used.add(d["name"])
            if one(ri, si, k + 1, di + 1):
                return True
            used.discard(d["name"])
            remove()
        return False

    def request(ri: int) -> bool:
        cost.calls += 1
        if ri == len(reqs):
            return True
        return any(one(ri, si, 0) for si in range(len(reqs[ri])))

    # Before the search, upstream validates every request: an `All` request or sub-request
    # has its selectors run on every device of the node, in use or not, and keeps the
    # matches; then the cache is dropped.
    every: dict[tuple[int, int], list[int]] = {}
    for ri, alts in enumerate(reqs):
        for si, alt in enumerate(alts):
            if alt[3] == "All":
                every[(ri, si)] = [di for di in range(len(devs)) if selectable(ri, si, di)]
    cache.clear()
    try:
        cost.ok = request(0)
    except _Cap:
        cost.capped = True
    return cost


Scenario = tuple[str, list[dict[str, Any]], set[str], dict[str, str]]


def _numa(device: Mapping[str, Any]) -> Any:
    return device["attributes"].get(NUMA_NODE, {}).get("int")


def machine_slices(cpu_group_at: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """Each machine's slices as toposlice publishes them, or with every NUMA node's CPU
    group moved to position ``cpu_group_at`` among that node's devices (a device order
    toposlice does not publish: for --cpu-group-at)."""
    slices = node_slices([(m, m) for m in MACHINES])
    if cpu_group_at is None:
        return slices
    for sl in slices.values():
        for s in sl:
            out: list[dict[str, Any]] = []
            # Each run of one NUMA node's devices, its CPU group moved to cpu_group_at.
            for _, run in groupby(s["spec"]["devices"], key=_numa):
                cpus, rest = [], []
                for d in run:
                    is_cpu = d["attributes"].get("type", {}).get("string") == "cpu"
                    (cpus if is_cpu else rest).append(d)
                out += rest[:cpu_group_at] + cpus + rest[cpu_group_at:]
            s["spec"]["devices"] = out
    return slices


def scenarios(cpu_group_at: int | None = None) -> list[Scenario]:
    """(label, slices, devices in use, node labels): each machine free, then with 2 and 1
    GPUs free (the 90 %-full cluster's partly free nodes), the free ones drawn at random."""
    slices = machine_slices(cpu_group_at)
    rng = random.Random(22)
    out: list[Scenario] = []
    for m in MACHINES:
        gpus = gpu_names(slices[m])
        labels = node_labels(m, m)
        out.append((f"{m} free", slices[m], set(), labels))
        for free in (2, 1):
            busy = set(rng.sample(gpus, len(gpus) - free))
            out.append((f"{m} {free} free", slices[m], busy, labels))
    return out


@dataclass
class PodCost:
    """One pod's allocator work over the cluster, as kube-scheduler spends it."""

    evaluations: float  # CEL evaluations summed over the nodes DynamicResources filters
    nodes: float  # nodes DynamicResources filters (not those NodeAffinity refused first)
    feasible: float  # share of nodes that can take the pod


def nodes_to_find(n: int) -> int:
    """kube-scheduler's default percentageOfNodesToScore (adaptive): it stops filtering
    once this many nodes passed (all nodes below 100)."""
    if n < 100:
        return n
    pct = max(5, 50 - n // 125)
    return max(100, n * pct // 100)


NodeState = tuple[float, list[dict[str, Any]], set[str], dict[str, str]]


def node_states(
    fill_pct: int, samples: int = 4, cpu_group_at: int | None = None
) -> list[NodeState]:
    """(share of the cluster's nodes, slices, devices in use, node labels) for
    bench/cluster_scale.py's fill: each machine half the nodes, busy GPUs per FILL_MIX at
    90 % (drawn at random, ``samples`` draws per state), none at 0 %."""
    slices = machine_slices(cpu_group_at)
    rng = random.Random(22)
    out: list[NodeState] = []
    for m in MACHINES:
        gpus = gpu_names(slices[m])
        labels = node_labels(m, m)
        if fill_pct == 0:
            out.append((1 / len(MACHINES), slices[m], set(), labels))
            continue
        for busy, share in FILL_MIX:
            busy = min(len(gpus), round(busy * fill_pct / 90))
            draws = 1 if busy in (0, len(gpus)) else samples
            for _ in range(draws):
                w = share / len(MACHINES) / draws
                out.append((w, slices[m], set(rng.sample(gpus, busy)), labels))
    return out


def pod_cost(
    spec: Mapping[str, Any],
    states: Sequence[NodeState],
    classes: Mapping[str, Mapping[str, Any]],
    n: int = 1000,
    affinity: Mapping[str, Any] | None = None,
    shared_cache: bool = False,
) -> PodCost:
    """Expected CEL evaluations per pod on an N-node cluster of ``states``: the scheduler
    filters nodes until nodes_to_find(N) passed every filter (or all N), so a kind that
    fits fewer nodes filters more of them; of those, the ones the pod's ``affinity``
    refuses stop at NodeAffinity and never reach DynamicResources."""
    cel = feasible = reached = 0.0
    for w, sl, busy, labels in states:
        if not admits(affinity, labels):
            continue
        c = search_cost(spec, sl, busy, classes, shared_cache)
        reached += w
        cel += w * c.cel
        feasible += w * (1.0 if c.ok else 0.0)
    want = nodes_to_find(n)
    visited = float(n) if feasible * n <= want else want / feasible
    return PodCost(evaluations=cel * visited, nodes=reached * visited, feasible=feasible)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--claims", choices=["old", "new", "both"], default="both")
    ap.add_argument("--kinds", default=None)
    ap.add_argument("--nodes", type=int, default=1000, help="cluster size of the per-pod model")
    ap.add_argument(
        "--extra", default=None, metavar="FILE", help="more kinds: JSON {name: claim spec}"
    )
    ap.add_argument(
        "--cpu-group-at",
        type=int,
        default=None,
        metavar="K",
        help="model each NUMA node's CPU group at position K of its node's devices",
    )
    ap.add_argument(
        "--shared-cache",
        action="store_true",
        help="model an allocator that caches CEL results per selector list and device, so "
        "rungs with the same class and selectors share them (v1.36 caches per sub-request)",
    )
    args = ap.parse_args(argv)
    shared = args.shared_cache
    classes = {c["metadata"]["name"]: c for c in device_classes(DRIVER)}
    sets = []
    affinities: dict[str, dict[str, dict[str, Any]]] = {
        "old": old_affinities(),
        "new": example_affinities(),
    }
    if args.claims in ("old", "both"):
        sets.append(("old", old_claims()))
    if args.claims in ("new", "both"):
        sets.append(("new", new_claims()))
    if args.extra:
        sets.append(("extra", json.loads(Path(args.extra).read_text())))

    def size(k: str) -> int:
        return gpus_of(next(s[k] for _, s in sets if k in s))

    kinds = sorted({k for _, s in sets for k in s}, key=lambda k: (size(k), k))
    if args.kinds:
        extra = dict(sets).get("extra", {})
        kinds = [k for k in kinds if k in args.kinds.split(",") or k in extra]
    scen = scenarios(args.cpu_group_at)
    print(
        "cel evaluations / constraint tries per node (x = cannot allocate; > = over the cap; "
        "- = the pod's node affinity refuses the node)"
    )
    print(f"{'claim':<48} {'set':<5} " + " ".join(f"{s[0]:>18}" for s in scen))
    for g in sorted({size(k) for k in kinds}):
        rows = [(f"plain {g}", "plain", plain_spec(g))]
        rows += [
            (k, label, s[k]) for k in kinds for label, s in sets if k in s and gpus_of(s[k]) == g
        ]
        for name, label, spec in rows:
            cells = []
            affinity = affinities.get(label, {}).get(name)
            for _, sl, busy, labels in scen:
                if not admits(affinity, labels):
                    cells.append("-")
                    continue
                c = search_cost(spec, sl, busy, classes, shared)
                mark = ">" if c.capped else ("" if c.ok else "x")
                cells.append(f"{mark}{c.cel}/{c.tries}")
            print(f"{name:<48} {label:<5} " + " ".join(f"{x:>18}" for x in cells))
    print()
    print(
        f"per pod on {args.nodes} nodes: CEL evaluations summed over the nodes the scheduler "
        "filters (x plain of as many GPUs), nodes DynamicResources filters (not those the "
        "pod's node affinity refused first), share of nodes that fit"
    )
    fills = (0, 90)
    print(f"{'claim':<48} {'set':<5} " + " ".join(f"{f'fill {f}%':>30}" for f in fills))
    states = {f: node_states(f, cpu_group_at=args.cpu_group_at) for f in fills}
    for g in sorted({size(k) for k in kinds}):
        rows = [(f"plain {g}", "plain", plain_spec(g))]
        rows += [
            (k, label, s[k]) for k in kinds for label, s in sets if k in s and gpus_of(s[k]) == g
        ]
        base = {
            f: pod_cost(rows[0][2], states[f], classes, args.nodes, None, shared) for f in fills
        }
        for name, label, spec in rows:
            cells = []
            affinity = affinities.get(label, {}).get(name)
            for f in fills:
                pc = pod_cost(spec, states[f], classes, args.nodes, affinity, shared)
                ratio = pc.evaluations / base[f].evaluations if base[f].evaluations else 0.0
                cells.append(
                    f"{pc.evaluations:7.0f} ({ratio:4.1f}) {pc.nodes:5.0f} {pc.feasible:5.0%}"
                )
            print(f"{name:<48} {label:<5} " + " ".join(f"{x:>30}" for x in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
