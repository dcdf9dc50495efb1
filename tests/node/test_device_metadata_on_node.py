"""KEP-5304 device metadata on a real kubelet + containerd node (issue #21): the chart
installed as in tests/node/test_chart_on_node.py (fake DGX H100, metadata on by default),
then one pod with two claims, one from a template (a prioritized list: its subrequest's
file is filed under the base request) and one referenced by name, a GPU claim each way.

- the container reads each claim's metadata file at the path the KEP's helpers give, and
  each names exactly the claim's devices with the attributes of the node's ResourceSlices;
  the file is mounted read-only, by containerd, from the CDI id the plugin answered (the
  container's OCI spec carries the mount: the id resolved);
- kill -9 of the plugin: it restarts, and the files are the same (bytes and inode), in
  the container too;
- deleting the pod removes the files and their specs, and ``helm uninstall`` leaves no
  metadata directory behind.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from driver.kubelet.device_metadata import decode_stream
from tests.e2e.cluster import poll
from tests.node.conftest import FIGURES, WORKLOAD_IMAGE
from tests.node.node import Node
from tests.node.test_chart_on_node import (
    DRIVER,
    RELEASE,
    container_id,
    get,
    installed,
    kill_plugin,
    plugin_pods,
    ready_plugin,
    slices,
)

pytestmark = pytest.mark.node

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "docs" / "schema" / "device-metadata.schema.json").read_text())
WORKLOADS = "node-metadata"
POD = "metadata-reader"
NAMED_CLAIM = "one-gpu"
ROOT = "/var/run/kubernetes.io/dra-device-attributes"


def workload() -> list[dict[str, Any]]:
    """A template claim for 4 GPUs else 2 (request ``gpus``), a named claim for one GPU
    (request ``gpu``), and a pod whose one container uses both."""
    gpu_class = f"gpu.{DRIVER}"
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpus-4-else-2", "namespace": WORKLOADS},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpus",
                            "firstAvailable": [
                                {"name": "four", "deviceClassName": gpu_class, "count": 4},
                                {"name": "two", "deviceClassName": gpu_class, "count": 2},
                            ],
                        }
                    ]
                }
            }
        },
    }
    named = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": NAMED_CLAIM, "namespace": WORKLOADS},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": gpu_class}}]}
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "namespace": WORKLOADS},
        "spec": {
            "restartPolicy": "Never",
            "resourceClaims": [
                {"name": "gpus", "resourceClaimTemplateName": "gpus-4-else-2"},
                {"name": "mine", "resourceClaimName": NAMED_CLAIM},
            ],
            "containers": [
                {
                    "name": "reader",
                    "image": WORKLOAD_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "resources": {"claims": [{"name": "gpus"}, {"name": "mine"}]},
                }
            ],
        },
    }
    return [template, named, pod]


@pytest.fixture(scope="module")
def release(node: Node) -> Iterator[Any]:
    with installed(node, WORKLOADS) as cfg:
        yield cfg


def running_pod(node: Node) -> dict[str, Any] | None:
    pod: dict[str, Any] = get(node, "pod", "-n", WORKLOADS, POD)
    if pod["status"].get("phase") == "Running":
        return pod
    assert pod["status"].get("phase") in ("Pending", None), pod["status"]
    return None


@pytest.fixture(scope="module")
def pod(node: Node, release: Any) -> dict[str, Any]:
    t0 = time.monotonic()
    node.cluster.apply(workload())
    found = poll(lambda: running_pod(node), timeout=90, interval=0.2, what=f"{POD} Running")
    FIGURES["pod with two claims (metadata files) to Running"] = f"{time.monotonic() - t0:.1f} s"
    assert found
    return found


def claims_of(node: Node, pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Pod claim name -> its ResourceClaim."""
    out = {}
    for status in pod["status"]["resourceClaimStatuses"]:
        out[status["name"]] = get(
            node, "resourceclaim", "-n", WORKLOADS, status["resourceClaimName"]
        )
    return out


def host_files(node: Node) -> dict[str, bytes]:
    """Every metadata file and metadata CDI spec on the node, by path."""
    base = node.kubelet_dir / "plugins" / DRIVER / "dra-device-metadata"
    found = {str(p): p.read_bytes() for p in base.rglob("*") if p.is_file()}
    found |= {str(p): p.read_bytes() for p in node.cdi_dir.glob(f"{DRIVER}_metadata_*")}
    return found


