"""The chart as users install it, on a real kubelet + containerd node (tests/node/node.py):
the image built without a daemon and imported with ctr, ``helm install`` through Helm's
Go SDK with the fake DGX H100 (values-fake.yaml), then what a user does with it.

- the DaemonSet's pod reaches Ready through its own readiness probe, registered with the
  real kubelet, and the node's slices appear;
- every example of ``examples/`` satisfiable on dgx-h100 runs as written (its image
  swapped for a local one: no registry here) and its container sees what the CDI spec
  promises; deleting the pod unprepares it;
- a rollout restart and a kill -9 of the plugin while a claim pod runs change nothing
  for that pod (same container, same spec file) and write no slice;
- the exporter answers on the chart's Service endpoints;
- ``helm upgrade`` with changed values and ``helm uninstall`` leave no slices, sockets
  or spec files behind.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import poll
from tests.node.conftest import FIGURES, TOPOSLICE_IMAGE, WORKLOAD_IMAGE
from tests.node.node import Node
from tests.test_exporter_page import DevTools, browser  # noqa: F401  (the fixture)

pytestmark = pytest.mark.node

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (test extra) not installed")

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "toposlice"
EXAMPLES = REPO / "examples"
RELEASE = NAMESPACE = "toposlice"
DRIVER = "toposlice.dev"
WORKLOADS = "node-examples"
SPEC_PREFIX = f"k8s.{DRIVER}-claim_"
REDISCOVER_S = 4
#: Device names (not request names such as gpu-0) in the examples' allocation comments.
_DEVICE = re.compile(r"\b((?:gpu|nic)-[0-9a-f]{4}(?:-[0-9a-f]{2}){2}-[0-7]|cpu-[a-z0-9]+)\b")


def satisfiable_examples() -> dict[str, set[str]]:
    """Example file -> the device names its comment says dgx-h100 allocates."""
    out: dict[str, set[str]] = {}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        m = re.search(r"^#\s+dgx-h100:(.*)$", path.read_text(), re.M)
        if m and "unsatisfiable" not in m.group(1):
            out[path.name] = set(_DEVICE.findall(m.group(1)))
    return out


def values(node: Node, **extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CHART / "values-fake.yaml").read_text())
    repo, tag = TOPOSLICE_IMAGE.rsplit(":", 1)
    data["image"] = {"repository": repo, "tag": tag, "pullPolicy": "Never"}
    # Rediscovery (in its spawned helper process) every few seconds: the tier sees many.
    data["extraArgs"] = [f"--rediscover-interval={REDISCOVER_S}"]
    data["host"] = {
        "kubeletDir": str(node.kubelet_dir),
        "cdiRoot": str(node.cdi_dir),
        "stateDir": str(node.dir / "toposlice-state"),
        # Only the node's own CDI directory (the default would mount, and create, this
        # machine's /etc/cdi and /var/run/cdi).
        "cdiSpecDirs": [],
    }
    data.update(extra)
    return data


def get(node: Node, *args: str) -> Any:
    return json.loads(node.cluster.kubectl("get", *args, "-o", "json"))


def plugin_pods(node: Node, terminating: bool = False) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = get(
        node, "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=node-plugin"
    )["items"]
    return [p for p in pods if terminating or not p["metadata"].get("deletionTimestamp")]


def ready_plugin(node: Node, not_uid: str = "") -> dict[str, Any] | None:
    for pod in plugin_pods(node):
        conds = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
        if conds.get("Ready") == "True" and pod["metadata"]["uid"] != not_uid:
            return pod
    return None


def slices(node: Node) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get(
        node,
        "resourceslices",
        f"--field-selector=spec.driver={DRIVER},spec.nodeName={node.name}",
    )["items"]
    return items


def container_id(pod: dict[str, Any]) -> str:
    (status,) = pod["status"]["containerStatuses"]
    return str(status["containerID"]).split("://", 1)[1]


def kill_plugin(node: Node, plugin: dict[str, Any]) -> None:
    """kill -9 of the PLUGIN pod's container; returns once the kubelet restarted it and it
    is Ready again (same pod, restartCount > 0)."""
    node.kill_container(container_id(plugin))
    poll(
        lambda: any(
            s.get("restartCount", 0) > 0 and s.get("ready")
            for p in plugin_pods(node)
            for s in p["status"].get("containerStatuses", [])
        ),
        timeout=120,
        interval=0.5,
        what="killed plugin restarted and Ready",
    )


def registry_sockets(node: Node) -> list[str]:
    return sorted(p.name for p in (node.kubelet_dir / "plugins_registry").glob("*"))


@contextmanager
def installed(node: Node, workloads: str) -> Iterator[Any]:
    """The chart installed with ``values(node)`` through Helm's SDK, its plugin pod Ready
    and the namespace ``workloads`` made (the helm Config is yielded); the namespace and
    the release are removed after."""
    cfg = helm.Config(kubeconfig_path=str(node.cluster.kubeconfig), namespace=NAMESPACE)
    t0 = time.monotonic()
    cfg.install(str(CHART), RELEASE, values(node), namespace=NAMESPACE, create_namespace=True)
    poll(lambda: ready_plugin(node), timeout=120, interval=0.25, what="plugin pod Ready")
    FIGURES.setdefault("helm install to plugin pod Ready", f"{time.monotonic() - t0:.1f} s")
    node.cluster.kubectl("create", "namespace", workloads, check=False)
    try:
        yield cfg
    finally:
        node.cluster.kubectl("delete", "namespace", workloads, "--wait=false", check=False)
        cfg.uninstall(RELEASE, ignore_not_found=True, timeout=60)


@pytest.fixture(scope="module")
def release(node: Node) -> Iterator[Any]:
    with installed(node, WORKLOADS) as cfg:
        yield cfg


# -- install ---------------------------------------------------------------------------------


def test_plugin_ready_registered_and_publishing(node: Node, release: Any) -> None:
    pod = ready_plugin(node)
    assert pod is not None
    ds = get(node, "daemonset", "-n", NAMESPACE, RELEASE)
    assert ds["status"]["desiredNumberScheduled"] == 1  # no affinity left on a plain node
    assert registry_sockets(node) == [f"{DRIVER}-reg.sock"]
    log = node.logs / "kubelet.log"
    assert re.search(rf'driverName="{re.escape(DRIVER)}".*connected=true', log.read_text())
    found = poll(lambda: slices(node), timeout=30, what="the node's ResourceSlices")
    names = {d["name"] for s in found for d in s["spec"]["devices"]}
    assert {n for want in satisfiable_examples().values() for n in want} <= names


def plugin_log(node: Node, grep: str) -> str:
    """The plugin container's log lines holding ``grep`` (read on the node)."""
    logs = (node.dir / "logs" / "pods").glob(f"{NAMESPACE}_*/plugin/*.log")
    lines = [ln for p in logs for ln in p.read_text(errors="replace").splitlines()]
    return "\n".join(ln for ln in lines if grep in ln)[-3000:]


