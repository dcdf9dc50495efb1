"""The extender's expected-completion wait on the real kube-scheduler (v1.36.2, issue #24).

A 2-GPU tensor-parallel pod that states its run time runs ~5x longer on a PCIe box than on
an NVSwitch board (scorer/slowdown.py). While the only NVSwitch node is taken, the
extender's filter keeps the pod off the PCIe node (the reason in ``FailedNodes``, which the
scheduler puts in the pod's condition) until its bound — one expected run time after the
pod's creation — expires: the pod lands on the NVSwitch node when that frees within the
bound, and on the PCIe node once the bound has passed.

Slices are published by the admin (as test_claim_ladder does); no kubelet runs, so pods
stay bound and unstarted. The second scheduler re-tries unschedulable pods every
``RETRY_S`` (``--pod-max-in-unschedulable-pods-duration``; 5 min by default), so the test
does not have to wait for an unrelated cluster event after the bound.
"""

from __future__ import annotations

import calendar
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, poll
from tests.e2e.toposlice_setup import (
    claim_pod,
    create_namespace,
    missing_device_classes,
    pod_outcome,
    publish_cli_slices,
    serve_scorer,
    spawn_extender_scheduler,
    tear_down,
)

pytestmark = pytest.mark.e2e

NS = "e2e-wait"
DGX, PCIE = "e2e-wait-dgx", "e2e-wait-pcie"
DRIVER = "toposlice.dev"
LABEL = "e2e.toposlice.dev/wait"
RETRY_S = 2


@pytest.fixture(scope="module")
def scheduler(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    where: Path = tmp_path_factory.mktemp("wait")
    ours = missing_device_classes(cluster, DRIVER)
    try:
        create_namespace(cluster, NS)
        if ours:
            cluster.apply(ours)
        for node, machine in ((DGX, "dgx-h100"), (PCIE, "pcie-8gpu")):
            cluster.add_node(node, {LABEL: "pair"})
            publish_cli_slices(cluster, node, machine)
        fakes = ["--fake", f"dgx-h100:{DGX}", "--fake", f"pcie-8gpu:{PCIE}"]
        port = serve_scorer(cluster, "toposlice-scorer-wait", fakes, DRIVER)
        spawn_extender_scheduler(
            cluster,
            "kube-scheduler-wait",
            port,
            where,
            scheduler_name="toposlice-wait",
            flags=(f"--pod-max-in-unschedulable-pods-duration={RETRY_S}s",),
        )
        yield
    finally:
        cluster.kill("kube-scheduler-wait")
        cluster.kill("toposlice-scorer-wait")
        tear_down(cluster, NS, (DGX, PCIE), ours)


def _gpus(n: int) -> list[dict[str, Any]]:
    return [{"name": "gpus", "exactly": {"deviceClassName": f"gpu.{DRIVER}", "count": n}}]


def _hog(cluster: Cluster, name: str) -> None:
    """Every GPU of the NVSwitch node, through the default scheduler."""
    cluster.apply(claim_pod(name, DGX, _gpus(8), NS))
    # Unschedulable at first while the previous test's claim is still being released:
    # the scheduler retries when it is, so wait for the allocation itself.
    out = poll(
        lambda: (o := pod_outcome(cluster, NS, name)) and o[0] == "allocated" and o,
        60,
        0.3,
        f"{name} allocated",
    )
    assert out is not None and out[0] == "allocated", out


def _tp_pod(cluster: Cluster, name: str, expected_run_s: int) -> float:
    objs = claim_pod(name, DGX, _gpus(2), NS)
    pod = objs[1]
    pod["spec"]["nodeSelector"] = {LABEL: "pair"}
    pod["spec"]["schedulerName"] = "toposlice-wait"
    workload = f"pattern: tensor-parallel\nexpectedRunSeconds: {expected_run_s}\n"
    pod["metadata"]["annotations"] = {"toposlice.dev/workload": workload}
    cluster.apply(objs)
    obj = json.loads(cluster.kubectl("-n", NS, "get", "pod", name, "-o", "json"))
    created = obj["metadata"]["creationTimestamp"]
    return float(calendar.timegm(time.strptime(created, "%Y-%m-%dT%H:%M:%SZ")))


def _node(cluster: Cluster, name: str) -> str | None:
    obj = json.loads(cluster.kubectl("-n", NS, "get", "pod", name, "-o", "json"))
    node: str | None = obj["spec"].get("nodeName")
    return node


def _pending_reason(cluster: Cluster, name: str) -> str:
    obj = json.loads(cluster.kubectl("-n", NS, "get", "pod", name, "-o", "json"))
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond["type"] == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or "")
    return ""


def _delete(cluster: Cluster, name: str) -> None:
    cluster.kubectl("-n", NS, "delete", "pod", name, "--force", "--grace-period=0")


def test_waits_for_the_nvswitch_node_within_its_bound(cluster: Cluster, scheduler: None) -> None:
    _hog(cluster, "hog-1")
    created = _tp_pod(cluster, "tp-wait", 90)
    # Held off the free PCIe node, with the extender's reason in the pod's condition.
    reason = poll(
        lambda: (m := _pending_reason(cluster, "tp-wait")) and "waiting" in m and m, 30, 0.3
    )
    assert "faster placement" in reason and DGX in reason, reason
    time.sleep(3 * RETRY_S)
    assert _node(cluster, "tp-wait") is None, cluster.log_tail("kube-scheduler-wait")
    _delete(cluster, "hog-1")
    node = poll(lambda: _node(cluster, "tp-wait"), 60, 0.3, "tp-wait bound")
    assert node == DGX, cluster.log_tail("toposlice-scorer-wait")
    assert time.time() - created < 90, "landed after its bound"
    _delete(cluster, "tp-wait")


def test_past_its_bound_takes_the_pcie_node(cluster: Cluster, scheduler: None) -> None:
    _hog(cluster, "hog-2")
    bound = 12
    created = _tp_pod(cluster, "tp-late", bound)
    poll(lambda: "waiting" in _pending_reason(cluster, "tp-late"), 30, 0.3, "held off PCIe")
    node = poll(lambda: _node(cluster, "tp-late"), 60, 0.3, "tp-late bound")
    assert node == PCIE
    assert time.time() - created >= bound - 1, "took the slow node before its bound expired"
    _delete(cluster, "tp-late")
    _delete(cluster, "hog-2")
