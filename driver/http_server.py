"""The one HTTP server of toposlice: probes, the exporter endpoints, ``/metrics`` and the page.

Routes (GET and HEAD; anything else 405 with ``Allow``; unknown paths 404):

``/healthz``            200 while the server's event loop runs.
``/readyz``             200 when ready (``run``: registered with the kubelet and the publisher
                        synced; ``serve``: first discovery done), else 503 with the reason.
``/v1/topology``        ``toposlice.graph/v1`` plus ``attrs.dra`` identities on device vertices;
                        ``?format=dot`` for Graphviz. ETag / If-None-Match -> 304; gzip.
``/v1/inventory``       the inventory (``toposlice.inventory/v1``), degraded links as warnings.
``/v1/normalization``   the cross-driver report (``toposlice.normalization/v1``).
``/metrics``            Prometheus text format from the :class:`~driver.metrics.DriverMetrics`.
``/``                   the HTML page (driver/page.py).

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

The stack is asyncio on uvloop (when installed) with httptools' llhttp parser: ~20 µs of
Python per request, so the GIL held by a discovery running in another thread, not the
server, sets the tail latency (see docs/exporter.md). Hostile clients cannot hurt others:
header block and body sizes are capped (431/413), malformed requests get 400 and a close, a
request must arrive whole within ``header_timeout`` (slowloris), idle keep-alive connections
close, connections beyond ``max_connections`` are refused with 503, and a client that does
not read its responses stops being read (write-buffer back-pressure).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from email.utils import formatdate
from typing import Any
from urllib.parse import parse_qs

import httptools
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from discovery.model import Inventory
from normalize.crossdriver import NormalizationReport, empty_report, with_dra_identities
from normalize.snapshot import Snapshot

from .interfaces import DeviceHealth, ExporterView
from .links import degraded_link_warnings
from .metrics import DeviceInfo, DriverMetrics
from .page import Mark, render_page

log = logging.getLogger(__name__)

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
class Limits:
    """Bounds on what one client may cost."""

    max_header_bytes: int = 16 * 1024
    """Request line plus headers; beyond: 431 and close."""
    max_body_bytes: int = 4 * 1024
    """No route takes a body; a small one is read and ignored, a larger one gets 413."""
    header_timeout: float = 10.0
    """A request must arrive whole this soon after its first byte (slowloris)."""
    keepalive_timeout: float = 30.0
    max_connections: int = 1024
    write_buffer_high: int = 512 * 1024
    """Stop reading a client whose unread responses exceed this (pipelining abuse)."""


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
    own = snap.vertex_devices if publishes else None
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


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port``, ``:port`` (all interfaces) or ``[v6]:port``; ValueError when bad
    (the wording every command uses: :func:`driver.config.parse_http_addr`)."""
    from .config import parse_http_addr

    return parse_http_addr(addr)


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


_REASONS = {
    200: b"OK",
    304: b"Not Modified",
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    413: b"Content Too Large",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    503: b"Service Unavailable",
}


class _Clock:
    """The ``Date`` header, formatted once a second."""

    def __init__(self) -> None:
        self._sec = 0
        self._value = b""

    def date(self) -> bytes:
        now = int(time.time())
        if now != self._sec:
            self._sec = now
            self._value = formatdate(now, usegmt=True).encode()
        return self._value