def discoveries(node: Node) -> tuple[int, int]:
    """(rediscoveries run, of which failed) from the plugin's metrics."""
    pod = ready_plugin(node)
    assert pod is not None
    url = f"http://{pod['status']['podIP']}:8080/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()

    def value(name: str) -> int:
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        return int(float(m.group(1))) if m else 0

    return (
        value("toposlice_discovery_duration_seconds_count"),
        value("toposlice_discovery_errors_total"),
    )


def test_registration_holds_across_rediscoveries(node: Node, release: Any) -> None:
    """Registration was lost after the first rediscovery: its spawned helper re-ran an
    unguarded launcher, so a second driver replaced the kubelet sockets, failed on the
    taken HTTP port and removed them ("DRA driver toposlice.dev is not registered")."""
    pod = ready_plugin(node)
    assert pod is not None
    poll(lambda: discoveries(node)[0] >= 2, timeout=6 * REDISCOVER_S, what="two rediscoveries")
    assert discoveries(node)[1] == 0, plugin_log(node, "rediscovery failed")
    log = (node.logs / "kubelet.log").read_text()
    registered = [m.start() for m in re.finditer(r"RegisterPlugin started", log)]
    assert registered and "UnregisterPlugin" not in log[registered[-1] :]
    assert registry_sockets(node) == [f"{DRIVER}-reg.sock"]
    again = ready_plugin(node)
    assert again is not None and again["metadata"]["uid"] == pod["metadata"]["uid"]
    assert again["status"]["containerStatuses"][0]["restartCount"] == 0


# -- workloads -------------------------------------------------------------------------------


def example_objects(name: str) -> tuple[list[dict[str, Any]], str]:
    """The example's objects, its pod's image swapped for the local workload image."""
    docs = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
    pod_name = ""
    for d in docs:
        d["metadata"]["namespace"] = WORKLOADS
        if d["kind"] == "Pod":
            pod_name = d["metadata"]["name"]
            for c in d["spec"]["containers"]:
                c["image"] = WORKLOAD_IMAGE
                c["imagePullPolicy"] = "Never"
    return docs, pod_name


def running(node: Node, pod_name: str) -> dict[str, Any] | None:
    pod: dict[str, Any] = get(node, "pod", "-n", WORKLOADS, pod_name)
    if pod["status"].get("phase") == "Running":
        return pod
    assert pod["status"].get("phase") in ("Pending", None), pod["status"]
    return None


