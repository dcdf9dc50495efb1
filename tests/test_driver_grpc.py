"""The kubelet's view: registration, the DRA node service (v1 and v1beta1) and the health
stream, driven over real unix sockets with the generated client stubs."""

from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from driver.interfaces import DeviceHealth
from driver.kubelet.dra_server import DraServer, start_dra_server
from driver.kubelet.registration import Registrar, start_registration
from driver.kubelet.sockets import SocketInUse
from driver.kubelet.state import DriverState
from driver.plumbing.gen import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    drahealth_v1_pb2,
    drahealth_v1_pb2_grpc,
    drahealth_v1alpha1_pb2,
    drahealth_v1alpha1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from tests.driver_support import (
    DRIVER,
    NODE,
    FakeClaims,
    FakeHealth,
    claim,
    device_names,
    make_state,
    snapshot,
)


class Node:
    """A driver instance as the daemon wires it, in a temp dir (short path: AF_UNIX)."""

    def __init__(self, base: Path, health: FakeHealth | None) -> None:
        self.reader = FakeClaims()
        self.state: DriverState = make_state(base, self.reader)
        self.plugins = base / "plugins"
        self.registry = base / "registry"
        snap = snapshot()
        self.dra: DraServer = start_dra_server(
            self.plugins,
            self.state,
            health,
            snapshot_fn=lambda: snap,
            health_resend_interval=0.3,
        )
        self.reg: Registrar = start_registration(
            self.registry, DRIVER, self.dra.endpoint, self.dra.supported_versions
        )

    def stop(self) -> None:
        self.reg.stop()
        self.dra.stop(0.5)


@pytest.fixture
def short_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # pytest's tmp paths can exceed the 107-byte AF_UNIX limit; /tmp is short.
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ts-") as d:
        yield Path(d)


@pytest.fixture
def health() -> FakeHealth:
    snap = snapshot()
    return FakeHealth(
        [DeviceHealth(pool=NODE, device=d["name"], status="Healthy") for d in snap.devices]
    )


@pytest.fixture
def node(short_tmp: Path, health: FakeHealth) -> Iterator[Node]:
    n = Node(short_tmp, health)
    yield n
    n.stop()


def channel(path: Path | str) -> grpc.Channel:
    return grpc.insecure_channel(f"unix://{path}")


def test_registration_as_the_kubelet_does_it(node: Node) -> None:
    sock = node.registry / f"{DRIVER}-reg.sock"
    assert stat.S_ISSOCK(sock.lstat().st_mode)
    with channel(sock) as ch:
        stub = pluginregistration_pb2_grpc.RegistrationStub(ch)
        info = stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=1)
        assert info.type == "DRAPlugin"
        assert info.name == DRIVER
        assert info.endpoint == str(node.plugins / "dra.sock")
        assert list(info.supported_versions) == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ]
        assert not node.reg.registered
        stub.NotifyRegistrationStatus(
            pluginregistration_pb2.RegistrationStatus(plugin_registered=False, error="nope"),
            timeout=1,
        )
        assert (node.reg.registered, node.reg.error) == (False, "nope")
        stub.NotifyRegistrationStatus(
            pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=1
        )
        assert node.reg.wait_registered(1)
        assert node.reg.error == ""


def test_no_health_feed_means_no_health_advertised(short_tmp: Path) -> None:
    n = Node(short_tmp, None)
    try:
        assert n.dra.supported_versions == ("v1.DRAPlugin", "v1beta1.DRAPlugin")
        with channel(n.dra.endpoint) as ch:
            stub = drahealth_v1alpha1_pb2_grpc.DRAResourceHealthStub(ch)
            with pytest.raises(grpc.RpcError) as err:
                next(
                    iter(
                        stub.NodeWatchResources(
                            drahealth_v1alpha1_pb2.NodeWatchResourcesRequest(), timeout=2
                        )
                    )
                )
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        n.stop()


