"""A small Kubernetes API server over HTTP for tests and benches (loopback only).

It serves the REST paths the ``kubernetes`` Python client calls for Nodes, ResourceSlices,
ResourceClaims and DeviceClasses (get, list, watch, create, update, patch, delete), counts
requests per verb, and plays the failures drivers must survive: scripted 409/429/500
answers and whole outages (connections refused, or 503s). A WATCH with
``sendInitialEvents=true`` is a streaming list only with ``KubeAPIServer(stream_lists=True)``;
by default the parameter is ignored, as a server without WatchList would.

    with KubeAPIServer() as api:
        api.add_node("n1")
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        ...
        api.faults.add(500, verb="create", resource="resourceslices")
        api.down(5)                       # refuse connections for 5 s
        assert api.writes("resourceslices") == 0
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.parse
from collections import Counter, deque
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .faults import FaultPlan
from .kubeconfig import write_kubeconfig
from .selectors import SelectorError
from .store import RESOURCES, ApiError, Store

#: The annotation on the BOOKMARK that ends a streaming list's initial events.
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
WRITE_VERBS = ("create", "update", "patch", "delete")
_REASONS = {
    400: "BadRequest",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (strategic merge patches are applied the same way)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge_patch(out.get(key), value)
    return out


def _json_patch(target: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 add/replace/remove/test on object members and list indexes."""
    for op in ops:
        parts = [
            p.replace("~1", "/").replace("~0", "~") for p in str(op.get("path", "")).split("/")[1:]
        ]
        if not parts:
            raise ApiError(422, "Invalid", "json patch: empty path")
        parent = target
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        kind = op.get("op")
        if kind == "test":
            cur = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if cur != op.get("value"):
                raise ApiError(422, "Invalid", f"json patch test failed at {op.get('path')}")
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                idx = len(parent) if last == "-" else int(last)
                if kind == "add":
                    parent.insert(idx, op.get("value"))
                else:
                    parent[idx] = op.get("value")
            else:
                parent[last] = op.get("value")
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                parent.pop(last)
        else:
            raise ApiError(415, "UnsupportedMediaType", f"json patch op {kind!r} not supported")
    return target


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    api: KubeAPIServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # -- plumbing ------------------------------------------------------------------------

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"body is not JSON: {exc}") from exc

    def _send(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, err: ApiError, headers: dict[str, str] | None = None) -> None:
        self._send(err.code, status_body(err.code, err.reason, err.message), headers)

    def _handle(self, method: str) -> None:
        api = self.server.api
        mode = api.faults.down_mode()
        if mode == "refuse":
            self.close_connection = True  # drop the connection without an answer
            return
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        try:
            body = self._body() if method in ("POST", "PUT", "PATCH", "DELETE") else None
            if mode == "503":
                raise ApiError(503, "ServiceUnavailable", "the server is currently unavailable")
            route = _route(url.path)
            if route is None:
                self._plain(url.path)
                return
            resource, namespace, name, sub = route
            verb = _verb(method, name, query)
            api.note(verb, resource)
            fault = api.faults.take(verb, resource, name or "")
            if fault is not None:
                headers = {}
                if fault.retry_after is not None:
                    headers["Retry-After"] = str(fault.retry_after)
                reason = _REASONS.get(fault.status, "InternalError")
                msg = fault.message or f"injected {fault.status} for {verb} {resource}"
                self._error(ApiError(fault.status, reason, msg), headers)
                return
            if verb == "watch":
                self._watch(resource, namespace, query)
                return
            code, out = api.serve(verb, resource, namespace, name, sub, body, self.headers, query)
            api.note_done(verb, resource)
            self._send(code, out)
        except SelectorError as exc:
            self._error(ApiError(400, "BadRequest", str(exc)))
        except ApiError as err:
            self._error(err)

    def _plain(self, path: str) -> None:
        api = self.server.api
        if path == "/debug/counts":  # test control: the counters of a server in another process
            with api._counts_lock:
                requests = {f"{v} {r}": n for (v, r), n in api.requests.items()}
            self._send(200, {"requests": requests, "writes": api.writes()})
        elif path == "/debug/reset":
            api.reset_counters()
            self._send(200, {})
        elif path == "/version":
            self._send(200, {"major": "1", "minor": "37", "gitVersion": "v1.37.0-toposlice-test"})
        elif path in ("/healthz", "/readyz", "/livez"):
            data = b"ok"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self._error(ApiError(404, "NotFound", f"the server could not find {path}"))

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _watch(self, resource: str, namespace: str | None, query: dict[str, str]) -> None:
        api = self.server.api
        match, _terms = api.store.matcher(
            resource, query.get("labelSelector"), query.get("fieldSelector")
        )
        deadline = time.monotonic() + min(float(query.get("timeoutSeconds") or 300), 1800)
        start_rv = query.get("resourceVersion") or "0"
        streaming = api.stream_lists and query.get("sendInitialEvents") == "true"
        if streaming and query.get("resourceVersionMatch") != "NotOlderThan":
            msg = "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
            self._error(ApiError(422, "Invalid", msg))
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        rv = int(start_rv)
        try:
            if streaming:  # WatchList: the state as ADDED events, then the end bookmark
                items, rv = api.store.select(
                    resource, namespace, query.get("labelSelector"), query.get("fieldSelector")
                )
                for obj in items:
                    self._chunk(json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n")
                meta = {"resourceVersion": str(rv), "annotations": {INITIAL_EVENTS_END: "true"}}
                mark = {"type": "BOOKMARK", "object": {"metadata": meta}}
                self._chunk(json.dumps(mark).encode() + b"\n")
            elif rv == 0:
                items, rv = api.store.select(
                    resource, namespace, query.get("labelSelector"), query.get("fieldSelector")
                )
                for obj in items:
                    self._chunk(json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n")
            while not api.stopping and api.faults.down_mode() is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                events, ok = api.store.events_since(resource, rv, min(left, 0.5))
                if not ok:
                    err = status_body(410, "Expired", f"too old resource version: {rv}")
                    self._chunk(json.dumps({"type": "ERROR", "object": err}).encode() + b"\n")
                    break
                for ev in events:
                    rv = ev.rv
                    if namespace is not None and ev.obj["metadata"].get("namespace") != namespace:
                        continue
                    if match(ev.obj):
                        line = {"type": ev.type, "object": ev.obj}
                        self._chunk(json.dumps(line).encode() + b"\n")
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True


def _route(path: str) -> tuple[str, str | None, str | None, str] | None:
    """``(resource, namespace, name, subresource)`` or None for a non-resource path."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        return None
    res = RESOURCES.get(rest[0])
    if res is None or (res.group, res.version) != (group, version):
        raise ApiError(404, "NotFound", f"the server could not find the requested resource {path}")
    if res.namespaced and namespace is None and len(rest) > 1:
        raise ApiError(404, "NotFound", f"{res.plural} is namespaced")
    if not res.namespaced and namespace is not None:
        raise ApiError(404, "NotFound", f"{res.plural} is not namespaced")
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else ""
    if sub and sub != "status":
        raise ApiError(404, "NotFound", f"no subresource {sub!r}")
    return res.plural, namespace, name, sub


def _verb(method: str, name: str | None, query: dict[str, str]) -> str:
    if method == "GET":
        if name is None:
            return "watch" if query.get("watch") in ("true", "1") else "list"
        return "get"
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
    if verb != "create" and name is None:
        raise ApiError(405, "MethodNotAllowed", f"{method} needs a name")
    if verb == "create" and name is not None:
        raise ApiError(405, "MethodNotAllowed", "POST to a named object")
    return verb


def _slice_validator(obj: dict[str, Any]) -> list[str]:
    from normalize.validation import validate_slice

    return validate_slice(obj)


def _slice_normalizer(obj: dict[str, Any]) -> None:
    """Render taint timestamps as the API server does (RFC 3339, UTC, seconds)."""
    import datetime

    for dev in (obj.get("spec") or {}).get("devices") or []:
        for taint in (dev.get("taints") or []) if isinstance(dev, dict) else []:
            raw = taint.get("timeAdded") if isinstance(taint, dict) else None
            if not isinstance(raw, str):
                continue
            try:
                when = datetime.datetime.fromisoformat(raw.replace("Z", "+00:00"))
            except ValueError:
                continue
            if when.tzinfo is None:
                when = when.replace(tzinfo=datetime.UTC)
            taint["timeAdded"] = when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeAPIServer:
    """The server, its store, its fault plan and its request counters."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        validate: bool = True,
        stream_lists: bool = False,
    ) -> None:
        """``stream_lists``: answer a WATCH with ``sendInitialEvents=true`` as a v1.34+
        API server does (WatchList). Off, the parameter is ignored, as an older server or
        one with the feature off would: the informer's fallback to LIST + WATCH."""
        self.host = host
        self.stream_lists = stream_lists
        self.store = Store(
            {"resourceslices": _slice_validator} if validate else None,
            {"resourceslices": _slice_normalizer},
        )
        self.faults = FaultPlan()
        self.stopping = False
        self._counts_lock = threading.Lock()
        self.requests: Counter[tuple[str, str]] = Counter()
        """(verb, resource) -> requests that reached the server (before any fault)."""
        self.succeeded: Counter[tuple[str, str]] = Counter()
        """(verb, resource) -> requests answered 2xx."""
        self.log: deque[tuple[float, str, str]] = deque(maxlen=10_000)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port = port
        self._restart_timer: threading.Timer | None = None
        self._lifecycle = threading.Lock()

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> KubeAPIServer:
        with self._lifecycle:
            self._listen()
        return self

    def _listen(self) -> None:
        httpd = _HTTPServer((self.host, self._port), _Handler)
        httpd.api = self
        self._port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def _close_listener(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def stop(self) -> None:
        self.stopping = True
        with self._lifecycle:
            if self._restart_timer is not None:
                self._restart_timer.cancel()
            self._close_listener()
        self.store.wake_watchers()

    def __enter__(self) -> KubeAPIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._port}"

    def write_kubeconfig(self, path: str | Path) -> Path:
        return write_kubeconfig(path, self.url)

    # -- outages -------------------------------------------------------------------------

    def down(self, seconds: float, mode: str = "refuse") -> None:
        """Play dead for ``seconds``: ``refuse`` closes the listening socket (new connections
        are refused, open ones are dropped), ``503`` answers every request with 503."""
        self.faults.set_down(seconds, mode)
        self.store.wake_watchers()
        if mode != "refuse":
            return
        with self._lifecycle:
            self._close_listener()
            if self._restart_timer is not None:
                self._restart_timer.cancel()
            self._restart_timer = threading.Timer(seconds, self._come_back)
            self._restart_timer.daemon = True
            self._restart_timer.start()

    def up(self) -> None:
        """End an outage now."""
        self.faults.set_down(0, "refuse")
        self._come_back()

    def _come_back(self) -> None:
        with self._lifecycle:
            if self.stopping or self._httpd is not None:
                return
            for _ in range(50):
                try:
                    self._listen()
                    return
                except OSError:
                    time.sleep(0.05)
            raise RuntimeError(f"test API server could not re-bind port {self._port}")

    # -- counters ------------------------------------------------------------------------

    def note(self, verb: str, resource: str) -> None:
        with self._counts_lock:
            self.requests[(verb, resource)] += 1
            self.log.append((time.monotonic(), verb, resource))

    def note_done(self, verb: str, resource: str) -> None:
        with self._counts_lock:
            self.succeeded[(verb, resource)] += 1

    def count(self, verbs: tuple[str, ...] | str, resource: str | None = None) -> int:
        verbs = (verbs,) if isinstance(verbs, str) else verbs
        with self._counts_lock:
            return sum(
                n
                for (v, r), n in self.requests.items()
                if v in verbs and (resource is None or r == resource)
            )

    def writes(self, resource: str | None = None) -> int:
        """Write requests (create/update/patch/delete) that reached the server."""
        return self.count(WRITE_VERBS, resource)

    def reset_counters(self) -> None:
        with self._counts_lock:
            self.requests.clear()
            self.succeeded.clear()
            self.log.clear()

    @contextlib.contextmanager
    def counting(self) -> Iterator[Counter[tuple[str, str]]]:
        """``with api.counting() as c:`` -> ``c`` holds the requests made inside the block."""
        with self._counts_lock:
            before = Counter(self.requests)
        diff: Counter[tuple[str, str]] = Counter()
        try:
            yield diff
        finally:
            with self._counts_lock:
                diff.update(self.requests)
            diff.subtract(before)
            for key in [k for k, v in diff.items() if v <= 0]:
                del diff[key]

    # -- object helpers for tests --------------------------------------------------------

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        return self.store.create(
            "nodes", "", {"metadata": {"name": name, "labels": labels or {}}, "spec": {}}
        )

    def add_claim(self, claim: dict[str, Any]) -> dict[str, Any]:
        """Create a ResourceClaim with its ``status`` (as the scheduler would have set it)."""
        ns = claim.get("metadata", {}).get("namespace", "default")
        created = self.store.create("resourceclaims", ns, claim)
        if claim.get("status") is not None:
            created["status"] = claim["status"]
            created = self.store.update(
                "resourceclaims", ns, created["metadata"]["name"], created, "status"
            )
        return created

    def slices(self, driver: str | None = None, node: str | None = None) -> list[dict[str, Any]]:
        sel = []
        if driver:
            sel.append(f"spec.driver={driver}")
        if node:
            sel.append(f"spec.nodeName={node}")
        items, _rv = self.store.select("resourceslices", None, None, ",".join(sel) or None)
        return items

    # -- request dispatch ----------------------------------------------------------------

    def serve(
        self,
        verb: str,
        resource: str,
        namespace: str | None,
        name: str | None,
        sub: str,
        body: Any,
        headers: Any,
        query: dict[str, str],
    ) -> tuple[int, Any]:
        res = RESOURCES[resource]
        ns = namespace or ""
        if verb == "get":
            return 200, self.store.get(resource, ns, name or "")
        if verb == "list":
            return 200, self._list(resource, namespace, query)
        if not isinstance(body, dict) and verb != "delete" and not isinstance(body, list):
            raise ApiError(400, "BadRequest", "request body required")
        if verb == "create":
            if res.namespaced and namespace is None:
                raise ApiError(404, "NotFound", f"{resource} is namespaced")
            meta = body.get("metadata") or {}
            if res.namespaced and meta.get("namespace") not in (None, "", ns):
                raise ApiError(400, "BadRequest", "namespace of the body does not match the URL")
            return 201, self.store.create(resource, ns, body)
        if verb == "update":
            return 200, self.store.update(resource, ns, name or "", body, sub)
        if verb == "patch":
            return 200, self._patch(resource, ns, name or "", body, sub, headers)
        pre = (body or {}).get("preconditions") if isinstance(body, dict) else None
        return 200, self.store.delete(resource, ns, name or "", pre)

    def _list(self, resource: str, namespace: str | None, query: dict[str, str]) -> dict[str, Any]:
        res = RESOURCES[resource]
        items, rv = self.store.select(
            resource, namespace, query.get("labelSelector"), query.get("fieldSelector")
        )
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.api_version,
            "metadata": {"resourceVersion": str(rv)},
            "items": items,
        }

    def _patch(
        self, resource: str, ns: str, name: str, body: Any, sub: str, headers: Any
    ) -> dict[str, Any]:
        ctype = (headers.get("Content-Type") or "").split(";")[0].strip()
        current = self.store.get(resource, ns, name)
        if ctype == "application/json-patch+json":
            if not isinstance(body, list):
                raise ApiError(400, "BadRequest", "a JSON patch is a list of operations")
            patched = _json_patch(current, body)
        elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            patched = _merge_patch(current, body)
        else:
            raise ApiError(415, "UnsupportedMediaType", f"patch type {ctype!r} not supported")
        # A patch applies to what it read: conflict only if it names a resourceVersion.
        rv = ((body if isinstance(body, dict) else {}).get("metadata") or {}).get("resourceVersion")
        patched.setdefault("metadata", {})["resourceVersion"] = (
            rv or current["metadata"]["resourceVersion"]
        )
        return self.store.update(resource, ns, name, patched, sub)