class _Stats:
    """Request counters kept as plain ints on the event loop thread (no locks per request)."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = {}
        self.rejected: dict[str, int] = {}
        self.connections = 0

    def count(self, route: str, status: int) -> None:
        key = (route, status)
        self.requests[key] = self.requests.get(key, 0) + 1

    def reject(self, why: str) -> None:
        self.rejected[why] = self.rejected.get(why, 0) + 1


class _Conn(asyncio.Protocol):
    """One client connection: httptools parses, the server answers from prepared bytes."""

    __slots__ = (
        "_accept_gzip",
        "_body",
        "_header_bytes",
        "_headers_done",
        "_inm",
        "_paused",
        "_raw",
        "_timer",
        "_url",
        "parser",
        "server",
        "transport",
    )

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._inm: bytes | None = None
        self._accept_gzip: bytes | None = None
        self._header_bytes = 0
        self._raw = 0
        self._headers_done = True
        self._body = 0
        self._paused = False
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport  # uvloop's TCPTransport is not an asyncio.Transport
        srv = self.server
        srv._conns.add(self)
        srv.stats.connections += 1
        if len(srv._conns) > srv.limits.max_connections:
            srv.stats.reject("too_many_connections")
            self._error(503, b"too many connections\n")
            return
        transport.set_write_buffer_limits(high=srv.limits.write_buffer_high)
        self._arm(srv.limits.keepalive_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._conns.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.transport = None

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        # Raw bytes since the last header block ended: bounds what the parser buffers for a
        # header that never ends. on_url/on_header count each block exactly.
        self._raw += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.server.stats.reject("upgrade")
            self._error(400, b"protocol upgrades are not supported\n")
        except _Reject as rej:
            self.server.stats.reject(rej.why)
            self._error(rej.status, rej.text)
        except httptools.HttpParserError as exc:
            # A limit raised in a callback arrives wrapped in HttpParserCallbackError.
            cause = exc.__context__ if isinstance(exc.__context__, _Reject) else None
            if cause is not None:
                self.server.stats.reject(cause.why)
                self._error(cause.status, cause.text)
            else:
                self.server.stats.reject("malformed")
                self._error(400, b"malformed request\n")
        else:
            if self._raw > self.server.limits.max_header_bytes + self.server.limits.max_body_bytes:
                self.server.stats.reject("header_too_large")
                self._error(431, b"request header too large\n")

    def pause_writing(self) -> None:
        if self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and self._paused:
            self._paused = False
            self.transport.resume_reading()

    # -- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._inm = None
        self._accept_gzip = None
        self._headers_done = False
        self._header_bytes = 0
        self._body = 0
        self._arm(self.server.limits.header_timeout)

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._header_bytes += len(url)
        if self._header_bytes > self.server.limits.max_header_bytes:
            raise _Reject(431, "header_too_large", b"request line too long\n")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > self.server.limits.max_header_bytes:
            raise _Reject(431, "header_too_large", b"request header too large\n")
        n = len(name)
        if n == 13 and name.lower() == b"if-none-match":
            self._inm = value
        elif n == 15 and name.lower() == b"accept-encoding":
            self._accept_gzip = value
        elif n == 14 and name.lower() == b"content-length":
            if not value.strip().isdigit() or int(value) > self.server.limits.max_body_bytes:
                raise _Reject(413, "body_too_large", b"request body too large\n")

    def on_headers_complete(self) -> None:
        self._headers_done = True
        self._raw = 0

    def on_body(self, body: bytes) -> None:
        self._body += len(body)
        if self._body > self.server.limits.max_body_bytes:
            raise _Reject(413, "body_too_large", b"request body too large\n")

    def on_message_complete(self) -> None:
        t = self.transport
        if t is None:
            return
        # An Upgrade (h2c, websocket) is ignored, as RFC 9110 allows; the connection closes
        # after the answer since the client may switch protocols regardless.
        keep = self.parser.should_keep_alive() and not self.parser.should_upgrade()
        method = self.parser.get_method()
        self.server._respond(self, method, self._url, self._inm, self._accept_gzip, keep)
        if not keep:
            t.close()
        else:
            self._arm(self.server.limits.keepalive_timeout)

    # -- helpers ---------------------------------------------------------------------------

    def _arm(self, seconds: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = self.server._loop
        if loop is not None:
            self._timer = loop.call_later(seconds, self._timeout)

    def _timeout(self) -> None:
        self._timer = None
        t = self.transport
        if t is None or t.is_closing():
            return
        if self._headers_done:
            t.close()  # idle keep-alive connection
        else:
            self.server.stats.reject("timeout")
            self._error(408, b"request not received in time\n")

    def _error(self, status: int, text: bytes) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        t.write(self.server._head(status, b"text/plain; charset=utf-8", len(text), close=True))
        t.write(text)
        t.close()


class _Reject(Exception):
    def __init__(self, status: int, why: str, text: bytes) -> None:
        super().__init__(why)
        self.status = status
        self.why = why
        self.text = text


class HttpServer:
    """HTTP server over an :class:`~driver.interfaces.ExporterView`, in its own thread.

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
        self.host, self.port = parse_addr(addr)
        self.dot = dot
        self.view = view
        self.metrics = metrics if metrics is not None else DriverMetrics()
        self.limits = limits or Limits()
        self.publishes = publishes
        self._ready = ready
        self.stats = _Stats()
        self._clock = _Clock()
        self._rendered = render(None, None, publishes, dot)
        self._recent: list[Snapshot] = []
        self._render_lock = threading.Lock()
        self._page: tuple[Any, bytes] | None = None
        self._conns: set[_Conn] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="toposlice-render")
        self._pending = False
        self._started = threading.Event()
        self.metrics.add_live(self._live_metrics)

    # ---- lifecycle -----------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port), after :meth:`start`."""
        if self._sock is None:
            return self.host, self.port
        name = self._sock.getsockname()
        return name[0], name[1]

    @property
    def url(self) -> str:
        host, port = self.address
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def start(self) -> HttpServer:
        """Bind now (errors raise here) and serve from a daemon thread."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        # Rebind at once after a crash (kill -9) while old connections sit in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
            sock.listen(1024)
        except OSError as exc:
            sock.close()
            where = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
            raise OSError(exc.errno, f"cannot listen on {where}: {exc.strerror or exc}") from exc
        sock.setblocking(False)
        self._sock = sock
        snap = self.view.snapshot()
        if snap is not None:
            self.publish(snap)
        self._thread = threading.Thread(target=self._run, name="toposlice-http", daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("HTTP server did not start")
        return self

    def _run(self) -> None:
        loop = _new_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)

        async def serve() -> None:
            assert self._sock is not None
            self._server = await loop.create_server(lambda: _Conn(self), sock=self._sock)
            loop.call_later(1.0, self._watch)

        try:
            loop.run_until_complete(serve())
            self._started.set()
            loop.run_forever()
        except Exception:
            log.exception("HTTP server failed")
            self._started.set()
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def stop(self, timeout: float = 5.0) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():

            def shutdown() -> None:
                if self._server is not None:
                    self._server.close()
                for conn in list(self._conns):
                    if conn.transport is not None:
                        conn.transport.abort()
                loop.stop()

            loop.call_soon_threadsafe(shutdown)
        if self._thread is not None:
            self._thread.join(timeout)
        if self._sock is not None:
            self._sock.close()
        self._pool.shutdown(wait=False)

    def __enter__(self) -> HttpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

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

    def _head(
        self,
        status: int,
        content_type: bytes | None,
        length: int | None,
        *,
        close: bool = False,
        extra: bytes = b"",
    ) -> bytes:
        parts = [
            b"HTTP/1.1 %d %s\r\nServer: toposlice\r\nDate: %s\r\n"
            % (status, _REASONS.get(status, b"Unknown"), self._clock.date())
        ]
        if content_type is not None:
            parts.append(b"Content-Type: %s\r\n" % content_type)
        if length is not None:
            parts.append(b"Content-Length: %d\r\n" % length)
        if close:
            parts.append(b"Connection: close\r\n")
        parts.append(extra)
        parts.append(b"\r\n")
        return b"".join(parts)

    def _respond(
        self,
        conn: _Conn,
        method: bytes,
        raw_url: bytes,
        inm: bytes | None,
        accept: bytes | None,
        keep: bool,
    ) -> None:
        t = conn.transport
        assert t is not None
        try:
            url = httptools.parse_url(raw_url or b"/")
            path = (url.path or b"/").decode("latin-1")
            query = (url.query or b"").decode("latin-1")
        except httptools.HttpParserInvalidURLError:
            self._send_text(t, "?", 400, b"bad request target\n", keep, method == b"HEAD")
            return
        head_only = method == b"HEAD"
        if path not in ROUTES:
            self._send_text(t, "other", 404, b"not found\n", keep, head_only)
            return
        if method not in (b"GET", b"HEAD"):
            self._send_text(
                t, path, 405, b"method not allowed\n", keep, False, b"Allow: %s\r\n" % ALLOW
            )
            return
        try:
            self._route(t, path, query, inm, accept, keep, head_only)
        except Exception:
            log.exception("serving %s failed", path)
            self._send_text(t, path, 500, b"internal error\n", keep, head_only)

    def _route(
        self,
        t: asyncio.Transport,
        path: str,
        query: str,
        inm: bytes | None,
        accept: bytes | None,
        keep: bool,
        head_only: bool,
    ) -> None:
        r = self._rendered
        if path == "/v1/topology":
            res = r.topology
            if query:
                fmt = parse_qs(query).get("format", ["json"])[-1]
                if fmt == "dot":
                    if r.dot is None and r.topology is not None:
                        self._send_text(t, path, 404, b"no DOT renderer\n", keep, head_only)
                        return
                    res = r.dot
                elif fmt != "json":
                    self._send_text(t, path, 400, b"format must be json or dot\n", keep, head_only)
                    return
            self._send_resource(t, path, res, inm, accept, keep, head_only)
        elif path == "/v1/inventory":
            self._send_resource(t, path, r.inventory, inm, accept, keep, head_only)
        elif path == "/v1/normalization":
            self._send_resource(t, path, r.normalization, inm, accept, keep, head_only)
        elif path == "/healthz":
            self._send_text(t, path, 200, b"ok\n", keep, head_only)
        elif path == "/readyz":
            ready, reason = self.readiness()
            text = (reason + "\n").encode()
            self._send_text(t, path, 200 if ready else 503, text, keep, head_only)
        elif path == "/metrics":
            body = self.metrics.exposition()
            gz = _wants_gzip(accept)
            if gz:
                body = gzip.compress(body, 1)
            extra = b"Content-Encoding: gzip\r\nVary: Accept-Encoding\r\n" if gz else b""
            self._send(t, path, 200, CONTENT_TYPE_LATEST.encode(), body, keep, head_only, extra)
        else:  # "/"
            if r.doc is None:
                self._send_text(t, path, 503, b"no discovery yet\n", keep, head_only)
                return
            body = self._page_bytes(r)
            extra = b"Cache-Control: no-cache\r\n"
            self._send(t, path, 200, b"text/html; charset=utf-8", body, keep, head_only, extra)

    def _send_resource(
        self,
        t: asyncio.Transport,
        route: str,
        res: Resource | None,
        inm: bytes | None,
        accept: bytes | None,
        keep: bool,
        head_only: bool,
    ) -> None:
        if res is None:
            self._send_text(t, route, 503, b"no discovery yet\n", keep, head_only)
            return
        gz = res.gz is not None and _wants_gzip(accept)
        etag = res.gz_etag if gz else res.etag
        vary = b"Vary: Accept-Encoding\r\n" if res.gz is not None else b""
        if inm is not None and (_etag_match(inm, etag)):
            self.stats.count(route, 304)
            t.write(
                self._head(304, None, None, close=not keep, extra=b"ETag: %s\r\n%s" % (etag, vary))
            )
            return
        body = res.gz if gz and res.gz is not None else res.body
        extra = b"ETag: %s\r\n%s" % (etag, vary)
        if gz:
            extra += b"Content-Encoding: gzip\r\n"
        self._send(t, route, 200, res.content_type, body, keep, head_only, extra)

    def _send(
        self,
        t: asyncio.Transport,
        route: str,
        status: int,
        content_type: bytes,
        body: bytes,
        keep: bool,
        head_only: bool,
        extra: bytes = b"",
    ) -> None:
        self.stats.count(route, status)
        t.write(self._head(status, content_type, len(body), close=not keep, extra=extra))
        if not head_only:
            t.write(body)

    def _send_text(
        self,
        t: asyncio.Transport,
        route: str,
        status: int,
        text: bytes,
        keep: bool,
        head_only: bool,
        extra: bytes = b"",
    ) -> None:
        self._send(t, route, status, b"text/plain; charset=utf-8", text, keep, head_only, extra)

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
        degraded = st.details.get("degraded")
        return True, f"ok, degraded: {degraded}" if degraded else "ok"

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


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        return loop
    except ImportError:  # pragma: no cover - uvloop is a dependency; asyncio still works
        return asyncio.new_event_loop()
