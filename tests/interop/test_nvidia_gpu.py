"""toposlice beside the real NVIDIA DRA GPU kubelet plugin (kubernetes-sigs/dra-driver-nvidia-gpu
@ 95932046 on NVIDIA's mock NVML, the kit's ``mock-nvml-dgx-h100.yaml`` profile: the fake
dgx-h100's bus ids, UUIDs, memory and driver version), through the kit's ``nvidia-gpu-up.sh``
with the tree ``toposlice machines tree`` writes over ``/sys``, and ``toposlice run`` with
its default flags (``publish: [gpu, nic, cpu]``).

What holds on the stock v1.36.2 scheduler (list gate off):
- the plugin reads toposlice's tree as written: its GPUs' standard attributes equal
  toposlice's (``numaNode`` needs each function's ``resource`` file, which the tree has);
- toposlice leaves the GPUs to the plugin (one owner per GPU), says so, and raises no
  vendor-CDI warning for GPUs it does not publish (the plugin writes its CDI spec per claim);
- ``examples/vendor-gpu-with-nic-and-cpus.yaml`` allocates a vendor GPU with toposlice's NIC
  on its root and CPUs on that NUMA node, prepared by both drivers, and the pod runs;
- ``toposlice doctor``: no error or warning; double publishing reported.
Not here yet (issue 36): the GB200 tray, observe mode, claims for N vendor GPUs, the NCCL
file of a claim holding vendor GPUs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import poll
from tests.interop.conftest import NriNode
from tests.interop.peers import FIGURES, NS, Scenario, devices_of, slices_of, toposlice

pytestmark = pytest.mark.interop

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "data" / "foreign-slices" / "recorded"
STD = "resource.kubernetes.io"
STANDARD = (f"{STD}/pciBusID", f"{STD}/pcieRoot", f"{STD}/numaNode")
MACHINE = "dgx-h100"
RECORD_HEADER = """Recorded from NVIDIA's DRA GPU kubelet plugin
(kubernetes-sigs/dra-driver-nvidia-gpu 95932046) on mock NVML (NVIDIA/k8s-test-infra
3b2b865d, profile mock-nvml-dgx-h100.yaml of ../shared/peers), run by
tests/interop/test_nvidia_gpu.py on the fake dgx-h100 tree (kube v1.36.2 node,
DRAListTypeAttributes off); node renamed to dgx-h100, devices sorted by name (the plugin
orders them differently at each start). Refresh: TOPOSLICE_RECORD_PEERS=1."""


class VendorNode(Scenario):
    def start(self) -> None:
        self.write_tree()
        took = self.peer.up("nvidia-gpu", self.node.name, self.tree / "sys")
        FIGURES[f"nvidia gpu-kubelet-plugin on {self.machine}: to its slice"] = f"{took:.1f} s"
        self.run.start()
        self.device_classes()

    def stop(self) -> None:
        self.release_all()
        self.run.stop()
        self.peer.down("nvidia-gpu")
        self.drop_slices("gpu.nvidia.com", "toposlice.dev")

    def own(self) -> dict[str, dict[str, Any]]:
        return self.devices("toposlice.dev")

    def vendor(self) -> dict[str, dict[str, Any]]:
        return self.devices("gpu.nvidia.com")


@pytest.fixture(scope="module")
def vendor(node: NriNode, kit: Path, tmp_path_factory: Any) -> Iterator[VendorNode]:
    v = VendorNode(node, kit, MACHINE, tmp_path_factory.mktemp("nvidia"))
    try:
        v.start()
        yield v
    finally:
        v.stop()


def toposlice_gpus() -> dict[str, dict[str, Any]]:
    text = toposlice("slices", "--fake", MACHINE, "-o", "yaml").stdout
    return {
        d["attributes"][f"{STD}/pciBusID"]["string"]: d
        for d in devices_of([s for s in yaml.safe_load_all(text) if s]).values()
        if d["attributes"]["type"]["string"] == "gpu"
    }


def test_the_plugin_reads_toposlices_tree_as_written(vendor: VendorNode) -> None:
    theirs = {d["attributes"][STANDARD[0]]["string"]: d for d in vendor.vendor().values()}
    ours = toposlice_gpus()
    assert set(theirs) == set(ours) and len(ours) == 8
    for bus, mine in ours.items():
        for name in STANDARD:  # numaNode too: the tree's `resource` files
            assert theirs[bus]["attributes"][name] == mine["attributes"][name], (bus, name)
        assert theirs[bus]["attributes"]["uuid"]["string"] == mine["attributes"]["uuid"]["string"]
    import sys

    sys.path.insert(0, str(REPO / "hack"))
    from record_peer_slices import recorded, write

    slices = recorded(
        slices_of(vendor.cluster, vendor.node.name, "gpu.nvidia.com"), "gpu.nvidia.com"
    )
    for s in slices:
        s["spec"]["devices"] = sorted(s["spec"]["devices"], key=lambda d: d["name"])
    path = RECORDED / "nvidia-gpu.yaml"
    if os.environ.get("TOPOSLICE_RECORD_PEERS"):
        write(path, slices, RECORD_HEADER)
    with open(path, encoding="utf-8") as fh:
        kept = [d for d in yaml.safe_load_all(fh) if d]
    assert devices_of(slices) == devices_of(kept)


def test_one_owner_per_gpu_and_no_vendor_cdi_warning(vendor: VendorNode) -> None:
    kinds = {d["attributes"]["type"]["string"] for d in vendor.own().values()}
    assert kinds == {"nic", "cpu"}, kinds
    ready = vendor.run.http("/readyz")
    assert "yielded: not publishing 8 device(s) published by gpu.nvidia.com" in ready
    assert "degraded" not in ready  # no VendorCDIMissing: the plugin writes per-claim specs
    metrics = vendor.run.http("/metrics")
    assert "toposlice_vendor_cdi_missing_gpus 0.0" in metrics
    assert 'action="yielded",driver="gpu.nvidia.com"} 8.0' in metrics
    assert "no vendor CDI device" not in vendor.run.log_path.read_text().split("serving")[-1]


def test_the_vendor_example_pairs_its_gpu_with_toposlices_nic_and_cpus(
    vendor: VendorNode,
) -> None:
    """The plugin orders its devices differently at each start, so which GPU is one of
    several right answers: the GPU and the NIC on one root, the CPUs on its NUMA node."""
    path = REPO / "examples" / "vendor-gpu-with-nic-and-cpus.yaml"
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    template = next(d for d in docs if d["kind"] == "ResourceClaimTemplate")
    vendor.claim("vendor-example", template["spec"]["spec"])
    try:
        got = {r["request"]: r for r in vendor.wait_allocated("vendor-example")}
        gpu = vendor.vendor()[got["gpu"]["device"]]["attributes"]
        own = vendor.own()
        nic = own[got["nic"]["device"]]["attributes"]
        cpus = own[got["cpus"]["device"]]["attributes"]
        assert gpu[f"{STD}/pcieRoot"] == nic[f"{STD}/pcieRoot"]
        assert nic[f"{STD}/numaNode"] == cpus[f"{STD}/numaNode"] == gpu[f"{STD}/numaNode"]

        def running() -> bool:
            out = vendor.cluster.kubectl("get", "pod", "vendor-example", "-n", NS, "-o", "json")
            return json.loads(out).get("status", {}).get("phase") == "Running"

        poll(running, timeout=90, what="the pod with a vendor GPU and toposlice's NIC running")
    finally:
        vendor.delete("vendor-example")


def doctor(vendor: VendorNode) -> tuple[int, dict[str, Any]]:
    return vendor.doctor("--kubeconfig", str(vendor.cluster.kubeconfig))


def test_doctor_beside_the_plugin(vendor: VendorNode) -> None:
    rc, report = doctor(vendor)
    alarms = [f for f in report["findings"] if f["severity"] in ("error", "warning")]
    assert alarms == [] and rc == 0
    drivers = {d["driver"]: d for d in report["drivers"]}
    assert drivers["gpu.nvidia.com"]["matched"] == 8 and drivers["gpu.nvidia.com"]["on_node"]
    vendor.run.stop()
    vendor.run.start("--duplicates", "publish")
    try:
        poll(
            lambda: any(d["attributes"]["type"]["string"] == "gpu" for d in vendor.own().values()),
            timeout=30,
            what="toposlice's GPUs published",
        )
        rc, report = doctor(vendor)
        doubled = {
            (f["driver"], f["device"]) for f in report["findings"]
            if f["check"] == "double-published"
        }  # fmt: skip
        assert rc == 1 and len({dev for d, dev in doubled if d == "gpu.nvidia.com"}) == 8
        assert len({dev for d, dev in doubled if d == "toposlice.dev"}) == 8
    finally:
        vendor.run.stop()
        vendor.run.start()
