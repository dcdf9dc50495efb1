"""The ResourceSlice publisher against the test API server: writes counted, failures played;
what it knows of the server comes from one LIST and a WATCH (driver/plumbing/server_view.py)."""

from __future__ import annotations

import copy
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from driver.plumbing.kube import build_api_client
from driver.publisher.slices import PublishError, SlicePublisher
from normalize.snapshot import build_snapshot
from normalize.validation import validate_pool
from tests.kubeapi import KubeAPIServer
from tests.kubelet import wait_for
from toposlice.discover import discover

DRIVER = "toposlice.dev"
NODE = "n1"


@pytest.fixture(scope="module")
def devices() -> list[dict[str, Any]]:
    snap = build_snapshot(discover("/", fake="dgx-h100"), NODE)
    return [copy.deepcopy(d) for d in snap.devices]


@pytest.fixture
def api() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as server:
        server.add_node(NODE)
        yield server


@pytest.fixture
def kubeconfig(api: KubeAPIServer, tmp_path: Path) -> str:
    return str(api.write_kubeconfig(tmp_path / "kubeconfig"))


_MADE: list[SlicePublisher] = []


@pytest.fixture(autouse=True)
def _stop_publishers() -> Iterator[None]:
    """Every publisher a test made is stopped after it (its watch thread too)."""
    yield
    while _MADE:
        _MADE.pop().stop()


def publisher(kubeconfig: str, node: str = NODE, **kw: Any) -> SlicePublisher:
    kw.setdefault("rng", random.Random(1))
    pub = SlicePublisher(build_api_client(kubeconfig), DRIVER, node, **kw)
    _MADE.append(pub)
    return pub


def pool(api: KubeAPIServer) -> list[dict[str, Any]]:
    return api.slices(DRIVER, NODE)


