"""toposlice on the real control plane, installed as a user installs it.

The chart (values-fake) is applied but its DaemonSet; on each of four nodes a
``toposlice run --fake MACHINE`` process runs as the chart's ServiceAccount with a token
bound to a Pod on its node, so RBAC and the admission policy are the chart's own. The
drivers start once for the module; the tests run in file order (the restarts last).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, poll
from tests.e2e.toposlice_setup import (
    DRIVER,
    NodeDriver,
    cli_slices,
    install,
    published_slices,
    uninstall,
)

pytestmark = pytest.mark.e2e

#: node name -> fake machine. The NVSwitch and the PCIe machines are also the extender's
#: pair; the others are named by examples/ comments.
MACHINES = {
    "e2e-drv-dgx": "dgx-h100",
    "e2e-drv-mi300x": "mi300x-8",
    "e2e-drv-gb200": "gb200-nvl72-tray",
    "e2e-drv-pcie": "pcie-8gpu",
}


@pytest.fixture(scope="module")
def drivers(cluster: Cluster) -> Iterator[dict[str, NodeDriver]]:
    objs = install(cluster)
    started: dict[str, NodeDriver] = {}
    try:
        for node, machine in MACHINES.items():
            cluster.add_node(node, {"e2e.toposlice.dev/machine": machine})
        for node, machine in MACHINES.items():
            started[node] = NodeDriver(cluster, node, machine).start()
        for d in started.values():
            d.wait_started()
        yield started
    finally:
        for d in started.values():
            d.cleanup()
        for node in MACHINES:
            cluster.kubectl(
                "delete",
                "resourceslices",
                f"--field-selector=spec.nodeName={node}",
                "--ignore-not-found",
            )
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
    total = 0.0
    for line in d.metrics().splitlines():
        if line.startswith("resourceslice_writes_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


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
    # Several resyncs (every 1 s) on every node; each lists its pool and finds it current.
    time.sleep(3.5)
    assert _versions(cluster) == before
    assert {n: _writes(d) for n, d in drivers.items()} == writes

    d = drivers["e2e-drv-mi300x"]
    d.stop(signal.SIGKILL)
    d.start().wait_started()
    time.sleep(2.5)  # two resyncs after the restart
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
