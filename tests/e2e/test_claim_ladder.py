"""Claim ladders on the real scheduler (v1.36.2): a `toposlice claim` prioritized list gets
the first rung while the best set is free and a looser rung once it is taken, and the real
allocation is the one scorer/allocator.py predicts from the same slices and devices in use.

The node's slices are published by the admin (what `toposlice slices --fake pcie-8gpu
--node-name N -o json` prints); no kubelet runs, so pods stay bound and unstarted — the
scheduler's allocation in the claim status is what is checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from normalize.deviceclasses import device_classes
from scorer.allocator import Allocator
from scorer.ladder import ladder_spec, prioritized_score, rung_of
from tests.e2e.cluster import Cluster, poll
from tests.e2e.toposlice_setup import (
    create_namespace,
    missing_device_classes,
    pod_outcome,
    publish_cli_slices,
    published_slices,
    tear_down,
)

pytestmark = pytest.mark.e2e

NODE = "e2e-ladder-pcie"
DGX = "e2e-ladder-dgx"
NS = "e2e-ladder"
DRIVER = "toposlice.dev"
TOPOSLICE = (sys.executable, "-m", "toposlice", "-q")


@pytest.fixture(scope="module")
def ladder_node(cluster: Cluster) -> Iterator[list[dict[str, Any]]]:
    ours = missing_device_classes(cluster, DRIVER)
    try:
        create_namespace(cluster, NS)
        if ours:
            cluster.apply(ours)
        for node, machine in ((NODE, "pcie-8gpu"), (DGX, "dgx-h100")):
            cluster.add_node(node, {"e2e": "ladder"})
            publish_cli_slices(cluster, node, machine)
        yield published_slices(cluster, NODE)
    finally:
        tear_down(cluster, NS, (NODE, DGX), ours)


def _pod(
    name: str, spec: dict[str, Any], selector: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"spec": spec},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeSelector": selector or {"kubernetes.io/hostname": NODE},
            "resourceClaims": [{"name": "c", "resourceClaimTemplateName": name}],
            "containers": [
                {"name": "c", "image": "pause", "resources": {"claims": [{"name": "c"}]}}
            ],
        },
    }
    return [template, pod]


def _allocated(
    cluster: Cluster, name: str, spec: dict[str, Any], selector: dict[str, str] | None = None
) -> list[tuple[str, str]]:
    got = _allocated_on(cluster, name, spec, selector)
    if selector is None:
        assert {pool for _, _, pool in got} == {NODE}
    return [(r, d) for r, d, _ in got]


def _allocated_on(
    cluster: Cluster, name: str, spec: dict[str, Any], selector: dict[str, str] | None = None
) -> list[tuple[str, str, str]]:
    """(request, device, pool) of the claim the scheduler allocated for a new pod."""
    try:
        cluster.apply(_pod(name, spec, selector))
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"apply {name}: {exc.stderr}")
    out = poll(lambda: pod_outcome(cluster, NS, name), 60, 0.3, f"pod {name} scheduled")
    assert out is not None and out[0] == "allocated", (out, cluster.log_tail("kube-scheduler"))
    claim = out[1]
    assert claim is not None
    results = claim["status"]["allocation"]["devices"]["results"]
    return sorted((r["request"], r["device"], r["pool"]) for r in results)


def _predicted(
    slices: list[dict[str, Any]], spec: dict[str, Any], busy: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    got = Allocator(slices, device_classes(DRIVER), NODE).allocate(
        spec, [(DRIVER, NODE, d) for _, d in busy]
    )
    assert got is not None
    return sorted((r.request, r.device) for r in got)


def _pinned(buses: list[str]) -> dict[str, Any]:
    requests = []
    for i, bus in enumerate(buses):
        expr = f'device.attributes["resource.kubernetes.io"].pciBusID == "{bus}"'
        requests.append(
            {
                "name": f"gpu-{i}",
                "exactly": {
                    "deviceClassName": f"gpu.{DRIVER}",
                    "selectors": [{"cel": {"expression": expr}}],
                },
            }
        )
    return {"devices": {"requests": requests}}


def test_scheduler_prefers_the_node_with_the_best_rungs(
    cluster: Cluster, ladder_node: list[dict[str, Any]]
) -> None:
    """Two nodes fit the ladder: the free DGX with its first rung for both GPUs (`paired`)
    and the PCIe box, whose free GPUs (all behind one switch, one NIC) give only one GPU a
    NIC of its own. kube-scheduler scores nodes by the sub-requests their allocation uses
    (KEP-4816 scoring), so the pod lands on the DGX."""
    blocker = _pinned(["0000:3a:00.0", "0000:3b:00.0", "0000:9a:00.0", "0000:9b:00.0"])
    _allocated(cluster, "pick-blocker", blocker)
    blocker2 = _pinned(["0000:ba:00.0", "0000:bb:00.0"])
    _allocated(cluster, "pick-blocker-2", blocker2)
    ladder = ladder_spec(2, 1, DRIVER)
    got = _allocated_on(cluster, "ladder-pick", ladder, {"e2e": "ladder"})
    assert {pool for _, _, pool in got} == {DGX}
    assert set(rung_of([r for r, _, _ in got]).values()) == {"paired"}
    for name in ("ladder-pick", "pick-blocker", "pick-blocker-2"):
        cluster.kubectl("-n", NS, "delete", "pod", name, "--force", "--grace-period=0")
    poll(lambda: not _claims_left(cluster), 60, 0.3, "claims released")


def _claims_left(cluster: Cluster) -> list[Any]:
    out = json.loads(cluster.kubectl("-n", NS, "get", "resourceclaims", "-o", "json"))
    return [c for c in out["items"] if (c.get("status") or {}).get("allocation")]


def test_scaleup_rung_sends_a_tensor_parallel_pair_to_the_nvswitch_board(
    cluster: Cluster, ladder_node: list[dict[str, Any]]
) -> None:
    """Both nodes free: the plain ladder pairs every GPU with its NIC on either, so their
    scores tie; `toposlice claim --pattern tensor-parallel` adds the `scaleup` rung, which
    only the DGX's GPUs match, and the scheduler's prioritized-list score sends the pod
    there, with each GPU still beside its own NIC."""
    spec = ladder_spec(2, 1, DRIVER, scaleup=True)
    got = _allocated_on(cluster, "ladder-tp", spec, {"e2e": "ladder"})
    assert {pool for _, _, pool in got} == {DGX}
    assert rung_of([r for r, _, _ in got]) == {
        "gpu-0": "scaleup",
        "nic-0": "paired",
        "gpu-1": "paired",
        "nic-1": "paired",
    }
    cluster.kubectl("-n", NS, "delete", "pod", "ladder-tp", "--force", "--grace-period=0")
    poll(lambda: not _claims_left(cluster), 60, 0.3, "claims released")


def test_ladder_first_rung_then_a_looser_one(
    cluster: Cluster, ladder_node: list[dict[str, Any]]
) -> None:
    slices = ladder_node
    ladder = ladder_spec(2, 1, DRIVER)
    # Free node: the first rung, two GPUs behind different switches, each with its
    # switch's NIC.
    first = _allocated(cluster, "ladder-a", ladder)
    assert first == _predicted(slices, ladder, [])
    rungs = rung_of([r for r, _ in first])
    assert set(rungs.values()) == {"paired"}
    # Take every other GPU but the two of one switch: one GPU can pair, the other not.
    taken = {d for _, d in first}
    rest = [
        f"0000:{b}:00.0"
        for b in ("18", "19", "3a", "3b", "9a", "9b", "ba", "bb")
        if f"gpu-0000-{b}-00-0" not in taken and b not in ("ba", "bb")
    ]
    blocked = _allocated(cluster, "blocker", _pinned(rest))
    # The same ladder now lands a looser rung, exactly where the allocator model says.
    second = _allocated(cluster, "ladder-b", ladder)
    assert second == _predicted(slices, ladder, first + blocked)
    rungs2 = rung_of([r for r, _ in second])
    # The two free GPUs share one NIC: mode P cannot pair both, so the claim takes mode A
    # as a whole (no NIC paired), never a mixture.
    assert rungs2 == {"gpu-0": "unpaired", "nic-0": "any", "gpu-1": "paired", "nic-1": "any"}
    score = prioritized_score(ladder, [r for r, _ in second])
    assert score < prioritized_score(ladder, [r for r, _ in first])
    gpus = {d for r, d in second if r.startswith("gpu-")}
    assert gpus.isdisjoint({d for _, d in first + blocked})
