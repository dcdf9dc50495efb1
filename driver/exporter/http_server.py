"""The exporter's routes: probes, the exporter endpoints, ``/metrics`` and the page.

Routes (GET and HEAD; anything else 405 with ``Allow``; unknown paths 404):

``/healthz``            200 while the server's event loop runs.
``/readyz``             200 when ready (``run``: registered with the kubelet and the publisher
                        synced; ``serve``: first discovery done), else 503 with the reason.
``/v1/topology``        ``toposlice.graph/v1`` plus ``attrs.dra`` identities on device vertices;
                        ``?format=dot`` for Graphviz. ETag / If-None-Match -> 304; gzip.
``/v1/inventory``       the inventory (``toposlice.inventory/v1``), degraded links as warnings.
``/v1/normalization``   the cross-driver report (``toposlice.normalization/v1``).
``/metrics``            Prometheus text format from :class:`~driver.exporter.metrics.DriverMetrics`.
``/``                   the HTML page (driver/exporter/page.py).

Lifecycle::

    server = HttpServer("0.0.0.0:8080", view, metrics)   # nothing bound yet
    server.start()        # binds (SO_REUSEADDR) in the caller, serves from a daemon thread
    server.publish(snap)  # after each discovery: pre-render and swap (any thread)
    server.publish(normalization=report)                  # observe mode: new report
    server.stop()         # closes the listener and every connection, joins the thread

Every response body is rendered once per snapshot (JSON, its gzip, the ETag, the DOT text)
and swapped in with one reference assignment; a request only picks prepared bytes. If the
daemon never calls :meth:`HttpServer.publish`, a one-second timer notices a new
``view.snapshot()`` and renders it in a worker thread. The page depends on allocations and
health too and is re-rendered when those change.

Connections, limits and framing are the project's one HTTP stack
(driver/plumbing/http_transport.py, shared with the scorer's extender): ~20 µs of Python per
request, so the GIL held by a discovery running in another thread, not the server, sets
the tail latency (see docs/exporter.md).
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from discovery.model import Inventory
from driver.exporter.links import degraded_link_warnings
from driver.exporter.metrics import DeviceInfo, DriverMetrics
from driver.exporter.page import Mark, render_page
from driver.interfaces import DeviceHealth, ExporterView
from driver.plumbing.http_transport import HttpTransport, Limits, Request, parse_addr
from normalize.crossdriver import NormalizationReport, empty_report, with_dra_identities
from normalize.snapshot import Snapshot

log = logging.getLogger("driver.http_server")

ROUTES = (
    "/",
    "/healthz",
    "/readyz",
    "/metrics",
    "/v1/topology",
    "/v1/inventory",
    "/v1/normalization",
)
ALLOW = b"GET, HEAD"
JSON = b"application/json"
_KEEP: Any = object()


@dataclass(frozen=True)
class Resource:
    """One immutable representation of an endpoint: identity and gzip bodies, ETags."""

    body: bytes
    content_type: bytes
    etag: bytes
    gz: bytes | None = None

    @classmethod
    def of(cls, body: bytes, content_type: bytes, compress: bool = True) -> Resource:
        digest = hashlib.sha256(body).hexdigest()[:32].encode()
        gz = gzip.compress(body, 6, mtime=0) if compress and len(body) > 512 else None
        return cls(body=body, content_type=content_type, etag=b'"' + digest + b'"', gz=gz)

    @property
    def gz_etag(self) -> bytes:
        return self.etag[:-1] + b'-gz"'


@dataclass(frozen=True)
class Rendered:
    """Everything served for one (snapshot, normalization report) pair."""

    snapshot: Snapshot | None
    report: NormalizationReport
    doc: dict[str, Any] | None
    topology: Resource | None
    dot: Resource | None
    inventory: Resource | None
    normalization: Resource
    inventory_dict: dict[str, Any] | None = None

    def same_content(self, snap: Snapshot, report: NormalizationReport) -> bool:
        """True when ``snap`` would render to the same bytes (a rediscovery that found the
        same hardware): then only the snapshot reference is swapped, nothing re-rendered."""
        return (
            self.snapshot is not None
            and report is self.report
            and snap.node_name == self.snapshot.node_name
            and snap.graph == self.snapshot.graph
            and snap.vertex_devices == self.snapshot.vertex_devices
            and snap.inventory.to_dict() == self.inventory_dict
        )


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


DotRenderer = Callable[[dict[str, Any]], str]


def render(
    snap: Snapshot | None,
    report: NormalizationReport | None,
    publishes: bool = True,
    dot: DotRenderer | None = None,
) -> Rendered:
    """Pre-render every representation for ``snap`` (pure; any thread). ``dot`` renders
    the graph as Graphviz text (the CLI's renderer; driver/ cannot import toposlice/)."""
    report = report or empty_report(snap.node_name if snap else None, snap)
    norm = Resource.of(_json(report.to_dict()), JSON)
    if snap is None:
        return Rendered(None, report, None, None, None, None, norm)
    own = (
        {v: name for v, name in snap.vertex_devices.items() if name not in report.withheld}
        if publishes
        else None
    )
    doc = with_dra_identities(snap.graph, own, report.identities())
    inv = snap.inventory.to_dict()
    extra = [w for w in degraded_link_warnings(snap.inventory) if w not in inv["warnings"]]
    if extra:
        inv = {**inv, "warnings": [*inv["warnings"], *extra]}
    return Rendered(
        snapshot=snap,
        report=report,
        doc=doc,
        topology=Resource.of(_json(doc), JSON),
        dot=Resource.of(dot(doc).encode(), b"text/vnd.graphviz; charset=utf-8") if dot else None,
        inventory=Resource.of(_json(inv), JSON),
        normalization=norm,
        inventory_dict=snap.inventory.to_dict() if extra else inv,
    )


def device_infos(rendered: Rendered) -> list[DeviceInfo]:
    """The ``toposlice_device_info`` series: one per DRA identity of a device vertex."""
    if rendered.doc is None:
        return []
    out: list[DeviceInfo] = []
    for v in rendered.doc["vertices"]:
        if v["kind"] not in ("gpu", "nic", "cpu_group", "nvswitch"):
            continue
        a = v["attrs"]
        kind = "cpu" if v["kind"] == "cpu_group" else v["kind"]
        numa = a.get("numa_node")
        base = DeviceInfo(
            vertex=v["id"],
            kind=kind,
            vendor=str(a.get("vendor") or ""),
            model=str(a.get("model") or ""),
            bus_id=str(a.get("bus_id") or ""),
            pcie_root=str(a.get("pcie_root") or ""),
            numa_node="" if numa is None else str(numa),
        )
        for ident in a.get("dra") or [{}]:
            out.append(
                replace(
                    base,
                    driver=ident.get("driver", ""),
                    pool=ident.get("pool", ""),
                    device=ident.get("device", ""),
                )
            )
    return out


def _etag_match(header: bytes, etag: bytes) -> bool:
    if header == etag or header == b"*":
        return True
    for part in header.split(b","):
        tag = part.strip()
        if tag.startswith(b"W/"):
            tag = tag[2:]
        if tag == etag:
            return True
    return False


def _wants_gzip(header: bytes | None) -> bool:
    if not header or b"gzip" not in header:
        return False
    for part in header.lower().split(b","):
        name, _, params = part.strip().partition(b";")
        if name.strip() in (b"gzip", b"*"):
            q = params.strip()
            return not (q.startswith(b"q=0") and q.rstrip(b"0.") in (b"q=", b"q"))
    return False


__all__ = ["HttpServer", "Limits", "Rendered", "Resource", "parse_addr", "render"]


class HttpServer(HttpTransport):
    """The exporter over an :class:`~driver.interfaces.ExporterView`, in its own thread.

    ``addr``: ``host:port`` (``:port`` = all interfaces; port 0 picks one, see
    :attr:`address`). ``metrics``: the daemon's :class:`DriverMetrics` (one is made if
    None). ``ready``: overrides the readiness rule (returns ``(ready, reason)``); by default
    ready = snapshot present and ``view.status()`` registered and publisher synced.
    ``publishes``: whether toposlice's own DRA identities are real (False for ``serve``).
    ``dot``: Graphviz renderer for ``?format=dot`` (``toposlice.render.graph_to_dot``;
    without one that format answers 404).
    """

    def __init__(
        self,
        addr: str,
        view: ExporterView,
        metrics: DriverMetrics | None = None,
        *,
        ready: Callable[[], tuple[bool, str]] | None = None,
        publishes: bool = True,
        limits: Limits | None = None,
        dot: DotRenderer | None = None,
    ) -> None:
        super().__init__(addr, limits, thread_name="toposlice-http", workers=1)
        self.dot = dot
        self.view = view
        self.metrics = metrics if metrics is not None else DriverMetrics()
        self.publishes = publishes
        self._ready = ready
        self._rendered = render(None, None, publishes, dot)
        self._recent: list[Snapshot] = []
        self._render_lock = threading.Lock()
        self._page: tuple[Any, bytes] | None = None
        self._pending = False
        self.metrics.add_live(self._live_metrics)

    def _before_serving(self) -> None:
        snap = self.view.snapshot()
        if snap is not None:
            self.publish(snap)

    def on_started(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.call_later(1.0, self._watch)

    # ---- publishing ----------------------------------------------------------------------

    def publish(
        self, snapshot: Snapshot | None = None, normalization: NormalizationReport | None = _KEEP
    ) -> None:
        """Render ``snapshot`` (default: ``view.snapshot()``) and, when given, a new
        cross-driver report; swap them in for every later request. Call from any thread."""
        with self._render_lock:
            snap = snapshot if snapshot is not None else self.view.snapshot()
            report = self._rendered.report if normalization is _KEEP else normalization
            prev = self._rendered
            if snap is not None and (report is None or report.node is None):
                # The empty report of "not observing" names the node; keep one object so
                # same_content() can tell nothing changed.
                old = prev.report
                empty = (
                    old.node == snap.node_name
                    and not old.matches
                    and not old.findings
                    and old.not_published == snap.dropped
                )
                report = old if empty else empty_report(snap.node_name, snap)
            if snap is not None and report is not None and prev.same_content(snap, report):
                self._rendered = replace(prev, snapshot=snap)
                self._recent = [snap, *self._recent[:1]]
                return
            rendered = render(snap, report, self.publishes, self.dot)
            self.metrics.set_topology(
                snap.inventory if snap is not None else Inventory(),
                device_infos(rendered),
                rendered.report.finding_counts(),
                rendered.report.device_counts(),
            )
            self._rendered = rendered  # the swap: one reference assignment
            if snap is not None:
                self._recent = [snap, *self._recent[:1]]

    @property
    def rendered(self) -> Rendered:
        return self._rendered

    def _watch(self) -> None:
        """Once a second: render a snapshot the daemon stored without calling publish()."""
        loop = self._loop
        if loop is None or not loop.is_running():
            return
        try:
            snap = self.view.snapshot()
            if snap is not None and not self._pending and not any(snap is s for s in self._recent):
                self._pending = True
                fut = loop.run_in_executor(self._pool, self.publish, snap)
                fut.add_done_callback(lambda _f: setattr(self, "_pending", False))
        except Exception:
            log.exception("watching the view for snapshots failed")
        loop.call_later(1.0, self._watch)

    # ---- responding ----------------------------------------------------------------------

    def respond(self, req: Request) -> bytes:
        path, keep, head_only = req.path, req.keep_alive, req.head_only
        if path not in ROUTES:
            return self.text("other", 404, b"not found\n", keep, head_only)
        if req.method not in (b"GET", b"HEAD"):
            return self.text(
                path, 405, b"method not allowed\n", keep, False, b"Allow: %s\r\n" % ALLOW
            )
        return self._route(path, req.query, req.if_none_match, req.accept_encoding, keep, head_only)

    def _route(
        self,
        path: str,
        query: str,
        inm: bytes | None,
        accept: bytes | None,
        keep: bool,
        head_only: bool,
    ) -> bytes:
        r = self._rendered
        if path == "/v1/topology":
            res = r.topology
            if query:
                fmt = parse_qs(query).get("format", ["json"])[-1]
                if fmt == "dot":
                    if r.dot is None and r.topology is not None:
                        return self.text(path, 404, b"no DOT renderer\n", keep, head_only)
                    res = r.dot
                elif fmt != "json":
                    return self.text(path, 400, b"format must be json or dot\n", keep, head_only)
            return self._resource(path, res, inm, accept, keep, head_only)
        if path == "/v1/inventory":
            return self._resource(path, r.inventory, inm, accept, keep, head_only)
        if path == "/v1/normalization":
            return self._resource(path, r.normalization, inm, accept, keep, head_only)
        if path == "/healthz":
            return self.text(path, 200, b"ok\n", keep, head_only)
        if path == "/readyz":
            ready, reason = self.readiness()
            text = (reason + "\n").encode()
            return self.text(path, 200 if ready else 503, text, keep, head_only)
        if path == "/metrics":
            body = self.metrics.exposition()
            gz = _wants_gzip(accept)
            if gz:
                body = gzip.compress(body, 1)
            extra = b"Content-Encoding: gzip\r\nVary: Accept-Encoding\r\n" if gz else b""
            ctype = CONTENT_TYPE_LATEST.encode()
            return self.response(path, 200, ctype, body, keep, head_only, extra)
        # "/"
        if r.doc is None:
            return self.text(path, 503, b"no discovery yet\n", keep, head_only)
        body = self._page_bytes(r)
        extra = b"Cache-Control: no-cache\r\n"
        return self.response(path, 200, b"text/html; charset=utf-8", body, keep, head_only, extra)

    def _resource(
        self,
        route: str,
        res: Resource | None,
        inm: bytes | None,
        accept: bytes | None,
        keep: bool,
        head_only: bool,
    ) -> bytes:
        if res is None:
            return self.text(route, 503, b"no discovery yet\n", keep, head_only)
        gz = res.gz is not None and _wants_gzip(accept)
        etag = res.gz_etag if gz else res.etag
        vary = b"Vary: Accept-Encoding\r\n" if res.gz is not None else b""
        if inm is not None and (_etag_match(inm, etag)):
            self.stats.count(route, 304)
            return self.head(
                304, None, None, close=not keep, extra=b"ETag: %s\r\n%s" % (etag, vary)
            )
        body = res.gz if gz and res.gz is not None else res.body
        extra = b"ETag: %s\r\n%s" % (etag, vary)
        if gz:
            extra += b"Content-Encoding: gzip\r\n"
        return self.response(route, 200, res.content_type, body, keep, head_only, extra)

    # ---- state for probes, the page and metrics -----------------------------------------

    def readiness(self) -> tuple[bool, str]:
        if self._ready is not None:
            return self._ready()
        if self.view.snapshot() is None:
            return False, "no discovery yet"
        st = self.view.status()
        if not st.registered:
            return False, "not registered with the kubelet" + (
                f": {st.last_error}" if st.last_error else ""
            )
        if not st.publisher_synced:
            return False, "ResourceSlices not synced" + (
                f": {st.last_error}" if st.last_error else ""
            )
        notes = [
            f"{key.replace('_', ' ')}: {st.details[key]}"
            for key in ("degraded", "yielded", "double_published")
            if st.details.get(key)
        ]
        return True, ", ".join(["ok", *notes])

    def marks(self, r: Rendered) -> dict[str, Mark]:
        """Vertex id -> allocation and health of the devices of toposlice's pool."""
        if r.snapshot is None:
            return {}
        by_device = {dev: vid for vid, dev in r.snapshot.vertex_devices.items()}
        allocated = dict(self.view.allocated())
        health = {h.device: h for h in self.view.health() if h.pool == r.snapshot.pool}
        out: dict[str, Mark] = {}
        for dev, vid in by_device.items():
            h: DeviceHealth | None = health.get(dev)
            tainted = None
            if h is not None and h.status == "Unhealthy":
                tainted = "NoExecute" if h.fatal else "NoSchedule"
            mark = Mark(
                allocated=allocated.get(dev),
                health=h.status if h else "Unknown",
                tainted=tainted,
                reason=h.reason if h else "",
            )
            if mark != Mark():
                out[vid] = mark
        return out

    def _page_bytes(self, r: Rendered) -> bytes:
        marks = self.marks(r)
        ready, reason = self.readiness()
        key = (id(r), tuple(sorted(marks.items(), key=lambda kv: kv[0])), ready, reason)
        cached = self._page
        if cached is not None and cached[0] == key:
            return cached[1]
        assert r.doc is not None
        body = render_page(
            r.doc,
            marks,
            r.report.to_dict() if r.report.matches or r.report.findings else None,
            status_line="ready" if ready else f"not ready: {reason}",
        ).encode()
        self._page = (key, body)
        return body

    def _live_metrics(self) -> Iterable[Metric]:
        r = self._rendered
        ready, _ = self.readiness()
        up = GaugeMetricFamily("toposlice_ready", "1 when /readyz answers 200")
        up.add_metric([], 1.0 if ready else 0.0)
        yield up
        st = self.view.status()
        reg = GaugeMetricFamily("toposlice_registered", "1 when registered with the kubelet")
        reg.add_metric([], 1.0 if st.registered else 0.0)
        yield reg
        sync = GaugeMetricFamily(
            "toposlice_publisher_synced", "1 when the ResourceSlices match the snapshot"
        )
        sync.add_metric([], 1.0 if st.publisher_synced else 0.0)
        yield sync
        marks = self.marks(r)
        health = GaugeMetricFamily(
            "toposlice_device_health",
            "Device health as a state set (1 for the current status)",
            labels=["device", "status"],
        )
        tainted = GaugeMetricFamily(
            "toposlice_device_tainted",
            "1 when the device is tainted, by taint effect",
            labels=["device", "effect"],
        )
        allocated = GaugeMetricFamily(
            "toposlice_device_allocated",
            "1 when the device is prepared for a claim on this node",
            labels=["device"],
        )
        if r.snapshot is not None:
            for vid, dev in r.snapshot.vertex_devices.items():
                mark = marks.get(vid, Mark())
                for status in ("Healthy", "Unhealthy", "Unknown"):
                    health.add_metric([dev, status], 1.0 if mark.health == status else 0.0)
                if mark.tainted:
                    tainted.add_metric([dev, mark.tainted], 1.0)
                allocated.add_metric([dev], 1.0 if mark.allocated else 0.0)
        yield health
        yield tainted
        yield allocated
        reqs = CounterMetricFamily(
            "toposlice_http_requests",
            "HTTP requests answered, by route and status",
            labels=["route", "code"],
        )
        for (route, code), n in sorted(self.stats.requests.items()):
            reqs.add_metric([route, str(code)], float(n))
        yield reqs
        rej = CounterMetricFamily(
            "toposlice_http_rejected",
            "Connections or requests refused (malformed, oversized, timeout, ...)",
            labels=["reason"],
        )
        for why, n in sorted(self.stats.rejected.items()):
            rej.add_metric([why], float(n))
        yield rej
        conns = GaugeMetricFamily("toposlice_http_connections", "Open HTTP connections")
        conns.add_metric([], float(len(self._conns)))
        yield conns
