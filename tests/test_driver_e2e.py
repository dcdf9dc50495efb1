"""``toposlice run --fake dgx-h100`` as a process, driven the way the kubelet drives it,
against the test API server: registration, slices, prepare/unprepare, health, SIGTERM,
kill -9 and restart, and the ways it must refuse to start."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from normalize.validation import validate_pool
from tests.kubeapi import KubeAPIServer
from tests.kubelet import (
    NodeClient,
    allocated_claim,
    register_retrying,
    run_argv,
    wait_for,
    wait_for_socket,
)

REPO = Path(__file__).resolve().parent.parent
DRIVER = "toposlice.dev"
NODE = "n1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Driver:
    """One ``toposlice run`` process and its directories (short: AF_UNIX paths)."""

    def __init__(self, base: Path, kubeconfig: Path, port: int) -> None:
        self.base = base
        self.kubeconfig = kubeconfig
        self.port = port
        self.reg = base / "reg"  # the paths run_argv uses
        self.plugins = base / "plug"
        self.cdi = base / "cdi"
        self.state = base / "state"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def reg_socket(self) -> Path:
        return self.reg / f"{DRIVER}-reg.sock"

    def argv(self, *extra: str) -> list[str]:
        return run_argv(
            self.base,
            self.kubeconfig,
            NODE,
            "--http-addr",
            f"127.0.0.1:{self.port}",
            "--resync-interval",
            "0.5",
            "--startup-timeout",
            "0",
            *extra,
        )

    def start(self, *extra: str) -> Driver:
        self.proc = subprocess.Popen(
            self.argv(*extra), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        return self

    def started(self, timeout: float = 30) -> Any:
        wait_for_socket(self.reg_socket, timeout)
        return register_retrying(self.reg_socket, timeout)

    def http(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def wait_http(self, path: str, status: int, timeout: float = 20) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.http(path)[0] == status:
                    return True
            except OSError:
                pass
            time.sleep(0.1)
        return False

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        return rc

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def api() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as server:
        server.add_node(NODE)
        yield server


@pytest.fixture
def driver(api: KubeAPIServer) -> Iterator[Driver]:
    with tempfile.TemporaryDirectory(prefix="ts-e2e-") as d:
        base = Path(d)
        drv = Driver(base, api.write_kubeconfig(base / "kubeconfig"), free_port())
        yield drv
        drv.kill()


def test_runs_as_the_kubelet_sees_it(api: KubeAPIServer, driver: Driver) -> None:
    foreign = driver.reg / "other.example.com-reg.sock"
    driver.reg.mkdir(parents=True)
    foreign_sock = socket.socket(socket.AF_UNIX)
    foreign_sock.bind(str(foreign))
    driver.start()
    reg = driver.started()
    assert reg.version == "v1.DRAPlugin"
    assert list(reg.info.supported_versions)[:2] == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert reg.info.name == DRIVER
    assert reg.info.endpoint == str(driver.plugins / "dra.sock")

    # Slices: valid, owned by the Node, and ready reflects registration + publishing.
    assert wait_for(lambda: len(api.slices(DRIVER, NODE)) == 1)
    slices = api.slices(DRIVER, NODE)
    assert validate_pool(slices) == []
    for s in slices:
        kubernetes_validate.validate(s, "1.37", strict=True)
    node_uid = api.store.get("nodes", "", NODE)["metadata"]["uid"]
    assert slices[0]["metadata"]["ownerReferences"][0]["uid"] == node_uid
    assert driver.wait_http("/readyz", 200)
    assert driver.http("/healthz")[0] == 200
    metrics = driver.http("/metrics")[1].decode()
    assert 'resourceslice_writes_total{operation="create"} 1.0' in metrics
    status, dot = driver.http("/v1/topology?format=dot")  # the CLI hands in the renderer
    assert status == 200 and dot.startswith(b"digraph"), (status, dot[:200])
    assert b"GPU0" in dot

    # Steady state: no writes, and no reads either, while resyncs (every 0.5 s) run: the
    # publisher compares against its watch of the slices.
    api.reset_counters()
    sent = driver.http("/metrics")[1].decode()
    time.sleep(2.0)
    assert api.writes() == 0
    assert api.count("list") == api.count("get") == 0
    # The driver's own count of its requests says the same, and names what it did send.
    assert 'toposlice_api_requests_total{resource="resourceslices",verb="list"} 1.0' in sent
    assert 'toposlice_api_requests_total{resource="nodes",verb="get"} 1.0' in sent
    again = driver.http("/metrics")[1].decode()
    assert [ln for ln in again.splitlines() if ln.startswith("toposlice_api_requests_total")] == [
        ln for ln in sent.splitlines() if ln.startswith("toposlice_api_requests_total")
    ]

    # A slice deleted behind its back comes back (well within 30 s).
    api.store.delete("resourceslices", "", slices[0]["metadata"]["name"])
    assert wait_for(lambda: len(api.slices(DRIVER, NODE)) == 1, 10)

    gpu = next(d["name"] for d in slices[0]["spec"]["devices"] if d["name"].startswith("gpu-"))
    claim = api.add_claim(allocated_claim("c1", [gpu], pool=NODE, driver=DRIVER))
    uid = claim["metadata"]["uid"]
    outside = api.add_claim(allocated_claim("c2", ["gpu-nope"], pool=NODE, driver=DRIVER))
    for version in ("v1.DRAPlugin", "v1beta1.DRAPlugin"):
        with NodeClient(reg.info.endpoint, version) as kubelet:
            resp = kubelet.prepare(
                [
                    ("default", "c1", uid),
                    ("default", "missing", "0c5f6a8e-0000-4000-8000-000000000000"),
                    ("default", "c2", outside["metadata"]["uid"]),
                ]
            )
            assert len(resp.claims) == 3
            got = resp.claims[uid]
            assert got.error == ""
            assert [(d.pool_name, d.device_name) for d in got.devices] == [(NODE, gpu)]
            assert resp.claims["0c5f6a8e-0000-4000-8000-000000000000"].error
            assert resp.claims[outside["metadata"]["uid"]].error
    specs = os.listdir(driver.cdi)
    # The claim's spec and its device metadata spec (one per request): every id resolves.
    assert len(specs) == 2 and all(uid in name for name in specs)
    ids = set()
    for name in specs:
        spec = json.loads((driver.cdi / name).read_text())
        ids |= {f"{spec['kind']}={d['name']}" for d in spec["devices"]}
    assert set(got.devices[0].cdi_device_ids) <= ids
    assert any("/metadata=" in i for i in got.devices[0].cdi_device_ids)

    # The health stream sends every device of the pool.
    with NodeClient(reg.info.endpoint) as kubelet:
        stream = kubelet.health(timeout=10)
        first = next(stream)
        assert {d.device.device_name for d in first.devices} == {
            d["name"] for d in api.slices(DRIVER, NODE)[0]["spec"]["devices"]
        }
        stream.cancel()

    # SIGTERM: exit 0, own sockets gone, the other plugin's socket, checkpoint, CDI spec
    # and slices stay.
    assert driver.stop() == 0
    assert not driver.reg_socket.exists()
    assert not (driver.plugins / "dra.sock").exists()
    assert foreign.exists()
    foreign_sock.close()
    assert (driver.state / "checkpoint.json").exists()
    assert os.listdir(driver.cdi) == specs
    assert len(api.slices(DRIVER, NODE)) == 1


def test_kill_9_and_restart(api: KubeAPIServer, driver: Driver) -> None:
    driver.start()
    reg = driver.started()
    assert driver.wait_http("/readyz", 200)
    gpu = "gpu-0000-1b-00-0"
    claim = api.add_claim(allocated_claim("c1", [gpu], pool=NODE, driver=DRIVER))
    ref = ("default", "c1", claim["metadata"]["uid"])
    with NodeClient(reg.info.endpoint) as kubelet:
        first = kubelet.prepare([ref]).claims[ref[2]]
    assert first.error == ""
    before = api.slices(DRIVER, NODE)

    driver.stop(signal.SIGKILL)
    assert driver.reg_socket.exists()  # left behind by the killed process
    api.reset_counters()
    driver.start()  # same --http-addr, --state-dir
    reg = driver.started()
    assert driver.wait_http("/readyz", 200)
    with NodeClient(reg.info.endpoint) as kubelet:
        again = kubelet.prepare([ref]).claims[ref[2]]
        assert again.error == ""
        assert [list(d.cdi_device_ids) for d in again.devices] == [
            list(d.cdi_device_ids) for d in first.devices
        ]
        assert kubelet.unprepare([ref]).claims[ref[2]].error == ""
    assert os.listdir(driver.cdi) == []
    # Same hardware: the restart kept the published slices as they were.
    assert api.slices(DRIVER, NODE) == before
    assert api.writes() == 0
    assert driver.stop() == 0


def run_fail(argv: list[str], timeout: float = 60) -> tuple[int, str]:
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stderr


def test_bad_flags_are_one_line(driver: Driver) -> None:
    for flags, needle in (
        (["--node-name", "BAD_Name"], "not a valid Kubernetes node name"),
        (["--driver", "bad_driver"], "--driver 'bad_driver'"),
        (["--publish", "gpu,fpga"], "--publish"),
        (["--http-addr", "nowhere"], "--http-addr"),
    ):
        rc, err = run_fail(driver.argv(*flags))
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and needle in lines[0], err
    assert not driver.reg.exists()


def test_unreachable_api_server_or_missing_node(api: KubeAPIServer, driver: Driver) -> None:
    rc, err = run_fail(driver.argv("--node-name", "not-there"))
    assert rc == 1 and "node 'not-there' not found" in err, err
    assert not driver.reg_socket.exists() and not (driver.plugins / "dra.sock").exists()

    api.stop()
    rc, err = run_fail(driver.argv())
    assert rc == 1 and "unreachable" in err, err
    error_lines = [ln for ln in err.splitlines() if ln.startswith("toposlice: error:")]
    assert len(error_lines) == 1
    assert not driver.reg_socket.exists()


def test_rediscovery_runs_in_a_helper_process(api: KubeAPIServer, driver: Driver) -> None:
    """Rediscovery is the niced helper's work (shared with ``toposlice serve``), not a GIL
    holder in the process serving the kubelet and HTTP; its snapshots still arrive."""
    driver.start("--rediscover-interval", "0.3")
    driver.started()
    assert driver.wait_http("/readyz", 200)
    assert driver.proc is not None
    pid = driver.proc.pid

    def helpers() -> list[int]:
        try:
            return _niced_helpers(pid)
        except OSError:  # a thread or child ended while being read
            return []

    def _niced_helpers(pid: int) -> list[int]:
        kids = [  # each thread lists the children it started
            k
            for t in Path(f"/proc/{pid}/task").iterdir()
            for k in (t / "children").read_text().split()
        ]
        return [
            int(k)
            for k in kids
            if b"multiprocessing" in Path(f"/proc/{k}/cmdline").read_bytes()
            and os.getpriority(os.PRIO_PROCESS, int(k)) > os.getpriority(os.PRIO_PROCESS, pid)
        ]

    assert wait_for(lambda: len(helpers()) == 1, 20)

    def discoveries() -> float:
        for line in driver.http("/metrics")[1].decode().splitlines():
            if line.startswith("toposlice_discovery_duration_seconds_count"):
                return float(line.split()[-1])
        return 0.0

    seen = discoveries()
    assert wait_for(lambda: discoveries() >= seen + 2, 20)
    assert driver.http("/readyz")[0] == 200
    helper = helpers()[0]
    assert driver.stop() == 0
    assert wait_for(lambda: not Path(f"/proc/{helper}").exists(), 10)  # closed with it
