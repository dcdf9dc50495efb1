"""The GPU vendor's CDI device on a real kubelet + containerd node (issue #21).

A stand-in for the NVIDIA Container Toolkit's ``/var/run/cdi/nvidia.yaml``, written the way
``nvidia-ctk cdi generate`` writes it (tests/vendor_specs.py: every GPU by index and
``GPU-<uuid>``, nodes by path with ``hostPath`` under a dev root, control nodes, the
library mount and ``NVIDIA_VISIBLE_DEVICES=void`` at the top level, no hooks), for the
fake DGX H100's GPUs: the device nodes are made with mknod in a temp dir (numbers of
/dev/null, so nothing real is reached) and the "libcuda" is a file there.

- on the node without that spec, the example pod with a GPU claim starts with toposlice's
  own ids only, and the gap shows once: one ``VendorCDIMissing`` Event on the Node, the
  gauge, ``/readyz`` ``ok, degraded: ...`` (not once per claim);
- with the spec (picked up by the next rediscovery, no restart): the same pod gets the
  vendor id first for each GPU; its container has the library mount, each device node
  once (containerd's OCI spec), the vendor's ``NVIDIA_VISIBLE_DEVICES=void``, and its
  environment and NCCL file as before;
- kill -9 of the plugin: the restarted plugin answers the claim with the same ids.
"""

from __future__ import annotations

import json
import os
import stat
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests import vendor_specs
from tests.driver_support import snapshot
from tests.e2e.cluster import poll
from tests.node.node import Node

pytestmark = pytest.mark.node

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (test extra) not installed")

from tests.node.test_chart_on_node import (  # noqa: E402
    DRIVER,
    REDISCOVER_S,
    WORKLOADS,
    check_container,
    claim_of,
    container_id,
    get,
    installed,
    kill_plugin,
    plugin_url,
    ready_plugin,
    start_example,
    stop_example,
)

EXAMPLE = "gpu-nic-same-pcie-root.yaml"
NVIDIA_KIND = "nvidia.com/gpu"
LIB_TEXT = "stand-in libcuda for the node tier\n"


@pytest.fixture(scope="module")
def release(node: Node) -> Iterator[Any]:
    (node.cdi_dir / "nvidia.yaml").unlink(missing_ok=True)
    try:
        with installed(node, WORKLOADS) as cfg:
            yield cfg
    finally:
        (node.cdi_dir / "nvidia.yaml").unlink(missing_ok=True)


def stand_in(node: Node) -> dict[str, Any]:
    """Device nodes and the library in ``<node dir>/fake-nvidia``; the spec (not written)."""
    inv = snapshot("dgx-h100").inventory
    root = node.dir / "fake-nvidia"
    (root / "dev").mkdir(parents=True, exist_ok=True)
    paths = [f"/dev/nvidia{g.minor}" for g in inv.gpus] + list(vendor_specs.CONTROL_NODES)
    for p in paths:
        target = root / p.lstrip("/")
        if not target.exists():
            os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    lib = root / "lib" / vendor_specs.LIBCUDA
    lib.parent.mkdir(exist_ok=True)
    lib.write_text(LIB_TEXT)
    return vendor_specs.nvidia_ctk_spec(inv, dev_root=str(root), lib_host_path=str(lib))


def http(node: Node, path: str) -> str:
    with urllib.request.urlopen(plugin_url(node) + path, timeout=10) as resp:
        return str(resp.read().decode())


def gauge(node: Node) -> float:
    for line in http(node, "/metrics").splitlines():
        if line.startswith("toposlice_vendor_cdi_missing_gpus "):
            return float(line.split()[1])
    raise AssertionError("no toposlice_vendor_cdi_missing_gpus")


def gap_events(node: Node) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get(
        node, "events", "-n", "default", "--field-selector=reason=VendorCDIMissing"
    )["items"]
    return [e for e in items if e["involvedObject"]["name"] == node.name]


def recorded_ids(node: Node, uid: str) -> list[list[str]]:
    doc = json.loads((node.dir / "toposlice-state" / "checkpoint.json").read_text())
    return [d["cdi_ids"] for d in doc["data"]["claims"][uid]["devices"]]


