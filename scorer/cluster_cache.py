"""What the extender knows about the cluster, kept by informers and read without I/O.

Four informers (driver/plumbing/informer.py: one LIST, then a WATCH resumed from its
resourceVersion) feed one cache:

- **Nodes**: labels (the workload's ``nodeLabels`` constraints) and the InternalIP (the
  graph URL), so the scheduler may send node names only (``nodeCacheCapable: true``);
- **ResourceSlices** of this driver: which nodes publish a pool, and a change of a node's
  slices (new hardware, a restarted driver) asks for its graph again;
- **ResourceClaims**: the allocated devices per pool (occupancy) and each claim's GPU/NIC
  counts (the pod's workload);
- **ResourceClaimTemplates**: the counts of a pod whose claim is not generated yet.

Occupancy is one immutable :class:`PoolUse` per pool, replaced when a claim on that pool
changes: the extender's per-node caches compare it by identity, so an occupancy change
invalidates exactly the nodes it touched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from normalize.deviceclasses import ANY_KIND, device_class_name

from .graph_source import GraphSource
from .request import BOUND_ANNOTATION

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from driver.plumbing.informer import Informer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeInfo:
    name: str
    labels: dict[str, str]
    address: str | None


@dataclass(frozen=True)
class SliceInfo:
    node: str | None
    pool: str
    generation: int
    resource_version: str


@dataclass(frozen=True)
class ClaimInfo:
    gpus: int
    nics: int
    """Counted over this driver's GPU and NIC classes (allocationMode All counts one)."""
    devices: tuple[tuple[str, str], ...]
    """(pool, device) of this driver's allocation results."""
    memory_bound: bool


@dataclass(frozen=True)
class PoolUse:
    """The devices of one pool taken by claims, and those running memory-bound work."""

    used: frozenset[str] = frozenset()
    busy: frozenset[str] = frozenset()


EMPTY_USE = PoolUse()
#: Changes logged before the log starts over.
CHANGES_KEPT = 100_000


def claim_counts(spec: dict[str, Any], driver: str) -> tuple[int, int]:
    """(GPUs, NICs) a ResourceClaimSpec asks from this driver's classes."""
    gpu_cls, nic_cls = device_class_name("gpu", driver), device_class_name("nic", driver)
    any_cls = device_class_name(ANY_KIND, driver)
    gpus = nics = 0
    for r in (spec.get("devices") or {}).get("requests") or []:
        body = r.get("exactly") or ((r.get("firstAvailable") or [None])[0]) or {}
        # allocationMode All: as many as match; count it as one (the least it can be).
        all_mode = body.get("allocationMode") == "All"
        count = 1 if all_mode else int(body.get("count", 1))
        if body.get("deviceClassName") == gpu_cls:
            gpus += count
        elif body.get("deviceClassName") == nic_cls:
            nics += count
        elif body.get("deviceClassName") == any_cls and all_mode:
            # Every device of the node (examples/whole-node.yaml): a GPU and a NIC at
            # least, as the per-kind All requests it replaced were counted.
            gpus, nics = gpus + 1, nics + 1
    return gpus, nics


def node_info(obj: dict[str, Any]) -> NodeInfo:
    meta = obj.get("metadata") or {}
    address = None
    for a in (obj.get("status") or {}).get("addresses") or []:
        if a.get("type") == "InternalIP":
            address = str(a.get("address"))
            break
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    return NodeInfo(str(meta.get("name") or ""), labels, address)


def slice_info(obj: dict[str, Any]) -> SliceInfo:
    spec = obj.get("spec") or {}
    pool = spec.get("pool") or {}
    return SliceInfo(
        node=spec.get("nodeName"),
        pool=str(pool.get("name") or ""),
        generation=int(pool.get("generation") or 0),
        resource_version=str((obj.get("metadata") or {}).get("resourceVersion") or ""),
    )


