"""toposlice beside the real NVIDIA DRA GPU kubelet plugin (kubernetes-sigs/dra-driver-nvidia-gpu
@ 95932046 on NVIDIA's mock NVML), through the kit's ``nvidia-gpu-up.sh`` with the tree
``toposlice machines tree`` writes over ``/sys`` and the profile ``toposlice machines
mock-nvml`` writes (the fake machine's bus ids, UUIDs, model, memory, driver version), on the
fake dgx-h100 and the GB200 tray, and ``toposlice run`` with its default flags (``publish:
[gpu, nic, cpu]``).

What holds on the stock v1.36.2 scheduler (list gate off), on both machines:
- the plugin reads toposlice's tree as written: its GPUs' standard attributes equal
  toposlice's (``numaNode`` needs each function's ``resource`` file, which the tree has);
- toposlice leaves the GPUs to the plugin (one owner per GPU), says so, and raises no
  vendor-CDI warning for GPUs it does not publish (the plugin writes its CDI spec per claim);
- ``examples/vendor-gpu-with-nic-and-cpus.yaml`` allocates as its comment says (a GPU with
  toposlice's NIC on its root and CPUs on that NUMA node on dgx-h100; nothing on the tray);
- ``toposlice claim --gpus-from gpu.nvidia.com`` for 1, 2 and 4 GPUs: each GPU with a NIC on
  its root where the hardware has one, else on its NUMA node, CPUs on the first GPU's node;
  the pod runs, prepared by both drivers, and toposlice's NCCL file names the vendor's GPUs
  and its NICs by bus id;
- ``run``'s ``/v1/topology`` and ``serve --observe`` join the plugin's GPUs to their vertices
  (run's, which yields its GPUs, names the plugin's devices only);
- ``toposlice doctor``: no error or warning; double publishing reported as an error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import free_ports, poll
from tests.interop.conftest import NriNode
from tests.interop.peers import FIGURES, NS, Scenario, devices_of, slices_of, toposlice

pytestmark = pytest.mark.interop

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "data" / "foreign-slices" / "recorded"
STD = "resource.kubernetes.io"
STANDARD = (f"{STD}/pciBusID", f"{STD}/pcieRoot", f"{STD}/numaNode")
#: Machine -> the file its recorded slice is kept in.
MACHINES = {"dgx-h100": "nvidia-gpu.yaml", "gb200-nvl72-tray": "nvidia-gpu-gb200.yaml"}
RECORD_HEADER = """Recorded from NVIDIA's DRA GPU kubelet plugin
(kubernetes-sigs/dra-driver-nvidia-gpu 95932046) on mock NVML (NVIDIA/k8s-test-infra
3b2b865d, profile written by `toposlice machines mock-nvml {m}`), run by
tests/interop/test_nvidia_gpu.py on the fake {m} tree (kube v1.36.2 node,
DRAListTypeAttributes off); node renamed to {m}, devices sorted by name (the plugin
orders them differently at each start). Refresh: TOPOSLICE_RECORD_PEERS=1."""


class VendorNode(Scenario):
    def start(self) -> None:
        import datetime as dt

        self.since = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.write_tree()
        profile = self.tree.parent / "mock-nvml.yaml"
        toposlice("machines", "mock-nvml", self.machine, "--output-file", str(profile))
        took = self.peer.up(
            "nvidia-gpu",
            self.node.name,
            self.tree / "sys",
            env={"MOCK_NVML_CONFIG": str(profile)},
        )
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


@pytest.fixture(scope="module", params=list(MACHINES))
def vendor(
    request: pytest.FixtureRequest, node: NriNode, kit: Path, tmp_path_factory: Any
) -> Iterator[VendorNode]:
    v = VendorNode(node, kit, request.param, tmp_path_factory.mktemp("nvidia"))
    try:
        v.start()
        yield v
    finally:
        v.stop()


def toposlice_gpus(machine: str) -> dict[str, dict[str, Any]]:
    text = toposlice("slices", "--fake", machine, "-o", "yaml").stdout
    return {
        d["attributes"][f"{STD}/pciBusID"]["string"]: d
        for d in devices_of([s for s in yaml.safe_load_all(text) if s]).values()
        if d["attributes"]["type"]["string"] == "gpu"
    }


def test_the_plugin_reads_toposlices_tree_as_written(vendor: VendorNode) -> None:
    theirs = {d["attributes"][STANDARD[0]]["string"]: d for d in vendor.vendor().values()}
    ours = toposlice_gpus(vendor.machine)
    assert set(theirs) == set(ours) and len(ours) == {"dgx-h100": 8}.get(vendor.machine, 4)
    for bus, mine in ours.items():
        for name in STANDARD:  # numaNode too: the tree's `resource` files
            assert theirs[bus]["attributes"][name] == mine["attributes"][name], (bus, name)
        assert theirs[bus]["attributes"]["uuid"]["string"] == mine["attributes"]["uuid"]["string"]
    sys.path.insert(0, str(REPO / "hack"))
    from record_peer_slices import recorded, write

    slices = recorded(
        slices_of(vendor.cluster, vendor.node.name, "gpu.nvidia.com"),
        "gpu.nvidia.com",
        vendor.machine,
    )
    for s in slices:
        s["spec"]["devices"] = sorted(s["spec"]["devices"], key=lambda d: d["name"])
    path = RECORDED / MACHINES[vendor.machine]
    if os.environ.get("TOPOSLICE_RECORD_PEERS"):
        write(path, slices, RECORD_HEADER.format(m=vendor.machine))
    with open(path, encoding="utf-8") as fh:
        kept = [d for d in yaml.safe_load_all(fh) if d]
    assert devices_of(slices) == devices_of(kept)


def test_one_owner_per_gpu_and_no_vendor_cdi_warning(vendor: VendorNode) -> None:
    kinds = {d["attributes"]["type"]["string"] for d in vendor.own().values()}
    assert kinds == {"nic", "cpu"}, kinds
    n = len(vendor.vendor())
    ready = vendor.run.http("/readyz")
    assert f"yielded: not publishing {n} device(s) published by gpu.nvidia.com" in ready
    assert "degraded" not in ready  # no VendorCDIMissing: the plugin writes per-claim specs
    metrics = vendor.run.http("/metrics")
    assert "toposlice_vendor_cdi_missing_gpus 0.0" in metrics
    assert f'action="yielded",driver="gpu.nvidia.com"}} {n}.0' in metrics
    assert "no vendor CDI device" not in vendor.run.log_path.read_text().split("serving")[-1]

    def ours() -> list[dict[str, Any]]:
        out = vendor.cluster.kubectl(
            "get", "events", "-A", "--field-selector", f"involvedObject.name={vendor.node.name}",
            "-o", "json",
        )  # fmt: skip
        return [  # this machine's, with the default flags (the doctor test keeps copies)
            e for e in json.loads(out)["items"]
            if (e.get("source") or {}).get("component", "").startswith("toposlice.dev")
            and f"{n} device(s) published by gpu.nvidia.com" in e["message"]
            and "--duplicates publish" not in e["message"]
        ]  # fmt: skip

    poll(lambda: bool(ours()), timeout=30, what="toposlice's Event saying it yielded")
    assert [e["reason"] for e in ours()] == ["DevicesPublishedByAnotherDriver"]
    assert {e["type"] for e in ours()} == {"Normal"}  # no warning where the plugin is healthy
    warned = vendor.cluster.kubectl(
        "get", "events", "-A", "--field-selector",
        f"involvedObject.name={vendor.node.name},type=Warning", "-o", "json",
    )  # fmt: skip
    assert not [
        e for e in json.loads(warned)["items"]
        if (e.get("source") or {}).get("component", "").startswith("toposlice.dev")
        and "--duplicates publish" not in e["message"]
        and (e.get("lastTimestamp") or e.get("eventTime") or "") >= vendor.since
    ]  # fmt: skip


def running(vendor: VendorNode, pod: str) -> bool:
    out = vendor.cluster.kubectl("get", "pod", pod, "-n", NS, "-o", "json")
    return json.loads(out).get("status", {}).get("phase") == "Running"


def test_the_vendor_example_allocates_as_its_comment_says(vendor: VendorNode) -> None:
    """The plugin orders its devices differently at each start, so which GPU is one of
    several right answers: the GPU and the NIC on one root, the CPUs on its NUMA node; on
    a machine the comment calls unsatisfiable the pod stays unscheduled."""
    path = REPO / "examples" / "vendor-gpu-with-nic-and-cpus.yaml"
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    template = next(d for d in docs if d["kind"] == "ResourceClaimTemplate")
    said = [line for line in path.read_text().splitlines() if f"#   {vendor.machine} " in line]
    assert len(said) == 1, said
    vendor.claim("vendor-example", template["spec"]["spec"])
    try:
        if said[0].endswith("unsatisfiable"):
            poll(
                lambda: "cannot allocate" in vendor.unschedulable("vendor-example"),
                timeout=60,
                what="the scheduler to find no node for the vendor example",
            )
            assert vendor.allocation("vendor-example") is None
            return
        got = {r["request"]: r for r in vendor.wait_allocated("vendor-example")}
        gpu = vendor.vendor()[got["gpu"]["device"]]["attributes"]
        own = vendor.own()
        nic = own[got["nic"]["device"]]["attributes"]
        cpus = own[got["cpus"]["device"]]["attributes"]
        assert gpu[f"{STD}/pcieRoot"] == nic[f"{STD}/pcieRoot"]
        assert nic[f"{STD}/numaNode"] == cpus[f"{STD}/numaNode"] == gpu[f"{STD}/numaNode"]
        poll(
            lambda: running(vendor, "vendor-example"),
            timeout=90,
            what="the pod with a vendor GPU and toposlice's NIC running",
        )
    finally:
        vendor.delete("vendor-example")


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_claims_for_vendor_gpus_pair_each_with_its_closest_nic(
    vendor: VendorNode, gpus: int
) -> None:
    """``toposlice claim --gpus-from gpu.nvidia.com``: every GPU with an RDMA NIC on its root
    where the machine has one (dgx-h100), else on its NUMA node (the GB200 tray), CPUs on the
    first GPU's node; the pod runs, and the NCCL file toposlice writes at prepare lists the
    vendor's GPUs and toposlice's NICs."""
    text = toposlice(
        "claim", "--gpus-from", "gpu.nvidia.com", "--gpus", str(gpus), "--cpu-groups", "1",
        "-o", "json",
    ).stdout  # fmt: skip
    template = next(i for i in json.loads(text)["items"] if i["kind"] == "ResourceClaimTemplate")
    name = f"vendor-gpus-{gpus}"
    vendor.claim(name, template["spec"]["spec"])
    try:
        results = vendor.wait_allocated(name)
        theirs, own = vendor.vendor(), vendor.own()
        by_req = {r["request"].split("/")[0]: r["device"] for r in results}
        rdma_roots = {
            d["attributes"][f"{STD}/pcieRoot"]["string"]
            for d in own.values()
            if d["attributes"]["type"]["string"] == "nic" and "rdmaDevice" in d["attributes"]
        }
        for i in range(gpus):
            g = theirs[by_req[f"gpu-{i}"]]["attributes"]
            n = own[by_req[f"nic-{i}"]]["attributes"]
            if g[f"{STD}/pcieRoot"]["string"] in rdma_roots:
                assert n[f"{STD}/pcieRoot"] == g[f"{STD}/pcieRoot"], (i, by_req)
            else:
                assert n[f"{STD}/numaNode"] == g[f"{STD}/numaNode"], (i, by_req)
        first = theirs[by_req["gpu-0"]]["attributes"]
        assert own[by_req["cpu"]]["attributes"][f"{STD}/numaNode"] == first[f"{STD}/numaNode"]
        poll(lambda: running(vendor, name), timeout=90, what=f"the pod of {name} running")
        uid = json.loads(
            vendor.cluster.kubectl("get", "resourceclaim", name, "-n", NS, "-o", "json")
        )["metadata"]["uid"]
        xml = vendor.run.topology_file(uid).read_text()
        for i in range(gpus):
            for dev, pool in ((by_req[f"gpu-{i}"], theirs), (by_req[f"nic-{i}"], own)):
                bus = pool[dev]["attributes"][f"{STD}/pciBusID"]["string"]
                assert f'busid="{bus}"' in xml, (dev, bus)
        FIGURES[f"vendor claim, {gpus} GPU(s), on {vendor.machine}"] = ", ".join(
            f"{by_req[f'gpu-{i}']}+{by_req[f'nic-{i}']}" for i in range(gpus)
        )
    finally:
        vendor.delete(name)


def test_the_graph_joins_the_plugins_gpus_to_their_vertices(vendor: VendorNode) -> None:
    """``run``'s /v1/topology, and ``serve --observe`` beside it, name the plugin's GPU on
    the vertex of the same bus id (what a scheduler maps an allocation result with)."""
    theirs = {
        d["attributes"][f"{STD}/pciBusID"]["string"]: name for name, d in vendor.vendor().items()
    }

    def joined(doc: dict[str, Any]) -> dict[str, str]:
        out = {}
        for v in doc["vertices"]:
            for ident in v["attrs"].get("dra") or []:
                if ident["driver"] == "gpu.nvidia.com":
                    out[v["attrs"]["bus_id"]] = ident["device"]
        return out

    poll(
        lambda: joined(json.loads(vendor.run.http("/v1/topology"))) == theirs,
        timeout=30,
        what="run's graph to name the plugin's GPUs",
    )
    # run yields its GPUs to the plugin: their vertices name the plugin's devices only.
    doc = json.loads(vendor.run.http("/v1/topology"))
    for v in doc["vertices"]:
        if v["kind"] == "gpu":
            assert [d["driver"] for d in v["attrs"]["dra"]] == ["gpu.nvidia.com"], v["id"]
    (port,) = free_ports(1)
    serve = subprocess.Popen(
        [
            sys.executable, "-m", "toposlice", "-q", "serve", "--fake", vendor.machine,
            "--node-name", vendor.node.name, "--observe", "--observe-interval", "1",
            "--kubeconfig", str(vendor.cluster.kubeconfig), "--http-addr", f"127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def observed() -> dict[str, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/topology", timeout=5) as r:
                return joined(json.loads(r.read()))
        except OSError:
            return {}

    try:
        poll(lambda: observed() == theirs, timeout=60, what="serve --observe to name them")
    finally:
        serve.terminate()
        serve.wait(20)


def doctor(vendor: VendorNode) -> tuple[int, dict[str, Any]]:
    return vendor.doctor("--kubeconfig", str(vendor.cluster.kubeconfig))


def test_doctor_beside_the_plugin(vendor: VendorNode) -> None:
    rc, report = doctor(vendor)
    alarms = [f for f in report["findings"] if f["severity"] in ("error", "warning")]
    assert alarms == [] and rc == 0
    drivers = {d["driver"]: d for d in report["drivers"]}
    n = len(vendor.vendor())
    assert drivers["gpu.nvidia.com"]["matched"] == n and drivers["gpu.nvidia.com"]["on_node"]
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
        assert rc == 1 and len({dev for d, dev in doubled if d == "gpu.nvidia.com"}) == n
        assert len({dev for d, dev in doubled if d == "toposlice.dev"}) == n
    finally:
        vendor.run.stop()
        vendor.run.start()
