"""Health: conditions on graph vertices, the blast radius, taints, and one write per change."""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from discovery.model import Inventory
from driver.health.monitor import HealthEvent, HealthMonitor, sysfs_link_reader, xid_event
from driver.health.nvml_events import NvmlXidSource
from driver.plumbing.hotplug import Debouncer
from driver.plumbing.kube import build_api_client
from driver.publisher.slices import SlicePublisher
from normalize.snapshot import Snapshot, build_snapshot
from tests.kubeapi import KubeAPIServer
from toposlice.discover import discover

DRIVER = "toposlice.dev"
NODE = "n1"


@pytest.fixture(scope="module")
def inv() -> Inventory:
    return discover("/", fake="dgx-h100")


@pytest.fixture(scope="module")
def snap(inv: Inventory) -> Snapshot:
    return build_snapshot(inv, NODE)


def monitor(snap: Snapshot, **kw: Any) -> HealthMonitor:
    m = HealthMonitor(DRIVER, clock=lambda: 1_700_000_000.0, **kw)
    m.update_snapshot(snap)
    return m


def unhealthy(m: HealthMonitor) -> dict[str, str]:
    return {h.device: h.reason for h in m.current() if h.status == "Unhealthy"}


def behind(snap: Snapshot, vertex: str) -> set[str]:
    """Devices below ``vertex`` following pcie edges, computed independently here."""
    children: dict[str, list[str]] = {}
    for e in snap.graph["edges"]:
        if e["kind"] == "pcie":
            children.setdefault(e["source"], []).append(e["target"])
    out, stack = set(), list(children.get(vertex, []))
    while stack:
        v = stack.pop()
        if v in snap.vertex_devices:
            out.add(snap.vertex_devices[v])
        stack.extend(children.get(v, []))
    return out


def test_all_healthy_at_first(snap: Snapshot) -> None:
    m = monitor(snap)
    cur = m.current()
    assert [h.device for h in cur] == [d["name"] for d in snap.devices]
    assert {h.status for h in cur} == {"Healthy"} and {h.pool for h in cur} == {NODE}
    assert m.taints() == {}


def test_xid_classes() -> None:
    assert xid_event("gpu:x", 13) is None  # the application's fault
    fatal = xid_event("gpu:x", 79)
    assert fatal is not None and fatal.fatal and fatal.value == "79"
    soft = xid_event("gpu:x", 61)
    assert soft is not None and not soft.fatal


def test_gpu_xid_taints_that_gpu(snap: Snapshot) -> None:
    m = monitor(snap)
    gpu_vertex, gpu = next((v, n) for v, n in snap.vertex_devices.items() if v.startswith("gpu:"))
    v0 = m.version
    ev = xid_event(gpu_vertex, 79)
    assert ev is not None and m.report(ev)
    assert m.wait_change(v0, 0.1) != v0
    assert unhealthy(m) == {gpu: "XID 79"}
    (taint,) = m.taints()[gpu]
    assert taint == {
        "key": f"{DRIVER}/xid",
        "value": "79",
        "effect": "NoExecute",
        "timeAdded": "2023-11-14T22:13:20Z",
    }
    assert not m.report(ev)  # the same condition again changes nothing
    assert m.report(HealthEvent(gpu_vertex, True, "xid"))
    assert unhealthy(m) == {}


def test_failed_pcie_switch_taints_everything_behind_it(snap: Snapshot) -> None:
    bridges = [v["id"] for v in snap.graph["vertices"] if v["kind"] == "bridge"]
    # The switch with the most devices below it (GPU and NICs share a switch on a DGX).
    switch = max(bridges, key=lambda b: len(behind(snap, b)))
    expected = behind(snap, switch)
    assert len(expected) >= 2 and any(n.startswith("gpu-") for n in expected)
    m = monitor(snap)
    m.report(HealthEvent(switch, False, "pcie-error", "aer", "uncorrectable AER", fatal=True))
    assert set(unhealthy(m)) == expected
    for name in expected:
        (taint,) = m.taints()[name]
        assert taint["key"] == f"{DRIVER}/upstream-failed"
        assert taint["effect"] == "NoExecute"
        assert ":" not in taint["value"]  # a label value
    assert all("behind failed PCIe switch" in r for r in unhealthy(m).values())


