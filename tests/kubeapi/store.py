"""The object store behind the test API server: resourceVersions, uids, selectors, watch events.

Semantics follow the real API server where clients can tell the difference: one global
resourceVersion counter, ``generateName`` suffixes, 409 ``AlreadyExists``/``Conflict``,
delete preconditions, immutable fields, ``metadata.generation`` bumped on spec changes.
"""

from __future__ import annotations

import copy
import datetime
import random
import threading
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .selectors import Predicate, field_selector, label_selector, parse_field_selector

_SUFFIX_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery rand.String alphabet
EVENT_HISTORY = 10_000


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    fields: frozenset[str] = frozenset()
    """Field-selector paths besides ``metadata.name``/``metadata.namespace``."""
    immutable: tuple[str, ...] = ()
    """Dotted paths that an update must not change (422 Invalid)."""
    index: str | None = None
    """A field path kept in an index, so lists filtered by it stay O(result)."""
    has_status: bool = False
    """Has a ``status`` subresource: the main resource ignores status writes."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCES = {
    r.plural: r
    for r in (
        Resource("", "v1", "nodes", "Node", False, has_status=True),
        Resource(
            "resource.k8s.io",
            "v1",
            "resourceslices",
            "ResourceSlice",
            False,
            fields=frozenset({"spec.driver", "spec.nodeName"}),
            immutable=("spec.driver", "spec.pool.name", "spec.nodeName"),
            index="spec.nodeName",
        ),
        Resource("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True, has_status=True),
        Resource("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False),
        Resource("", "v1", "events", "Event", True),
    )
}


class ApiError(Exception):
    """An error answer: HTTP code, ``Status.reason`` and message."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