def test_sockets_are_not_world_accessible(node: Node) -> None:
    for path in (Path(node.dra.endpoint), node.registry / f"{DRIVER}-reg.sock"):
        assert stat.S_IMODE(path.stat().st_mode) & 0o007 == 0


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_prepare_and_unprepare(node: Node, version: str) -> None:
    pb, grpc_mod = {
        "v1": (dra_v1_pb2, dra_v1_pb2_grpc),
        "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
    }[version]
    devices = device_names(snapshot(), "gpu-")[:2]
    share = {"request": "r", "driver": DRIVER, "pool": NODE, "device": "cpu-numa0"}
    share["shareID"] = "7f9c2d4e-0000-4000-8000-000000000001"
    node.reader.add(claim("uid-a", devices, extra_results=[share]))
    with channel(node.dra.endpoint) as ch:
        stub = grpc_mod.DRAPluginStub(ch)
        claims = [
            pb.Claim(namespace="default", name="claim-uid-a", uid="uid-a"),
            pb.Claim(namespace="default", name="gone", uid="uid-gone"),
        ]
        resp = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=claims), timeout=5)
        assert set(resp.claims) == {"uid-a", "uid-gone"}
        assert "not found" in resp.claims["uid-gone"].error
        got = resp.claims["uid-a"]
        assert got.error == ""
        assert [d.device_name for d in got.devices] == [*devices, "cpu-numa0"]
        assert all(d.pool_name == NODE for d in got.devices)
        assert all(list(d.request_names) == ["req"] for d in got.devices[:2])
        ids = [list(d.cdi_device_ids) for d in got.devices]
        assert all(len(i) == 1 and i[0].startswith("k8s.toposlice.dev/claim=uid-a-") for i in ids)
        if version == "v1":
            assert got.devices[2].HasField("share_id")
            assert got.devices[2].share_id == share["shareID"]
            assert not got.devices[0].HasField("share_id")
        assert node.state.spec_path("uid-a").exists()

        again = stub.NodePrepareResources(
            pb.NodePrepareResourcesRequest(claims=claims[:1]), timeout=5
        )
        assert [list(d.cdi_device_ids) for d in again.claims["uid-a"].devices] == ids

        un = stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=claims), timeout=5)
        assert set(un.claims) == {"uid-a", "uid-gone"}
        assert un.claims["uid-a"].error == "" and un.claims["uid-gone"].error == ""
        assert not node.state.spec_path("uid-a").exists()


def test_empty_request_is_an_empty_answer(node: Node) -> None:
    with channel(node.dra.endpoint) as ch:
        stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
        resp = stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(), timeout=5)
        assert len(resp.claims) == 0
    assert node.reader.reads == 0


def _read(stream: Any, n: int) -> list[Any]:
    return [next(stream) for _ in range(n)]


@pytest.mark.parametrize("version", ["v1alpha1", "v1"])
def test_health_stream(node: Node, health: FakeHealth, version: str) -> None:
    pb, grpc_mod = {
        "v1alpha1": (drahealth_v1alpha1_pb2, drahealth_v1alpha1_pb2_grpc),
        "v1": (drahealth_v1_pb2, drahealth_v1_pb2_grpc),
    }[version]
    names = [d["name"] for d in snapshot().devices]
    with channel(node.dra.endpoint) as ch:
        stub = grpc_mod.DRAResourceHealthStub(ch)
        stream = stub.NodeWatchResources(pb.NodeWatchResourcesRequest(), timeout=30)
        first = next(stream)
        assert [d.device.device_name for d in first.devices] == names
        assert {d.device.pool_name for d in first.devices} == {NODE}
        assert {d.health for d in first.devices} == {pb.HEALTHY}
        assert all(abs(d.last_updated_time - time.time()) < 60 for d in first.devices)

        # A change is sent at once, with the complete list and a message.
        t0 = time.monotonic()
        items = health.current()
        items[0] = DeviceHealth(NODE, names[0], "Unhealthy", reason="XID 79", fatal=True)
        health.set(items[:-1])  # the feed forgot a device: it is still sent, as Unknown
        changed = next(stream)
        assert time.monotonic() - t0 < 2
        by_name = {d.device.device_name: d for d in changed.devices}
        assert set(by_name) == set(names)
        assert by_name[names[0]].health == pb.UNHEALTHY
        assert by_name[names[0]].message == "XID 79"
        assert by_name[names[-1]].health == pb.UNKNOWN

        # Without changes it keeps re-sending (heartbeat 0.3 s here) and stays open.
        t0 = time.monotonic()
        beats = _read(stream, 3)
        assert all(len(b.devices) == len(names) for b in beats)
        assert time.monotonic() - t0 < 5
        stream.cancel()


