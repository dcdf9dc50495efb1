"""The HTTP exporter: endpoints, caching, content negotiation and hostile clients."""

from __future__ import annotations

import gzip
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from discovery.fake import list_machines
from driver.exporter.http_server import HttpServer, Limits, parse_addr
from driver.interfaces import DriverStatus
from normalize.devices import build_devices
from tests.exporter_view import View, connect, read_response, request, snapshot_of, wait_for
from tests.test_fake_matches_captures import parse_nvidia_smi
from toposlice.render import graph_to_dot

REPO = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((REPO / "docs/schema/graph.schema.json").read_text())
TOPO = REPO / "tests/data/topo"


@pytest.fixture
def view() -> View:
    return View(snapshot_of("dgx-h100"))


@pytest.fixture
def server(view: View) -> Iterator[HttpServer]:
    srv = HttpServer("127.0.0.1:0", view, dot=graph_to_dot, limits=Limits(header_timeout=1.0))
    srv.start()
    yield srv
    srv.stop()


def topology(server: HttpServer) -> dict:
    resp = request(server.url, "/v1/topology")
    assert resp.status == 200
    assert resp.headers["content-type"] == "application/json"
    return json.loads(resp.body)


@pytest.mark.parametrize("machine", list_machines())
def test_topology_validates_and_carries_dra_identity_on_every_machine(machine: str) -> None:
    snap = snapshot_of(machine)
    with HttpServer("127.0.0.1:0", View(snap)) as srv:
        doc = topology(srv)
    jsonschema.validate(doc, SCHEMA)
    published = {d["name"] for d in build_devices(snap.inventory, snap.options)}
    seen = set()
    for v in doc["vertices"]:
        if v["kind"] in ("gpu", "nic", "cpu_group"):
            (ident,) = v["attrs"]["dra"]
            assert ident["driver"] == "toposlice.dev"
            assert ident["pool"] == snap.node_name
            assert ident["device"] in published
            seen.add(ident["device"])
    assert seen == published  # every published device maps to exactly one vertex


def test_dgx_h100_matrix_equals_captured_nvidia_smi(server: HttpServer) -> None:
    labels, cells, legend = parse_nvidia_smi((TOPO / "dgx-h100.txt").read_text())
    rel = topology(server)["relations"]
    assert rel["labels"] == labels
    got = {(a, b): rel["matrix"][i][j] for i, a in enumerate(labels) for j, b in enumerate(labels)}
    assert got == cells
    assert rel["legend"] == legend


def test_etag_304_gzip_head_and_dot(server: HttpServer) -> None:
    plain = request(server.url, "/v1/topology")
    etag = plain.headers["etag"]
    assert request(server.url, "/v1/topology", headers={"If-None-Match": etag}).status == 304
    listed = request(server.url, "/v1/topology", headers={"If-None-Match": f'"x", W/{etag}'})
    assert listed.status == 304
    assert request(server.url, "/v1/topology", headers={"If-None-Match": '"other"'}).status == 200
    gz = request(server.url, "/v1/topology", headers={"Accept-Encoding": "gzip, deflate"})
    assert gz.headers["content-encoding"] == "gzip"
    assert gz.headers["etag"] != etag and "accept-encoding" in gz.headers["vary"].lower()
    assert gzip.decompress(gz.body) == plain.body
    assert len(gz.body) < len(plain.body) / 3
    assert (
        request(
            server.url,
            "/v1/topology",
            headers={"Accept-Encoding": "gzip", "If-None-Match": gz.headers["etag"]},
        ).status
        == 304
    )
    refused = request(server.url, "/v1/topology", headers={"Accept-Encoding": "gzip;q=0"})
    assert "content-encoding" not in refused.headers
    head = request(server.url, "/v1/topology", method="HEAD")
    assert head.status == 200 and head.body == b""
    assert head.headers["content-length"] == str(len(plain.body))
    dot = request(server.url, "/v1/topology?format=dot")
    assert dot.status == 200 and dot.body.startswith(b"digraph")
    assert b"GPU0" in dot.body
    assert request(server.url, "/v1/topology?format=xml").status == 400


