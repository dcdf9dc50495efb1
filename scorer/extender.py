"""kube-scheduler extender: ``filter`` and ``prioritize`` over nodes' topology graphs.

Wire format (k8s.io/kube-scheduler ``extender/v1``): kube-scheduler POSTs ExtenderArgs to
``<urlPrefix>/<filterVerb>`` and ``<urlPrefix>/<prioritizeVerb>``. Those Go types carry no
JSON tags, so the real scheduler sends Go's field names, capitalised:
``{"Pod": Pod, "Nodes": NodeList, "NodeNames": null}`` (``"Nodes": null, "NodeNames": [...]``
when the extender is ``nodeCacheCapable``). Keys are matched as Go's decoder matches them
(exact first, then without regard to case), so lowercase senders work too. The answers use
the same Go field names: ExtenderFilterResult ``{"Nodes", "NodeNames", "FailedNodes",
"FailedAndUnresolvableNodes", "Error"}`` and HostPriorityList ``[{"Host": name, "Score":
0..10}]`` (MaxExtenderPriority = 10). The Pod and NodeList inside are ordinary API objects
(lowercase keys).

The pod's workload comes from its ``toposlice.dev/workload`` annotation (a request document,
as for ``toposlice score``); missing fields — the GPU and NIC counts — are read from the pod's
ResourceClaims (or their templates). An extender ranks whole nodes; the claim the scorer
emits (``toposlice score --emit-claim``) carries the choice down to devices.

No call does network I/O: nodes' labels, claims, templates and occupancy come from the
informers' cache and graphs from the background fetches (scorer/cluster_cache.py,
scorer/graph_source.py). A node's best placement for a request shape is cached per node
and shared by nodes of the same hardware in the same occupancy; a claim allocated or
released on a node replaces that node's :class:`~scorer.cluster_cache.PoolUse`, which is
what invalidates its entries. The HTTP side is scorer/extender_server.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import yaml

from .cluster_cache import ClusterCache, PoolUse
from .completion import filter_waits
from .estimate import kueue_hint
from .request import PROFILE_ANNOTATION, Occupancy, Request, request_from_dict
from .search import node_placements
from .topology import NodeTopology

log = logging.getLogger(__name__)

MAX_EXTENDER_PRIORITY = 10
#: Shared (hardware, occupancy, request) results kept before the table is cleared.
SHARED_CACHE_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class Verdict:
    """One node for one request: its best placement's score (0..100), or -1 and why not."""

    score: float
    reason: str = ""
    fits: bool = field(init=False)
    priority: int = field(init=False)
    """The HostPriority score, 0..MAX_EXTENDER_PRIORITY (computed once: read per node
    per call)."""

    def __post_init__(self) -> None:
        fits = self.score >= 0
        prio = round(max(0.0, min(100.0, self.score)) / 10.0) if fits else 0
        object.__setattr__(self, "fits", fits)
        object.__setattr__(self, "priority", int(min(MAX_EXTENDER_PRIORITY, prio)))


class _Shape:
    """The verdicts of every node for one request shape, valid up to change ``seq`` of
    the cluster cache's change log."""

    __slots__ = ("key", "seq", "too_few", "unsearched", "verdicts")

    def __init__(self, seq: int, req: Request) -> None:
        self.seq = seq
        self.verdicts: dict[str, Verdict] = {}
        self.key = req.key()
        # The two answers of the bound (Extender._bound), made once per shape.
        self.too_few = Verdict(-1.0, f"no {req.gpus}-GPU placement fits the free devices")
        self.unsearched = Verdict(0.0)


