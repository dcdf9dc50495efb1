"""toposlice on the real control plane, installed as a user installs it.

The chart (values-fake) is applied but its DaemonSet; on each of eight nodes a
``toposlice run --fake MACHINE`` process runs as the chart's ServiceAccount with a token
bound to a Pod on its node, so RBAC and the admission policy are the chart's own. The
drivers start once for the module; the tests run in file order (the restarts last).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from normalize.nccl_topo import nic_bus_id
from normalize.vendor_view import vendor_slice
from tests.e2e.cluster import Cluster, poll
from tests.e2e.toposlice_setup import (
    DRIVER,
    NodeDriver,
    chart_objects,
    claim_of,
    claim_pod,
    cli_slices,
    install,
    pod_outcome,
    published_slices,
    serve_scorer,
    spawn_extender_scheduler,
    uninstall,
)
from tests.kubelet import NodeClient
from tests.test_examples import EXAMPLES, VENDOR_CLASSES, expectations, recorded_vendor

pytestmark = pytest.mark.e2e

#: node name -> fake machine: every shipped machine, so each examples/ comment line has its
#: node (the NVSwitch and the PCIe machines are also the extender's pair).
MACHINES = {
    "e2e-drv-dgx": "dgx-h100",
    "e2e-drv-mi300x": "mi300x-8",
    "e2e-drv-gb200": "gb200-nvl72-tray",
    "e2e-drv-pcie": "pcie-8gpu",
    "e2e-drv-vm": "cloud-vm-1gpu",
    "e2e-drv-cpu": "cpu-2s",
}
#: Machines where a vendor GPU driver publishes the GPUs and toposlice only NICs and CPUs.
VENDOR_DRIVER = "gpu.nvidia.com"
VENDOR_NODES = {"e2e-drv-dgxv": "dgx-h100", "e2e-drv-gb200v": "gb200-nvl72-tray"}
ALL_NODES = [*MACHINES, *VENDOR_NODES]
EXAMPLE_NODES = {machine: node for node, machine in MACHINES.items()}
EXAMPLE_NODES |= {f"{m} beside {VENDOR_DRIVER}": node for node, m in VENDOR_NODES.items()}


def plugin_slice(node: str, machine: str) -> dict[str, Any]:
    """What NVIDIA's plugin published on ``machine`` (recorded), as node ``node``'s."""
    (theirs,) = recorded_vendor(machine, VENDOR_DRIVER) or [
        vendor_slice(cli_slices(machine, node), VENDOR_DRIVER, node)
    ]
    spec = {**theirs["spec"], "nodeName": node, "pool": {**theirs["spec"]["pool"], "name": node}}
    return {**theirs, "metadata": {"name": f"{node}-{VENDOR_DRIVER}"}, "spec": spec}


@pytest.fixture(scope="module")
def drivers(cluster: Cluster) -> Iterator[dict[str, NodeDriver]]:
    objs = install(cluster)
    started: dict[str, NodeDriver] = {}
    try:
        for node, machine in MACHINES.items():
            cluster.add_node(node, {"e2e.toposlice.dev/machine": machine})
        for node, machine in VENDOR_NODES.items():
            cluster.add_node(node, {"e2e.toposlice.dev/machine": machine})
        vendor = [plugin_slice(n, m) for n, m in VENDOR_NODES.items()]
        cluster.apply([VENDOR_CLASSES[VENDOR_DRIVER], *vendor])
        for node, machine in MACHINES.items():
            started[node] = NodeDriver(cluster, node, machine).start()
        for node, machine in VENDOR_NODES.items():
            started[node] = NodeDriver(cluster, node, machine, "--publish", "nic,cpu").start()
        for d in started.values():
            d.wait_started()
        yield started
    finally:
        cluster.kill_all(d.name for d in started.values())
        for d in started.values():
            d.cleanup()
        cluster.kubectl("delete", "deviceclass", VENDOR_DRIVER, "--ignore-not-found")
        listed = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json"))["items"]
        ours = [s["metadata"]["name"] for s in listed if s["spec"].get("nodeName") in ALL_NODES]
        if ours:
            cluster.kubectl("delete", "resourceslices", "--ignore-not-found", *ours)
        for node in ALL_NODES:
            cluster.remove_node(node)
        uninstall(cluster, objs)


def _specs(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((s["spec"] for s in slices), key=lambda s: json.dumps(s, sort_keys=True))


def _versions(cluster: Cluster) -> dict[str, str]:
    out = {}
    for node in MACHINES:
        for s in published_slices(cluster, node):
            out[s["metadata"]["name"]] = s["metadata"]["resourceVersion"]
    return out


def _writes(d: NodeDriver) -> float:
    """ResourceSlice writes this driver process has sent (its /metrics)."""
    total = 0.0
    for fam in text_string_to_metric_families(d.metrics()):
        if fam.name.endswith("resourceslice_writes"):
            total += sum(s.value for s in fam.samples if s.name.endswith("_total"))
    return total


def _slice_requests(cluster: Cluster) -> dict[str, float]:
    """kube-apiserver's own count of ResourceSlice requests, by verb (its /metrics)."""
    out: dict[str, float] = {}
    text = cluster.kubectl("get", "--raw", "/metrics")
    for fam in text_string_to_metric_families(text):
        if fam.name != "apiserver_request":
            continue
        for s in fam.samples:
            labels = s.labels
            if s.name.endswith("_total") and labels.get("resource") == "resourceslices":
                out[labels["verb"]] = out.get(labels["verb"], 0.0) + s.value
    return out


WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY")


def _quiet(cluster: Cluster, seconds: float) -> tuple[dict[str, float], dict[str, float]]:
    """kube-apiserver's ResourceSlice request counts before and after ``seconds`` in which
    the drivers resync (every 1 s) and nothing else here asks the API server anything."""
    before = _slice_requests(cluster)
    time.sleep(seconds)
    return before, _slice_requests(cluster)


def test_slices_are_accepted_and_equal_toposlice_slices(
    cluster: Cluster, drivers: dict[str, NodeDriver]
) -> None:
    for node, machine in MACHINES.items():
        got = poll(lambda n=node: published_slices(cluster, n), 20, 0.1, f"slices of {node}")
        want = cli_slices(machine, node)
        assert _specs(got) == _specs(want), node
        node_uid = json.loads(cluster.kubectl("get", "node", node, "-o", "json"))["metadata"]["uid"]
        for s in got:
            assert s["metadata"]["ownerReferences"][0]["uid"] == node_uid


def test_steady_state_and_kill_9_restart_write_nothing(
    cluster: Cluster, drivers: dict[str, NodeDriver]
) -> None:
    before = _versions(cluster)
    writes = {n: _writes(d) for n, d in drivers.items()}
    assert all(w >= 1 for w in writes.values()), writes  # each created its slices
    # Three resyncs (every 1 s) of every driver, counted by the API server itself: each
    # compares its pool with what its watch says the server holds, and finds it current:
    # no write and no LIST.
    requests, after = _quiet(cluster, 3.5)
    assert {v: after.get(v, 0) for v in (*WRITE_VERBS, "LIST")} == {
        v: requests.get(v, 0) for v in (*WRITE_VERBS, "LIST")
    }
    assert _versions(cluster) == before
    assert {n: _writes(d) for n, d in drivers.items()} == writes

    d = drivers["e2e-drv-mi300x"]
    d.stop(signal.SIGKILL)
    requests = _slice_requests(cluster)
    d.start().wait_started()  # ready: registered and its pool found current
    time.sleep(2.5)  # and resyncing
    after = _slice_requests(cluster)
    assert {v: after.get(v, 0) for v in WRITE_VERBS} == {v: requests.get(v, 0) for v in WRITE_VERBS}
    assert after.get("LIST", 0) - requests.get("LIST", 0) == 1  # its one LIST, then the watch
    assert _versions(cluster) == before
    assert _writes(d) == 0


def test_another_nodes_slice_is_refused_with_the_policys_message(
    cluster: Cluster, drivers: dict[str, NodeDriver]
) -> None:
    own = drivers["e2e-drv-dgx"]
    victim = published_slices(cluster, "e2e-drv-pcie")[0]
    forged = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "e2e-forged-pcie"},
        "spec": {
            "driver": DRIVER,
            "nodeName": "e2e-drv-pcie",
            "pool": {"name": "e2e-drv-pcie", "generation": 99, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-forged"}],
        },
    }
    as_node = [f"--kubeconfig={own.kubeconfig}"]
    want = (
        "the toposlice node plugin on node e2e-drv-dgx may not write ResourceSlices of node "
        "e2e-drv-pcie"
    )
    out = cluster.kubectl(*as_node, "create", "-f", "-", input=json.dumps(forged), check=False)
    assert want in out, out
    out = cluster.kubectl(
        *as_node, "delete", "resourceslice", victim["metadata"]["name"], check=False
    )
    assert want in out, out
    # Its own node's slices it may write (the same identity, the same policy): an update
    # (PUT; the chart grants update, not patch) that changes nothing is admitted.
    mine = published_slices(cluster, "e2e-drv-dgx")[0]
    out = cluster.kubectl(*as_node, "replace", "-f", "-", input=json.dumps(mine), check=False)
    assert "replaced" in out, out
    with pytest.raises(subprocess.CalledProcessError):
        cluster.kubectl("get", "resourceslice", "e2e-forged-pcie")