def test_routes_404_405_probes(server: HttpServer, view: View) -> None:
    assert request(server.url, "/nope").status == 404
    assert request(server.url, "/v1/topology/extra").status == 404
    post = request(server.url, "/v1/topology", method="POST", headers={"Content-Length": "0"})
    assert post.status == 405 and post.headers["allow"] == "GET, HEAD"
    assert request(server.url, "/v1/inventory", method="DELETE").status == 405
    assert request(server.url, "/healthz").body == b"ok\n"
    assert request(server.url, "/readyz").status == 200
    view.state = DriverStatus(registered=True, publisher_synced=False, last_error="409 conflict")
    not_ready = request(server.url, "/readyz")
    assert not_ready.status == 503 and b"409 conflict" in not_ready.body
    view.state = DriverStatus(registered=False)
    assert b"kubelet" in request(server.url, "/readyz").body
    inv = json.loads(request(server.url, "/v1/inventory").body)
    assert inv["schema"] == "toposlice.inventory/v1" and len(inv["gpus"]) == 8
    norm = json.loads(request(server.url, "/v1/normalization").body)
    assert norm["schema"] == "toposlice.normalization/v1" and norm["devices"] == []


def test_no_snapshot_yet_is_503_then_watch_picks_it_up() -> None:
    view = View(None)
    with HttpServer("127.0.0.1:0", view) as srv:
        assert request(srv.url, "/v1/topology").status == 503
        assert request(srv.url, "/readyz").status == 503
        assert request(srv.url, "/healthz").status == 200
        view.snap = snapshot_of("dgx-h100")  # stored without publish(): the timer renders it
        assert wait_for(lambda: request(srv.url, "/v1/topology").status == 200, 5)


def test_publish_swaps_atomically(server: HttpServer, view: View) -> None:
    before = request(server.url, "/v1/topology")
    same = snapshot_of("dgx-h100")
    server.publish(same)
    assert request(server.url, "/v1/topology").headers["etag"] == before.headers["etag"]
    other = snapshot_of("mi300x-8")
    view.snap = other
    server.publish(other)
    after = request(server.url, "/v1/topology", headers={"If-None-Match": before.headers["etag"]})
    assert after.status == 200
    assert json.loads(after.body)["node"] == other.inventory.hostname


def test_pipelined_requests_answered_in_order(server: HttpServer) -> None:
    with connect(server.url) as sock:
        sock.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
            b"HEAD /v1/topology HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        statuses = [read_response(sock).status, read_response(sock).status]
        statuses.append(read_response(sock, head_only=True).status)
        last = read_response(sock)
        statuses.append(last.status)
        assert last.headers.get("connection") == "close"
        assert sock.recv(10) == b""
    assert statuses == [200, 404, 200, 200]


def _served_quickly(server: HttpServer) -> float:
    start = time.perf_counter()
    assert request(server.url, "/v1/topology").status == 200
    return time.perf_counter() - start