def test_failed_nvswitch_taints_its_gpus(snap: Snapshot) -> None:
    nvswitch = next(v["id"] for v in snap.graph["vertices"] if v["kind"] == "nvswitch")
    linked = {
        snap.vertex_devices[e["source"] if e["target"] == nvswitch else e["target"]]
        for e in snap.graph["edges"]
        if e["kind"] == "nvlink" and nvswitch in (e["source"], e["target"])
    }
    assert len(linked) == 8
    m = monitor(snap)
    m.report(HealthEvent(nvswitch, False, "nvswitch", "fatal", "NVSwitch fatal error", True))
    assert set(unhealthy(m)) == linked


def _with_operstate(inv: Inventory, netdev: str, state: str) -> Inventory:
    inv2 = copy.deepcopy(inv)
    for iface in inv2.net_interfaces:
        if iface.name == netdev:
            iface.operstate = state
    return inv2


def test_nic_link_down_from_the_inventory(inv: Inventory, snap: Snapshot) -> None:
    nic_vertex = next(
        v for v in snap.graph["vertices"] if v["kind"] == "nic" and v["attrs"].get("netdevs")
    )
    netdev = nic_vertex["attrs"]["netdevs"][0]
    nic = snap.vertex_devices[nic_vertex["id"]]
    m = monitor(snap)
    assert m.update_snapshot(build_snapshot(_with_operstate(inv, netdev, "down"), NODE))
    assert list(unhealthy(m)) == [nic]
    assert m.taints()[nic][0]["effect"] == "NoSchedule"
    assert m.taints()[nic][0]["value"] == netdev
    assert m.update_snapshot(build_snapshot(_with_operstate(inv, netdev, "up"), NODE))
    assert unhealthy(m) == {}


def test_nic_link_from_sysfs(snap: Snapshot, tmp_path: Path) -> None:
    nic_vertex = next(
        v for v in snap.graph["vertices"] if v["kind"] == "nic" and v["attrs"].get("netdevs")
    )
    netdev = nic_vertex["attrs"]["netdevs"][0]
    base = tmp_path / "sys/class/net" / netdev
    base.mkdir(parents=True)
    (base / "operstate").write_text("up\n")
    (base / "carrier").write_text("1\n")
    m = monitor(snap, link_reader=sysfs_link_reader(str(tmp_path)))
    assert not m.poll_links()
    (base / "carrier").write_text("0\n")
    assert m.poll_links()
    assert list(unhealthy(m)) == [snap.vertex_devices[nic_vertex["id"]]]


def test_device_that_disappears_stays_tainted(inv: Inventory, snap: Snapshot) -> None:
    m = monitor(snap)
    gone = inv.nics[-1].bus_id
    inv2 = copy.deepcopy(inv)
    inv2.nics = [n for n in inv2.nics if n.bus_id != gone]
    snap2 = build_snapshot(inv2, NODE)
    lost_name = snap.vertex_devices[f"nic:{gone}"]
    assert lost_name not in {d["name"] for d in snap2.devices}
    assert m.update_snapshot(snap2)
    assert unhealthy(m) == {lost_name: f"{lost_name} disappeared from the node"}
    assert [d["name"] for d in m.lost_devices()] == [lost_name]
    assert m.taints()[lost_name][0]["effect"] == "NoExecute"
    assert m.update_snapshot(snap)  # it came back
    assert unhealthy(m) == {} and m.lost_devices() == []


