"""List + watch of one resource into a local cache, so readers never ask the API server.

client-go's informer in small. One paged LIST fills the cache and gives a
resourceVersion; a WATCH from it (the kubernetes client's ``watch.Watch``, bookmarks on,
plain JSON: the typed models would cost more than the events) applies every ADDED,
MODIFIED and DELETED. When a stream ends (the server's ``timeoutSeconds``, an API-server
restart, a broken connection) the watch resumes from the last resourceVersion seen, from
an event or a bookmark; when the server did not answer, after a capped exponential
backoff with jitter, so a fleet does not return in step. A stream the server ended long
before its timeout (a shutting-down API server closes every watch, and would accept a
re-watch on the kept-alive connection while it drains) is resumed after a jittered delay
(``rewatch_delay_s``, doubling while streams keep ending early), not at once. Only
``410 Gone`` (the version left the server's window) lists again, once, served from the
API server's watch cache (``resourceVersionMatch=NotOlderThan`` the last version seen).
A restarted API server starts its watch cache at etcd's current revision, so a watch
older than that gets 410: one LIST per informer after an API-server restart, measured in
tests/e2e/test_scorer_informers.py. There is no periodic LIST.

Objects are kept as ``transform(obj)`` (what the reader needs, not 16 KB of slice) under
``namespace/name`` (``name`` for cluster-scoped kinds); ``on_event(type, key, old, new)``
runs on the informer's thread for every change, relist differences included.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

#: (event type, key, old value, new value); type is ADDED, MODIFIED or DELETED.
Handler = Callable[[str, str, Any, Any], None]


def object_key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def _rv(obj: dict[str, Any]) -> str | None:
    value = (obj.get("metadata") or {}).get("resourceVersion")
    return str(value) if value else None


class Gone(Exception):
    """410: the resourceVersion is older than the server keeps; list again."""


class Informer(Generic[T]):
    """The cache of one resource kind; :meth:`start` runs it in a daemon thread.

    ``list_fn`` is a typed list call of the kubernetes client (``CoreV1Api.list_node``,
    ``ResourceV1Api.list_resource_slice``, ...): it takes ``limit``, ``_continue``,
    ``watch``, ``resource_version``, ``allow_watch_bookmarks`` and ``timeout_seconds``.
    ``selectors``: extra arguments for every call (``field_selector=...``).
    """

    def __init__(
        self,
        name: str,
        list_fn: Callable[..., Any],
        transform: Callable[[dict[str, Any]], T],
        *,
        on_event: Handler | None = None,
        selectors: dict[str, str] | None = None,
        page_size: int = 500,
        watch_timeout_s: float = 300.0,
        backoff_base: float = 0.2,
        backoff_max: float = 30.0,
        rewatch_delay_s: float = 1.0,
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self.list_fn = list_fn
        self.transform = transform
        self.on_event = on_event
        self.selectors = dict(selectors or {})
        self.page_size = page_size
        self.watch_timeout_s = watch_timeout_s
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.rewatch_delay_s = rewatch_delay_s
        self.rng = rng or random.Random()
        self.store: dict[str, T] = {}
        self._versions: dict[str, str | None] = {}
        self.resource_version: str | None = None
        self.synced = threading.Event()
        """Set once the first LIST is in the cache."""
        self.lists = 0
        self.watches = 0
        self.events = 0
        self.failures = 0
        self.last_error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Any = None
        self._list_from: str | None = None
        self._early = False
        """The last watch stream ended without error well before its timeout."""

    # -- reads ---------------------------------------------------------------------------

    def get(self, key: str) -> T | None:
        return self.store.get(key)

    def values(self) -> list[T]:
        return list(self.store.values())

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Informer[T]:
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        w = self._watch
        if w is not None:
            w.stop()
            resp = getattr(w, "_resp", None)  # the open stream: end the blocking read now
            if resp is not None:
                try:
                    resp.close()
                except Exception:  # already closed by the reading thread
                    pass
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_synced(self, timeout: float) -> bool:
        return self.synced.wait(timeout)

    def run(self) -> None:
        failures = 0
        early = 0
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self._relist()
                if self._watch_once():
                    failures = 0
                if self._early:
                    self._stop.wait(self.rewatch_delay(early))
                    early += 1
                else:
                    early = 0
                continue
            except Gone:
                log.info("informer %s: resourceVersion too old, listing again", self.name)
                self._expired()
                continue
            except Exception as exc:
                from .kube import failure

                if self._stop.is_set():
                    return
                fail = failure(exc)
                if fail.status == 410:
                    self._expired()
                    continue
                self.failures += 1
                self.last_error = fail.message
                delay = self.backoff(failures)
                failures += 1
                log.warning(
                    "informer %s: %s; retrying in %.1fs (from resourceVersion %s)",
                    self.name,
                    fail.message,
                    delay,
                    self.resource_version or "none: list",
                )
                self._stop.wait(delay)

    def _expired(self) -> None:
        self._list_from = self.resource_version
        self.resource_version = None

    def backoff(self, attempt: int) -> float:
        ceiling = min(self.backoff_max, self.backoff_base * (2 ** min(attempt, 30)))
        return ceiling * (0.5 + 0.5 * self.rng.random())

    def rewatch_delay(self, early: int) -> float:
        """Seconds before resuming after the ``early``-th stream in a row that the server
        ended early: half to all of ``rewatch_delay_s`` doubled per repeat, capped."""
        ceiling = min(self.backoff_max, self.rewatch_delay_s * (2 ** min(early, 30)))
        return ceiling * (0.5 + 0.5 * self.rng.random())

    # -- list and watch ------------------------------------------------------------------

    def _pages(self) -> Iterator[dict[str, Any]]:
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = dict(self.selectors, limit=self.page_size)
            if token:
                kwargs["_continue"] = token
            elif self._list_from:  # a relist: any state at least this new will do
                kwargs["resource_version"] = self._list_from
                kwargs["resource_version_match"] = "NotOlderThan"
            resp = self.list_fn(_preload_content=False, _request_timeout=(5.0, 60.0), **kwargs)
            page: dict[str, Any] = json.loads(resp.data)
            yield page
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return

    def _relist(self) -> None:
        items: dict[str, dict[str, Any]] = {}
        rv: str | None = None
        for page in self._pages():
            rv = (page.get("metadata") or {}).get("resourceVersion") or rv
            for obj in page.get("items") or []:
                items[object_key(obj)] = obj
        self.lists += 1
        for key in [k for k in self.store if k not in items]:
            self._apply("DELETED", key, None)
        for key, obj in items.items():
            if key not in self.store:
                self._apply("ADDED", key, obj)
            elif self._versions.get(key) != _rv(obj):
                self._apply("MODIFIED", key, obj)
        self.resource_version = rv
        self.synced.set()

    def _watch_once(self) -> bool:
        """One watch stream until it ends; True when it delivered anything (the server
        answered, so the next retry need not back off)."""
        from kubernetes import watch

        timeout = max(1, int(self.watch_timeout_s * (0.9 + 0.2 * self.rng.random())))
        # ``object``: events stay plain JSON (no typed models), and the client's 410 and
        # bookmark handling still runs (with deserialize=False it does not: an ERROR event
        # raises KeyError there). Naming the type also skips the client's model lookup,
        # which fails for kinds whose model names it mangles (ResourceClaim).
        w = watch.Watch(return_type=object)
        self._watch = w
        self.watches += 1
        delivered = False
        self._early = False
        began = time.monotonic()
        try:
            for ev in w.stream(
                self.list_fn,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout,
                _request_timeout=(5.0, timeout + 30.0),
                **self.selectors,
            ):
                if self._stop.is_set():
                    break
                delivered = True
                typ, obj = ev.get("type"), ev.get("object") or {}
                if typ == "ERROR":  # the client raises for these; kept for other versions
                    if obj.get("code") == 410:
                        raise Gone()
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                rv = _rv(obj)
                if typ in ("ADDED", "MODIFIED", "DELETED"):
                    self.events += 1
                    self._apply(str(typ), object_key(obj), obj if typ != "DELETED" else None)
                if rv:
                    self.resource_version = rv
        except Exception as exc:
            if getattr(exc, "status", None) == 410:
                raise Gone() from exc
            raise
        finally:
            self._watch = None
        ran = time.monotonic() - began
        self._early = not self._stop.is_set() and ran < 0.9 * timeout
        # A stream that ran a while (the server's timeout) is a healthy one, too.
        return delivered or ran > 1.0

    def _apply(self, typ: str, key: str, obj: dict[str, Any] | None) -> None:
        old = self.store.get(key)
        if obj is None:
            self.store.pop(key, None)
            self._versions.pop(key, None)
            new = None
        else:
            new = self.transform(obj)
            self.store[key] = new
            self._versions[key] = _rv(obj)
        if self.on_event is not None:
            try:
                self.on_event(typ, key, old, new)
            except Exception:  # a handler's bug must not stop the cache
                log.exception("informer %s: handler failed for %s %s", self.name, typ, key)