def test_hostile_clients_are_rejected_without_hurting_others(server: HttpServer) -> None:
    huge = "x" * 20000
    assert request(server.url, "/healthz", headers={"X-Big": huge}).status == 431
    assert request(server.url, "/" + "a" * 20000).status == 431
    body = request(server.url, "/v1/topology", method="POST", headers={"Content-Length": "99999"})
    assert body.status == 413
    with connect(server.url) as sock:
        sock.sendall(b"GARBAGE\x00\x01 / HTTP/9\r\n\r\n")
        assert read_response(sock).status == 400
        assert sock.recv(10) == b""  # closed
    with connect(server.url) as sock:
        sock.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"
        )
        upgrade = read_response(sock)  # the upgrade is ignored, the connection then closed
        assert upgrade.status == 200 and upgrade.headers["connection"] == "close"
        assert sock.recv(10) == b""
    # Slowloris: many half-sent requests; others are still served at once, and the
    # stragglers are cut off after header_timeout (1 s here).
    slow = []
    for _ in range(50):
        s = connect(server.url)
        s.sendall(b"GET /v1/topology HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        slow.append(s)
    try:
        assert _served_quickly(server) < 0.5
        time.sleep(1.3)
        answered = [read_response(s).status for s in slow]
        assert set(answered) == {408}
    finally:
        for s in slow:
            s.close()
    assert server.stats.rejected["timeout"] >= 50
    assert _served_quickly(server) < 0.5


def test_connection_limit_and_unread_responses() -> None:
    view = View(snapshot_of("dgx-h100"))
    limits = Limits(max_connections=4, write_buffer_high=64 * 1024)
    with HttpServer("127.0.0.1:0", view, limits=limits) as srv:
        held = [connect(srv.url) for _ in range(4)]
        try:
            with connect(srv.url) as extra:
                assert read_response(extra).status == 503
            # A client that pipelines requests and never reads: the server stops reading
            # it once the unread output passes the limit, and keeps serving others.
            greedy = held[0]
            greedy.setblocking(False)
            sent = 0
            req = b"GET /v1/inventory HTTP/1.1\r\nHost: x\r\n\r\n" * 50
            for _ in range(200):
                try:
                    sent += greedy.send(req)
                except BlockingIOError:
                    break
            time.sleep(0.2)
            for s in held[1:]:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert read_response(s).status == 200
        finally:
            for s in held:
                s.close()


def test_address_reusable_right_after_the_server_dies(view: View) -> None:
    srv = HttpServer("127.0.0.1:0", view).start()
    port = srv.address[1]
    with connect(srv.url) as sock:  # a live connection: the server side ends in TIME_WAIT
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        read_response(sock)
        srv.stop()
    again = HttpServer(f"127.0.0.1:{port}", view).start()
    try:
        assert request(again.url, "/healthz").status == 200
    finally:
        again.stop()


def test_parse_addr() -> None:
    assert parse_addr(":8080") == ("0.0.0.0", 8080)
    assert parse_addr("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_addr("[::1]:9") == ("::1", 9)
    with pytest.raises(ValueError):
        parse_addr("localhost")


def test_busy_port_fails_at_start(view: View) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            HttpServer(f"127.0.0.1:{taken.getsockname()[1]}", view).start()


def test_a_gpu_left_to_its_vendor_driver_carries_only_the_vendor_identity() -> None:
    """``--duplicates yield`` beside NVIDIA's plugin: toposlice does not publish its GPUs,
    so /v1/topology's GPU vertices name only the plugin's devices; NICs and CPUs keep
    toposlice's identity."""
    import dataclasses

    import yaml

    from normalize.crossdriver import normalization_report

    snap = snapshot_of("dgx-h100")
    path = Path(__file__).parent / "data" / "foreign-slices" / "recorded" / "nvidia-gpu.yaml"
    slices = [
        {**s, "spec": {**s["spec"], "nodeName": snap.node_name, "pool": {
            **s["spec"]["pool"], "name": snap.node_name}}}
        for s in yaml.safe_load_all(path.read_text()) if s
    ]  # fmt: skip
    report = normalization_report(snap, slices)
    gpus = {n for n in snap.vertex_devices.values() if n.startswith("gpu-")}
    assert len(gpus) == 8
    view = View(snap)
    with HttpServer("127.0.0.1:0", view) as srv:
        for withheld, drivers in ((frozenset(), 2), (frozenset(gpus), 1)):
            srv.publish(normalization=dataclasses.replace(report, withheld=withheld))
            doc = topology(srv)
            for v in doc["vertices"]:
                idents = [d["driver"] for d in v["attrs"].get("dra", [])]
                if v["kind"] == "gpu":
                    assert len(idents) == drivers and "gpu.nvidia.com" in idents, v["id"]
                    assert ("toposlice.dev" in idents) == (drivers == 2)
                elif v["kind"] in ("nic", "cpu_group"):
                    assert "toposlice.dev" in idents