def start_example(node: Node, name: str) -> tuple[dict[str, Any], float]:
    docs, pod_name = example_objects(name)
    t0 = time.monotonic()
    node.cluster.apply(docs)
    pod = poll(lambda: running(node, pod_name), timeout=90, interval=0.2, what=f"{name} Running")
    return pod, time.monotonic() - t0


def stop_example(node: Node, name: str) -> None:
    docs, _ = example_objects(name)
    for d in reversed(docs):
        node.cluster.kubectl(
            "delete", d["kind"], "-n", WORKLOADS, d["metadata"]["name"], "--grace-period=1"
        )


def claim_of(node: Node, pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim: dict[str, Any] = get(node, "resourceclaim", "-n", WORKLOADS, status["resourceClaimName"])
    return claim


def bus_ids_in(xml_text: str) -> tuple[set[str], set[str]]:
    """(GPU bus ids, NIC bus ids) of an NCCL topology file."""
    root = ET.fromstring(xml_text)
    gpus = {p.get("busid", "") for p in root.iter("pci") if p.find("gpu") is not None}
    nics = {p.get("busid", "") for p in root.iter("pci") if p.get("class", "").startswith("0x02")}
    return gpus, nics


def check_container(node: Node, pod: dict[str, Any], want: set[str]) -> str:
    """What the container sees against the claim's allocation; the claim UID."""
    claim = claim_of(node, pod)
    results = claim["status"]["allocation"]["devices"]["results"]
    allocated = {r["device"] for r in results if r["driver"] == DRIVER}
    assert allocated == want
    uid = claim["metadata"]["uid"]
    spec = node.cdi_specs()[f"{SPEC_PREFIX}{uid}.json"]
    assert all("deviceNodes" not in d["containerEdits"] for d in spec["devices"])
    assert spec["annotations"]["toposlice.dev/omitted-device-nodes"] or not allocated

    cid = container_id(pod)
    env = dict(line.split("=", 1) for line in node.exec(cid, "env").splitlines() if "=" in line)
    assert env["TOPOSLICE_CLAIM_UID"] == uid
    assert set(env["TOPOSLICE_DEVICES"].split(",")) == allocated
    gpus = {n for n in allocated if n.startswith("gpu-")}
    nics = {n for n in allocated if n.startswith("nic-")}
    if gpus or nics:
        topo = node.exec(cid, "cat", env["NCCL_TOPO_FILE"])
        gpu_ids, nic_ids = bus_ids_in(topo)
        want_gpu = set(env.get("TOPOSLICE_GPU_BUS_IDS", "").split(",")) - {""}
        assert gpu_ids == want_gpu and len(gpu_ids) == len(gpus)
        pci = set(env["TOPOSLICE_PCI_BUS_IDS"].split(","))
        # NCCL looks an IB NIC up by function 0: the ports of one card are one entry.
        assert nic_ids == {b.rsplit(".", 1)[0] + ".0" for b in pci - want_gpu}
    if nics:
        hcas = env["NCCL_IB_HCA"]
        assert hcas.startswith("=") and len(hcas[1:].split(",")) >= len(nics)
    # The examples that print their NCCL_* variables (env | grep) printed the file's path.
    command = " ".join(pod["spec"]["containers"][0].get("command") or [])
    if "NCCL" in command and (gpus or nics):
        logs = node.dir / "logs" / "pods"

        def printed() -> str:
            found = logs.glob(f"{WORKLOADS}_{pod['metadata']['name']}_*/*/*.log")
            return "".join(p.read_text() for p in found)

        out = poll(lambda: "NCCL_TOPO_FILE=" in printed(), timeout=15, what="the pod's output")
        assert out
    return str(uid)


@pytest.mark.parametrize("example", sorted(satisfiable_examples()))
def test_example_runs_with_its_devices(node: Node, release: Any, example: str) -> None:
    want = satisfiable_examples()[example]
    pod, took = start_example(node, example)
    FIGURES.setdefault("pod creation to Running with a claim", {})[example] = f"{took:.1f} s"
    try:
        uid = check_container(node, pod, want)
    finally:
        stop_example(node, example)
    # Deleting the pod unprepares: its spec file goes.
    poll(
        lambda: f"{SPEC_PREFIX}{uid}.json" not in node.cdi_specs(),
        timeout=60,
        what="the claim's CDI spec removed",
    )


# -- the plugin restarting under a running claim ------------------------------------------------


def test_restart_and_kill_change_nothing_for_a_running_claim(node: Node, release: Any) -> None:
    example = "gpu-nic-same-pcie-root.yaml"
    pod, _ = start_example(node, example)
    try:
        cid = container_id(pod)
        specs = node.cdi_specs()
        versions = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in slices(node)}
        old = ready_plugin(node)
        assert old is not None

        node.cluster.kubectl("rollout", "restart", f"daemonset/{RELEASE}", "-n", NAMESPACE)
        new = poll(
            lambda: ready_plugin(node, not_uid=old["metadata"]["uid"]),
            timeout=120,
            interval=0.5,
            what="restarted plugin Ready",
        )
        assert registry_sockets(node) == [f"{DRIVER}-reg.sock"]

        kill_plugin(node, new)  # kill -9 of the plugin's container
        after: dict[str, Any] = get(node, "pod", "-n", WORKLOADS, pod["metadata"]["name"])
        assert after["status"]["phase"] == "Running"
        assert container_id(after) == cid
        assert after["status"]["containerStatuses"][0]["restartCount"] == 0
        assert node.cdi_specs() == specs  # none lost, none added, none rewritten
        now = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in slices(node)}
        assert now == versions  # 0 slice writes
        assert registry_sockets(node) == [f"{DRIVER}-reg.sock"]
    finally:
        stop_example(node, example)