# -- examples/ allocated by the real scheduler, prepared by the driver --------------------


def _bus_ids(cluster: Cluster, node: str, names: set[str]) -> set[str]:
    """The NCCL bus IDs of these devices, from their published pciBusID: a NIC's ports
    and functions are one NCCL ``pci`` element at function 0 (normalize/nccl_topo.py)."""
    out = set()
    for sl in published_slices(cluster, node):
        for d in sl["spec"]["devices"]:
            a = d["attributes"]
            bus = a.get("resource.kubernetes.io/pciBusID")
            if d["name"] in names and bus:
                busid = bus["string"].lower()
                if a["type"]["string"] == "nic":
                    busid = nic_bus_id(busid, a.get("sriovVF", {}).get("bool", False))
                out.add(busid)
    return out


def _vendor_gpu_bus_ids(cluster: Cluster, node: str, results: list[dict[str, Any]]) -> set[str]:
    """The pciBusID of every device of another driver in ``results`` (the vendor GPUs of
    the vendor examples), from that driver's slices of the node."""
    wanted = {(r["driver"], r["device"]) for r in results if r["driver"] != DRIVER}
    out = set()
    for driver in {drv for drv, _ in wanted}:
        for sl in published_slices(cluster, node, driver):
            for dev in sl["spec"]["devices"]:
                bus = dev["attributes"].get("resource.kubernetes.io/pciBusID")
                if (driver, dev["name"]) in wanted and bus:
                    out.add(bus["string"].lower())
    return out


def _nccl_endpoints(xml: str) -> set[str]:
    """Bus IDs of the GPU and NIC endpoints in an NCCL topology file: every ``pci`` but
    PCIe switches (class 0x0604xx) and NVSwitches (0x0680xx)."""
    out = set()
    for pci in ET.fromstring(xml).iter("pci"):
        if not pci.attrib.get("class", "").startswith(("0x0604", "0x0680")):
            out.add(pci.attrib["busid"].lower())
    return out


def _files_naming(base: Path, uid: str) -> list[Path]:
    return [p for p in base.rglob("*") if p.is_file() and uid in p.name]