def test_one_health_change_is_one_slice_write(snap: Snapshot, tmp_path: Path) -> None:
    with KubeAPIServer() as api:
        api.add_node(NODE)
        client = build_api_client(str(api.write_kubeconfig(tmp_path / "kc")))
        m = monitor(snap)
        pub = SlicePublisher(client, DRIVER, NODE)
        pub.set_devices(list(snap.devices), m.taints())
        pub.reconcile()
        api.reset_counters()
        gpu_vertex = next(v for v in snap.vertex_devices if v.startswith("gpu:"))
        ev = xid_event(gpu_vertex, 48)
        assert ev is not None
        m.report(ev)
        pub.set_devices(list(snap.devices) + m.lost_devices(), m.taints())
        assert pub.reconcile().writes == 1
        for _ in range(3):
            pub.set_devices(list(snap.devices), m.taints())
            assert pub.reconcile().writes == 0
        assert api.writes() == 1
        published = api.slices(DRIVER, NODE)[0]["spec"]["devices"]
        tainted = [d["name"] for d in published if d.get("taints")]
        assert tainted == [snap.vertex_devices[gpu_vertex]]


class _FakeNvmlEvents:
    """The pynvml event calls, one GPU, one XID queued."""

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

    def __init__(self, bus: str, xid: int) -> None:
        self.bus, self.queue = bus, [xid]
        self.registered: list[Any] = []

    def nvmlInit(self) -> None:
        pass

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceGetHandleByPciBusId(self, bus: str) -> str:
        if bus != self.bus:
            raise self.NVMLError(6)
        return "h0"

    def nvmlDeviceRegisterEvents(self, handle: str, types: int, es: str) -> None:
        self.registered.append((handle, types, es))

    def nvmlEventSetWait_v2(self, es: str, timeout_ms: int) -> Any:
        if not self.queue:
            raise self.NVMLError(10)
        return type("E", (), {"device": "h0", "eventData": self.queue.pop(), "eventType": 8})

    def nvmlDeviceGetPciInfo(self, handle: str) -> Any:
        return type("P", (), {"busId": b"00000000:" + self.bus[5:].upper().encode()})

    def nvmlEventSetFree(self, es: str) -> None:
        pass


def test_nvml_xid_source(snap: Snapshot) -> None:
    bus = snap.inventory.gpus[0].bus_id
    nvml = _FakeNvmlEvents(bus, 79)
    src = NvmlXidSource(nvml, [bus, "0000:ff:00.0"])
    assert src.watched == [bus] and nvml.registered == [("h0", 8, "set")]
    (ev,) = src.poll(0.01)
    assert ev.vertex == f"gpu:{bus}" and ev.fatal and ev.value == "79"
    assert src.poll(0.01) == []
    src.close()


def test_debouncer_turns_a_burst_into_one_call() -> None:
    calls: list[float] = []
    d = Debouncer(lambda: calls.append(time.monotonic()), quiet=0.2, max_delay=5)
    try:
        for _ in range(20):
            d.poke()
            time.sleep(0.01)
        deadline = time.monotonic() + 3
        while not calls and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.4)
        assert len(calls) == 1
        d.poke()
        time.sleep(0.6)
        assert len(calls) == 2
    finally:
        d.stop()


def test_debouncer_fires_within_max_delay_under_a_storm() -> None:
    calls: list[float] = []
    d = Debouncer(lambda: calls.append(time.monotonic()), quiet=0.5, max_delay=0.3)
    stop = threading.Event()

    def storm() -> None:
        while not stop.is_set():
            d.poke()
            time.sleep(0.02)

    t = threading.Thread(target=storm)
    t.start()
    time.sleep(1.0)
    stop.set()
    t.join()
    d.stop()
    assert len(calls) >= 2  # not starved by never-quiet events


def test_published_snapshot_filters_kinds(snap: Snapshot) -> None:
    from driver.daemon import device_kind, published_snapshot

    only = published_snapshot(snap, frozenset({"nic"}))
    assert {device_kind(d) for d in only.devices} == {"nic"}
    assert set(only.vertex_devices.values()) == {d["name"] for d in only.devices}
    assert published_snapshot(snap, frozenset({"gpu", "nic", "cpu"})) is snap
    assert dataclasses.replace(only).graph is snap.graph
