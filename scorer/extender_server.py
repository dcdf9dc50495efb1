"""The extender's HTTP routes on the project's one HTTP stack (driver/plumbing/http_transport.py).

``POST <prefix>/filter`` and ``POST <prefix>/prioritize`` take kube-scheduler's
ExtenderArgs (any path ending in the verb, so a ``urlPrefix`` with a path works);
``GET /healthz`` (the loop runs), ``GET /readyz`` (200 once the informers listed, else 503
with the kinds still waiting), ``GET /metrics`` (calls and their seconds per verb, graph
fetches). A call answered from the warm caches (no search, no wait) runs on the event
loop; any other in a worker thread, so probes never wait behind it. Answers of a
kept-alive connection go out in request order.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from driver.plumbing.http_transport import HttpTransport, Limits, Reply, Request

from .extender import Extender, WouldWait, filter_error

log = logging.getLogger(__name__)

#: The extender's POST endpoints (kube-scheduler's filterVerb and prioritizeVerb).
VERBS = ("filter", "prioritize")
JSON = b"application/json"
#: ExtenderArgs with 5,000 whole Node objects (nodeCacheCapable: false) fit.
MAX_BODY = 64 << 20
#: Larger bodies (whole Node objects: 2.7 MB at N=1000) are parsed in a worker, never on
#: the event loop; 5,000 node names are ~70 KB.
QUICK_MAX_BODY = 256 << 10


class ExtenderServer(HttpTransport):
    """``toposlice scorer serve``'s server. ``ready`` says whether the caches are filled."""

    def __init__(
        self,
        addr: str,
        ext: Extender,
        *,
        ready: Callable[[], tuple[bool, str]] | None = None,
        limits: Limits | None = None,
        workers: int = 4,
    ) -> None:
        super().__init__(
            addr,
            limits or Limits(max_body_bytes=MAX_BODY, header_timeout=30.0),
            thread_name="toposlice-scorer-http",
            workers=workers,
        )
        self.ext = ext
        self.ready = ready or (lambda: (True, "ok"))
        self.registry = CollectorRegistry()
        self.seconds = Histogram(
            "toposlice_extender_call_seconds",
            "Time to answer one extender call, by verb",
            ["verb"],
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=self.registry,
        )
        self.registry.register(_Live(self))

    def respond(self, req: Request) -> Reply:
        path, keep = req.path, req.keep_alive
        verb = path.rstrip("/").rsplit("/", 1)[-1]
        if path in ("/healthz", "/readyz", "/metrics"):
            if req.method not in (b"GET", b"HEAD"):
                return self.text(
                    path, 405, b"method not allowed\n", keep, False, b"Allow: GET, HEAD\r\n"
                )
            if path == "/healthz":
                return self._json(path, 200, {"status": "ok"}, keep, req.head_only)
            if path == "/readyz":
                ok, why = self.ready()
                return self._json(path, 200 if ok else 503, {"status": why}, keep, req.head_only)
            body = generate_latest(self.registry)
            return self.response(path, 200, CONTENT_TYPE_LATEST.encode(), body, keep, req.head_only)
        if verb not in VERBS:
            return self._json("other", 404, {"error": "not found"}, keep, req.head_only)
        if req.method != b"POST":
            use_post = {"error": "use POST with ExtenderArgs"}
            return self._json(verb, 405, use_post, keep, req.head_only, b"Allow: POST\r\n")
        if not req.body:
            return self._json(verb, 400, {"error": "missing body"}, keep)
        if len(req.body) <= QUICK_MAX_BODY:
            answer = self._call(verb, req.body, quick=True)
            if answer is not None:
                return self.response(verb, answer[0], JSON, answer[1], keep, False)
        fut = self.in_worker(self._call, verb, req.body)
        out = self.loop.create_future() if self.loop else None
        assert out is not None

        def done(f: Any) -> None:
            try:
                status, body = f.result()
                out.set_result(self.response(verb, status, JSON, body, keep, False))
            except Exception as exc:  # _call catches; this is the last line of defence
                out.set_exception(exc)

        fut.add_done_callback(done)
        return out

    def _call(self, verb: str, raw: bytes, quick: bool = False) -> tuple[int, bytes] | None:
        """(status, JSON answer) for one verb, in a worker thread. ``quick``: on the event
        loop, from what the caches hold at once (a warm verdict table: no search, no wait
        for the informers), sparing the call two thread handoffs; None when it needs the
        worker (:class:`~scorer.extender.WouldWait`)."""
        t0 = time.perf_counter()
        try:
            args = json.loads(raw)
            if not isinstance(args, dict):
                raise ValueError("ExtenderArgs must be a JSON object")
        except ValueError as exc:
            return 400, _dumps({"error": f"bad ExtenderArgs: {exc}"})
        answered = True
        try:
            if verb == "filter":
                return 200, self.ext.filter_json(args, quick)
            return 200, self.ext.prioritize_json(args, quick)
        except WouldWait:
            answered = False  # the worker's call is the one timed
            return None
        except Exception as exc:  # a bad pod or graph must not kill the server
            log.exception("extender %s failed", verb)
            return (200, _dumps(filter_error(str(exc)))) if verb == "filter" else (500, b"[]")
        finally:
            if answered:
                self.seconds.labels(verb).observe(time.perf_counter() - t0)

    def _json(
        self,
        route: str,
        status: int,
        body: Any,
        keep: bool,
        head_only: bool = False,
        extra: bytes = b"",
    ) -> bytes:
        return self.response(route, status, JSON, _dumps(body), keep, head_only, extra)


