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
(``rewatch_delay_s``, doubling while streams keep ending early), not at once. There is no
periodic LIST.

Only ``410 Gone`` (the version left the server's window) fetches the whole state again,
once. A restarted API server starts its watch cache at etcd's current revision, so a
watch older than that gets 410 after every API-server restart. The state comes back as a
streaming list where the server has one (WatchList, on by default since 1.34): a WATCH
with ``sendInitialEvents=true`` and ``resourceVersionMatch=NotOlderThan`` the last version
seen, whose ADDED events up to a BOOKMARK annotated ``k8s.io/initial-events-end`` are the
state, and which then goes on as the watch: one request where LIST + WATCH are two. A
server that refuses the parameters (400/422: the feature off), ignores them (it answers
410 again, or sends no such bookmark within ``initial_events_timeout_s``) gets LIST +
WATCH, for the rest of the informer's life; the first sync is always a paged LIST (it
works against every server, and a start is within the fleet's target with it). Both
paths are counted against the real API server in tests/e2e/test_driver_watch.py and
tests/e2e/test_scorer_informers.py.

When the server went away (connections refused, or the open stream cut: an API-server
restart; not a timeout), the informer does not send its retry the moment the port opens
again: a just-started kube-apiserver listens before it handles requests, holds those it
gets, answers them all at once when it starts, some 403 (its RBAC authorizer not synced
yet), and goes on answering 403 for a moment. On v1.36.2, idle, requests sent up to
1.5-1.8 s after the port opened were held and some of them answered 403. A restarted
server's old process keeps its watches open while it drains (3 s here) after it stopped
listening, so the cut stream may come after the new one listens: a fleet of 20 drivers
that waited only after a refusal met the 403 20 times in 20 (docs/performance.md). With
``server`` (its URL) given, after the backoff the informer checks with a bare TCP
connect, no request, that the port accepts (every ``probe_s``, jittered, at most
``backoff_max`` in all), then waits ``settle_s`` (jittered, 0.75-1.25x) before the
request. After a timeout (a server that accepts and does not answer) it does not wait.

Objects are kept as ``transform(obj)`` (what the reader needs, not 16 KB of slice) under
``namespace/name`` (``name`` for cluster-scoped kinds); ``on_event(type, key, old, new)``
runs on the informer's thread for every change, relist differences included.
"""

from __future__ import annotations

import json
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

log = logging.getLogger("driver.informer")

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


#: The annotation on the BOOKMARK that ends a streaming list's initial events.
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


class Gone(Exception):
    """410: the resourceVersion is older than the server keeps; list again."""


class NoStreamingList(Exception):
    """The server does not stream lists (refused or ignored ``sendInitialEvents``)."""


def timed_out(exc: BaseException) -> bool:
    """True when ``exc`` (a request's failure) is a timeout: the server accepted and did
    not answer in time, as opposed to a refused or cut connection (it went away)."""
    from urllib3.exceptions import NewConnectionError
    from urllib3.exceptions import TimeoutError as Urllib3Timeout

    seen: set[int] = set()
    cur: BaseException | None = exc
    timeout = False
    while cur is not None and id(cur) not in seen:
        # urllib3's NewConnectionError (a refused connection) is a ConnectTimeoutError.
        if isinstance(cur, NewConnectionError | ConnectionError):
            return False
        timeout = timeout or isinstance(cur, TimeoutError | Urllib3Timeout)
        seen.add(id(cur))
        reason = getattr(cur, "reason", None)  # urllib3's MaxRetryError and friends
        cur = reason if isinstance(reason, BaseException) else (cur.__cause__ or cur.__context__)
    return timeout


def accepts_connections(url: str, timeout: float = 1.0) -> bool:
    """Whether the server at ``url`` accepts a TCP connection (closed at once: no TLS, no
    request, nothing an audit log or a request counter sees)."""
    parts = urlsplit(url)
    if not parts.hostname:
        return False
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


class Informer(Generic[T]):
    """The cache of one resource kind; :meth:`start` runs it in a daemon thread.

    ``list_fn`` is a typed list call of the kubernetes client (``CoreV1Api.list_node``,
    ``ResourceV1Api.list_resource_slice``, ...): it takes ``limit``, ``_continue``,
    ``watch``, ``resource_version``, ``allow_watch_bookmarks`` and ``timeout_seconds``.
    ``selectors``: extra arguments for every call (``field_selector=...``).
    ``stream_lists``: fetch the state again after a 410 by a streaming list (falls back
    to LIST + WATCH by itself). ``server``: the API server's URL, for the TCP check and
    the settle before a retry after the server went away (neither without it).
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
        stream_lists: bool = True,
        initial_events_timeout_s: float = 30.0,
        server: str | None = None,
        probe_s: float = 0.5,
        settle_s: float = 3.0,
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
        self.stream_lists = stream_lists
        self.initial_events_timeout_s = initial_events_timeout_s
        self.server = server
        self.probe_s = probe_s
        self.settle_s = settle_s
        self.store: dict[str, T] = {}
        self._versions: dict[str, str | None] = {}
        self.resource_version: str | None = None
        self.synced = threading.Event()
        """Set once the first LIST is in the cache."""
        self.lists = 0
        """LIST requests that filled the cache (pages of one LIST count once)."""
        self.streamed = 0
        """Streaming lists that filled the cache (each one a WATCH, counted in watches)."""
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
        self._no_streaming = ""
        """Why the server was found not to stream lists ("" while it may)."""
        self._abandoned = False
        """The initial events' timer closed the stream: no end bookmark came in time."""

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
                if self.resource_version is None and not self._streaming():
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
            except NoStreamingList as exc:
                self._no_streaming = str(exc)
                log.info("informer %s: %s; LIST + WATCH from now on", self.name, exc)
                continue
            except Exception as exc:
                from driver.plumbing.kube import failure

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
                if fail.status is None and self.server and not timed_out(exc):
                    self._await_server()

    def _expired(self) -> None:
        self._list_from = self.resource_version
        self.resource_version = None

    def _streaming(self) -> bool:
        """Whether the state is to come back by a streaming list (a relist after a 410,
        with a server not known to lack them) rather than a LIST."""
        return self.stream_lists and self._list_from is not None and not self._no_streaming

    def _await_server(self) -> None:
        """After the server went away: until its port accepts connections (checked every
        ``probe_s``, jittered, for at most ``backoff_max``), then ``settle_s`` more, so
        the retry does not reach an API server still syncing its authorizer. A check
        that never passes (a proxy in between) costs at most ``backoff_max``: the request
        goes out anyway."""
        assert self.server is not None
        deadline = time.monotonic() + self.backoff_max
        while not accepts_connections(self.server):
            if self._stop.is_set() or time.monotonic() >= deadline:
                return
            self._stop.wait(self.probe_s * (0.5 + 0.5 * self.rng.random()))
        self._stop.wait(self.settle_delay())

    def settle_delay(self) -> float:
        """Seconds between a server that went away accepting connections again and the
        retry."""
        return self.settle_s * (0.75 + 0.5 * self.rng.random())

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
        self._replace(items, rv)

    def _replace(self, items: dict[str, dict[str, Any]], rv: str | None) -> None:
        """The cache becomes ``items`` (a LIST's or a streaming list's), at ``rv``: the
        differences go to ``on_event`` as DELETED, ADDED and MODIFIED."""
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
        answered, so the next retry need not back off). Without a resourceVersion (a
        relist after a 410) it is a streaming list: its initial events are gathered, and
        replace the cache at the end bookmark, before the stream goes on as a watch."""
        from kubernetes import watch

        timeout = max(1, int(self.watch_timeout_s * (0.9 + 0.2 * self.rng.random())))
        initial = self.resource_version is None
        args: dict[str, Any] = dict(self.selectors)
        if initial:
            args.update(
                resource_version=self._list_from,
                resource_version_match="NotOlderThan",
                send_initial_events=True,
            )
        else:
            args["resource_version"] = self.resource_version
        pending: dict[str, dict[str, Any]] = {}
        # ``object``: events stay plain JSON (no typed models), and the client's 410 and
        # bookmark handling still runs (with deserialize=False it does not: an ERROR event
        # raises KeyError there). Naming the type also skips the client's model lookup,
        # which fails for kinds whose model names it mangles (ResourceClaim).
        w = watch.Watch(return_type=object)
        self._watch = w
        self.watches += 1
        delivered = False
        self._early = False
        self._abandoned = False
        timer: threading.Timer | None = None
        if initial:
            timer = threading.Timer(self.initial_events_timeout_s, self._abandon, (w,))
            timer.daemon = True
            timer.start()
        began = time.monotonic()
        try:
            for ev in w.stream(
                self.list_fn,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout,
                _request_timeout=(5.0, timeout + 30.0),
                **args,
            ):
                if self._stop.is_set() or self._abandoned:
                    break
                delivered = True
                typ, obj = ev.get("type"), ev.get("object") or {}
                if typ == "ERROR":  # the client raises for these; kept for other versions
                    if obj.get("code") == 410:
                        raise Gone()
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                rv = _rv(obj)
                if initial:
                    annotations = (obj.get("metadata") or {}).get("annotations") or {}
                    if typ == "BOOKMARK" and annotations.get(INITIAL_EVENTS_END) == "true":
                        if timer is not None:
                            timer.cancel()
                        initial = False
                        self.streamed += 1
                        self._replace(pending, rv)
                    elif typ in ("ADDED", "MODIFIED"):
                        self.events += 1
                        pending[object_key(obj)] = obj
                    elif typ == "DELETED":
                        self.events += 1
                        pending.pop(object_key(obj), None)
                    continue  # no resourceVersion counts before the end bookmark
                if typ in ("ADDED", "MODIFIED", "DELETED"):
                    self.events += 1
                    self._apply(str(typ), object_key(obj), obj if typ != "DELETED" else None)
                if rv:
                    self.resource_version = rv
        except Exception as exc:
            status = getattr(exc, "status", None)
            if initial and not self._stop.is_set():
                if self._abandoned:
                    raise NoStreamingList(self._abandon_reason()) from exc
                if status == 410 or isinstance(exc, Gone):
                    # NotOlderThan is never too old: the server ignored the parameters.
                    raise NoStreamingList("a streaming list answered 410 Gone") from exc
                if status in (400, 422):  # refused them: WatchList is off there
                    why = f"the server refused a streaming list ({status})"
                    raise NoStreamingList(why) from exc
            if status == 410:
                raise Gone() from exc
            raise
        finally:
            if timer is not None:
                timer.cancel()
            self._watch = None
        ran = time.monotonic() - began
        self._early = not self._stop.is_set() and ran < 0.9 * timeout
        if initial and not self._stop.is_set() and (self._abandoned or not self._early):
            # Its whole timeout (or the timer's) and no end bookmark: not a streaming list.
            raise NoStreamingList(self._abandon_reason())
        # A stream that ran a while (the server's timeout) is a healthy one, too.
        return delivered or ran > 1.0

    def _abandon(self, w: Any) -> None:
        """The initial events' timer: close the stream that brought no end bookmark."""
        self._abandoned = True
        w.stop()
        resp = getattr(w, "_resp", None)
        if resp is not None:
            try:
                resp.close()
            except Exception:  # already closed by the reading thread
                pass

    def _abandon_reason(self) -> str:
        return (
            f"no {INITIAL_EVENTS_END} bookmark within {self.initial_events_timeout_s:g}s"
            " of a streaming list"
        )

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