class ClusterCache:
    """Nodes, slices, claims and templates as the extender reads them."""

    def __init__(self, driver: str = "toposlice.dev", graphs: GraphSource | None = None) -> None:
        self.driver = driver
        self.graphs = graphs or GraphSource()
        self.nodes: dict[str, NodeInfo] = {}
        self.claims: dict[str, ClaimInfo] = {}
        self.templates: dict[str, tuple[int, int]] = {}
        self._slices: dict[str, SliceInfo] = {}
        self._pool_claims: dict[str, dict[str, ClaimInfo]] = {}
        self._use: dict[str, PoolUse] = {}
        self._lock = threading.Lock()
        self.informers: list[Informer[Any]] = []
        self.changes: list[tuple[str, str]] = []
        """What changed, in order: ("pool", name) when a pool's occupancy did, ("node",
        name) when a node's graph did. Readers keep their place in it (index + base)."""
        self.change_base = 0
        if self.graphs.on_change is None:
            self.graphs.on_change = lambda node: self._changed("node", node)

    def _changed(self, kind: str, name: str) -> None:
        """Log a change (after the state it names was updated)."""
        with self._lock:
            self._log(kind, name)

    def _log(self, kind: str, name: str) -> None:
        if len(self.changes) >= CHANGES_KEPT:  # readers this far behind start over
            self.change_base += len(self.changes)
            self.changes = []
        self.changes.append((kind, name))

    # -- reads ---------------------------------------------------------------------------

    def pool_use(self, pool: str) -> PoolUse:
        return self._use.get(pool, EMPTY_USE)

    def node(self, name: str) -> NodeInfo | None:
        return self.nodes.get(name)

    def claim(self, namespace: str, name: str) -> ClaimInfo | None:
        return self.claims.get(f"{namespace}/{name}")

    def template(self, namespace: str, name: str) -> tuple[int, int] | None:
        return self.templates.get(f"{namespace}/{name}")

    def synced(self) -> tuple[bool, str]:
        waiting = [i.name for i in self.informers if not i.synced.is_set()]
        if waiting:
            return False, "informers not synced: " + ", ".join(waiting)
        return True, "ok"

    def wait_synced(self, timeout: float) -> tuple[bool, str]:
        """:meth:`synced`, after waiting up to ``timeout`` seconds in all for the
        informers' first LISTs (returns at once when they are done)."""
        deadline = time.monotonic() + timeout
        for inf in self.informers:
            inf.synced.wait(max(0.0, deadline - time.monotonic()))
        return self.synced()

    # -- transforms ------------------------------------------------------------------------

    def claim_info(self, obj: dict[str, Any]) -> ClaimInfo:
        gpus, nics = claim_counts(obj.get("spec") or {}, self.driver)
        alloc = ((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}
        devices = tuple(
            (str(r["pool"]), str(r["device"]))
            for r in alloc.get("results") or []
            if r.get("driver", self.driver) == self.driver and r.get("pool") and r.get("device")
        )
        ann = (obj.get("metadata") or {}).get("annotations") or {}
        return ClaimInfo(gpus, nics, devices, ann.get(BOUND_ANNOTATION) == "memory")

    def template_info(self, obj: dict[str, Any]) -> tuple[int, int]:
        return claim_counts((obj.get("spec") or {}).get("spec") or {}, self.driver)

    # -- events (informer threads) ---------------------------------------------------------

    def on_node(self, typ: str, key: str, old: NodeInfo | None, new: NodeInfo | None) -> None:
        if new is None:
            self.nodes.pop(key, None)
            self.graphs.forget(key)
            return
        self.nodes[key] = new
        if old is None or old.address != new.address:
            if self._publishes(key):
                self.graphs.want(key, new.address)

    def on_slice(self, typ: str, key: str, old: SliceInfo | None, new: SliceInfo | None) -> None:
        if new is None:
            self._slices.pop(key, None)
            return
        self._slices[key] = new
        if new.node and (old is None or old.generation != new.generation or old.node != new.node):
            info = self.nodes.get(new.node)
            if info is None and self.graphs.needs_address:
                return  # the Node's event asks once its address is known
            self.graphs.want(new.node, info.address if info else None)

    def on_claim(self, typ: str, key: str, old: ClaimInfo | None, new: ClaimInfo | None) -> None:
        if new is None:
            self.claims.pop(key, None)
        else:
            self.claims[key] = new
        before = set(old.devices) if old else set()
        after = set(new.devices) if new else set()
        if before == after and (old is None or new is None or old.memory_bound == new.memory_bound):
            return
        pools = {p for p, _ in before | after}
        with self._lock:
            for pool in pools:
                members = self._pool_claims.setdefault(pool, {})
                if new is not None and any(p == pool for p, _ in new.devices):
                    members[key] = new
                else:
                    members.pop(key, None)
                used: set[str] = set()
                busy: set[str] = set()
                for c in members.values():
                    devs = {d for p, d in c.devices if p == pool}
                    used |= devs
                    if c.memory_bound:
                        busy |= devs
                if members:
                    self._use[pool] = PoolUse(frozenset(used), frozenset(busy))
                else:
                    self._pool_claims.pop(pool, None)
                    self._use.pop(pool, None)
                self._log("pool", pool)

    def on_template(
        self, typ: str, key: str, old: tuple[int, int] | None, new: tuple[int, int] | None
    ) -> None:
        if new is None:
            self.templates.pop(key, None)
        else:
            self.templates[key] = new

    def _publishes(self, node: str) -> bool:
        return any(s.node == node for s in self._slices.values())

    def apply(self, kind: str, typ: str, obj: dict[str, Any]) -> None:
        """Feed one API object as an informer would (tests, the bench)."""
        from driver.plumbing.informer import object_key

        transform, handler = self._kinds()[kind]
        key = object_key(obj)
        store = self._stores()[kind]
        old = store.get(key)
        if kind == "ResourceSlice":
            old = self._slices.get(key)
        handler(typ, key, old, None if typ == "DELETED" else transform(obj))

    def _stores(self) -> dict[str, dict[str, Any]]:
        return {
            "Node": self.nodes,
            "ResourceSlice": self._slices,
            "ResourceClaim": self.claims,
            "ResourceClaimTemplate": self.templates,
        }

    def _kinds(self) -> dict[str, tuple[Callable[[dict[str, Any]], Any], Callable[..., None]]]:
        return {
            "Node": (node_info, self.on_node),
            "ResourceSlice": (slice_info, self.on_slice),
            "ResourceClaim": (self.claim_info, self.on_claim),
            "ResourceClaimTemplate": (self.template_info, self.on_template),
        }

    # -- informers -------------------------------------------------------------------------

    def start_informers(self, client: ApiClient, **informer_args: Any) -> list[Informer[Any]]:
        """List + watch the four kinds through ``client`` (each in its own thread)."""
        from kubernetes.client import CoreV1Api, ResourceV1Api

        from driver.plumbing.informer import Informer

        core, res = CoreV1Api(client), ResourceV1Api(client)
        # The API server's URL: after the server went away each informer waits for its
        # port to open, and a moment more, before it retries (driver/plumbing/informer.py).
        args: dict[str, Any] = {"server": client.configuration.host, **informer_args}
        ours = {"field_selector": f"spec.driver={self.driver}"}
        self.informers = [
            Informer("Node", core.list_node, node_info, on_event=self.on_node, **args),
            Informer(
                "ResourceSlice",
                res.list_resource_slice,
                slice_info,
                on_event=self.on_slice,
                selectors=ours,
                **args,
            ),
            Informer(
                "ResourceClaim",
                res.list_resource_claim_for_all_namespaces,
                self.claim_info,
                on_event=self.on_claim,
                **args,
            ),
            Informer(
                "ResourceClaimTemplate",
                res.list_resource_claim_template_for_all_namespaces,
                self.template_info,
                on_event=self.on_template,
                **args,
            ),
        ]
        for inf in self.informers:
            inf.start()
        return self.informers

    def stop(self) -> None:
        for inf in self.informers:
            inf.stop(1.0)
        self.graphs.stop()
