"""``/metrics``: names, label bounds, the daemon's event helpers, degraded links."""

from __future__ import annotations

import copy
import gzip
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from driver.exporter.http_server import HttpServer
from driver.exporter.links import degraded_link_warnings, pcie_links
from driver.exporter.metrics import MAX_METHODS, DriverMetrics
from driver.interfaces import DeviceHealth, DriverStatus
from normalize.snapshot import build_snapshot
from tests.exporter_view import View, request, snapshot_of

REPO = Path(__file__).resolve().parent.parent


def scrape(server: HttpServer) -> dict[str, list[tuple[dict[str, str], float]]]:
    resp = request(server.url, "/metrics")
    assert resp.status == 200
    assert resp.headers["content-type"].startswith("text/plain; version=")
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(resp.body.decode()):
        out.setdefault(fam.name + ("_total" if fam.type == "counter" else ""), [])
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


@pytest.fixture
def served() -> Iterator[tuple[HttpServer, View, DriverMetrics]]:
    snap = snapshot_of("dgx-h100")
    view = View(
        snap,
        alloc={"gpu-0000-1b-00-0": "uid-1"},
        healths=[DeviceHealth(snap.pool, "gpu-0000-43-00-0", "Unhealthy", "XID 79", fatal=True)],
    )
    metrics = DriverMetrics()
    with HttpServer("127.0.0.1:0", view, metrics) as srv:
        yield srv, view, metrics


def test_device_info_links_nvlinks_health(served: tuple[HttpServer, View, DriverMetrics]) -> None:
    srv, _view, _m = served
    m = scrape(srv)
    info = m["toposlice_device_info"]
    kinds = [labels["kind"] for labels, _ in info]
    assert kinds.count("gpu") == 8 and kinds.count("nic") == 12 and kinds.count("cpu") == 2
    gpu0 = next(labels for labels, _ in info if labels["bus_id"] == "0000:1b:00.0")
    assert gpu0 == {
        "kind": "gpu",
        "vendor": "nvidia",
        "model": "NVIDIA H100 80GB HBM3",
        "bus_id": "0000:1b:00.0",
        "pcie_root": "pci0000:15",
        "numa_node": "0",
        "driver": "toposlice.dev",
        "pool": "dgx-h100",
        "device": "gpu-0000-1b-00-0",
    }
    nvl = {labels["bus_id"]: v for labels, v in m["toposlice_nvlink_links_up"]}
    assert len(nvl) == 8 and set(nvl.values()) == {18.0}
    speeds = {labels["bus_id"] for labels, _ in m["toposlice_pcie_link_speed_gts"]}
    assert {"0000:1b:00.0", "0000:18:00.0"} <= speeds
    assert all(v == 0 for _, v in m["toposlice_pcie_link_degraded"])
    health = {(lb["device"], lb["status"]): v for lb, v in m["toposlice_device_health"]}
    assert health[("gpu-0000-43-00-0", "Unhealthy")] == 1
    assert health[("gpu-0000-43-00-0", "Healthy")] == 0
    assert m["toposlice_device_tainted"] == [
        ({"device": "gpu-0000-43-00-0", "effect": "NoExecute"}, 1.0)
    ]
    alloc = {lb["device"]: v for lb, v in m["toposlice_device_allocated"]}
    assert alloc["gpu-0000-1b-00-0"] == 1 and alloc["gpu-0000-43-00-0"] == 0
    assert m["toposlice_ready"] == [({}, 1.0)]


