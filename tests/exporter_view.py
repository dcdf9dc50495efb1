"""Shared pieces of the exporter tests: a settable ExporterView, cached snapshots of the
fake machines, the planted foreign slices served by a test API server, and a raw HTTP/1.1
client (http.client hides what hostile-client tests need)."""

from __future__ import annotations

import functools
import re
import socket
import subprocess
import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from driver.interfaces import DeviceHealth, DriverStatus
from driver.publisher.observe import load_slice_files
from normalize.snapshot import Snapshot, build_snapshot
from tests.kubeapi import KubeAPIServer
from toposlice.discover import discover

#: Slices shaped like other drivers' (NVIDIA GPU driver, dranet, dra-driver-cpu) for the
#: dgx-h100 node, with planted defects (see the folder's README).
FOREIGN_SLICE_FILES = sorted(
    str(p) for p in (Path(__file__).parent / "data" / "foreign-slices").glob("*.yaml")
)


@contextmanager
def foreign_api() -> Iterator[KubeAPIServer]:
    """A test API server holding node ``dgx-h100`` and the foreign slices."""
    with KubeAPIServer() as server:
        server.add_node("dgx-h100")
        for s in load_slice_files(FOREIGN_SLICE_FILES):
            server.store.create("resourceslices", "", s)
        yield server


@functools.cache
def snapshot_of(machine: str, node: str | None = None) -> Snapshot:
    inv = discover(fake=machine)
    return build_snapshot(inv, node or inv.hostname or machine)


@dataclass
class View:
    snap: Snapshot | None = None
    state: DriverStatus = field(default_factory=lambda: DriverStatus(True, True))
    alloc: dict[str, str] = field(default_factory=dict)
    healths: list[DeviceHealth] = field(default_factory=list)

    def snapshot(self) -> Snapshot | None:
        return self.snap

    def status(self) -> DriverStatus:
        return self.state

    def allocated(self) -> Mapping[str, str]:
        return self.alloc

    def health(self) -> list[DeviceHealth]:
        return self.healths


_LEFTOVER: weakref.WeakKeyDictionary[socket.socket, bytes] = weakref.WeakKeyDictionary()


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


def read_response(sock: socket.socket, head_only: bool = False) -> Response:
    """One HTTP/1.1 response from ``sock`` (Content-Length framed, as the server sends)."""
    buf = _LEFTOVER.pop(sock, b"")
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {buf[:200]!r}")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    length = 0 if head_only or status == 304 else int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    if rest[length:]:
        _LEFTOVER[sock] = rest[length:]  # pipelined responses that came in the same read
    return Response(status, headers, rest[:length])


def request(
    url: str,
    path: str,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    timeout: float = 5.0,
) -> Response:
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return read_response(sock, head_only=method == "HEAD")


def connect(url: str, timeout: float = 5.0) -> socket.socket:
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout)


def wait_for(predicate: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return True
        time.sleep(0.05)
    return False


def serving_url(proc: subprocess.Popen[str], deadline: float) -> str:
    """The URL a ``toposlice serve`` child says (on stderr) it listens on; fails the test
    if it has said none by DEADLINE (a ``time.monotonic()`` value)."""
    assert proc.stderr is not None
    url = None
    while url is None and time.monotonic() < deadline:
        m = re.search(r"serving on (http://\S+)", proc.stderr.readline())
        url = m.group(1) if m else None
    assert url, "serve did not say where it listens"
    return url