def _run_example(
    cluster: Cluster, drivers: dict[str, NodeDriver], path: Path, machine: str, idx: int
) -> None:
    want = expectations(path)[machine]
    node = EXAMPLE_NODES[machine]
    ns = f"e2e-ex-{path.stem[:30]}-{idx}"
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    pod = next(d for d in docs if d["kind"] == "Pod")
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    cluster.kubectl("create", "namespace", ns)
    try:
        for d in docs:
            d["metadata"]["namespace"] = ns
        cluster.apply(docs)
        name = pod["metadata"]["name"]
        what, claim = poll(
            lambda: pod_outcome(cluster, ns, name), 30, 0.1, f"{path.name} on {node}"
        )
        if want is None:
            assert what == "unschedulable", f"{path.name} on {machine}: comment says unsatisfiable"
            assert claim is None or not (claim.get("status") or {}).get("allocation")
            return
        assert what == "allocated", f"{path.name} on {machine}: not allocated"
        assert claim is not None
        results = claim["status"]["allocation"]["devices"]["results"]
        got: dict[str, list[str]] = {}
        for r in results:
            got.setdefault(r["request"], []).append(r["device"])
            assert r["pool"] == node
        assert got == want, f"{path.name} on {machine}"

        # The kubelet side: prepare the real claim on its node.
        d = drivers[node]
        ours = {r["device"] for r in results if r["driver"] == DRIVER}
        uid = claim["metadata"]["uid"]
        ref = (ns, claim["metadata"]["name"], uid)
        with NodeClient(d.endpoint) as kubelet:
            resp = kubelet.prepare([ref]).claims[uid]
            assert resp.error == ""
            assert {dev.device_name for dev in resp.devices} == ours
            assert {dev.pool_name for dev in resp.devices} == {node}
            # the claim's own spec, and one device-metadata spec per request (KEP-5304)
            specs = [p for p in d.cdi.iterdir() if uid in p.name]
            (spec_file,) = [p for p in specs if "_metadata_" not in p.name]
            spec = json.loads(spec_file.read_text())
            assert {dev["name"] for dev in spec["devices"]} == {f"{uid}-{n}" for n in ours}
            requests = {r["request"].split("/")[0] for r in results if r["driver"] == DRIVER}
            assert len(specs) - 1 == len(requests), [p.name for p in specs]
            topo = [p for p in _files_naming(d.state, uid) if p.suffix == ".xml"]
            endpoints = {n for n in ours if not n.startswith("cpu-")}
            if endpoints:
                (topo_file,) = topo
                # Another driver's GPUs in the claim are in the file too (driver/kubelet/state.py:
                # matched to this host's GPUs by their standard pciBusID).
                vendor = _vendor_gpu_bus_ids(cluster, node, results)
                want_ids = _bus_ids(cluster, node, endpoints) | vendor
                assert _nccl_endpoints(topo_file.read_text()) == want_ids
            else:
                assert topo == []
            assert kubelet.unprepare([ref]).claims[uid].error == ""
        assert _files_naming(d.base, uid) == []
    finally:
        cluster.kubectl("-n", ns, "delete", "pod", "--all", "--force", "--grace-period=0")
        cluster.kubectl("delete", "namespace", ns, "--wait=false")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_allocated_by_the_scheduler_and_prepared(
    cluster: Cluster, drivers: dict[str, NodeDriver], path: Path
) -> None:
    """Applied alone (pinned by nodeSelector to each node whose machine its comment names,
    one namespace per node, all at once), the real scheduler allocates exactly the devices
    the comment names or leaves the pod unschedulable where it says so; the driver
    prepares exactly the allocated devices, and unprepare leaves no file behind."""
    cases = [m for m in expectations(path) if m in EXAMPLE_NODES]
    assert cases, f"{path.name}: names none of the e2e machines"
    with ThreadPoolExecutor(len(cases)) as pool:
        futures = [
            pool.submit(_run_example, cluster, drivers, path, m, i) for i, m in enumerate(cases)
        ]
        for f in futures:
            f.result()
    # Every node's devices are free again before the next example.
    _wait_no_claims(cluster)


# -- the scorer: behind a second real kube-scheduler, and its emitted claims ---------------

REPO = Path(__file__).resolve().parents[2]
PAIR_LABEL = "e2e.toposlice.dev/pair"
NVSWITCH_NODE, PCIE_NODE = "e2e-drv-dgx", "e2e-drv-pcie"


def _graph_files(drivers: dict[str, NodeDriver], nodes: list[str], where: Path) -> list[str]:
    """Each node's graph as its driver serves it (/v1/topology), saved for ``--graph``."""
    files = []
    for node in nodes:
        status, body = drivers[node].http("/v1/topology")
        assert status == 200, node
        path = where / f"{node}.json"
        path.write_bytes(body)
        files.append(str(path))
    return files


@pytest.fixture(scope="module")
def scorer(
    cluster: Cluster, drivers: dict[str, NodeDriver], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, list[str]]]:
    """``toposlice scorer serve`` over the drivers' graphs, reading claims as admin; the
    scheduler profile of examples/scheduler/kube-scheduler-config.yaml, its address
    adapted, in a second kube-scheduler. Yields (scorer process name, graph files)."""
    where = tmp_path_factory.mktemp("scorer")
    graphs = _graph_files(drivers, list(MACHINES), where)
    argv = [a for g in graphs for a in ("--graph", g)]
    port = serve_scorer(cluster, "toposlice-scorer", argv, DRIVER)
    spawn_extender_scheduler(cluster, "kube-scheduler-toposlice", port, where)
    for node in (NVSWITCH_NODE, PCIE_NODE):
        cluster.kubectl("label", "node", node, f"{PAIR_LABEL}=tp", "--overwrite")
    try:
        yield "toposlice-scorer", graphs
    finally:
        cluster.kill("kube-scheduler-toposlice")
        cluster.kill("toposlice-scorer")
        for node in (NVSWITCH_NODE, PCIE_NODE):
            cluster.kubectl("label", "node", node, f"{PAIR_LABEL}-")