def published_attributes(node: Node) -> dict[str, dict[str, Any]]:
    return {
        d["name"]: d.get("attributes") or {} for s in slices(node) for d in s["spec"]["devices"]
    }


def container_mounts(node: Node, cid: str) -> dict[str, dict[str, Any]]:
    """Destination -> mount of the container's OCI spec, as containerd made it."""
    info = json.loads(node.ctr("containers", "info", cid))
    return {m["destination"]: m for m in info["Spec"]["mounts"]}


def test_container_reads_exactly_its_devices(node: Node, pod: dict[str, Any]) -> None:
    check_files_in_container(node, pod)


def check_files_in_container(node: Node, pod: dict[str, Any]) -> None:
    claims = claims_of(node, pod)
    attributes = published_attributes(node)
    cid = container_id(pod)
    mounts = container_mounts(node, cid)
    mountinfo = node.exec(cid, "cat", "/proc/self/mountinfo")
    for pod_claim, claim in claims.items():
        results = [
            r for r in claim["status"]["allocation"]["devices"]["results"] if r["driver"] == DRIVER
        ]
        assert results
        (full,) = {r["request"] for r in results}
        base = full.split("/")[0]
        if pod_claim == "gpus":  # from the template: the pod's claim name, a subrequest
            assert claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == (
                "gpus"
            )
            assert full in ("gpus/four", "gpus/two")
            path = f"{ROOT}/resourceclaimtemplates/gpus/{base}/{DRIVER}-metadata.json"
        else:
            assert claim["metadata"]["name"] == NAMED_CLAIM
            path = f"{ROOT}/resourceclaims/{NAMED_CLAIM}/{base}/{DRIVER}-metadata.json"
        (obj,) = decode_stream(node.exec(cid, "cat", path))
        jsonschema.validate(obj, SCHEMA)
        assert obj["apiVersion"] == "metadata.resource.k8s.io/v1alpha1"
        meta = claim["metadata"]
        assert obj["metadata"] == {
            "name": meta["name"],
            "namespace": WORKLOADS,
            "uid": meta["uid"],
            "generation": 1,
        }
        (req,) = obj["requests"]
        assert req["name"] == full
        assert [(d["driver"], d["pool"], d["name"]) for d in req["devices"]] == [
            (DRIVER, r["pool"], r["device"]) for r in results
        ]
        for d in req["devices"]:
            assert d["attributes"] == attributes[d["name"]]
        # containerd resolved the metadata CDI id into this read-only bind mount.
        mount = mounts[path]
        assert "ro" in mount["options"] and mount["source"].endswith(
            f"/dra-device-metadata/{WORKLOADS}_{meta['name']}/{base}/metadata.json"
        )
        (line,) = [ln for ln in mountinfo.splitlines() if ln.split()[4] == path]
        assert "ro" in line.split()[5].split(",")


def test_kill_9_of_the_plugin_keeps_the_same_files(node: Node, pod: dict[str, Any]) -> None:
    before = host_files(node)
    assert len(before) == 4  # two files, two specs
    inodes = {p: Path(p).stat().st_ino for p in before}
    plugin = ready_plugin(node)
    assert plugin is not None
    kill_plugin(node, plugin)
    assert host_files(node) == before
    assert {p: Path(p).stat().st_ino for p in before} == inodes  # not even rewritten
    after: dict[str, Any] = get(node, "pod", "-n", WORKLOADS, POD)
    assert container_id(after) == container_id(pod)
    check_files_in_container(node, after)


def test_unprepare_and_uninstall_leave_nothing(
    node: Node, pod: dict[str, Any], release: Any
) -> None:
    assert host_files(node)
    node.cluster.kubectl("delete", "pod", "-n", WORKLOADS, POD, "--grace-period=1")
    poll(lambda: not host_files(node), timeout=60, what="the metadata files removed")
    release.uninstall(RELEASE, timeout=60)
    poll(
        lambda: not plugin_pods(node, terminating=True),
        timeout=90,
        interval=0.5,
        what="plugin pod gone",
    )
    assert not (node.kubelet_dir / "plugins" / DRIVER / "dra-device-metadata").exists()
    assert [n for n in node.cdi_specs() if "metadata" in n] == []
