"""Keep one API object per node equal to a desired one, writing only what changed.

Used for the node's ``NodeResourceTopology`` (``toposlice run --nrt``) and its NFD
``NodeFeature`` (``--node-feature``), with the publisher's rules (driver/publisher/slices.py; the
loop both run is driver/publisher/resync_loop.py):

- a reconcile reads the object (one GET) and compares the fields this writer owns
  (``zones``/``attributes``/``topologyPolicies`` of an NRT, ``spec`` of a NodeFeature),
  our labels and the Node owner reference: equal → no write (steady state, restarts with
  unchanged hardware); different → one update (PUT with the read ``resourceVersion``);
  absent → one create. What the server stored after our last write counts as equal too,
  so a field the server normalizes never causes a rewrite per resync;
- an object of that name not labelled ``app.kubernetes.io/managed-by: toposlice`` (NFD's
  topology updater writing the same NRT, say) is never overwritten: an error is logged
  and retried with backoff, with no write;
- 409 re-reads and retries at once; 429, 5xx, no answer and a missing CRD (404 on the
  resource) back off exponentially with jitter (``Retry-After`` wins), capped, forever;
- a resync every ``resync_seconds`` restores an object deleted or edited behind our back.

The object is owned by the Node (garbage-collected with it); it is left in place when
the driver stops.
"""

from __future__ import annotations

import copy
import json
import logging
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from driver.plumbing.kube import ApiFailure, failure, get_node, request_json
from driver.publisher.resync_loop import Restart, ResyncLoop, WriteError

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger("toposlice.topology_objects")

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "toposlice"


class ObjectError(WriteError):
    """An API call of a :class:`TopologyObjectWriter` failed."""


@dataclass(frozen=True)
class ObjectKind:
    """Where objects of one kind live and which top-level fields the writer owns."""

    name: str
    """For logs and thread names, e.g. ``NodeResourceTopology``."""
    group_version: str
    plural: str
    owned_fields: tuple[str, ...]
    namespaced: bool = False

    def collection(self, namespace: str | None) -> str:
        if self.namespaced:
            if not namespace:
                raise ValueError(f"{self.name} is namespaced: a namespace is required")
            return f"/apis/{self.group_version}/namespaces/{quote(namespace)}/{self.plural}"
        return f"/apis/{self.group_version}/{self.plural}"


NRT_KIND = ObjectKind(
    "NodeResourceTopology",
    "topology.node.k8s.io/v1alpha2",
    "noderesourcetopologies",
    ("zones", "attributes", "topologyPolicies"),
)
NODE_FEATURE_KIND = ObjectKind(
    "NodeFeature", "nfd.k8s-sigs.io/v1alpha1", "nodefeatures", ("spec",), namespaced=True
)


def _owned(obj: Mapping[str, Any], fields: Sequence[str]) -> str:
    return json.dumps({f: obj.get(f) for f in fields}, sort_keys=True)