#: Request shapes whose verdicts are kept (least recently used dropped first).
SHAPES_KEPT = 256
#: Seconds of node searches one call may spend; the nodes still unsearched then are answered
#: from a bound (:meth:`Extender._bound`) and searched by the next calls of their shape.
#: What keeps the first call of a new request shape (every distinct node state unknown:
#: ~1,400 searches, 1-2 s at N=1000) far inside the scheduler's ``httpTimeout``.
SEARCH_BUDGET_S = 0.015
#: Searches a call may run whatever they cost (a node's first search also fills that
#: hardware's own caches), so a call with a few candidates is always fully ranked.
MIN_SEARCHES = 4
#: Longest a call waits for the informers' first LIST (the scorer just started) before it
#: answers with an error, which an ``ignorable`` extender's scheduler goes on without.
SYNC_WAIT_S = 2.0
#: Longest a call waits for a claim or template the pod names to reach the informers'
#: cache (the scheduler's own informer can be a few milliseconds ahead of ours).
CLAIM_LAG_S = 1.0
CLAIM_LAG_POLL_S = 0.01


class WouldWait(Exception):
    """A ``quick`` call (answered on the server's event loop, without a thread handoff)
    would have to wait for the caches or search a node: run it in a worker instead."""


class NotReady(RuntimeError):
    """The caches cannot answer for this pod yet; filter says so in ExtenderFilterResult's
    Error instead of passing every node as if the pod asked for nothing."""