def _tp_pod(name: str, gpus: int = 2) -> list[dict[str, Any]]:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"{name}-gpus"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpus",
                            "exactly": {"deviceClassName": f"gpu.{DRIVER}", "count": gpus},
                        }
                    ]
                }
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            # GPU count from the claim; the pattern from the annotation (docs/scorer.md).
            "annotations": {"toposlice.dev/workload": "pattern: tensor-parallel"},
        },
        "spec": {
            "schedulerName": "toposlice-scheduler",
            "nodeSelector": {PAIR_LABEL: "tp"},
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": f"{name}-gpus"}],
            "containers": [
                {"name": "c", "image": "pause", "resources": {"claims": [{"name": "gpus"}]}}
            ],
        },
    }
    return [template, pod]


def _node_of(cluster: Cluster, ns: str, pod: str) -> str | None:
    obj = json.loads(cluster.kubectl("-n", ns, "get", "pod", pod, "-o", "json"))
    node: str | None = obj["spec"].get("nodeName")
    return node


def _namespace(cluster: Cluster, ns: str) -> None:
    cluster.kubectl("create", "namespace", ns)


def _drop_namespace(cluster: Cluster, ns: str) -> None:
    cluster.kubectl("-n", ns, "delete", "pod", "--all", "--force", "--grace-period=0")
    cluster.kubectl("delete", "namespace", ns, "--wait=false")


def test_extender_puts_tensor_parallel_on_nvswitch_and_is_ignorable(
    cluster: Cluster, drivers: dict[str, NodeDriver], scorer: tuple[str, list[str]]
) -> None:
    ns = "e2e-extender"
    _namespace(cluster, ns)
    try:
        # Three 2-GPU TP pods one after another: each lands on the NVSwitch machine (a
        # tie broken at random would put all three there one time in eight).
        for i in range(3):
            objs = _tp_pod(f"tp-{i}")
            for o in objs:
                o["metadata"]["namespace"] = ns
            cluster.apply(objs)
            node = poll(lambda i=i: _node_of(cluster, ns, f"tp-{i}"), 30, 0.1, f"tp-{i} bound")
            assert node == NVSWITCH_NODE, cluster.log_tail("kube-scheduler-toposlice")

        # The scorer stopped: `ignorable: true` lets the scheduler go on without it.
        cluster.kill(scorer[0])
        objs = _tp_pod("tp-no-scorer")
        for o in objs:
            o["metadata"]["namespace"] = ns
        cluster.apply(objs)
        node = poll(lambda: _node_of(cluster, ns, "tp-no-scorer"), 30, 0.1, "bound w/o scorer")
        assert node in (NVSWITCH_NODE, PCIE_NODE)
    finally:
        _drop_namespace(cluster, ns)
        _wait_no_claims(cluster)


def _wait_no_claims(cluster: Cluster) -> None:
    poll(
        lambda: (
            not json.loads(cluster.kubectl("get", "resourceclaims", "-A", "-o", "json"))["items"]
        ),
        60,
        0.2,
        "claims deleted",
    )


@pytest.mark.parametrize("request_file", ["decode-2gpu.yaml", "tp4-training.yaml"])
def test_emitted_claim_is_allocated_to_the_scorers_choice(
    cluster: Cluster,
    drivers: dict[str, NodeDriver],
    scorer: tuple[str, list[str]],
    tmp_path: Path,
    request_file: str,
) -> None:
    request = REPO / "examples" / "requests" / request_file
    emitted = tmp_path / "claim.yaml"
    argv = [sys.executable, "-m", "toposlice", "-q", "score", "--request", str(request)]
    argv += ["--graph", *scorer[1], "-o", "json", "--top", "1", "--emit-claim", str(emitted)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=REPO)
    (best,) = json.loads(out.stdout)["placements"]
    items = yaml.safe_load(emitted.read_text())["items"]
    (template,) = [o for o in items if o["kind"] == "ResourceClaimTemplate"]
    assert template["metadata"]["annotations"]["toposlice.dev/node"] == best["node"]
    ns = f"e2e-emit-{request.stem}"
    _namespace(cluster, ns)
    try:
        template["metadata"]["namespace"] = ns
        name = template["metadata"]["name"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": best["node"]},
                "resourceClaims": [{"name": "c", "resourceClaimTemplateName": name}],
                "containers": [
                    {"name": "c", "image": "pause", "resources": {"claims": [{"name": "c"}]}}
                ],
            },
        }
        # The DeviceClasses it lists are the chart's, already installed.
        cluster.apply([template, pod])
        what, claim = poll(lambda: pod_outcome(cluster, ns, name), 30, 0.1, "emitted claim")
        assert what == "allocated" and claim is not None
        results = claim["status"]["allocation"]["devices"]["results"]
        assert {r["pool"] for r in results} == {best["node"]}
        # Every request takes its first alternative: the scorer's own choice.
        assert all(r["request"].endswith("/chosen") for r in results), results
        assert {r["device"] for r in results} == set(best["devices"])
    finally:
        _drop_namespace(cluster, ns)
        _wait_no_claims(cluster)