@dataclass
class WatchEvent:
    rv: int
    type: str
    resource: str
    obj: dict[str, Any]


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _get(obj: dict[str, Any], path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


@dataclass
class _Table:
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """(namespace or "", name) -> stored object."""
    index: dict[str, set[tuple[str, str]]] = field(default_factory=dict)


class Store:
    """Thread-safe; every method returns deep copies, never the stored objects."""

    def __init__(
        self,
        validators: dict[str, Callable[[dict[str, Any]], list[str]]] | None = None,
        normalizers: dict[str, Callable[[dict[str, Any]], None]] | None = None,
    ):
        self._lock = threading.Condition()
        self._rv = 0
        self._tables = {name: _Table() for name in RESOURCES}
        self._events: deque[WatchEvent] = deque(maxlen=EVENT_HISTORY)
        self.validators = validators or {}
        self.normalizers = normalizers or {}

    # -- helpers -------------------------------------------------------------------------

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def _index_key(self, res: Resource, obj: dict[str, Any]) -> str | None:
        if res.index is None:
            return None
        value = _get(obj, res.index)
        return None if value is None else str(value)

    def _put(self, res: Resource, key: tuple[str, str], obj: dict[str, Any]) -> None:
        table = self._tables[res.plural]
        old = table.objects.get(key)
        if old is not None:
            old_ix = self._index_key(res, old)
            if old_ix is not None:
                table.index.get(old_ix, set()).discard(key)
        table.objects[key] = obj
        ix = self._index_key(res, obj)
        if ix is not None:
            table.index.setdefault(ix, set()).add(key)

    def _remove(self, res: Resource, key: tuple[str, str]) -> dict[str, Any]:
        table = self._tables[res.plural]
        obj = table.objects.pop(key)
        ix = self._index_key(res, obj)
        if ix is not None:
            table.index.get(ix, set()).discard(key)
        return obj

    def _commit(
        self, res: Resource, key: tuple[str, str], obj: dict[str, Any], event: str
    ) -> dict[str, Any]:
        """Store ``obj`` at a new resourceVersion, tell watchers, return a copy."""
        obj["metadata"]["resourceVersion"] = str(self._next_rv())
        self._put(res, key, obj)
        self._event(event, res, obj)
        return copy.deepcopy(obj)

    def _event(self, kind: str, res: Resource, obj: dict[str, Any]) -> None:
        self._events.append(WatchEvent(self._rv, kind, res.plural, copy.deepcopy(obj)))
        self._lock.notify_all()

    def _not_found(self, res: Resource, name: str) -> ApiError:
        return ApiError(404, "NotFound", f'{res.plural}.{res.group} "{name}" not found')

    def _validate(self, res: Resource, obj: dict[str, Any]) -> None:
        normalize = self.normalizers.get(res.plural)
        if normalize is not None:
            normalize(obj)
        check = self.validators.get(res.plural)
        errs = check(obj) if check else []
        if errs:
            name = (obj.get("metadata") or {}).get("name", "")
            raise ApiError(
                422, "Invalid", f'{res.kind} "{name}" is invalid: ' + "; ".join(errs[:10])
            )

    # -- verbs ---------------------------------------------------------------------------

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        res = RESOURCES[resource]
        with self._lock:
            obj = self._tables[resource].objects.get((namespace, name))
            if obj is None:
                raise self._not_found(res, name)
            return copy.deepcopy(obj)

    def matcher(
        self, resource: str, label_sel: str | None, field_sel: str | None
    ) -> tuple[Predicate, list[tuple[str, str, bool]]]:
        res = RESOURCES[resource]
        supported = res.fields | {"metadata.name", "metadata.namespace"}
        terms = parse_field_selector(field_sel, supported)
        by_label, by_field = label_selector(label_sel), field_selector(terms)
        return (lambda obj: by_field(obj) and by_label(obj)), terms

    def select(
        self,
        resource: str,
        namespace: str | None = None,
        label_sel: str | None = None,
        field_sel: str | None = None,
    ) -> tuple[list[dict[str, Any]], int]:
        res = RESOURCES[resource]
        match, terms = self.matcher(resource, label_sel, field_sel)
        with self._lock:
            table = self._tables[resource]
            keys: Any = table.objects.keys()
            indexed = [v for p, v, eq in terms if eq and p == res.index]
            if indexed:
                keys = table.index.get(indexed[0], set())
            out = []
            for key in sorted(keys):
                if namespace is not None and key[0] != namespace:
                    continue
                obj = table.objects[key]
                if match(obj):
                    out.append(copy.deepcopy(obj))
            return out, self._rv

    def create(self, resource: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        res = RESOURCES[resource]
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        with self._lock:
            table = self._tables[resource]
            name = meta.get("name")
            if not name:
                prefix = meta.get("generateName")
                if not prefix:
                    raise ApiError(
                        422, "Invalid", "metadata.name: Required value: name or generateName"
                    )
                for _ in range(100):
                    name = prefix + "".join(random.choices(_SUFFIX_CHARS, k=5))
                    if (namespace, name) not in table.objects:
                        break
            if (namespace, name) in table.objects:
                raise ApiError(
                    409, "AlreadyExists", f'{res.plural}.{res.group} "{name}" already exists'
                )
            meta["name"] = name
            if res.namespaced:
                meta["namespace"] = namespace
            else:
                meta.pop("namespace", None)
            obj["apiVersion"], obj["kind"] = res.api_version, res.kind
            self._validate(res, obj)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            meta["generation"] = 1
            meta.pop("deletionTimestamp", None)
            return self._commit(res, (namespace, name), obj, "ADDED")

    def update(
        self,
        resource: str,
        namespace: str,
        name: str,
        body: dict[str, Any],
        subresource: str = "",
    ) -> dict[str, Any]:
        res = RESOURCES[resource]
        with self._lock:
            current = self._tables[resource].objects.get((namespace, name))
            if current is None:
                raise self._not_found(res, name)
            new = copy.deepcopy(body)
            meta = new.setdefault("metadata", {})
            if meta.get("name", name) != name:
                raise ApiError(400, "BadRequest", "the name of the object does not match the URL")
            rv = meta.get("resourceVersion")
            if rv and rv != current["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {res.plural}.{res.group} "{name}": '
                    "the object has been modified; please apply your changes to the latest "
                    "version and try again",
                )
            if subresource == "status":
                merged = copy.deepcopy(current)
                merged["status"] = new.get("status")
                new = merged
            elif res.has_status:
                new["status"] = copy.deepcopy(current.get("status"))
            for path in res.immutable:
                if _get(new, path) != _get(current, path):
                    raise ApiError(422, "Invalid", f"{path}: Invalid value: field is immutable")
            cur_meta = current["metadata"]
            meta = new.setdefault("metadata", {})
            meta["name"] = name
            for key in ("uid", "creationTimestamp", "namespace"):
                if key in cur_meta:
                    meta[key] = cur_meta[key]
            new["apiVersion"], new["kind"] = res.api_version, res.kind
            self._validate(res, new)
            gen = cur_meta.get("generation", 1)
            meta["generation"] = gen + 1 if new.get("spec") != current.get("spec") else gen
            return self._commit(res, (namespace, name), new, "MODIFIED")

    def delete(
        self,
        resource: str,
        namespace: str,
        name: str,
        preconditions: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        res = RESOURCES[resource]
        with self._lock:
            current = self._tables[resource].objects.get((namespace, name))
            if current is None:
                raise self._not_found(res, name)
            pre = preconditions or {}
            meta = current["metadata"]
            for key in ("uid", "resourceVersion"):
                if pre.get(key) and pre[key] != meta.get(key):
                    raise ApiError(
                        409,
                        "Conflict",
                        f"Precondition failed: {key}: {pre[key]}, object {key}: {meta.get(key)}",
                    )
            obj = self._remove(res, (namespace, name))
            obj["metadata"]["resourceVersion"] = str(self._next_rv())
            self._event("DELETED", res, obj)
            return copy.deepcopy(obj)

    # -- watch ---------------------------------------------------------------------------

    def events_since(self, resource: str, rv: int, timeout: float) -> tuple[list[WatchEvent], bool]:
        """Events of ``resource`` after ``rv``, waiting up to ``timeout`` for one; the flag
        is False when ``rv`` is older than the kept history (the client must relist)."""
        with self._lock:
            full = len(self._events) == self._events.maxlen
            if full and rv < self._events[0].rv - 1:
                return [], False
            if self._rv <= rv:
                self._lock.wait(timeout)
            return [e for e in self._events if e.rv > rv and e.resource == resource], True

    def wake_watchers(self) -> None:
        with self._lock:
            self._lock.notify_all()