def oci_devices(node: Node, cid: str) -> list[str]:
    info = json.loads(node.ctr("containers", "info", cid))
    return [d["path"] for d in info["Spec"]["linux"].get("devices") or []]


def test_without_the_vendor_spec_the_pod_starts_and_the_gap_shows_once(
    node: Node, release: Any
) -> None:
    events = poll(lambda: gap_events(node), timeout=30, what="the VendorCDIMissing Event")
    assert len(events) == 1 and events[0]["type"] == "Warning"
    assert "no vendor CDI device for 8 of 8 GPU(s)" in events[0]["message"]
    assert gauge(node) == 8
    assert http(node, "/readyz").startswith("ok, degraded: ")
    assert "no vendor CDI device" in http(node, "/readyz")
    for _ in range(2):  # two claims: still one Event
        pod, _took = start_example(node, EXAMPLE)
        try:
            uid = check_container(node, pod, _want())
            for ids in recorded_ids(node, uid):  # toposlice's own (and metadata) ids only
                assert ids and not [i for i in ids if i.startswith("nvidia.com/")], ids
        finally:
            stop_example(node, EXAMPLE)
        poll(lambda: not _pods(node), timeout=60, what="example pod gone")
    assert len(gap_events(node)) == 1


def test_with_the_vendor_spec_the_pod_gets_the_library_and_each_node_once(
    node: Node, release: Any
) -> None:
    inv = snapshot("dgx-h100").inventory
    vendor_specs.write(node.cdi_dir / "nvidia.yaml", stand_in(node))
    poll(lambda: gauge(node) == 0, timeout=6 * REDISCOVER_S, what="the gap cleared")
    assert http(node, "/readyz") == "ok\n"
    pod, _took = start_example(node, EXAMPLE)
    try:
        uid = check_container(node, pod, _want())  # environment and NCCL file as before
        claim = claim_of(node, pod)
        results = claim["status"]["allocation"]["devices"]["results"]
        by_name = {r["device"]: r for r in results if r["driver"] == DRIVER}
        ids = recorded_ids(node, uid)
        gpus = [
            g for g in inv.gpus if "gpu-" + g.bus_id.replace(":", "-").replace(".", "-") in by_name
        ]
        assert len(gpus) == 2
        vendor = sorted(i[0] for i in ids if i[0].startswith(NVIDIA_KIND))
        assert vendor == sorted(f"{NVIDIA_KIND}={g.uuid}" for g in gpus)
        cid = container_id(pod)
        lib = f"{vendor_specs.LIB_DIR}/{vendor_specs.LIBCUDA}"
        assert node.exec(cid, "cat", lib) == LIB_TEXT
        env = dict(ln.split("=", 1) for ln in node.exec(cid, "env").splitlines() if "=" in ln)
        assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert env["NVIDIA_CTK_LIBCUDA_DIR"] == vendor_specs.LIB_DIR
        devices = oci_devices(node, cid)
        want = {f"/dev/nvidia{g.minor}" for g in gpus} | set(vendor_specs.CONTROL_NODES)
        assert want <= set(devices)
        assert sorted(devices) == sorted(set(devices)), devices  # each node once
        assert node.exec(cid, "ls", *sorted(want)).split() == sorted(want)

        # kill -9 of the plugin: the restarted one answers the claim with the same ids.
        old = ready_plugin(node)
        assert old is not None
        kill_plugin(node, old)
        from tests.kubelet import NodeClient

        sock = node.kubelet_dir / "plugins" / DRIVER / "dra.sock"
        with NodeClient(str(sock)) as kubelet:
            again = kubelet.prepare([(WORKLOADS, claim["metadata"]["name"], uid)]).claims[uid]
        assert again.error == ""
        assert [list(d.cdi_device_ids) for d in again.devices] == ids
        assert recorded_ids(node, uid) == ids
    finally:
        stop_example(node, EXAMPLE)
    assert len(gap_events(node)) == 1  # the Event of the first test only


def _want() -> set[str]:
    from tests.node.test_chart_on_node import satisfiable_examples

    return satisfiable_examples()[EXAMPLE]


def _pods(node: Node) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get(node, "pods", "-n", WORKLOADS)["items"]
    return items