class TopologyObjectWriter(ResyncLoop):
    """Keeps one object (of ``kind``, owned by the Node ``node_name``) equal to the
    desired one given by :meth:`set_desired`."""

    error_type = ObjectError

    def __init__(
        self,
        client: ApiClient,
        kind: ObjectKind,
        node_name: str,
        *,
        resync_seconds: float = 10.0,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(
            client,
            node_name,
            thread_name=f"{kind.plural}-writer",
            resync_seconds=resync_seconds,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            rng=rng,
        )
        self.kind = kind
        self._desired: dict[str, Any] | None = None
        self._echo: tuple[str, str] | None = None
        """(owned fields sent, owned fields the server stored) of our last write."""
        self.writes: Counter[str] = Counter()
        """Write requests sent, by verb (create/update), including failed ones."""

    # -- desired state -------------------------------------------------------------------

    def set_desired(self, obj: Mapping[str, Any]) -> bool:
        """Set the desired object; True if that changed it (the loop reconciles at once)."""
        new = copy.deepcopy(dict(obj))
        with self._cond:
            if new == self._desired:
                return False
            self._desired = new
            self._changed()
        return True

    def desired(self) -> dict[str, Any] | None:
        with self._cond:
            return copy.deepcopy(self._desired)

    # -- one reconcile -------------------------------------------------------------------

    def reconcile(self) -> int:
        """Read, compare, write; the number of writes (0 or 1). Raises :class:`ObjectError`."""
        desired = self.desired()
        if desired is None:
            raise RuntimeError("reconcile before set_desired")
        return self._retry_conflicts(lambda: self._reconcile(desired), f"write {self.kind.name}")

    def _path(self, desired: Mapping[str, Any], named: bool) -> str:
        meta = desired.get("metadata") or {}
        base = self.kind.collection(meta.get("namespace"))
        return f"{base}/{quote(str(meta['name']))}" if named else base

    def _call(self, what: str, method: str, path: str, body: Any = None) -> Any:
        write = {"POST": "create", "PUT": "update"}.get(method)
        if write is not None:
            self.writes[write] += 1
        try:
            return request_json(self.client, method, path, body)
        except Exception as exc:
            f = failure(exc)
            if f.conflict:
                log.info("%s: conflict, re-reading", what)
                raise Restart() from exc
            if f.not_found and method == "POST":
                where = " and its namespace there" if self.kind.namespaced else ""
                hint = f"{f.message} (is the {self.kind.name} CRD installed{where}?)"
                f = ApiFailure(404, f.retry_after, hint)
            raise ObjectError(what, f) from exc

    def _get_node(self) -> dict[str, Any]:
        # This module's get_node, looked up at the call (tests replace it here).
        return get_node(self.client, self.node_name)

    def _read(self, desired: Mapping[str, Any]) -> dict[str, Any] | None:
        what = f"read {self.kind.name}"
        try:
            obj: dict[str, Any] = request_json(self.client, "GET", self._path(desired, True))
            return obj
        except Exception as exc:
            f = failure(exc)
            if not f.not_found:
                raise ObjectError(what, f) from exc
            return None

    def _same(self, existing: Mapping[str, Any], desired: Mapping[str, Any], uid: str) -> bool:
        meta = existing.get("metadata") or {}
        labels = meta.get("labels") or {}
        want = (desired.get("metadata") or {}).get("labels") or {}
        if any(labels.get(k) != v for k, v in want.items()):
            return False
        refs = meta.get("ownerReferences") or []
        if not any(r.get("uid") == uid and r.get("kind") == "Node" for r in refs):
            return False
        have = _owned(existing, self.kind.owned_fields)
        sent = _owned(desired, self.kind.owned_fields)
        return have == sent or self._echo == (sent, have)

    def _reconcile(self, desired: dict[str, Any]) -> int:
        existing = self._read(desired)
        name = desired["metadata"]["name"]
        if existing is None:
            owner = self._owner(refresh=True)  # the Node may have been re-created
            body = copy.deepcopy(desired)
            body["metadata"]["ownerReferences"] = [owner]
            stored = self._call(
                f"create {self.kind.name}", "POST", self._path(desired, False), body
            )
            self._remember(desired, stored)
            return 1
        labels = (existing.get("metadata") or {}).get("labels") or {}
        if labels.get(MANAGED_BY_LABEL) != MANAGED_BY:
            raise ObjectError(
                f"{self.kind.name} {name}",
                ApiFailure(
                    None,
                    None,
                    f"exists and is not labelled {MANAGED_BY_LABEL}={MANAGED_BY} (another "
                    "writer owns it); not overwriting it",
                ),
            )
        owner = self._owner(refresh=False)
        if self._same(existing, desired, owner["uid"]):
            return 0
        body = copy.deepcopy(desired)
        meta = {k: v for k, v in existing["metadata"].items() if k != "managedFields"}
        meta["labels"] = {**labels, **(desired["metadata"].get("labels") or {})}
        others = [r for r in meta.get("ownerReferences") or [] if r.get("kind") != "Node"]
        meta["ownerReferences"] = [owner, *others]
        body["metadata"] = meta
        for field in self.kind.owned_fields:
            if field not in desired:
                body.pop(field, None)
        stored = self._call(f"update {self.kind.name}", "PUT", self._path(desired, True), body)
        self._remember(desired, stored)
        return 1

    def _remember(self, desired: Mapping[str, Any], stored: Any) -> None:
        if isinstance(stored, dict):
            fields = self.kind.owned_fields
            self._echo = (_owned(desired, fields), _owned(stored, fields))

    # -- the loop (driver/publisher/resync_loop.py) -----------------------------------------------

    def _has_desired(self) -> bool:
        return self.desired() is not None

    def _sync_once(self) -> None:
        if self.reconcile():
            log.info("wrote %s for node %s", self.kind.name, self.node_name)

    def _log_recovered(self, failures: int) -> None:
        log.info("%s written again after %d failure(s)", self.kind.name, failures)

    def _log_failed(self, exc: WriteError, delay: float) -> None:
        log.warning("%s failed (%s); retrying in %.1f s", self.kind.name, exc, delay)

    def _log_unexpected(self, delay: float) -> None:
        log.exception("%s failed unexpectedly; retrying in %.1f s", self.kind.name, delay)
