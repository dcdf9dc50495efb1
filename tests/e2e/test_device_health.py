"""Device health through the real API: the driver's taints in the published slices, the
real scheduler honouring them, and what the real controller-manager (v1.36.2,
DRADeviceTaints on) does with a NoExecute taint on an allocated device.

The driver reads a fake DGX tree with ``--root`` (to it, a live host: NIC link states are
polled from that tree's sysfs, rediscovery reads it again), so the test can take a link
down and make a NIC disappear the way the kernel would show it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from discovery.fake import build_sysfs, load_machine
from tests.e2e.cluster import Cluster, poll
from tests.e2e.toposlice_setup import (
    DRIVER,
    NodeDriver,
    claim_pod,
    install,
    pod_outcome,
    published_slices,
    uninstall,
)

pytestmark = pytest.mark.e2e

NODE = "e2e-health-dgx"
NS = "e2e-health"
FLAPPY = ("nic-0000-5e-00-0", "0000:5e:00.0", "ibp94s0")
LOST = ("nic-0000-4f-00-0", "0000:4f:00.0", "ibp79s0")


@pytest.fixture(scope="module")
def health_driver(cluster: Cluster) -> Iterator[tuple[NodeDriver, Path]]:
    objs = install(cluster)
    root = Path(tempfile.mkdtemp(prefix="ts-health-root-"))
    build_sysfs(load_machine("dgx-h100"), root)
    cluster.add_node(NODE)
    cluster.kubectl("create", "namespace", NS)
    drv = NodeDriver(cluster, NODE, "dgx-h100", "--rediscover-interval", "1", root=root)
    try:
        drv.start().wait_started()
        yield drv, root
    finally:
        cluster.kubectl("-n", NS, "delete", "pod", "--all", "--force", "--grace-period=0")
        cluster.kubectl("delete", "namespace", NS, "--wait=false")
        drv.cleanup()
        cluster.kubectl("delete", "resourceslices", f"--field-selector=spec.nodeName={NODE}")
        cluster.remove_node(NODE)
        uninstall(cluster, objs)
        shutil.rmtree(root, ignore_errors=True)


def _taints(cluster: Cluster, device: str) -> list[dict[str, Any]] | None:
    for s in published_slices(cluster, NODE):
        for d in s["spec"]["devices"]:
            if d["name"] == device:
                return list(d.get("taints") or [])
    return None


def _nic_request(bus: str) -> list[dict[str, Any]]:
    expr = f'device.attributes["resource.kubernetes.io"].pciBusID == "{bus}"'
    return [
        {
            "name": "nic",
            "exactly": {
                "deviceClassName": f"nic.{DRIVER}",
                "selectors": [{"cel": {"expression": expr}}],
            },
        }
    ]


def _set_link(root: Path, netdev: str, up: bool) -> None:
    net = root / "sys" / "class" / "net" / netdev
    (net / "carrier").write_text("1\n" if up else "0\n")
    (net / "operstate").write_text("up\n" if up else "down\n")


def test_link_down_taints_the_nic_and_the_scheduler_keeps_off_it(
    cluster: Cluster, health_driver: tuple[NodeDriver, Path]
) -> None:
    _, root = health_driver
    device, bus, netdev = FLAPPY
    assert _taints(cluster, device) == []
    _set_link(root, netdev, up=False)
    taints = poll(lambda: _taints(cluster, device), 20, 0.2, f"taint on {device}")
    assert [(t["key"], t["effect"], t.get("value")) for t in taints] == [
        (f"{DRIVER}/link-down", "NoSchedule", netdev)
    ]
    # A new claim that can only have this NIC is not allocated while it is tainted.
    cluster.apply(claim_pod("wants-flappy", NODE, _nic_request(bus), NS))
    what, claim = poll(lambda: pod_outcome(cluster, NS, "wants-flappy"), 30, 0.1, "verdict")
    assert what == "unschedulable"
    assert claim is None or not (claim.get("status") or {}).get("allocation")
    # Link back: the taint goes, and the scheduler retries the pod onto the NIC.
    _set_link(root, netdev, up=True)
    poll(lambda: _taints(cluster, device) == [], 20, 0.2, f"{device} untainted")
    what, claim = poll(
        lambda: (v := pod_outcome(cluster, NS, "wants-flappy")) and v[0] == "allocated" and v,
        60,
        0.2,
        "allocated after the link came back",
    )
    assert claim is not None
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["device"] == device


def test_lost_nic_is_tainted_no_execute_and_its_pod_evicted(
    cluster: Cluster, health_driver: tuple[NodeDriver, Path]
) -> None:
    _, root = health_driver
    device, bus, netdev = LOST
    cluster.apply(claim_pod("uses-lost", NODE, _nic_request(bus), NS))
    what, _ = poll(lambda: pod_outcome(cluster, NS, "uses-lost"), 30, 0.1, "uses-lost verdict")
    assert what == "allocated"
    # The NIC disappears from the host (its PCI function and netdev gone).
    sys_ = root / "sys"
    for path in (
        sys_ / "bus" / "pci" / "devices" / bus,
        sys_ / "class" / "net" / netdev,
    ):
        if path.is_symlink() or path.is_file():
            path.unlink()
        else:
            shutil.rmtree(path)
    taints = poll(lambda: _taints(cluster, device), 30, 0.2, f"NoExecute on {device}")
    assert [(t["key"], t["effect"]) for t in taints] == [(f"{DRIVER}/gone", "NoExecute")]

    # kube-controller-manager v1.36.2 with DRADeviceTaints: its device-taint eviction
    # controller deletes the pod whose allocated device carries the NoExecute taint
    # (no toleration). With no kubelet, the deletion shows as deletionTimestamp plus
    # a DisruptionTarget condition.
    def evicted() -> dict[str, Any] | None:
        pod = json.loads(cluster.kubectl("-n", NS, "get", "pod", "uses-lost", "-o", "json"))
        return pod if pod["metadata"].get("deletionTimestamp") else None

    pod = poll(evicted, 60, 0.5, "eviction of uses-lost")
    reasons = {c["type"]: c.get("reason") for c in pod["status"].get("conditions") or []}
    assert reasons.get("DisruptionTarget") == "DeletionByDeviceTaintManager", reasons
