"""The NodeResourceTopology scheduler plugin (scheduler-plugins, openshift-kni build) in its
cached mode, the mode its authors recommend for production, reading toposlice's NRT: the
plugin subtracts the pods it placed until the object's pods fingerprint matches the pods it
sees on the node. The harness stands in for the kubelet (a pod it marks Running is running)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from normalize.pod_fingerprint import ATTRIBUTE, sign
from tests.consumers.readers import DGX, FIGURES, Fleet, wait
from tests.e2e.toposlice_setup import NAMESPACE

pytestmark = pytest.mark.consumers

RESYNC_S = 5
SCHEDULER = "topo-aware-cached"


def _pod(name: str, node: str, cpus: int) -> dict[str, Any]:
    res = {"cpu": str(cpus), "memory": "1Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "schedulerName": SCHEDULER,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10.2",
                    "resources": {"requests": res, "limits": res},  # Guaranteed
                }
            ],
        },
    }


def _fingerprint(fleet: Fleet, node: str) -> str | None:
    nrt = fleet.get("noderesourcetopology", node) or {}
    return {a["name"]: a["value"] for a in nrt.get("attributes") or []}.get(ATTRIBUTE)


def _bound(fleet: Fleet, name: str) -> str:
    pod = fleet.get("pod", name, "-n", "default") or {}
    return str(pod.get("spec", {}).get("nodeName") or "")


def _why(fleet: Fleet, name: str) -> str:
    pod = fleet.get("pod", name, "-n", "default") or {}
    conds = pod.get("status", {}).get("conditions") or []
    return "; ".join(str(c.get("message", "")) for c in conds) or "no condition"


def _placed(fleet: Fleet, name: str, node: str, timeout: float) -> None:
    try:
        wait(lambda: _bound(fleet, name) == node, timeout, f"{name} placed on {node}")
    except TimeoutError as exc:
        tail = "\n".join(fleet.log("nrt-scheduler-cached").splitlines()[-15:])
        raise AssertionError(f"{exc}: {_why(fleet, name)}\n{tail}") from None


def test_cached_mode_admits_a_pod_on_a_node_emptied_by_an_earlier_pod(fleet: Fleet) -> None:
    node = DGX[0]
    nrt = fleet.get("noderesourcetopology", node)
    assert nrt is not None and "topologyPolicies" not in nrt  # deprecated field off
    # The node's own toposlice pod (the harness marked it Running) is the only one counted.
    own = [(NAMESPACE, f"toposlice-{node}")]
    wait(lambda: _fingerprint(fleet, node) == sign(own), 30, "the NRT signs the running pod")
    fleet.up(
        "nrt-scheduler", "--v=2", env={"NRT_MODE": "cached", "NRT_RESYNC_SECONDS": str(RESYNC_S)}
    )
    kubectl = fleet.cluster.kubectl
    try:
        # Two 112-CPU zones: a 100-CPU pod fits one of them.
        kubectl("create", "-f", "-", input=json.dumps(_pod("nrt-first", node, 100)))
        _placed(fleet, "nrt-first", node, 60)
        kubectl(
            "patch", "pod", "nrt-first", "-n", "default", "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": {"phase": "Running"}}),
        )  # fmt: skip
        wait(lambda: _fingerprint(fleet, node) == sign([*own, ("default", "nrt-first")]), 30,
             "the NRT accounts for the running pod")  # fmt: skip
        kubectl("delete", "pod", "nrt-first", "-n", "default", "--force", "--grace-period=0")
        wait(lambda: _fingerprint(fleet, node) == sign(own), 30, "the NRT shows the pod gone")
        # The plugin still counts its own placement: a pod sent now is refused, which
        # marks the node for its next resync; there the fingerprint it computes (the
        # node's running pods) matches toposlice's, it takes the object as it is, and the
        # node admits 100 CPUs again.
        t0 = time.monotonic()
        kubectl("create", "-f", "-", input=json.dumps(_pod("nrt-refused", node, 100)))
        wait(lambda: "cannot align pod" in _why(fleet, "nrt-refused"), 30, "stale refusal")
        # The refused pod waits for a cluster event to be retried (the plugin's queueing,
        # up to 5 min): a new pod after the resync shows the node admitting again.
        time.sleep(max(0.0, t0 + RESYNC_S + 1 - time.monotonic()))
        kubectl("delete", "pod", "nrt-refused", "-n", "default", "--force", "--grace-period=0")
        kubectl("create", "-f", "-", input=json.dumps(_pod("nrt-second", node, 100)))
        _placed(fleet, "nrt-second", node, 6 * RESYNC_S)
        took = time.monotonic() - t0
        FIGURES["cached NRT: node emptied to a 100-CPU pod admitted there"] = (
            f"{took:.1f} s (resync period {RESYNC_S} s)"
        )
        assert took <= 2 * RESYNC_S + 2, took
    finally:
        for name in ("nrt-first", "nrt-refused", "nrt-second"):
            kubectl("delete", "pod", name, "-n", "default", "--force", "--grace-period=0",
                    "--ignore-not-found")  # fmt: skip
        fleet.down("nrt-scheduler", "cached")