@lru_cache(maxsize=4096)
def _profile(annotation: str) -> dict[str, Any]:
    try:
        if annotation.lstrip().startswith("{"):
            data = json.loads(annotation)
        else:
            data = yaml.safe_load(annotation)
    except (ValueError, yaml.YAMLError) as exc:
        raise ValueError(f"annotation {PROFILE_ANNOTATION}: not JSON/YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"annotation {PROFILE_ANNOTATION}: not a mapping")
    return dict(data)


@lru_cache(maxsize=4096)
def _request(annotation: str | None, gpus: int, nics: int) -> Request | None:
    """The workload of every pod with this annotation and these claim counts (pods of
    one job share it, so it is parsed once)."""
    return _build_request(annotation, gpus, nics, "workload")


def _build_request(annotation: str | None, gpus: int, nics: int, where: str) -> Request | None:
    profile = dict(_profile(annotation)) if annotation else {}
    if "gpus" not in profile:
        if gpus == 0:
            return None
        profile["gpus"] = gpus
    if "nicsPerGpu" not in profile and gpus:
        profile["nicsPerGpu"] = nics // gpus
    return request_from_dict(profile, where)


class Extender:
    """filter and prioritize over a :class:`ClusterCache` (informers + graphs)."""

    def __init__(self, cluster: ClusterCache) -> None:
        self.cluster = cluster
        self.driver = cluster.driver
        self._shapes: OrderedDict[Any, _Shape] = OrderedDict()
        self._pool_nodes: dict[str, set[str]] = {}
        self._shared: dict[tuple[Any, ...], Verdict] = {}
        self._json = _Encoded()
        self.searches = 0
        """Node searches run (cache misses); the bench reads it."""
        self.bounded = 0
        """Verdicts answered from the bound because a call's search budget was spent."""

    # -- the pod's workload --------------------------------------------------------------

    def workload(self, pod: dict[str, Any], quick: bool = False) -> Request | None:
        """The pod's request, or None when it asks for no GPUs of this driver. ``quick``:
        raise :class:`WouldWait` rather than wait for the informers."""
        meta = pod.get("metadata") or {}
        ns = str(meta.get("namespace") or "default")
        ann = (meta.get("annotations") or {}).get(PROFILE_ANNOTATION)
        ok, why = self.cluster.synced() if quick else self.cluster.wait_synced(SYNC_WAIT_S)
        if quick and not ok:
            raise WouldWait(why)
        if not ok:
            raise NotReady(f"toposlice scorer not ready: {why}")
        counts = self._from_claims(pod, ns)
        if quick and isinstance(counts, str):
            raise WouldWait(counts)
        deadline = time.monotonic() + CLAIM_LAG_S
        while isinstance(counts, str) and time.monotonic() < deadline:
            time.sleep(CLAIM_LAG_POLL_S)
            counts = self._from_claims(pod, ns)
        if isinstance(counts, str):
            raise NotReady(f"pod {ns}/{meta.get('name')}: {counts} not in the scorer's cache")
        gpus, nics = counts
        try:
            return _request(ann or None, gpus, nics)
        except ValueError:  # again, uncached, for an error that names the pod
            return _build_request(ann or None, gpus, nics, f"pod {ns}/{meta.get('name')}")

    def _from_claims(self, pod: dict[str, Any], ns: str) -> tuple[int, int] | str:
        """(GPUs, NICs) of the pod's claims, or the first claim the cache lacks."""
        spec = pod.get("spec") or {}
        generated = {
            s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        gpus = nics = 0
        for ref in spec.get("resourceClaims") or []:
            counts: tuple[int, int] | None = None
            claim_name = ref.get("resourceClaimName") or generated.get(ref.get("name"))
            if claim_name:
                claim = self.cluster.claim(ns, claim_name)
                counts = (claim.gpus, claim.nics) if claim is not None else None
            if counts is None and ref.get("resourceClaimTemplateName"):
                counts = self.cluster.template(ns, ref["resourceClaimTemplateName"])
            if counts is None:
                missing = claim_name or ref.get("resourceClaimTemplateName")
                if missing:
                    return f"ResourceClaim{'' if claim_name else 'Template'} {ns}/{missing}"
                continue
            gpus, nics = gpus + counts[0], nics + counts[1]
        return gpus, nics

    # -- decisions -----------------------------------------------------------------------

    def shape(self, req: Request) -> _Shape:
        """The verdict table of ``req``'s shape, brought up to date with the cluster
        cache's change log (an allocation, a release, a new graph: only those nodes'
        entries are dropped and searched again when next asked)."""
        key = req.key()
        # Never out of the table while it is brought up to date: a call of the same shape
        # in another thread (a worker and the event loop) must not start a fresh one.
        view = self._shapes.get(key)
        base, log = self.cluster.change_base, self.cluster.changes
        n = len(log)
        if view is None or view.seq < base:
            view = self._shapes[key] = _Shape(base + n, req)
        else:
            for kind, name in log[view.seq - base : n]:
                if kind == "pool":
                    for node in tuple(self._pool_nodes.get(name, ())):
                        view.verdicts.pop(node, None)
                else:
                    view.verdicts.pop(name, None)
            view.seq = base + n
        self._shapes.move_to_end(key)  # least recently used first
        if len(self._shapes) > SHAPES_KEPT:
            self._shapes.popitem(last=False)
        return view

    def verdict(
        self,
        node: str,
        labels: dict[str, str] | None,
        req: Request,
        view: _Shape | None = None,
        budget: _Budget | None = None,
    ) -> Verdict:
        """How well ``req`` fits ``node`` now. ``labels``: the node's labels as the
        scheduler sent them (None: the Node informer's); ``view``: :meth:`shape` of
        ``req`` (fetched when not given); ``budget``: the call's search time left (spent:
        the answer is the bound, not cached)."""
        if req.node_labels:
            if labels is None:
                info = self.cluster.node(node)
                labels = info.labels if info is not None else {}
            if not all(labels.get(k) == v for k, v in req.node_labels.items()):
                return Verdict(-1.0, "node labels do not meet the workload's constraints")
        view = view or self.shape(req)
        found = view.verdicts.get(node)
        if found is not None:
            return found
        topo = self.cluster.graphs.topology(node)
        if topo is None:  # not cached: the graph may arrive any moment
            return Verdict(-1.0, self.cluster.graphs.why_missing(node))
        use = self.cluster.pool_use(topo.pool)
        shared = (topo.signature, use, view.key)
        found = self._shared.get(shared)
        if found is None:
            if budget is not None and budget.quick:
                raise WouldWait(node)
            if budget is not None and budget.left <= 0 and budget.searches >= MIN_SEARCHES:
                self.bounded += 1
                return self._bound(topo, use, req, view)
            t0 = time.perf_counter()
            found = self._search(topo, use, req)
            if budget is not None:
                budget.left -= time.perf_counter() - t0
                budget.searches += 1
            if len(self._shared) >= SHARED_CACHE_LIMIT:
                self._shared.clear()
            self._shared[shared] = found
        self._pool_nodes.setdefault(topo.pool, set()).add(node)
        view.verdicts[node] = found
        return found

    def _search(self, topo: NodeTopology, use: PoolUse, req: Request) -> Verdict:
        self.searches += 1
        occ = Occupancy(
            allocated={topo.pool: set(use.used)}, memory_bound={topo.pool: set(use.busy)}
        )
        # Node labels were checked by the caller; the search result is shared across nodes.
        plain = dataclasses.replace(req, node_labels={}) if req.node_labels else req
        found = node_placements(topo, occ, plain, 1)
        if not found:
            return Verdict(-1.0, f"no {req.gpus}-GPU placement fits the free devices")
        return Verdict(found[0].score)

    @staticmethod
    def _bound(topo: NodeTopology, use: PoolUse, req: Request, view: _Shape) -> Verdict:
        """The answer without a search: a node with too few free GPUs fails (as its
        search would); any other passes with the lowest score. Lenient on purpose: the
        nodes an extender is sent already passed the scheduler's DynamicResources filter,
        and the node is searched, and ranked, by the next call of this shape."""
        free = len(topo.gpu_devices) - len(topo.gpu_devices & use.used)
        return view.too_few if free < req.gpus else view.unsearched

    def verdicts(self, req: Request, nodes: list[Any], quick: bool = False) -> dict[str, Verdict]:
        """Every candidate's verdict, in the order sent (names or Node objects).
        ``quick``: raise :class:`WouldWait` rather than search."""
        view = self.shape(req)
        budget = _Budget(0.0, True) if quick else _Budget(SEARCH_BUDGET_S)
        if req.node_labels:
            return {
                name: self.verdict(name, labels, req, view, budget)
                for name, labels, _ in _named(nodes)
            }
        get = view.verdicts.get
        # One list is all names (NodeNames) or all Node objects (Nodes.items).
        names = nodes if not nodes or type(nodes[0]) is str else [_name_of(n) for n in nodes]
        out = {n: get(n) for n in names}
        for name, v in out.items():  # only values change: safe while iterating
            if v is None:
                out[name] = self.verdict(name, None, req, view, budget)
        return out  # type: ignore[return-value]

    def decide(
        self, req: Request, verdicts: dict[str, Verdict]
    ) -> tuple[list[str], dict[str, str]]:
        """filter's one decision over every candidate's verdict: the nodes that pass, and
        why each other one does not. (A rule that holds a pod back for a better node
        belongs here: it sees all candidates at once.)"""
        kept = [n for n, v in verdicts.items() if v.fits]
        failed = {n: v.reason for n, v in verdicts.items() if not v.fits}
        return kept, failed

    def waits(self, pod: dict[str, Any], req: Request, fits: set[str]) -> dict[str, str]:
        """Nodes to refuse for now (``completion.filter_waits``), only for a pod that states
        its run time (``expectedRunSeconds`` or Kueue's max-exec-time label). The yardstick
        is every node with a graph that the pod's nodeSelector allows, not only the
        candidates sent: a taken NVSwitch node never reaches the extender."""
        expected = req.expected_run_s or kueue_hint(pod)
        created = _timestamp((pod.get("metadata") or {}).get("creationTimestamp"))
        if expected is None or created is None:
            return {}
        selector = {
            str(k): str(v) for k, v in ((pod.get("spec") or {}).get("nodeSelector") or {}).items()
        }
        graphs = self.cluster.graphs
        topos: list[NodeTopology] = []
        allocated: dict[str, set[str]] = {}
        busy: dict[str, set[str]] = {}
        for name in graphs.nodes():
            topo = graphs.topology(name)
            if topo is None:
                continue
            info = self.cluster.node(name)
            if info is not None and not all(info.labels.get(k) == v for k, v in selector.items()):
                continue
            topos.append(topo)
            use = self.cluster.pool_use(topo.pool)
            allocated[topo.pool], busy[topo.pool] = set(use.used), set(use.busy)
        occ = Occupancy(allocated=allocated, memory_bound=busy)
        return filter_waits(topos, fits, occ, req, expected, time.time() - created)

    # -- verbs -----------------------------------------------------------------------------

    def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        """ExtenderFilterResult for ``args`` (ExtenderArgs), decoded from :meth:`filter_json`."""
        out: dict[str, Any] = json.loads(self.filter_json(args))
        return out

    def prioritize(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        """HostPriorityList for ``args``, decoded from :meth:`prioritize_json`."""
        out: list[dict[str, Any]] = json.loads(self.prioritize_json(args))
        return out

    def filter_json(self, args: dict[str, Any], quick: bool = False) -> bytes:
        """ExtenderFilterResult as the JSON the scheduler reads. With names on the wire
        (``nodeCacheCapable``) the body is joined from per-name and per-reason pieces
        encoded once, not built as objects and serialised for 1,000 nodes per call.
        ``quick``: only from what is at hand, else :class:`WouldWait` (a search, a wait
        for the informers, the expected-completion rule over every node)."""
        nodes, by_name = _nodes(args)
        pod = wire_field(args, "Pod") or {}
        try:
            req = self.workload(pod, quick)
        except (ValueError, NotReady) as exc:
            return _dumps(_filter_result([], {}, by_name, error=str(exc)))
        if req is None:
            if not by_name:
                return _dumps(_filter_result(nodes, {}, by_name))
            return self._json.filter(nodes, {})
        if quick and (req.expected_run_s or kueue_hint(pod)) is not None:
            raise WouldWait("expected completion")
        kept, failed = self.decide(req, self.verdicts(req, nodes, quick))
        # Expected completion (issue #24): held off slow nodes while a faster one may free
        # within the pod's bound; the reason goes to FailedNodes.
        waits = self.waits(pod, req, set(kept))
        if waits:
            failed.update(waits)
            kept = [n for n in kept if n not in waits]
        if not by_name:
            keep = set(kept)
            return _dumps(_filter_result([n for n in nodes if _name_of(n) in keep], failed, False))
        return self._json.filter(kept, failed)

    def prioritize_json(self, args: dict[str, Any], quick: bool = False) -> bytes:
        """HostPriorityList as JSON, joined from per-(name, score) pieces (``quick``: as
        for :meth:`filter_json`)."""
        nodes, by_name = _nodes(args)
        try:
            req = self.workload(wire_field(args, "Pod") or {}, quick)
        except (ValueError, NotReady):
            req = None
        if req is None:
            names = nodes if by_name else [_name_of(n) for n in nodes]
            return self._json.priorities((n, 0) for n in names)
        # Node objects as sent: their labels are what nodeLabels constraints are checked on.
        verdicts = self.verdicts(req, nodes, quick)
        return self._json.priorities((n, v.priority) for n, v in verdicts.items())


class _Budget:
    """Search seconds a call has left (shared by its nodes); ``quick``: none, and none
    answered from the bound either."""

    __slots__ = ("left", "quick", "searches")

    def __init__(self, seconds: float, quick: bool = False) -> None:
        self.left = seconds
        self.quick = quick
        self.searches = 0


#: Names and reasons whose JSON is kept before the tables start over.
ENCODED_KEPT = 50_000


class _Encoded:
    """JSON pieces encoded once: a node name, a ``HostPriority`` per (name, score), a
    failure reason. Node names are DNS names and reasons a handful of strings, so the
    tables stay small; they start over past :data:`ENCODED_KEPT`."""

    def __init__(self) -> None:
        self.names: dict[str, bytes] = {}
        self.hosts: dict[str, tuple[bytes, ...]] = {}
        self.reasons: dict[str, bytes] = {}

    def _name(self, name: str) -> bytes:
        got = self.names.get(name)
        if got is None:
            if len(self.names) >= ENCODED_KEPT:
                self.names = {}
            got = self.names[name] = json.dumps(name).encode()
        return got

    def _host(self, name: str) -> tuple[bytes, ...]:
        got = self.hosts.get(name)
        if got is None:
            if len(self.hosts) >= ENCODED_KEPT:
                self.hosts = {}
            head = b'{"Host":' + self._name(name) + b',"Score":'
            got = tuple(head + b"%d}" % s for s in range(MAX_EXTENDER_PRIORITY + 1))
            self.hosts[name] = got
        return got

    def _reason(self, reason: str) -> bytes:
        got = self.reasons.get(reason)
        if got is None:
            if len(self.reasons) >= ENCODED_KEPT:
                self.reasons = {}
            got = self.reasons[reason] = json.dumps(reason).encode()
        return got

    def filter(self, kept: list[str], failed: dict[str, str]) -> bytes:
        """ExtenderFilterResult with NodeNames (as :func:`_filter_result` builds it)."""
        names, name, reason = self.names.get, self._name, self._reason
        parts = [
            b'{"Nodes":null,"NodeNames":[',
            b",".join([names(n) or name(n) for n in kept]),
            b'],"FailedNodes":{',
            b",".join([(names(n) or name(n)) + b":" + reason(r) for n, r in failed.items()]),
            b'},"FailedAndUnresolvableNodes":{},"Error":""}',
        ]
        return b"".join(parts)

    def priorities(self, scores: Iterable[tuple[str, int]]) -> bytes:
        hosts, host = self.hosts.get, self._host
        return b"[" + b",".join([(hosts(n) or host(n))[s] for n, s in scores]) + b"]"


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _timestamp(value: Any) -> float | None:
    """Seconds since the epoch of an RFC 3339 API timestamp, or None."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _nodes(args: dict[str, Any]) -> tuple[list[Any], bool]:
    """The candidates as sent: Node objects (``Nodes.items``) or names (``NodeNames``)."""
    nodes = (wire_field(args, "Nodes") or {}).get("items")
    if nodes is not None:
        return list(nodes), False
    names = wire_field(args, "NodeNames") or []
    if all(type(n) is str for n in names):
        return names, True
    return [str(n) for n in names], True


def _name_of(node: Any) -> str:
    return node if isinstance(node, str) else str((node.get("metadata") or {}).get("name"))


def _named(nodes: list[Any]) -> list[tuple[str, dict[str, str] | None, Any]]:
    """(name, labels or None when only the name came, the node as sent)."""
    out: list[tuple[str, dict[str, str] | None, Any]] = []
    for n in nodes:
        if isinstance(n, str):
            out.append((n, None, n))
        else:
            meta = n.get("metadata") or {}
            labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
            out.append((str(meta.get("name")), labels, n))
    return out


def wire_field(args: dict[str, Any], name: str) -> Any:
    """``args[name]`` matched as Go's encoding/json matches a struct field: the exact key
    first, else the first key equal to it without regard to case (``Pod``/``pod``)."""
    if name in args:
        return args[name]
    folded = name.casefold()
    for key, value in args.items():
        if isinstance(key, str) and key.casefold() == folded:
            return value
    return None


def _filter_result(
    nodes: list[Any], failed: dict[str, str], by_name: bool, error: str = ""
) -> dict[str, Any]:
    """ExtenderFilterResult as Go marshals it: every field, nil pointers as null."""
    names = [_name_of(n) for n in nodes] if by_name else None
    node_list = (
        None
        if by_name
        else {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": nodes}
    )
    return {
        "Nodes": node_list,
        "NodeNames": names,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": {},
        "Error": error,
    }


def filter_error(error: str) -> dict[str, Any]:
    """The answer to a filter call that failed as a whole."""
    return _filter_result([], {}, True, error=error)