def _dumps(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


#: Seconds between moves of the collector's survivors into its permanent generation.
FREEZE_EVERY_S = 30.0


def serve(server: ExtenderServer, freeze_every_s: float = FREEZE_EVERY_S) -> None:
    """Block while ``server`` runs; every ``freeze_every_s``, and as soon as a burst of
    graph fetches is done, move the objects that survived so far out of the cyclic
    garbage collector's reach (``gc.freeze``).

    Why: the caches (1,000 nodes' views, verdict tables, search results) are long-lived
    and acyclic; a full collection walking them took 80 ms of CPU at N=1000 (0.3-0.9 s
    wall on a loaded 2-core machine), a pause any call could land in. The graphs of a
    starting scorer arrive within seconds, just when the first calls of every request
    shape come (bench/extender.py's cold phase saw an 80-125 ms collection there before
    this froze them at once). Frozen objects are still freed by reference counting when
    replaced; only reference cycles alive at a freeze would stay, and the caches hold
    none."""
    import gc

    graphs = server.ext.cluster.graphs
    gc.freeze()
    last, fetched = time.monotonic(), graphs.stats.fetched
    while server._thread is not None and server._thread.is_alive():
        server._thread.join(1.0)
        now = time.monotonic()
        settled = graphs.stats.fetched != fetched and graphs.idle()
        if settled or now - last >= freeze_every_s:
            gc.freeze()
            last, fetched = now, graphs.stats.fetched


class _Live(Collector):
    """Counters read at scrape time: searches, graph fetches, informer state."""

    def __init__(self, server: ExtenderServer) -> None:
        self.server = server

    def collect(self) -> Iterable[Metric]:
        ext = self.server.ext
        searches = CounterMetricFamily(
            "toposlice_extender_searches", "Node searches run (placement cache misses)"
        )
        searches.add_metric([], float(ext.searches))
        yield searches
        st = ext.cluster.graphs.stats
        fetches = CounterMetricFamily(
            "toposlice_extender_graph_requests",
            "Requests to nodes' /v1/topology, by result (background, never per call)",
            labels=["result"],
        )
        for result, n in (
            ("fetched", st.fetched),
            ("not_modified", st.not_modified),
            ("failed", st.failed),
        ):
            fetches.add_metric([result], float(n))
        yield fetches
        graphs = GaugeMetricFamily("toposlice_extender_graphs", "Nodes with a topology graph")
        graphs.add_metric([], float(len(ext.cluster.graphs.nodes())))
        yield graphs
        lists = CounterMetricFamily(
            "toposlice_extender_informer_lists", "LISTs by informer", labels=["kind"]
        )
        watches = CounterMetricFamily(
            "toposlice_extender_informer_watches", "WATCH requests by informer", labels=["kind"]
        )
        for inf in ext.cluster.informers:
            lists.add_metric([inf.name], float(inf.lists))
            watches.add_metric([inf.name], float(inf.watches))
        yield lists
        yield watches