# -- exporter ------------------------------------------------------------------------------------


def test_exporter_answers_on_the_service_endpoints(node: Node, release: Any) -> None:
    """The chart's Service is headless (one endpoint per node plugin): its EndpointSlice
    names the pod's address, reached over the node's CNI bridge."""
    found = get(
        node,
        "endpointslices",
        "-n",
        NAMESPACE,
        "-l",
        f"kubernetes.io/service-name={RELEASE}",
    )["items"]
    addrs = [
        (a, p["port"])
        for s in found
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready")
        for a in e["addresses"]
        for p in s.get("ports") or []
    ]
    assert len(addrs) == 1
    addr, port = addrs[0]
    base = f"http://{addr}:{port}"

    def fetch(path: str) -> tuple[int, str]:
        with urllib.request.urlopen(base + path, timeout=10) as resp:
            return resp.status, resp.read().decode()

    status, text = fetch("/metrics")
    assert status == 200 and "toposlice_ready 1" in text
    status, text = fetch("/v1/topology")
    assert status == 200 and json.loads(text)
    status, text = fetch("/")
    assert status == 200 and "<html" in text.lower()


def plugin_url(node: Node) -> str:
    pod = ready_plugin(node)
    assert pod is not None
    return f"http://{pod['status']['podIP']}:8080"


def test_page_renders_with_a_running_claim(
    node: Node,
    release: Any,
    browser: DevTools,  # noqa: F811
) -> None:
    """The exporter's page, drawn by headless Chromium from the plugin pod, marks the
    devices of the claim that runs."""
    example = "gpu-nic-same-pcie-root.yaml"
    pod, _ = start_example(node, example)
    try:
        want = satisfiable_examples()[example]
        browser.open(plugin_url(node) + "/")
        count = "document.querySelectorAll('svg#topology [data-kind=\"{}\"]').length"
        assert browser.js(count.format("gpu")) == 8
        assert browser.js(count.format("nic")) == 12
        allocated = browser.js(
            "document.querySelectorAll('svg#topology [data-allocated=\"true\"]').length"
        )
        assert allocated == len(want)
        assert claim_of(node, pod)["status"]["allocation"]
    finally:
        stop_example(node, example)


# -- upgrade and uninstall -----------------------------------------------------------------------


def test_upgrade_then_uninstall_leave_nothing_behind(node: Node, release: Any) -> None:
    old = ready_plugin(node)
    assert old is not None
    release.upgrade(
        str(CHART),
        RELEASE,
        values(node, logging={"level": "info", "format": "text"}),
        namespace=NAMESPACE,
    )
    new = poll(
        lambda: ready_plugin(node, not_uid=old["metadata"]["uid"]),
        timeout=120,
        interval=0.5,
        what="upgraded plugin Ready",
    )
    assert "--log-format=text" in new["spec"]["containers"][0]["args"]
    assert slices(node)
    release.uninstall(RELEASE, timeout=60)
    poll(
        lambda: not plugin_pods(node, terminating=True),
        timeout=90,
        interval=0.5,
        what="plugin pod gone",
    )
    assert registry_sockets(node) == []
    assert list((node.kubelet_dir / "plugins" / DRIVER).glob("*.sock")) == []
    assert node.cdi_specs() == {}
    # The kubelet removes the slices of a driver that deregistered (after its grace period).
    poll(lambda: not slices(node), timeout=90, interval=1, what="the node's slices removed")
