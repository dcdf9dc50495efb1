"""Node graphs for the extender, kept current in the background and read without I/O.

A call to the extender only looks graphs up here (:meth:`GraphSource.topology`); nothing
on that path touches the network, so a slow or dead node endpoint costs the call nothing:
that node simply has no graph (yet) and is filtered out with the reason.

Graphs come from fixed documents (``--graph``/``--fake``) and/or each node's exporter
(``/v1/topology`` through a URL template, ``{node}`` = name, ``{address}`` = InternalIP).
:meth:`GraphSource.want` asks for a (re)validation, which the cluster cache does when a
node appears, its address changes or its ResourceSlices change (new hardware, a
restarted driver): never per call, never on a timer. Fetches run on a bounded pool of
worker threads over kept-alive connections (urllib3), revalidated by ETag /
If-None-Match (a 304 is a few hundred bytes) and gzip-encoded; a failure is retried
with capped, jittered backoff while the last good graph stays in use.
"""

from __future__ import annotations

import heapq
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .topology import GRAPH_SCHEMA, NodeTopology, from_graph

log = logging.getLogger(__name__)


@dataclass
class FetchStats:
    """What the background fetches did (the bench and /metrics read these)."""

    requests: int = 0
    fetched: int = 0
    not_modified: int = 0
    failed: int = 0


@dataclass
class _Entry:
    url: str
    etag: str | None = None
    topology: NodeTopology | None = None
    failures: int = 0
    error: str = ""