def test_stale_socket_replaced_and_foreign_files_untouched(short_tmp: Path) -> None:
    plugins = short_tmp / "plugins"
    registry = short_tmp / "registry"
    plugins.mkdir()
    registry.mkdir()
    # A previous run killed with -9 left its sockets behind.
    for path in (plugins / "dra.sock", registry / f"{DRIVER}-reg.sock"):
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    other = socket.socket(socket.AF_UNIX)
    other_path = registry / "gpu.example.com-reg.sock"
    other.bind(str(other_path))
    n = Node(short_tmp, None)
    with channel(n.reg.socket.path if n.reg.socket else "") as ch:
        info = pluginregistration_pb2_grpc.RegistrationStub(ch).GetInfo(
            pluginregistration_pb2.InfoRequest(), timeout=1
        )
        assert info.name == DRIVER
    n.stop()
    assert sorted(os.listdir(registry)) == ["gpu.example.com-reg.sock"]
    assert os.listdir(plugins) == []
    other.close()


def test_refuses_to_remove_a_non_socket(short_tmp: Path) -> None:
    plugins = short_tmp / "plugins"
    plugins.mkdir()
    (plugins / "dra.sock").write_text("not a socket")
    reader = FakeClaims()
    with pytest.raises(FileExistsError):
        start_dra_server(plugins, make_state(short_tmp, reader))
    assert (plugins / "dra.sock").read_text() == "not a socket"


def test_a_second_instance_leaves_a_live_instances_sockets(short_tmp: Path) -> None:
    """A second driver process on the node (a helper that re-ran the CLI, a stray start)
    used to replace the live sockets, fail later in its start and remove them: the kubelet
    then had no plugin ("DRA driver ... is not registered"). A live socket is not stale."""
    first = Node(short_tmp, None)
    with pytest.raises(SocketInUse, match="another running process"):
        Node(short_tmp, None)
    with pytest.raises(SocketInUse, match="another running process"):
        start_registration(first.registry, DRIVER, "/unused/dra.sock", ["v1.DRAPlugin"])
    assert first.reg.socket is not None
    assert sorted(os.listdir(first.registry)) == [f"{DRIVER}-reg.sock"]
    with channel(first.reg.socket.path) as ch:
        info = pluginregistration_pb2_grpc.RegistrationStub(ch).GetInfo(
            pluginregistration_pb2.InfoRequest(), timeout=1
        )
        assert info.endpoint == first.dra.endpoint
    with channel(first.dra.endpoint) as ch:
        stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
        stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(), timeout=5)
    first.stop()
    assert os.listdir(first.registry) == []
    second = Node(short_tmp, None)  # once the first has gone, its successor starts
    assert Path(second.dra.endpoint).exists()
    second.stop()


def test_stop_removes_only_the_socket_it_created(short_tmp: Path) -> None:
    first = Node(short_tmp, None)
    assert first.reg.socket is not None
    path = first.reg.socket.path
    first.reg.socket.server.stop(0).wait()  # it died without cleaning up: the file is stale
    successor = start_registration(first.registry, DRIVER, first.dra.endpoint, ["v1.DRAPlugin"])
    first.stop()  # its late stop must not remove the successor's socket
    assert path.exists()
    successor.stop()
    assert not path.exists()


def test_stop_ends_open_health_streams_and_removes_only_own_sockets(short_tmp: Path) -> None:
    feed = FakeHealth([DeviceHealth(NODE, d["name"], "Healthy") for d in snapshot().devices])
    n = Node(short_tmp, feed)
    ch = channel(n.dra.endpoint)
    stream = drahealth_v1alpha1_pb2_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
        drahealth_v1alpha1_pb2.NodeWatchResourcesRequest(), timeout=30
    )
    next(stream)
    t0 = time.monotonic()
    n.stop()
    with pytest.raises((StopIteration, grpc.RpcError)):
        while True:
            next(stream)
    assert time.monotonic() - t0 < 5
    assert os.listdir(n.plugins) == [] and os.listdir(n.registry) == []
    assert n.state.checkpoint_path.exists()
    ch.close()
