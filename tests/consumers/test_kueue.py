"""Kueue v0.19.2 topology-aware scheduling (TAS) over toposlice's labels, with toposlice GPU
claims: the examples of examples/integrations applied as they are (the DeviceClass mapping
merged into Kueue's configuration, the Topology and ResourceFlavor, the queues and the
2-pod x 4-GPU Job), Kueue admitting the Job into one NVLink clique, kube-scheduler placing
its pods on two different trays and allocating both claims."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.consumers.readers import CLIQUES, FIGURES, REPO, Fleet, wait

pytestmark = pytest.mark.consumers

EXAMPLES = REPO / "examples" / "integrations"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


@pytest.fixture(scope="module")
def kueue(fleet: Fleet) -> Iterator[Fleet]:
    fleet.ensure_labels()
    mapping = str(EXAMPLES / "kueue-config-dra.yaml")
    took = fleet.up("kueue", env={"KUEUE_CONFIG_APPEND": mapping})
    FIGURES["kueue-up.sh with the DeviceClass mapping"] = f"{took:.1f} s"
    try:
        objs = _docs("kueue-topology.yaml") + [
            d for d in _docs("kueue-gpu-job.yaml") if d["kind"] != "Job"
        ]
        fleet.cluster.kubectl(
            "apply", "--server-side", "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}),
        )  # fmt: skip
        yield fleet
    finally:
        fleet.cluster.kubectl(
            "delete", "jobs", "--all", "-n", "default", "--cascade=foreground", "--wait=false",
            check=False,
        )  # fmt: skip
        fleet.cluster.kubectl(
            "delete", "pods", "--all", "-n", "default", "--force", "--grace-period=0",
            check=False,
        )  # fmt: skip
        fleet.down("kueue")


def _job(name: str, cpu: str | None = None) -> dict[str, Any]:
    (job,) = [d for d in _docs("kueue-gpu-job.yaml") if d["kind"] == "Job"]
    job = copy.deepcopy(job)
    job["metadata"]["name"] = name
    spec = job["spec"]["template"]["spec"]
    spec["tolerations"] = [{"operator": "Exists"}]
    if cpu is not None:
        spec["containers"][0]["resources"]["requests"]["cpu"] = cpu
    return job


def _remove_job(fleet: Fleet, name: str) -> None:
    """The Job, its pods (forced: no kubelet confirms a graceful delete here) and their
    generated claims, waited for, so the next test finds the trays free."""
    kubectl = fleet.cluster.kubectl
    kubectl("delete", "job", name, "-n", "default", "--wait=false", "--ignore-not-found")
    kubectl("delete", "pods", "-n", "default", "-l", f"job-name={name}", "--force",
            "--grace-period=0", "--ignore-not-found")  # fmt: skip

    def gone() -> bool:
        out = kubectl("get", "resourceclaims,pods", "-n", "default", "-o", "json")
        return not [
            o for o in json.loads(out)["items"]
            if o["metadata"]["name"].startswith(f"{name}-")
        ]  # fmt: skip

    wait(gone, 60, f"pods and claims of {name} gone")


@pytest.fixture
def job_name(kueue: Fleet) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        _remove_job(kueue, name)


def _pods(fleet: Fleet, job: str) -> list[dict[str, Any]]:
    out = fleet.cluster.kubectl(
        "get", "pods", "-n", "default", "-l", f"job-name={job}", "-o", "json"
    )
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def _claim_allocation(fleet: Fleet, pod: dict[str, Any]) -> dict[str, Any] | None:
    for status in pod.get("status", {}).get("resourceClaimStatuses") or []:
        claim = fleet.get("resourceclaim", status["resourceClaimName"], "-n", "default")
        return None if claim is None else claim.get("status", {}).get("allocation")
    return None


def test_two_pods_of_four_gpus_land_on_two_trays_of_one_clique(
    kueue: Fleet, job_name: list[str]
) -> None:
    fleet = kueue
    job_name.append("two-trays")
    t0 = time.monotonic()
    fleet.apply([_job("two-trays")])

    def placed() -> list[dict[str, Any]] | None:
        pods = _pods(fleet, "two-trays")
        bound = [p for p in pods if p["spec"].get("nodeName")]
        return bound if len(bound) == 2 else None

    pods = wait(placed, 90, "both pods of the Job bound")
    nodes = sorted(p["spec"]["nodeName"] for p in pods)
    FIGURES["Kueue TAS 2 x 4-GPU job: created to both pods bound"] = (
        f"{time.monotonic() - t0:.1f} s on {', '.join(nodes)}"
    )
    assert len(set(nodes)) == 2, nodes
    assert any(set(nodes) == set(trays) for trays in CLIQUES.values()), nodes
    for pod in pods:
        # TAS pinned each pod to its tray; kube-scheduler allocated its claim there.
        assert pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] == pod["spec"]["nodeName"]
        name = pod["metadata"]["name"]

        def allocation(n: str = name) -> dict[str, Any] | None:
            return _claim_allocation(fleet, fleet.get("pod", n, "-n", "default") or {})

        alloc = wait(allocation, 60, "claim allocated")
        results = alloc["devices"]["results"]
        assert len(results) == 4 and all(r["driver"] == "toposlice.dev" for r in results)
        assert {r["pool"] for r in results} == {pod["spec"]["nodeName"]}
    workload = json.loads(fleet.cluster.kubectl("get", "workloads", "-n", "default", "-o", "json"))[
        "items"
    ]
    assert any(
        c["type"] == "Admitted" and c["status"] == "True"
        for w in workload
        for c in w.get("status", {}).get("conditions") or []
    )


def test_gpus_alone_are_not_counted_per_node_by_tas(kueue: Fleet, job_name: list[str]) -> None:
    """The limit the recipe works around: with only the claim (and a small CPU request),
    Kueue admits the Job but TAS may put both pods on one 4-GPU tray, where the second
    claim cannot be allocated. If this ever fails, Kueue counts DRA devices per node
    (kubernetes-sigs/kueue#10548) and the CPU request of the example can go."""
    fleet = kueue
    job_name.append("gpus-only")
    job = _job("gpus-only", cpu="1")
    # Trays only (a DGX holds 8 GPUs: both pods there would be right).
    job["spec"]["template"]["spec"]["nodeSelector"] = {"toposlice.dev/gpu.count": "4"}
    fleet.apply([job])

    def assigned() -> list[str] | None:
        pods = _pods(fleet, "gpus-only")
        hosts = [(p["spec"].get("nodeSelector") or {}).get("kubernetes.io/hostname") for p in pods]
        return [h for h in hosts if h] if len([h for h in hosts if h]) == 2 else None

    hosts = wait(assigned, 90, "TAS assigned both pods")
    assert len(set(hosts)) == 1, hosts  # one tray for both: GPUs are not counted per node
    assert any(hosts[0] in trays for trays in CLIQUES.values())
    time.sleep(3)
    pods = _pods(fleet, "gpus-only")
    allocated = [p for p in pods if _claim_allocation(fleet, p)]
    assert len(allocated) == 1, [p["metadata"]["name"] for p in allocated]
