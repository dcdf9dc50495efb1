"""The harness itself against the real control plane: the API server answers with the
v1.36.2 version and the DRA API, a node added by the harness stays Ready past the
controller-manager's node-monitor grace period, and a token bound to a Pod on a node
carries that node's name in its user extra (what the chart's admission policy reads)."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.cluster import KUBE_VERSION, NODE_GRACE_S, Cluster, poll

pytestmark = pytest.mark.e2e

NODE = "e2e-cp-node-1"


def test_api_server_answers_with_dra(cluster: Cluster) -> None:
    version = json.loads(cluster.kubectl("version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"].startswith(KUBE_VERSION)
    resources = cluster.kubectl("api-resources", "--api-group=resource.k8s.io", "-o", "name")
    for kind in ("resourceslices", "resourceclaims", "deviceclasses", "resourceclaimtemplates"):
        assert f"{kind}.resource.k8s.io" in resources.split()


def _ready(cluster: Cluster, name: str) -> tuple[str, list[str]]:
    node = json.loads(cluster.kubectl("get", "node", name, "-o", "json"))
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    taints = [t["key"] for t in node["spec"].get("taints") or []]
    return ready["status"], taints


def test_node_stays_ready_past_grace_period(cluster: Cluster) -> None:
    cluster.add_node(NODE, {"e2e": "control-plane"})
    try:
        # The lifecycle controller adds not-ready taints to a new node until it sees it
        # Ready; wait for them to go, then outlive the grace period by a margin.
        poll(lambda: _ready(cluster, NODE) == ("True", []), 30, 0.2, "node Ready, untainted")
        end = time.monotonic() + NODE_GRACE_S + 4
        while time.monotonic() < end:
            assert _ready(cluster, NODE) == ("True", []), cluster.log_tail(
                "kube-controller-manager"
            )
            time.sleep(1)
    finally:
        cluster.remove_node(NODE)


def test_pod_bound_token_names_the_node(cluster: Cluster) -> None:
    ns = "e2e-cp-identity"
    cluster.kubectl("create", "namespace", ns)
    try:
        cluster.kubectl("-n", ns, "create", "serviceaccount", "agent")
        poll(lambda: cluster.kubectl("-n", ns, "get", "sa", "agent", check=False), 10)
        kubeconfig = cluster.token_kubeconfig(ns, "agent", "e2e-cp-node-2")
        review = json.loads(
            cluster.kubectl(f"--kubeconfig={kubeconfig}", "auth", "whoami", "-o", "json")
        )
        info = review["status"]["userInfo"]
        assert info["username"] == f"system:serviceaccount:{ns}:agent"
        assert info["extra"]["authentication.kubernetes.io/node-name"] == ["e2e-cp-node-2"]
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false")