def test_first_publish_is_valid_and_owned_by_the_node(
    api: KubeAPIServer, kubeconfig: str, devices: list[dict[str, Any]]
) -> None:
    pub = publisher(kubeconfig)
    pub.set_devices(devices)
    result = pub.reconcile()
    slices = pool(api)
    assert result.writes == 1 and len(slices) == 1
    node_uid = api.store.get("nodes", "", NODE)["metadata"]["uid"]
    s = slices[0]
    assert s["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid, "controller": True}
    ]
    assert s["metadata"]["name"].startswith(f"00000-{DRIVER}-{NODE}-")
    assert s["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in s["spec"]["devices"]] == [d["name"] for d in devices]
    assert validate_pool(slices) == []
    for obj in slices:
        kubernetes_validate.validate(obj, "1.37", strict=True)


def test_steady_state_makes_no_writes(
    api: KubeAPIServer, kubeconfig: str, devices: list[dict[str, Any]]
) -> None:
    pub = publisher(kubeconfig)
    pub.set_devices(devices)
    pub.reconcile()
    api.reset_counters()
    for _ in range(30):
        assert pub.set_devices(copy.deepcopy(devices)) is False
        assert pub.reconcile().writes == 0
    assert api.writes() == 0
    # What the server holds comes from the watch: not one request for 30 reconciles.
    assert api.count("list") == api.count("get") == 0
    assert pub.view.informer.lists == 1


def test_one_change_is_one_write_and_bumps_the_generation(
    api: KubeAPIServer, kubeconfig: str, devices: list[dict[str, Any]]
) -> None:
    pub = publisher(kubeconfig)
    pub.set_devices(devices)
    pub.reconcile()
    uid_before = pool(api)[0]["metadata"]["uid"]
    api.reset_counters()

    assert pub.set_devices(devices[:-1]) is True  # a device went away
    assert pub.reconcile().writes == 1
    assert api.writes() == 1 and api.count("update") == 1
    (s,) = pool(api)
    assert s["metadata"]["uid"] == uid_before  # updated in place
    assert s["spec"]["pool"]["generation"] == 2
    assert len(s["spec"]["devices"]) == len(devices) - 1

    api.reset_counters()
    taint = {"key": f"{DRIVER}/xid", "value": "79", "effect": "NoExecute"}
    pub.set_taints({devices[0]["name"]: [taint]})
    assert pub.reconcile().writes == 1
    (s,) = pool(api)
    assert s["spec"]["devices"][0]["taints"][0]["effect"] == "NoExecute"
    assert s["spec"]["pool"]["generation"] == 3
    kubernetes_validate.validate(s, "1.37", strict=True)
    for _ in range(5):
        assert pub.reconcile().writes == 0
    assert api.writes() == 1


def test_taint_keeps_its_time_added(
    api: KubeAPIServer, kubeconfig: str, devices: list[dict[str, Any]]
) -> None:
    pub = publisher(kubeconfig)
    first = {"key": f"{DRIVER}/xid", "value": "79", "effect": "NoExecute"}
    first_at = {**first, "timeAdded": "2026-01-01T00:00:00Z"}
    pub.set_devices(devices, {devices[0]["name"]: [first_at]})
    pub.reconcile()
    later = {**first, "timeAdded": "2026-06-01T00:00:00Z"}
    pub.set_devices(devices, {devices[0]["name"]: [later]})
    assert pub.reconcile().writes == 0  # same taint: timeAdded is not content
    link = {"key": f"{DRIVER}/link-down", "value": "eth0", "effect": "NoSchedule"}
    pub.set_devices(devices, {devices[0]["name"]: [later], devices[1]["name"]: [link]})
    assert pub.reconcile().writes == 1
    taints = pool(api)[0]["spec"]["devices"][0]["taints"]
    assert taints[0]["timeAdded"] == "2026-01-01T00:00:00Z"


def test_multi_slice_pool_changes(
    api: KubeAPIServer, kubeconfig: str, devices: list[dict[str, Any]]
) -> None:
    pub = publisher(kubeconfig, max_devices_per_slice=5)
    pub.set_devices(devices)
    assert pub.reconcile().writes == 5  # 22 devices, 5 per slice
    slices = pool(api)
    assert len(slices) == 5 and validate_pool(slices) == []
    names = sorted(s["metadata"]["name"] for s in slices)
    assert [n[:5] for n in names] == ["00000", "00001", "00002", "00003", "00004"]

    api.reset_counters()
    changed = copy.deepcopy(devices)
    changed[6]["attributes"]["model"] = {"string": "changed"}  # in slice 1 only
    pub.set_devices(changed)
    assert pub.reconcile().writes == 1
    slices = pool(api)
    assert {s["spec"]["pool"]["generation"] for s in slices} == {1}
    assert validate_pool(slices) == []

    api.reset_counters()
    pub.set_devices(changed[:20])  # 4 slices now: surplus one deleted, the rest rewritten
    result = pub.reconcile()
    slices = pool(api)
    assert len(slices) == 4 and validate_pool(slices) == []
    assert {s["spec"]["pool"]["generation"] for s in slices} == {2}
    assert result.writes == api.writes() == 5
    assert api.count("delete") == 1


def test_conflict_rereads_and_retries(
    api: KubeAPIServer, kubeconfig: str, devices: list[dict[str, Any]]
) -> None:
    pub = publisher(kubeconfig, conflict_wait_s=0.05)
    pub.set_devices(devices)
    pub.reconcile()
    api.faults.add(409, verb="update", times=2)
    pub.set_devices(devices[:-1])
    pub.reconcile()
    assert api.count("update") == 3
    assert api.count("list") == 1  # the retries read the watch, not the server
    assert len(pool(api)[0]["spec"]["devices"]) == len(devices) - 1

    api.faults.add(409, verb="update", times=-1)
    pub.set_devices(devices)
    with pytest.raises(PublishError):
        pub.reconcile()
    api.faults.clear()


def test_429_and_500_back_off_then_publish(
    api: KubeAPIServer, kubeconfig: str, devices: list[dict[str, Any]]
) -> None:
    pub = publisher(kubeconfig, backoff_base=0.05, backoff_max=0.2, resync_seconds=5)
    api.faults.add(429, verb="create", retry_after=0)
    api.faults.add(500, verb="create", times=2)
    api.faults.add(503, verb="list")
    pub.set_devices(devices)
    pub.start()
    try:
        assert wait_for(lambda: pub.synced)
    finally:
        pub.stop()
    assert len(pool(api)) == 1
    assert api.count("create") == 4
    assert pub.last_error == ""


def test_backoff_is_bounded_with_jitter(kubeconfig: str) -> None:
    pub = publisher(kubeconfig, backoff_base=0.5, backoff_max=30)
    delays = [pub.backoff(n, None) for n in range(40)]
    assert all(0 < d <= 30 for d in delays)
    assert delays[0] <= 0.5 and max(delays) > 14
    assert len({round(d, 6) for d in delays[10:]}) > 1  # jitter at the cap
    from driver.plumbing.kube import ApiFailure

    assert pub.backoff(3, ApiFailure(429, 7.0, "slow down")) == 7.0
    assert pub.backoff(3, ApiFailure(429, 999.0, "slow down")) == 30


def test_outage_is_waited_out(
    api: KubeAPIServer, kubeconfig: str, devices: list[dict[str, Any]]
) -> None:
    pub = publisher(kubeconfig, backoff_base=0.05, backoff_max=0.3, resync_seconds=0.2)
    pub.set_devices(devices)
    api.down(2.0)
    pub.start()
    try:
        time.sleep(0.5)
        assert not pub.synced and pub.last_error  # failing, and saying why
        assert wait_for(lambda: pub.synced, 10)
        assert len(pool(api)) == 1
        # An outage after publishing changes nothing on the server.
        api.down(1.0, mode="503")
        time.sleep(1.3)
        assert wait_for(lambda: pub.synced, 10)
    finally:
        pub.stop()
    assert len(pool(api)) == 1
    assert api.count("create") == 1


def test_deleted_or_edited_slices_come_back(
    api: KubeAPIServer, kubeconfig: str, devices: list[dict[str, Any]]
) -> None:
    pub = publisher(kubeconfig, resync_seconds=0.2)
    pub.set_devices(devices)
    pub.start()
    try:
        assert wait_for(lambda: len(pool(api)) == 1)
        first = pool(api)[0]["metadata"]["name"]
        api.store.delete("resourceslices", "", first)  # right after create (kubelet wipe)
        assert wait_for(lambda: len(pool(api)) == 1)
        again = pool(api)[0]
        assert again["metadata"]["name"] != first

        edited = copy.deepcopy(again)
        edited["spec"]["devices"] = edited["spec"]["devices"][:1]
        api.store.update("resourceslices", "", edited["metadata"]["name"], edited)
        assert wait_for(lambda: len(pool(api)[0]["spec"]["devices"]) == len(devices))
    finally:
        pub.stop()
    assert validate_pool(pool(api)) == []


def test_stale_slices_removed_others_untouched(
    api: KubeAPIServer, kubeconfig: str, devices: list[dict[str, Any]]
) -> None:
    def body(name: str, driver: str, pool_name: str, gen: int, count: int = 1) -> dict[str, Any]:
        return {
            "metadata": {"name": name},
            "spec": {
                "driver": driver,
                "pool": {"name": pool_name, "generation": gen, "resourceSliceCount": count},
                "nodeName": NODE,
                "devices": [{"name": "old-0"}],
            },
        }

    api.store.create("resourceslices", "", body(f"{NODE}-{DRIVER}-abcde", DRIVER, NODE, 3))
    api.store.create("resourceslices", "", body(f"00000-{DRIVER}-{NODE}-zzzzz", DRIVER, "x", 1))
    api.store.create("resourceslices", "", body(f"00001-{DRIVER}-{NODE}-qqqqq", DRIVER, NODE, 3, 2))
    other = api.store.create("resourceslices", "", body("gpu-slice", "gpu.example.com", NODE, 1))
    pub = publisher(kubeconfig)
    pub.set_devices(devices)
    pub.reconcile()
    mine = pool(api)
    assert len(mine) == 1 and validate_pool(mine) == []
    assert mine[0]["spec"]["pool"]["generation"] == 4  # above everything seen
    others = api.slices("gpu.example.com")
    assert [s["metadata"]["name"] for s in others] == ["gpu-slice"]
    assert others[0] == other  # never written


def test_restart_keeps_slices(
    api: KubeAPIServer, kubeconfig: str, devices: list[dict[str, Any]]
) -> None:
    first = publisher(kubeconfig, resync_seconds=0.1)
    first.set_devices(devices)
    first.start()
    assert wait_for(lambda: first.synced)
    first.stop()
    before = pool(api)
    api.reset_counters()
    second = publisher(kubeconfig)
    second.set_devices(copy.deepcopy(devices))
    assert second.reconcile().writes == 0
    assert pool(api) == before
    assert api.writes() == 0


def test_missing_node_is_an_error(api: KubeAPIServer, kubeconfig: str) -> None:
    pub = publisher(kubeconfig, "absent-node")
    pub.set_devices([])
    with pytest.raises(PublishError) as err:
        pub.reconcile()
    assert err.value.failure.status == 404 and "absent-node" in str(err.value)


def test_concurrent_set_devices_during_run(
    api: KubeAPIServer, kubeconfig: str, devices: list[dict[str, Any]]
) -> None:
    pub = publisher(kubeconfig, resync_seconds=0.1)
    pub.set_devices(devices)
    pub.start()

    def flip() -> None:
        for i in range(20):
            pub.set_devices(devices[: len(devices) - (i % 3)])

    t = threading.Thread(target=flip)
    t.start()
    t.join()
    pub.set_devices(devices)
    try:
        assert wait_for(lambda: pub.synced and len(pool(api)[0]["spec"]["devices"]) == 22)
    finally:
        pub.stop()
    assert validate_pool(pool(api)) == []


def test_fields_the_server_drops_are_reported_not_rewritten(
    api: KubeAPIServer,
    kubeconfig: str,
    devices: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    def gate_off(obj: dict[str, Any]) -> None:  # DRADeviceTaints disabled on the server
        for dev in obj["spec"].get("devices") or []:
            dev.pop("taints", None)

    api.store.normalizers["resourceslices"] = gate_off
    pub = publisher(kubeconfig)
    taint = {"key": f"{DRIVER}/xid", "value": "79", "effect": "NoExecute"}
    pub.set_devices(devices, {devices[0]["name"]: [taint]})
    with caplog.at_level("ERROR", logger="toposlice.publisher"):
        assert pub.reconcile().writes == 1
    assert "dropped taints" in caplog.text and "DRADeviceTaints" in caplog.text
    for _ in range(5):
        assert pub.reconcile().writes == 0  # no write storm against a gate that is off
    assert api.writes() == 1
    # A real change is still written.
    pub.set_devices(devices[:-1], {devices[0]["name"]: [taint]})
    assert pub.reconcile().writes == 1
    assert len(pool(api)[0]["spec"]["devices"]) == len(devices) - 1
