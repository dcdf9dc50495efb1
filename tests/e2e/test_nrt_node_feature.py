"""NodeResourceTopology and NFD NodeFeature on the real API server with the real CRDs.

The CRDs copied in charts/toposlice/crds-optional are installed (and removed at the end);
the builders' objects for dgx-h100, gb200-nvl72-tray, mi300x-8 and cpu-2s are accepted and
stored unchanged (nothing pruned). Then ``toposlice run --nrt --node-feature`` runs as the
chart's ServiceAccount (chart RBAC with ``integrations.*.enabled``, token bound to a Pod on
its node) over a saved DGX H100 inventory that it re-reads every second: in steady state
the API server counts no write to either resource; once a GPU is gone from the inventory
it counts exactly one write (PUT) to the NodeFeature and none to the NRT (devices are not
NRT zone resources); once a pod on the node is Running, one write to the NRT (its pods
fingerprint, from the driver's watch of the node's pods) and none to the NodeFeature.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from discovery.model import Inventory
from normalize.node_feature import build_node_feature
from normalize.nrt import build_nrt
from normalize.pod_fingerprint import ATTRIBUTE as FINGERPRINT
from normalize.pod_fingerprint import sign
from tests.driver_support import snapshot
from tests.e2e.cluster import Cluster, poll
from tests.e2e.toposlice_setup import (
    NAMESPACE,
    NodeDriver,
    chart_objects,
    cluster_scoped,
    in_release_namespace,
    remove_node_and_slices,
)

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "charts" / "toposlice" / "crds-optional"
NODE = "e2e-nrt-dgx"
MACHINES = ["dgx-h100", "gb200-nvl72-tray", "mi300x-8", "cpu-2s"]
RESOURCES = {"noderesourcetopologies": "nrt", "nodefeatures": "nodefeature"}
#: Every verb that changes an object (the driver only ever creates and updates).
WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY"}


def _crds() -> list[dict[str, Any]]:
    return [
        yaml.safe_load((CRDS / f).read_text())
        for f in ("noderesourcetopologies.yaml", "nodefeatures.yaml")
    ]


def _get(cluster: Cluster, *args: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", *args, "-o", "json", "--ignore-not-found")
    return json.loads(out) if out.strip() else None


def server_writes(cluster: Cluster) -> dict[str, float]:
    """Write requests the API server has served per resource (apiserver_request_total)."""
    counts = dict.fromkeys(RESOURCES, 0.0)
    text = cluster.kubectl("get", "--raw", "/metrics")
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for s in family.samples:
            if (
                s.name == "apiserver_request_total"
                and s.labels.get("resource") in counts
                and s.labels.get("verb") in WRITE_VERBS
            ):
                counts[s.labels["resource"]] += s.value
    return counts


def _chart_objects() -> list[dict[str, Any]]:
    values = yaml.safe_load((REPO / "charts" / "toposlice" / "values-fake.yaml").read_text())
    values["integrations"] = {
        "nrt": {"enabled": True, "topologyManagerPolicy": "single-numa-node"},
        "nodeFeature": {"enabled": True},
    }
    objs = [
        o
        for o in chart_objects(values)
        if o["kind"] not in ("DaemonSet", "CustomResourceDefinition")
    ]
    return in_release_namespace(objs)


class InventoryDriver(NodeDriver):
    """``toposlice run --inventory FILE --nrt --node-feature``: the file is re-read on every
    rediscovery (every second), so editing it is a hardware change."""

    def __init__(self, cluster: Cluster, node: str, inventory: Path) -> None:
        self.inventory = inventory
        super().__init__(
            cluster,
            node,
            "dgx-h100",
            "--nrt",
            "--topology-manager-policy",
            "single-numa-node",
            "--node-feature",
            "--node-feature-namespace",
            NAMESPACE,
            "--rediscover-interval",
            "1",
        )

    def argv(self) -> list[str]:
        argv = super().argv()
        i = argv.index("--fake")
        argv[i : i + 2] = ["--inventory", str(self.inventory)]
        return argv


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> Iterator[None]:
    cluster.apply(_crds())
    try:
        yield
    finally:
        for crd in _crds():
            cluster.kubectl("delete", "crd", crd["metadata"]["name"], "--ignore-not-found")


@pytest.fixture(scope="module")
def release(cluster: Cluster, crds: None) -> Iterator[list[dict[str, Any]]]:
    # Another module may have just deleted the namespace (without waiting): let it go.
    poll(lambda: _get(cluster, "namespace", NAMESPACE) is None, 120, 0.5, "namespace gone")
    cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
    objs = _chart_objects()
    cluster.apply(objs)
    try:
        yield objs
    finally:
        for o in objs:
            if cluster_scoped(o):
                cluster.kubectl("delete", o["kind"], o["metadata"]["name"], "--ignore-not-found")
        # The token-binding pods have no kubelet to confirm a graceful delete: force them,
        # then wait for the namespace, so a later module can install the chart again.
        cluster.kubectl("-n", NAMESPACE, "delete", "pods", "--all", "--force", "--grace-period=0")
        cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=120s")


@pytest.mark.parametrize("machine", MACHINES)
def test_objects_are_accepted_unchanged(cluster: Cluster, crds: None, machine: str) -> None:
    inv = snapshot(machine).inventory
    name = f"e2e-nrt-{machine}"
    ns = f"e2e-nf-{machine}"
    nrt = build_nrt(inv, name, policy="restricted", scope="container")
    nf = build_node_feature(inv, name, ns)
    cluster.kubectl("create", "namespace", ns)
    try:
        for obj, owned in ((nrt, ("zones", "attributes", "topologyPolicies")), (nf, ("spec",))):
            stored = json.loads(
                cluster.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(obj))
            )
            for field in owned:
                assert stored.get(field) == obj.get(field), (machine, field)
            assert stored["metadata"]["labels"] == obj["metadata"]["labels"]
    finally:
        cluster.kubectl("delete", "noderesourcetopology", name, "--ignore-not-found")
        # Waited for: the namespace controller's deletes must not land in a later count.
        cluster.kubectl("delete", "namespace", ns, "--ignore-not-found", "--timeout=120s")


def test_steady_state_writes_nothing_and_each_change_writes_its_object_once(
    cluster: Cluster, release: list[dict[str, Any]], tmp_path: Path
) -> None:
    inv = snapshot("dgx-h100").inventory
    inv_file = tmp_path / "inventory.json"
    inv_file.write_text(json.dumps(inv.to_dict()))
    cluster.add_node(NODE, {"e2e.toposlice.dev/machine": "dgx-h100"})
    driver = InventoryDriver(cluster, NODE, inv_file)
    nf_name = build_node_feature(inv, NODE, NAMESPACE)["metadata"]["name"]
    try:
        driver.start().wait_started()

        def objects() -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
            return (
                _get(cluster, "noderesourcetopology", NODE),
                _get(cluster, "-n", NAMESPACE, "nodefeature", nf_name),
            )

        poll(lambda: all(objects()), 30, 0.2, "NRT and NodeFeature written")
        nrt, nf = objects()
        assert nrt is not None and nf is not None
        want_nrt = build_nrt(inv, NODE, policy="single-numa-node", pods_fingerprint=sign([]))
        assert nrt["zones"] == want_nrt["zones"] and nrt["attributes"] == want_nrt["attributes"]
        assert "topologyPolicies" not in nrt  # deprecated: only with --nrt-topology-policies
        assert nf["spec"] == build_node_feature(inv, NODE, NAMESPACE)["spec"]
        node_uid = json.loads(cluster.kubectl("get", "node", NODE, "-o", "json"))["metadata"]["uid"]
        for obj in (nrt, nf):
            assert [r["uid"] for r in obj["metadata"]["ownerReferences"]] == [node_uid]

        # Steady state: several resyncs and rediscoveries (1 s each), no write.
        before = server_writes(cluster)
        time.sleep(5)
        assert server_writes(cluster) == before
        nrt2, nf2 = objects()
        assert nrt2 is not None and nf2 is not None
        assert nrt2["metadata"]["resourceVersion"] == nrt["metadata"]["resourceVersion"]
        assert nf2["metadata"]["resourceVersion"] == nf["metadata"]["resourceVersion"]

        # A GPU lost: the saved inventory loses it (written atomically), the driver re-reads it.
        lost = Inventory.from_dict(inv.to_dict())
        lost.gpus = lost.gpus[1:]
        tmp = inv_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(lost.to_dict()))
        os.replace(tmp, inv_file)

        def caught_up() -> bool:
            nrt3, nf3 = objects()
            return bool(
                nrt3
                and nf3
                and nrt3["zones"] == build_nrt(inv, NODE)["zones"]
                and nf3["spec"]["labels"].get("toposlice.dev/gpu.count") == "7"
            )

        poll(caught_up, 30, 0.2, "objects show 7 GPUs")
        time.sleep(4)  # and nothing more after it
        after = server_writes(cluster)
        assert {k: after[k] - before[k] for k in RESOURCES} == {
            "noderesourcetopologies": 0.0,
            "nodefeatures": 1.0,
        }

        # A pod bound to the node turns Running (the harness stands in for the kubelet):
        # the NRT's fingerprint follows, one write; the pod leaving, one more.
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "e2e-nrt-pod", "namespace": "default"},
            "spec": {
                "nodeName": NODE,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10.2"}],
            },
        }
        cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
        time.sleep(2)  # Pending: not counted, no write
        assert server_writes(cluster)["noderesourcetopologies"] == after["noderesourcetopologies"]
        status = {"status": {"phase": "Running"}}
        cluster.kubectl(
            "patch", "pod", "e2e-nrt-pod", "-n", "default", "--subresource=status",
            "--type=merge", "-p", json.dumps(status),
        )  # fmt: skip

        def fingerprint() -> str | None:
            nrt4 = _get(cluster, "noderesourcetopology", NODE) or {}
            attrs = {a["name"]: a["value"] for a in nrt4.get("attributes") or []}
            return attrs.get(FINGERPRINT)

        poll(lambda: fingerprint() == sign([("default", "e2e-nrt-pod")]), 30, 0.2, "pod signed")
        cluster.kubectl(
            "delete", "pod", "e2e-nrt-pod", "-n", "default", "--force", "--grace-period=0"
        )
        poll(lambda: fingerprint() == sign([]), 30, 0.2, "pod gone from the fingerprint")
        time.sleep(2)
        final = server_writes(cluster)
        assert {k: final[k] - after[k] for k in RESOURCES} == {
            "noderesourcetopologies": 2.0,
            "nodefeatures": 0.0,
        }
    finally:
        driver.cleanup()
        cluster.kubectl(
            "delete", "pod", "e2e-nrt-pod", "-n", "default", "--force", "--grace-period=0",
            "--ignore-not-found",
        )  # fmt: skip
        cluster.kubectl("delete", "noderesourcetopology", NODE, "--ignore-not-found")
        cluster.kubectl("-n", NAMESPACE, "delete", "nodefeature", nf_name, "--ignore-not-found")
        remove_node_and_slices(cluster, NODE)


def test_node_plugin_may_write_only_its_own_nodes_objects(
    cluster: Cluster, release: list[dict[str, Any]]
) -> None:
    """The chart's RBAC and admission policy, enforced by the real API server: with a token
    bound to a Pod on its node the plugin creates that node's objects and is refused
    another node's, with the policy's message."""
    node, other = "e2e-nrt-policy-a", "e2e-nrt-policy-b"
    inv = snapshot("cpu-2s").inventory
    cluster.add_node(node)
    kubeconfig = cluster.token_kubeconfig(NAMESPACE, "toposlice", node)
    created: list[tuple[str, ...]] = []
    try:
        for build, kind in (
            (lambda n: build_nrt(inv, n), ("noderesourcetopology",)),
            (lambda n: build_node_feature(inv, n, NAMESPACE), ("-n", NAMESPACE, "nodefeature")),
        ):
            as_plugin = (f"--kubeconfig={kubeconfig}", "create", "-f", "-")
            own = build(node)
            cluster.kubectl(*as_plugin, input=json.dumps(own))
            created.append((*kind, own["metadata"]["name"]))
            out = cluster.kubectl(*as_plugin, input=json.dumps(build(other)), check=False)
            assert f"on node {node} may not write the {own['kind']} of node {other}" in out, out
            assert _get(cluster, *kind, build(other)["metadata"]["name"]) is None
    finally:
        for *kind, name in created:
            cluster.kubectl("delete", *kind, name, "--ignore-not-found")
        cluster.remove_node(node)
