"""KubeClaimReader against a loopback HTTP server speaking the ResourceClaim REST path."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration

from driver.interfaces import ClaimNotFound
from driver.kubelet.claims import KubeClaimReader
from tests.driver_support import claim


class Api:
    """Answers queued per path; records requests."""

    def __init__(self) -> None:
        self.answers: dict[str, list[tuple[int, Any]]] = {}
        self.requests: list[str] = []
        self.auth: list[str | None] = []


@pytest.fixture
def api() -> Iterator[tuple[Api, ApiClient]]:
    state = Api()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.requests.append(self.path)
            state.auth.append(self.headers.get("Authorization"))
            queue = state.answers.get(self.path) or [(404, {"kind": "Status", "code": 404})]
            code, body = queue.pop(0) if len(queue) > 1 else queue[0]
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    cfg = Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    client = ApiClient(cfg)
    yield state, client
    server.shutdown()
    server.server_close()


PATH = "/apis/resource.k8s.io/v1/namespaces/ns1/resourceclaims/c1"


def test_reads_claim_json(api: tuple[Api, ApiClient]) -> None:
    state, client = api
    obj = claim("uid-1", ["gpu-0000-1b-00-0"], name="c1", namespace="ns1")
    state.answers[PATH] = [(200, obj)]
    assert KubeClaimReader(client).get_claim("ns1", "c1") == obj
    assert state.requests == [PATH]


def test_404_is_claim_not_found(api: tuple[Api, ApiClient]) -> None:
    _, client = api
    with pytest.raises(ClaimNotFound, match="ns1/c1"):
        KubeClaimReader(client).get_claim("ns1", "c1")


def test_retries_429_and_5xx_then_succeeds(api: tuple[Api, ApiClient]) -> None:
    state, client = api
    obj = claim("uid-1", [], name="c1", namespace="ns1")
    state.answers[PATH] = [(429, {}), (500, {}), (503, {}), (200, obj)]
    sleeps: list[float] = []
    assert KubeClaimReader(client, sleep=sleeps.append).get_claim("ns1", "c1") == obj
    assert len(state.requests) == 4 and len(sleeps) == 3
    assert all(0 < s <= 1.0 for s in sleeps)


def test_gives_up_after_bounded_retries(api: tuple[Api, ApiClient]) -> None:
    state, client = api
    state.answers[PATH] = [(500, {"message": "etcd down"})]
    sleeps: list[float] = []
    with pytest.raises(RuntimeError, match="etcd down"):
        KubeClaimReader(client, attempts=3, sleep=sleeps.append).get_claim("ns1", "c1")
    assert len(state.requests) == 3 and len(sleeps) == 2


def test_403_is_not_retried(api: tuple[Api, ApiClient]) -> None:
    state, client = api
    state.answers[PATH] = [(403, {"message": "forbidden"})]
    with pytest.raises(RuntimeError, match="403"):
        KubeClaimReader(client, sleep=lambda s: None).get_claim("ns1", "c1")
    assert len(state.requests) == 1


def test_names_are_path_escaped(api: tuple[Api, ApiClient]) -> None:
    state, client = api
    with pytest.raises(ClaimNotFound):
        KubeClaimReader(client).get_claim("ns1", "a/../b")
    assert state.requests == ["/apis/resource.k8s.io/v1/namespaces/ns1/resourceclaims/a%2F..%2Fb"]


def test_token_refresh_hook_runs_at_most_once_per_ttl(
    api: tuple[Api, ApiClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The configuration's refresh hook (token rotation) is not run per request, but a
    rotated token is sent once the cached header is AUTH_TTL_S old."""
    import driver.plumbing.kube

    state, client = api
    state.answers[PATH] = [(200, claim("uid-1", [], name="c1", namespace="ns1"))]
    cfg = client.configuration
    cfg.api_key_prefix["BearerToken"] = "Bearer"
    tokens = iter(["t1", "t2", "t3"])
    hooks: list[str] = []

    def refresh(c: Configuration) -> None:
        c.api_key["BearerToken"] = next(tokens)
        hooks.append(c.api_key["BearerToken"])

    cfg.api_key["BearerToken"] = "t0"
    cfg.refresh_api_key_hook = refresh
    now = [1000.0]
    monkeypatch.setattr(driver.plumbing.kube, "monotonic", lambda: now[0])
    reader = KubeClaimReader(client)
    for _ in range(3):
        reader.get_claim("ns1", "c1")
    assert hooks == ["t1"]
    assert state.auth == ["Bearer t1"] * 3
    now[0] += driver.plumbing.kube.AUTH_TTL_S
    reader.get_claim("ns1", "c1")
    assert hooks == ["t1", "t2"]
    assert state.auth[-1] == "Bearer t2"
