"""Observe mode: other drivers' slices read from the API server, matched to the graph and
served; ``toposlice serve`` end to end, including a restart on the same port after kill -9."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from driver.exporter.http_server import HttpServer
from driver.publisher.observe import ApiSlices, Observer
from tests.exporter_view import (
    FOREIGN_SLICE_FILES,
    View,
    foreign_api,
    request,
    snapshot_of,
    wait_for,
)
from tests.kubeapi import KubeAPIServer
from tests.test_doctor import assert_observed_planted

REPO = Path(__file__).resolve().parent.parent
FILES = FOREIGN_SLICE_FILES


@pytest.fixture
def api() -> Iterator[KubeAPIServer]:
    with foreign_api() as server:
        yield server


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    reg = tmp_path / "plugins_registry"
    reg.mkdir()
    for name in ("gpu.nvidia.com-reg.sock", "dra.net-reg.sock", "dra.cpu-reg.sock"):
        (reg / name).touch()
    return reg


def test_observer_feeds_the_server(api: KubeAPIServer, registry: Path, tmp_path: Path) -> None:
    snap = snapshot_of("dgx-h100")
    view = View(snap)
    kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
    with HttpServer("127.0.0.1:0", view, publishes=False) as srv:
        before = request(srv.url, "/v1/topology").headers["etag"]
        observer = Observer(
            ApiSlices("dgx-h100", kubeconfig).list,
            view.snapshot,
            lambda report: srv.publish(normalization=report),
            registry_dir=registry,
        )
        report = observer.observe_once()
        assert report is not None and observer.reads == 1
        norm = json.loads(request(srv.url, "/v1/normalization").body)
        assert_observed_planted(norm)
        topo = request(srv.url, "/v1/topology")
        assert topo.headers["etag"] != before
        doc = json.loads(topo.body)
        jsonschema.validate(doc, json.loads((REPO / "docs/schema/graph.schema.json").read_text()))
        verts = {v["id"]: v for v in doc["vertices"]}
        # serve publishes nothing itself: only the other drivers' identities.
        assert verts["gpu:0000:c3:00.0"]["attrs"]["dra"] == [
            {"driver": "gpu.nvidia.com", "pool": "dgx-h100", "device": "gpu-5"}
        ]
        assert verts["nic:0000:c0:00.0"]["attrs"]["dra"] == [
            {"driver": "dra.net", "pool": "dgx-h100", "device": "rdma-mlx5-9"}
        ]
        assert verts["cpu_group:cpu-numa0"]["attrs"]["dra"] == [
            {"driver": "dra.cpu", "pool": "dgx-h100", "device": "cpudevnuma000"}
        ]
        assert "dra" not in verts["nvswitch:0000:05:00.0"]["attrs"]
        metrics = request(srv.url, "/metrics").body.decode()
        assert (
            'toposlice_normalization_findings{check="disagrees-with-hardware",'
            'driver="gpu.nvidia.com"} 1.0' in metrics
        )
        assert 'toposlice_foreign_devices{driver="dra.net",matched="true"} 12.0' in metrics
        page = request(srv.url, "/").body.decode()
        assert "Cross-driver findings" in page and "pciBusID-without-pcieRoot" in page
        # The API server goes away: the last report stays, the error is kept, no crash.
        api.down(5)
        assert observer.observe_once() is None
        assert "listing ResourceSlices failed" in observer.last_error
        assert json.loads(request(srv.url, "/v1/normalization").body)["summary"]["devices"] == 23


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(port: int, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toposlice",
            "-q",
            "serve",
            "--fake",
            "dgx-h100",
            "--http-addr",
            f"127.0.0.1:{port}",
            *extra,
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_serve_observes_and_restarts_on_the_same_port_after_kill_9(
    api: KubeAPIServer, registry: Path, tmp_path: Path
) -> None:
    kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    args = ("--observe", "--kubeconfig", kubeconfig, "--plugins-registry", str(registry))
    proc = _serve(port, *args, "--observe-interval", "0.5")
    try:

        def observed() -> bool:
            try:
                body = request(url, "/v1/normalization", timeout=2).body
            except OSError:
                return False
            return bool(json.loads(body).get("devices"))

        assert wait_for(observed, 60), proc.stderr.read() if proc.poll() is not None else ""
        assert request(url, "/readyz").status == 200
        # Hold a connection open, then kill -9: the port must be reusable at once.
        held = socket.create_connection(("127.0.0.1", port))
        held.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        held.recv(1024)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        held.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    again = _serve(port, "--discover-in-process")
    try:
        assert wait_for(lambda: _ok(url), 60), again.stderr.read() if again.poll() else ""
        assert again.poll() is None
    finally:
        again.terminate()
        assert again.wait(15) == 0  # SIGTERM: clean shutdown


def _ok(url: str) -> bool:
    try:
        return request(url, "/readyz", timeout=2).status == 200
    except OSError:
        return False