# -- the control plane restarts under the running drivers (last: they disturb the rest) ---


def _pools(cluster: Cluster) -> dict[str, list[tuple[str, int, int]]]:
    """node -> [(slice name, pool generation, resourceSliceCount)], sorted."""
    out = {}
    for node in ALL_NODES:
        out[node] = sorted(
            (
                s["metadata"]["name"],
                s["spec"]["pool"]["generation"],
                s["spec"]["pool"]["resourceSliceCount"],
            )
            for s in published_slices(cluster, node)
        )
    return out


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_control_plane_restart_converges(
    cluster: Cluster, drivers: dict[str, NodeDriver], component: str
) -> None:
    """Restart the API server (or etcd) under the running drivers: no driver exits, the
    slices are the same ones (no duplicates, none lost), an allocated claim survives and
    still prepares, and a slice deleted after the restart comes back (the drivers'
    watches and writes reconnected)."""
    ns = f"e2e-restart-{component}"
    node = "e2e-drv-gb200"
    cluster.kubectl("create", "namespace", ns)
    try:
        request = {"name": "gpu", "exactly": {"deviceClassName": f"gpu.{DRIVER}"}}
        cluster.apply(claim_pod("keeps", node, [request], ns))
        what, claim = poll(lambda: pod_outcome(cluster, ns, "keeps"), 30, 0.1, "allocated")
        assert what == "allocated" and claim is not None
        pools = _pools(cluster)
        assert all(len(v) == v[0][2] for v in pools.values() if v)

        if component == "etcd":
            cluster.restart_etcd()
        else:
            cluster.restart_apiserver()

        for d in drivers.values():
            assert d.proc is not None and d.proc.poll() is None, d.name
        poll(lambda: all(d.http("/readyz")[0] == 200 for d in drivers.values()), 30, 0.2, "ready")
        assert _pools(cluster) == pools
        again = claim_of(cluster, ns, "keeps")
        assert again is not None and again["metadata"]["uid"] == claim["metadata"]["uid"]
        assert again["status"]["allocation"] == claim["status"]["allocation"]

        uid = claim["metadata"]["uid"]
        ref = (ns, claim["metadata"]["name"], uid)
        with NodeClient(drivers[node].endpoint) as kubelet:
            assert kubelet.prepare([ref]).claims[uid].error == ""
            assert kubelet.unprepare([ref]).claims[uid].error == ""

        victim = pools[node][0][0]
        cluster.kubectl("delete", "resourceslice", victim)
        poll(
            lambda: len(published_slices(cluster, node)) == len(pools[node]),
            30,
            0.2,
            f"{node} republished",
        )
        # Back to one complete pool per node, nothing doubled.
        after = _pools(cluster)
        assert {n: len(v) for n, v in after.items()} == {n: len(v) for n, v in pools.items()}
    finally:
        _drop_namespace(cluster, ns)
        _wait_no_claims(cluster)


@pytest.mark.parametrize("variant", ["default", "fake", "all-options", "observe"])
def test_every_chart_object_is_accepted_by_the_api_server(
    cluster: Cluster, drivers: dict[str, NodeDriver], variant: str
) -> None:
    """Each variant tests/test_chart.py renders, every object (the DaemonSet and the
    scorer's Deployments included), through kube-apiserver's validation and admission
    with a server-side dry run; only kinds of CRDs not installed here are left out."""
    from tests.test_chart import CRD_KINDS, VARIANTS

    values = VARIANTS[variant]
    objs = [
        o
        for o in chart_objects(values if values is not None else {})
        if (o["apiVersion"], o["kind"]) not in CRD_KINDS
    ]
    for o in objs:
        if o["kind"] in ("DaemonSet", "Deployment", "ConfigMap", "Service", "ServiceAccount"):
            o["metadata"].setdefault("namespace", "toposlice")
    doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
    out = cluster.kubectl(
        "apply", "--dry-run=server", "--server-side", "--force-conflicts", "-f", "-", input=doc
    )
    assert out.count("serverside-applied") == len(objs), out