def test_event_helpers_and_label_bounds(served: tuple[HttpServer, View, DriverMetrics]) -> None:
    srv, view, metrics = served
    metrics.grpc_call("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources", 0.004)
    with pytest.raises(ValueError), metrics.time_grpc("NodeUnprepareResources"):
        raise ValueError("boom")
    for i in range(MAX_METHODS + 10):
        metrics.grpc_call(f"/svc/Method{i}", 0.001, code="NOT_A_CODE")
    metrics.slice_write("create")
    metrics.slice_write("update", 409, ok=False)
    metrics.slice_write("delete", "connection refused", ok=False)
    metrics.slice_write("frobnicate")
    metrics.discovery(0.2, snapshot_of("dgx-h100").inventory)
    metrics.discovery(1.5, None, failed=True)
    view.state = DriverStatus(registered=True, publisher_synced=False)
    m = scrape(srv)
    calls = {(lb["method"], lb["code"]): v for lb, v in m["toposlice_grpc_requests_total"]}
    assert calls[("NodePrepareResources", "OK")] == 1
    assert calls[("NodeUnprepareResources", "INTERNAL")] == 1
    methods = {lb["method"] for lb, _ in m["toposlice_grpc_requests_total"]}
    assert len(methods) <= MAX_METHODS + 1 and "other" in methods
    assert {lb["code"] for lb, _ in m["toposlice_grpc_requests_total"]} <= {
        "OK",
        "INTERNAL",
        "other",
    }
    counts = [
        v
        for lb, v in m["toposlice_grpc_request_duration_seconds_count"]
        if lb["method"] == "NodePrepareResources"
    ]
    assert counts == [1.0]
    writes = {lb["operation"]: v for lb, v in m["toposlice_resourceslice_writes_total"]}
    assert writes == {"create": 1, "update": 1, "delete": 1, "other": 1}
    errors = {
        (lb["operation"], lb["code"]) for lb, _ in m["toposlice_resourceslice_write_errors_total"]
    }
    assert errors == {("update", "409"), ("delete", "network")}
    assert m["toposlice_discovery_errors_total"] == [({}, 1.0)]
    assert {lb["probe"] for lb, _ in m["toposlice_probe_up"]} >= {"nvidia", "rdma"}
    assert m["toposlice_ready"] == [({}, 0.0)]
    assert m["toposlice_publisher_synced"] == [({}, 0.0)]
    # A request is counted once answered: the first scrape shows up in the second.
    assert ("/metrics", "200") in {
        (lb["route"], lb["code"]) for lb, _ in scrape(srv)["toposlice_http_requests_total"]
    }


def test_metrics_gzip(served: tuple[HttpServer, View, DriverMetrics]) -> None:
    srv, _, _ = served
    resp = request(srv.url, "/metrics", headers={"Accept-Encoding": "gzip"})
    assert resp.headers["content-encoding"] == "gzip"
    assert b"toposlice_device_info" in gzip.decompress(resp.body)


def test_degraded_link_is_a_metric_and_an_inventory_warning() -> None:
    base = snapshot_of("dgx-h100")
    inv = copy.deepcopy(base.inventory)
    nic = inv.pci("0000:18:00.0")
    gpu = inv.pci("0000:1b:00.0")
    assert nic is not None and gpu is not None
    nic.link.current_width = 8  # x16 card trained at x8
    gpu.link.current_speed_gts = 2.5  # an idle GPU downclocks: not degraded
    links = {s.bus_id: s for s in pcie_links(inv)}
    assert links["0000:18:00.0"].degraded and not links["0000:1b:00.0"].degraded
    snap = build_snapshot(inv, base.node_name)
    with HttpServer("127.0.0.1:0", View(snap)) as srv:
        m = scrape(srv)
        degraded = {lb["bus_id"] for lb, v in m["toposlice_pcie_link_degraded"] if v == 1}
        assert degraded == {"0000:18:00.0"}
        warnings = json.loads(request(srv.url, "/v1/inventory").body)["warnings"]
    assert warnings == degraded_link_warnings(inv)
    assert len(warnings) == 1 and "0000:18:00.0" in warnings[0] and "x8" in warnings[0]


def test_dashboard_uses_only_exported_metrics(
    served: tuple[HttpServer, View, DriverMetrics],
) -> None:
    srv, _view, metrics = served
    metrics.grpc_call("NodePrepareResources", 0.01)
    metrics.slice_write("update", 500, ok=False)
    metrics.discovery(0.1, snapshot_of("dgx-h100").inventory)
    metrics.discovery(0.1, None, failed=True)
    request(srv.url, "/nope")
    with socket.create_connection(srv.address) as bad:
        bad.sendall(b"\x00garbage\r\n\r\n")
        bad.recv(100)
    exported = set(scrape(srv))
    dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    used = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used.update(re.findall(r"toposlice_[a-z_]+", target["expr"]))
    assert used and used <= exported, used - exported
    # The metrics doc names every exported family.
    doc = (REPO / "docs" / "metrics.md").read_text()
    families = {re.sub(r"_(bucket|count|sum|total)$", "", n) for n in exported}
    missing = {f for f in families if f not in doc and f.removesuffix("_info") not in doc}
    assert not missing, missing
