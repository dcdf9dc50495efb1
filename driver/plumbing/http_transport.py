"""The one HTTP/1.1 stack of toposlice: connections, limits and framing; routes elsewhere.

Both servers of the project sit on it: the exporter (driver/exporter/http_server.py: probes,
``/v1/topology``, ``/metrics``, the page) and the placement scorer's kube-scheduler
extender (scorer/extender_server.py: ``POST /filter``, ``POST /prioritize``). A server
subclasses :class:`HttpTransport` and implements :meth:`HttpTransport.respond`, which gets
one whole :class:`Request` on the event loop thread and returns the response bytes, or an
asyncio future of them when the work should not hold the loop (the extender's verbs run
in :meth:`HttpTransport.in_worker`). Responses of pipelined requests go out in request
order whichever finishes first.

The stack is asyncio on uvloop (when installed) with httptools' llhttp parser: ~20 µs of
Python per request. Hostile clients cannot hurt others: header block and body sizes are
capped (431/413), malformed requests get 400 and a close, a request must arrive whole
within ``header_timeout`` (slowloris), idle keep-alive connections close, connections
beyond ``max_connections`` are refused with 503, and a client that does not read its
responses stops being read (write-buffer back-pressure).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any, TypeVar

import httptools

log = logging.getLogger("driver.http_transport")

T = TypeVar("T")

#: What :meth:`HttpTransport.respond` returns: the whole response, now or later.
Reply = bytes | asyncio.Future[bytes]


@dataclass(frozen=True)
class Limits:
    """Bounds on what one client may cost."""

    max_header_bytes: int = 16 * 1024
    """Request line plus headers; beyond: 431 and close."""
    max_body_bytes: int = 4 * 1024
    """Larger bodies get 413 (the exporter takes none; the extender's ExtenderArgs do)."""
    header_timeout: float = 10.0
    """A request must arrive whole this soon after its first byte (slowloris)."""
    keepalive_timeout: float = 30.0
    max_connections: int = 1024
    write_buffer_high: int = 512 * 1024
    """Stop reading a client whose unread responses exceed this (pipelining abuse)."""


@dataclass(frozen=True)
class Request:
    """One parsed request, as a route sees it."""

    method: bytes
    path: str
    query: str
    if_none_match: bytes | None
    accept_encoding: bytes | None
    body: bytes
    keep_alive: bool

    @property
    def head_only(self) -> bool:
        return self.method == b"HEAD"


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port``, ``:port`` (all interfaces) or ``[v6]:port``; ValueError when bad
    (the wording every command uses: :func:`driver.plumbing.checks.parse_http_addr`)."""
    from driver.plumbing.checks import parse_http_addr

    return parse_http_addr(addr)


REASONS = {
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
TEXT = b"text/plain; charset=utf-8"


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


class Stats:
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


class _Reject(Exception):
    def __init__(self, status: int, why: str, text: bytes) -> None:
        super().__init__(why)
        self.status = status
        self.why = why
        self.text = text


class _Conn(asyncio.Protocol):
    """One client connection: httptools parses, the server answers, in request order."""

    __slots__ = (
        "_accept_gzip",
        "_body",
        "_chunks",
        "_closing",
        "_header_bytes",
        "_headers_done",
        "_inm",
        "_paused",
        "_pending",
        "_raw",
        "_timer",
        "_url",
        "parser",
        "server",
        "transport",
    )

    def __init__(self, server: HttpTransport) -> None:
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
        self._chunks: list[bytes] = []
        self._paused = False
        self._closing = False
        self._pending: deque[tuple[Reply, bool]] = deque()
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
        self._pending.clear()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing() or self._closing:
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
            limits = self.server.limits
            if not self._headers_done and self._raw > limits.max_header_bytes:
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
        self._chunks = []
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
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        t = self.transport
        if t is None or self._closing:
            return
        # An Upgrade (h2c, websocket) is ignored, as RFC 9110 allows; the connection closes
        # after the answer since the client may switch protocols regardless.
        keep = self.parser.should_keep_alive() and not self.parser.should_upgrade()
        if not keep:
            self._closing = True  # later pipelined requests are not answered
        body = b"".join(self._chunks) if self._chunks else b""
        self._chunks = []
        reply = self.server._dispatch(
            self.parser.get_method(), self._url, self._inm, self._accept_gzip, body, keep
        )
        self._pending.append((reply, keep))
        if not isinstance(reply, bytes):
            reply.add_done_callback(lambda _f: self._flush())
        self._flush()

    # -- helpers ---------------------------------------------------------------------------

    def _flush(self) -> None:
        """Write the answers that are ready, in request order."""
        while self._pending:
            t = self.transport
            if t is None or t.is_closing():
                self._pending.clear()
                return
            reply, keep = self._pending[0]
            if isinstance(reply, bytes):
                data = reply
            elif reply.done():
                data = self.server._result(reply)
            else:
                return
            self._pending.popleft()
            t.write(data)
            if not keep:
                self._pending.clear()
                t.close()
                return
        self._arm(self.server.limits.keepalive_timeout)

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
        if self._pending:  # still working on an answer: the client is not idle
            self._arm(self.server.limits.keepalive_timeout)
        elif self._headers_done:
            t.close()  # idle keep-alive connection
        else:
            self.server.stats.reject("timeout")
            self._error(408, b"request not received in time\n")

    def _error(self, status: int, text: bytes) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        self._pending.clear()
        t.write(self.server.head(status, TEXT, len(text), close=True))
        t.write(text)
        t.close()


class HttpTransport:
    """An HTTP server in its own thread and event loop; :meth:`respond` is the routes.

    ``addr``: ``host:port`` (``:port`` = all interfaces; port 0 picks one, see
    :attr:`address`). ``workers``: threads for :meth:`in_worker`.
    """

    def __init__(
        self,
        addr: str,
        limits: Limits | None = None,
        *,
        thread_name: str = "toposlice-http",
        workers: int = 1,
    ) -> None:
        self.host, self.port = parse_addr(addr)
        self.limits = limits or Limits()
        self.stats = Stats()
        self.thread_name = thread_name
        self._clock = _Clock()
        self._conns: set[_Conn] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=f"{thread_name}-worker")
        self._started = threading.Event()

    # ---- what a server supplies ----------------------------------------------------------

    def respond(self, req: Request) -> Reply:
        """The whole response to ``req`` (on the loop thread; must not block)."""
        raise NotImplementedError

    def on_started(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called on the loop thread once the server listens (timers go here)."""

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

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    def start(self: _S) -> _S:
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
        self._before_serving()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("HTTP server did not start")
        return self

    def _before_serving(self) -> None:
        """Hook run in :meth:`start` after binding, before the loop runs."""

    def _run(self) -> None:
        loop = _new_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)

        async def serve() -> None:
            assert self._sock is not None
            self._server = await loop.create_server(lambda: _Conn(self), sock=self._sock)
            self.on_started(loop)

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

    def serve_forever(self) -> None:
        """Block until the serving thread ends (``KeyboardInterrupt`` ends the wait)."""
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(0.5)

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
        # Queued renders are dropped: the interpreter's exit joins the pool's threads and
        # would run every one of them first (a SIGTERM must not wait for a backlog).
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self: _S) -> _S:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- helpers for routes --------------------------------------------------------------

    def in_worker(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` in the server's worker threads; the loop stays free meanwhile."""
        assert self._loop is not None
        return self._loop.run_in_executor(self._pool, fn, *args)

    def head(
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
            % (status, REASONS.get(status, b"Unknown"), self._clock.date())
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

    def response(
        self,
        route: str,
        status: int,
        content_type: bytes,
        body: bytes,
        keep: bool,
        head_only: bool = False,
        extra: bytes = b"",
    ) -> bytes:
        """A whole response (counted under ``route``); HEAD gets the headers only."""
        self.stats.count(route, status)
        head = self.head(status, content_type, len(body), close=not keep, extra=extra)
        return head if head_only else head + body

    def text(
        self,
        route: str,
        status: int,
        text: bytes,
        keep: bool,
        head_only: bool = False,
        extra: bytes = b"",
    ) -> bytes:
        return self.response(route, status, TEXT, text, keep, head_only, extra)

    # ---- dispatch ------------------------------------------------------------------------

    def _dispatch(
        self,
        method: bytes,
        raw_url: bytes,
        inm: bytes | None,
        accept: bytes | None,
        body: bytes,
        keep: bool,
    ) -> Reply:
        try:
            url = httptools.parse_url(raw_url or b"/")
            path = (url.path or b"/").decode("latin-1")
            query = (url.query or b"").decode("latin-1")
        except httptools.HttpParserInvalidURLError:
            return self.text("?", 400, b"bad request target\n", keep, method == b"HEAD")
        req = Request(method, path, query, inm, accept, body, keep)
        try:
            return self.respond(req)
        except Exception:
            log.exception("serving %s failed", path)
            return self.text(path, 500, b"internal error\n", keep, req.head_only)

    def _result(self, fut: asyncio.Future[bytes]) -> bytes:
        try:
            return fut.result()
        except Exception:
            log.exception("an HTTP handler failed")
            return self.text("?", 500, b"internal error\n", False)


_S = TypeVar("_S", bound=HttpTransport)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        return loop
    except ImportError:  # pragma: no cover - uvloop is a dependency; asyncio still works
        return asyncio.new_event_loop()