class GraphSource:
    """Node name -> scoring view, from fixed graphs and background fetches."""

    def __init__(
        self,
        static: dict[str, dict[str, Any]] | None = None,
        url_template: str | None = None,
        *,
        workers: int = 8,
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 5.0,
        retry_base_s: float = 1.0,
        retry_max_s: float = 60.0,
        rng: random.Random | None = None,
        on_change: Callable[[str], None] | None = None,
    ) -> None:
        self._static = {name: _view(g) for name, g in (static or {}).items()}
        self.url_template = url_template
        self.workers = workers
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.retry_base_s = retry_base_s
        self.retry_max_s = retry_max_s
        self.rng = rng or random.Random()
        self.on_change = on_change
        self.stats = FetchStats()
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Condition()
        self._ready: list[str] = []
        """Nodes to fetch now (FIFO), each at most once (``_queued``)."""
        self._queued: set[str] = set()
        self._again: set[str] = set()
        """Asked for again while its fetch ran: fetch once more after it."""
        self._running: set[str] = set()
        self._later: list[tuple[float, str]] = []
        """(due, node) retries after failures."""
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._http: Any = None
        self._parse = threading.Lock()
        """One fetch worker at a time turns a body into a view (CPU under the GIL):
        eight at once gain nothing and make a call wait its turn behind each of them."""

    # -- reads (the extender's path: no I/O, no locks) -------------------------------------

    def topology(self, node: str) -> NodeTopology | None:
        view = self._static.get(node)
        if view is not None:
            return view
        entry = self._entries.get(node)
        return entry.topology if entry is not None else None

    def why_missing(self, node: str) -> str:
        entry = self._entries.get(node)
        if entry is None:
            return "no topology graph for this node"
        if entry.error:
            return f"no topology graph for this node yet ({entry.error})"
        return "no topology graph for this node yet (fetching)"

    @property
    def needs_address(self) -> bool:
        return bool(self.url_template and "{address}" in self.url_template)

    def nodes(self) -> list[str]:
        return sorted(set(self._static) | {n for n, e in self._entries.items() if e.topology})

    # -- what the cluster cache calls ------------------------------------------------------

    def want(self, node: str, address: str | None) -> None:
        """(Re)validate ``node``'s graph in the background (no-op for fixed graphs)."""
        if node in self._static or not self.url_template:
            return
        url = self.url_template.format(node=node, address=address or node)
        with self._lock:
            entry = self._entries.get(node)
            if entry is None:
                self._entries[node] = _Entry(url)
            elif entry.url != url:
                entry.url, entry.etag = url, None
            if node in self._running:
                self._again.add(node)
            elif node not in self._queued:
                self._queued.add(node)
                self._ready.append(node)
                self._lock.notify()

    def forget(self, node: str) -> None:
        with self._lock:
            self._entries.pop(node, None)

    # -- workers ---------------------------------------------------------------------------

    def start(self) -> GraphSource:
        if not self.url_template or self._threads:
            return self
        import urllib3

        self._http = urllib3.PoolManager(
            # One pool per node address; kept connections serve a burst of revalidations
            # (the exporters close idle ones after 30 s).
            num_pools=max(64, self.workers * 4),
            maxsize=self.workers,
            retries=False,
            timeout=urllib3.Timeout(connect=self.connect_timeout_s, read=self.read_timeout_s),
        )
        for i in range(self.workers):
            t = threading.Thread(target=self._work, name=f"graph-fetch-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        for t in self._threads:
            t.join(1.0)

    def idle(self) -> bool:
        """No fetch queued or running (retries scheduled later do not count)."""
        with self._lock:
            return not self._ready and not self._running

    def _next(self) -> str | None:
        with self._lock:
            while not self._stop.is_set():
                now = time.monotonic()
                while self._later and self._later[0][0] <= now:
                    _, node = heapq.heappop(self._later)
                    if node in self._entries and node not in self._queued:
                        self._queued.add(node)
                        self._ready.append(node)
                if self._ready:
                    node = self._ready.pop(0)
                    self._queued.discard(node)
                    self._running.add(node)
                    return node
                wait = self._later[0][0] - now if self._later else 1.0
                self._lock.wait(min(max(wait, 0.01), 1.0))
            return None

    def _work(self) -> None:
        while True:
            node = self._next()
            if node is None:
                return
            try:
                self._fetch(node)
            except Exception:  # never lose a worker
                log.exception("graph fetch for %s failed", node)
            finally:
                with self._lock:
                    self._running.discard(node)
                    if node in self._again:
                        self._again.discard(node)
                        if node not in self._queued:
                            self._queued.add(node)
                            self._ready.append(node)
                            self._lock.notify()

    def _fetch(self, node: str) -> None:
        entry = self._entries.get(node)
        if entry is None:
            return
        headers = {"Accept": "application/json", "Accept-Encoding": "gzip"}
        if entry.etag and entry.topology is not None:
            headers["If-None-Match"] = entry.etag
        self.stats.requests += 1
        try:
            resp = self._http.request("GET", entry.url, headers=headers, preload_content=True)
            if resp.status == 304 and entry.topology is not None:
                self.stats.not_modified += 1
                self._ok(node, entry)
                return
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}")
            with self._parse:
                graph = json.loads(resp.data)
                if not isinstance(graph, dict) or graph.get("schema") != GRAPH_SCHEMA:
                    raise ValueError(f"not a {GRAPH_SCHEMA} document")
                view = _view(graph)
                if view.name != node:  # the exporter names its node; the scheduler's wins
                    view = _view({**graph, "node": node})
        except Exception as exc:
            self.stats.failed += 1
            entry.failures += 1
            entry.error = _reason(exc)
            delay = min(self.retry_max_s, self.retry_base_s * 2 ** min(entry.failures - 1, 20))
            delay *= 0.5 + 0.5 * self.rng.random()
            log.warning("node %s: graph from %s: %s; retry in %.0fs", node, entry.url, exc, delay)
            with self._lock:
                heapq.heappush(self._later, (time.monotonic() + delay, node))
                self._lock.notify()
            return
        self.stats.fetched += 1
        entry.etag = resp.headers.get("ETag")
        entry.topology = view  # the swap the extender sees: one reference assignment
        self._ok(node, entry)
        if self.on_change is not None:
            self.on_change(node)

    def _ok(self, node: str, entry: _Entry) -> None:
        entry.failures = 0
        entry.error = ""


def _view(graph: dict[str, Any]) -> NodeTopology:
    """The scoring view without the document it came from: 1,000 parsed graphs are
    millions of objects the garbage collector would walk, and scoring needs none of it."""
    view = from_graph(graph)
    view.graph = {}
    return view


def _reason(exc: BaseException) -> str:
    cause: BaseException = exc
    while getattr(cause, "reason", None) is not None and isinstance(cause.reason, BaseException):  # type: ignore[attr-defined]
        cause = cause.reason  # type: ignore[attr-defined]
    text = str(cause)
    return text if len(text) < 120 else text[:117] + "..."
