"""toposlice beside the real CPU DRA driver (kubernetes-sigs/dra-driver-cpu v0.2.0, ``dra.cpu``)
on one real node, both reading one fake machine (the tree ``toposlice machines tree`` writes,
bind-mounted over ``/sys`` in the peer's own mount namespace), in both of the peer's modes.

What must hold on the stock v1.36.2 scheduler (list-attribute gate off):
- the peer runs on toposlice's fake tree as written (no patching script);
- toposlice leaves its own CPU devices out (the peer publishes those CPUs) and speaks the
  peer's NUMA dialect (``dra.net/numaNode``), saying so in its log, Event, metric, /readyz;
- a claim for 1 and for 2 GPUs plus the peer's CPUs, naming no NUMA node, is allocated with
  every GPU and every CPU (the ids the peer prepares) on one NUMA node; the same claim on a
  node whose free GPUs and free CPUs are on different NUMA nodes stays unallocated;
- ``toposlice doctor`` on the live pair: no error or warning; a wrong root and a wrong NUMA
  id planted in the peer's slice are reported; double publishing is reported.

The peer's NRI plugin rewrites every container's cpuset to CPU ids of the fake machine, which
this 2-CPU host lacks, so containers do not start here (runc: numerical result out of range):
allocation and NodePrepareResources on both drivers are what is checked.
"""

from __future__ import annotations

import copy
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from discovery.readers import parse_cpulist
from tests.e2e.cluster import poll
from tests.interop.conftest import NriNode
from tests.interop.peers import (
    FIGURES,
    NS,
    Scenario,
    devices_of,
    expected_lines,
    slices_of,
    toposlice,
)

pytestmark = pytest.mark.interop

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "dra-cpu"
RECORDED = REPO / "tests" / "data" / "foreign-slices" / "recorded"
BRIDGE = "dra.net/numaNode"
NUMA = "resource.kubernetes.io/numaNode"
SCENARIOS = [
    ("dgx-h100", "grouped"),
    ("dgx-h100", "individual"),
    ("mi300x-8", "grouped"),
    ("mi300x-8", "individual"),
]


class Pair(Scenario):
    """One scenario: the fake machine's tree, the peer in one mode and ``toposlice run``."""

    def __init__(self, node: NriNode, kit: Path, machine: str, mode: str, base: Path) -> None:
        super().__init__(node, kit, machine, base)
        self.mode = mode

    @property
    def flags(self) -> list[str]:
        # No --expose-pcie-roots: with the list gate off the API server refuses the peer's
        # list attribute ("exactly one value must be specified") and it publishes nothing.
        return ["--cpu-device-mode=individual"] if self.mode == "individual" else []

    def start(self) -> None:
        self.write_tree()
        # The peer first: toposlice then sees it at its first read and never publishes CPUs.
        took = self.peer.up("dracpu", self.node.name, self.tree / "sys", *self.flags)
        FIGURES[f"dracpu {self.mode} on {self.machine}: to its slice"] = f"{took:.1f} s"
        t0 = time.monotonic()
        self.run.start()
        FIGURES[f"toposlice run beside it ({self.machine}): ready"] = (
            f"{time.monotonic() - t0:.1f} s"
        )
        self.device_classes()

    def stop(self) -> None:
        self.release_all()
        self.run.stop()
        self.peer.down("dracpu")
        self.drop_slices("dra.cpu", "toposlice.dev")

    def prepared_cpus(self, uid: str) -> list[int]:
        """The CPU ids dra.cpu picked for the claim at NodePrepareResources (its log)."""

        def found() -> list[int] | None:
            for line in self.peer.log("dracpu").splitlines():
                if uid in line and "added allocation" in line:
                    m = re.search(r'cpus="([^"]+)"', line)
                    if m:
                        return parse_cpulist(m.group(1))
            return None

        return poll(found, timeout=60, what=f"dra.cpu prepared claim {uid}")


@pytest.fixture(scope="module", params=SCENARIOS, ids=[f"{m}-{k}" for m, k in SCENARIOS])
def pair(
    request: pytest.FixtureRequest, node: NriNode, kit: Path, tmp_path_factory: Any
) -> Iterator[Pair]:
    machine, mode = request.param
    p = Pair(node, kit, machine, mode, tmp_path_factory.mktemp(f"{machine}-{mode}"))
    try:
        p.start()
        yield p
    finally:
        p.stop()


def numa_cpus(pair: Pair) -> dict[int, set[int]]:
    """NUMA node -> its CPU ids, from the tree both drivers read."""
    base = pair.tree / "sys" / "devices" / "system" / "node"
    return {
        int(d.name[4:]): set(parse_cpulist((d / "cpulist").read_text().strip()))
        for d in base.glob("node[0-9]*")
    }


# ---- the peer on toposlice's tree, toposlice beside it


def test_the_peer_runs_on_toposlices_tree_and_publishes_its_cpus(pair: Pair) -> None:
    peer = devices_of(slices_of(pair.cluster, pair.node.name, "dra.cpu"))
    nodes = numa_cpus(pair)
    if pair.mode == "grouped":
        assert set(peer) == {f"cpudevnuma{n:03d}" for n in nodes}
        for n, cpus in nodes.items():
            attrs = peer[f"cpudevnuma{n:03d}"]["attributes"]
            assert attrs["dra.cpu/numCPUs"]["int"] == len(cpus)
            assert attrs[BRIDGE]["int"] == n and attrs["dra.cpu/numaNodeID"]["int"] == n
    else:
        assert len(peer) == sum(len(c) for c in nodes.values())
        for dev in peer.values():
            cpu = dev["attributes"]["dra.cpu/cpuID"]["int"]
            assert cpu in nodes[dev["attributes"][BRIDGE]["int"]]
    if pair.machine == "dgx-h100":  # the fixtures are what this peer publishes
        sys.path.insert(0, str(REPO / "hack"))
        from record_peer_slices import recorded

        live = recorded(slices_of(pair.cluster, pair.node.name, "dra.cpu"), "dra.cpu")
        with open(RECORDED / f"dra-cpu-{pair.mode}.yaml", encoding="utf-8") as fh:
            kept = [d for d in yaml.safe_load_all(fh) if d]
        # Recorded with --expose-pcie-roots (a cluster with the list gate on), which this
        # gate-off cluster refuses: the rest is the same.
        for dev in devices_of(kept).values():
            del dev["attributes"]["resource.kubernetes.io/pcieRoot"]
        assert devices_of(live) == devices_of(kept)


def test_toposlice_leaves_the_cpus_to_the_peer_and_speaks_its_dialect(pair: Pair) -> None:
    own = devices_of(slices_of(pair.cluster, pair.node.name, "toposlice.dev"))
    kinds = {d["attributes"]["type"]["string"] for d in own.values()}
    assert "cpu" not in kinds and "gpu" in kinds
    for dev in own.values():
        attrs = dev["attributes"]
        if NUMA in attrs:
            assert attrs[BRIDGE] == attrs[NUMA]
    assert "yielded: not publishing" in pair.run.http("/readyz")
    metrics = pair.run.http("/metrics")
    assert re.search(
        r'toposlice_devices_shared_with_other_drivers\{action="yielded",driver="dra.cpu"\} '
        r"[1-9]",
        metrics,
    )
    events = pair.cluster.kubectl(
        "get",
        "events",
        "-A",
        "--field-selector",
        "reason=DevicesPublishedByAnotherDriver",
        "-o",
        "json",
    )
    assert any(e["involvedObject"]["name"] == pair.node.name for e in json.loads(events)["items"])
    assert "not publishing" in pair.run.log_path.read_text()


# ---- claims across the two drivers


def cli_claim(pair: Pair, gpus: int, cpus: int) -> dict[str, Any]:
    args = ["claim", "--gpus", str(gpus), "--cpus-from", "dra.cpu", "--cpus", str(cpus)]
    if pair.mode == "individual":
        args += ["--cpu-device-mode", "individual"]
    doc = yaml.safe_load(toposlice(*args).stdout)
    spec: dict[str, Any] = doc["items"][0]["spec"]["spec"]
    return spec


def check_together(pair: Pair, name: str, gpus: int) -> tuple[list[str], list[str]]:
    """The claim's GPUs and CPUs all on one NUMA node, the CPU ids prepared there too."""
    results = pair.wait_allocated(name)
    own = devices_of(slices_of(pair.cluster, pair.node.name, "toposlice.dev"))
    peer = devices_of(slices_of(pair.cluster, pair.node.name, "dra.cpu"))
    got_gpus = [r["device"] for r in results if r["driver"] == "toposlice.dev"]
    got_cpus = [r["device"] for r in results if r["driver"] == "dra.cpu"]
    assert len(got_gpus) == gpus and got_cpus
    nodes = {own[g]["attributes"][NUMA]["int"] for g in got_gpus}
    nodes |= {peer[c]["attributes"]["dra.cpu/numaNodeID"]["int"] for c in got_cpus}
    assert len(nodes) == 1, (got_gpus, got_cpus)
    uid = json.loads(pair.cluster.kubectl("get", "resourceclaim", name, "-n", NS, "-o", "json"))
    prepared = pair.prepared_cpus(uid["metadata"]["uid"])
    assert set(prepared) <= numa_cpus(pair)[nodes.pop()]
    return got_gpus, got_cpus


def test_the_example_gets_what_its_comment_says(pair: Pair) -> None:
    """On the empty node (the first claim of the scenario)."""
    path = next(EXAMPLES.glob(f"*-{pair.mode}.yaml"))
    template = yaml.safe_load(path.read_text())
    name = f"example-{pair.mode}"
    pair.claim(name, template["spec"]["spec"])
    gpus, cpus = check_together(pair, name, 2)
    want = expected_lines(path)[pair.machine]
    assert (sorted(gpus), sorted(cpus)) == (sorted(want["gpus"]), sorted(want["cpus"]))
    pair.delete(name)


@pytest.mark.parametrize("gpus", [1, 2])
def test_gpus_and_the_peers_cpus_land_on_one_numa_node(pair: Pair, gpus: int) -> None:
    name = f"cli-{gpus}"
    pair.claim(name, cli_claim(pair, gpus, 4))
    check_together(pair, name, gpus)


def test_no_set_on_one_numa_node_leaves_the_claim_unallocated(pair: Pair) -> None:
    """Every free GPU on NUMA node 0 and every free CPU on node 1: the same claim that fits an
    empty node must wait, not take CPUs of the other socket."""
    own = devices_of(slices_of(pair.cluster, pair.node.name, "toposlice.dev"))
    taken = {
        name
        for c in pair.claims
        if pair.allocation(c)
        for name in [r["device"] for r in pair.allocation(c)["devices"]["results"]]
    }
    free_gpus_1 = [
        n
        for n, d in own.items()
        if d["attributes"]["type"]["string"] == "gpu"
        and d["attributes"][NUMA]["int"] == 1
        and n not in taken
    ]
    gpu_sel = 'device.attributes["resource.kubernetes.io"].numaNode == 1'
    pair.claim(
        "block-gpus",
        {
            "devices": {
                "requests": [
                    {
                        "name": "g",
                        "exactly": {
                            "deviceClassName": "gpu.toposlice.dev",
                            "count": len(free_gpus_1),
                            "selectors": [{"cel": {"expression": gpu_sel}}],
                        },
                    }
                ]
            }
        },
    )
    pair.wait_allocated("block-gpus")
    cpu_sel = 'device.attributes["dra.cpu"].numaNodeID == 0'
    node0 = len(numa_cpus(pair)[0])
    if pair.mode == "grouped":
        # What other claims consumed of node 0 is left to this one's count: all that remains.
        used = sum(
            int(r.get("consumedCapacity", {}).get("dra.cpu/cpu", "0"))
            for c in pair.claims
            if pair.allocation(c)
            for r in pair.allocation(c)["devices"]["results"]
            if r["device"] == "cpudevnuma000"
        )
        exact: dict[str, Any] = {
            "deviceClassName": "dra.cpu",
            "count": 1,
            "capacity": {"requests": {"dra.cpu/cpu": str(node0 - used)}},
        }
    else:
        peer = devices_of(slices_of(pair.cluster, pair.node.name, "dra.cpu"))
        on_node0 = {n for n, d in peer.items() if d["attributes"][BRIDGE]["int"] == 0}
        used = sum(
            1
            for c in pair.claims
            if pair.allocation(c)
            for r in pair.allocation(c)["devices"]["results"]
            if r["device"] in on_node0
        )
        exact = {"deviceClassName": "dra.cpu", "count": node0 - used}
    exact["selectors"] = [{"cel": {"expression": cpu_sel}}]
    # An allocation holds at most 32 devices (resource.k8s.io/v1): one CPU per device takes
    # several claims.
    left, part = exact["count"], 0
    while left > 0:
        chunk = dict(exact, count=min(left, 32)) if pair.mode == "individual" else exact
        pair.claim(
            f"block-cpus-{part}", {"devices": {"requests": [{"name": "c", "exactly": chunk}]}}
        )
        pair.wait_allocated(f"block-cpus-{part}")
        left -= chunk["count"]
        part += 1
    pair.claim("no-set", cli_claim(pair, 1, 4))
    message = poll(lambda: pair.unschedulable("no-set"), timeout=30, what="no-set unschedulable")
    assert "cannot allocate all claims" in message
    time.sleep(3)  # a retry of the scheduler must not find a set either
    assert pair.allocation("no-set") is None


# ---- the doctor on the live pair


def test_doctor_raises_no_false_alarm_on_the_live_pair(pair: Pair) -> None:
    rc, report = pair.doctor("--kubeconfig", str(pair.cluster.kubeconfig))
    alarms = [f for f in report["findings"] if f["severity"] in ("error", "warning")]
    assert alarms == [] and rc == 0
    drivers = {d["driver"]: d for d in report["drivers"]}
    assert drivers["dra.cpu"]["matched"] == drivers["dra.cpu"]["devices"] > 0
    assert drivers["dra.cpu"]["on_node"] is True


def test_doctor_reports_a_wrong_root_and_numa_id_planted_in_the_peers_slice(
    pair: Pair, tmp_path: Path
) -> None:
    slices = slices_of(pair.cluster, pair.node.name)
    planted = copy.deepcopy(slices)
    peer = devices_of([s for s in planted if s["spec"]["driver"] == "dra.cpu"])
    own = devices_of([s for s in planted if s["spec"]["driver"] == "toposlice.dev"])
    node1_root = next(
        d["attributes"]["resource.kubernetes.io/pcieRoot"]["string"]
        for d in own.values()
        if d["attributes"]["type"]["string"] == "gpu" and d["attributes"][NUMA]["int"] == 1
    )
    on_node0 = sorted(n for n, d in peer.items() if d["attributes"][BRIDGE]["int"] == 0)
    wrong_root, wrong_numa = on_node0[0], on_node0[-1]
    # The list the peer publishes with --expose-pcie-roots (on a cluster with the list gate),
    # holding a root of the other NUMA node.
    peer[wrong_root]["attributes"]["resource.kubernetes.io/pcieRoot"] = {"strings": [node1_root]}
    peer[wrong_numa]["attributes"]["dra.cpu/numaNodeID"] = {"int": 1}
    path = tmp_path / "planted.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": planted}))
    rc, report = pair.doctor("--slices", str(path))
    errors = {(f["device"], f["check"]) for f in report["findings"] if f["severity"] == "error"}
    assert (wrong_root, "cpu-pcieRoot-wider-than-pinned") in errors
    assert (wrong_numa, "disagrees-with-hardware") in errors
    assert rc == 1 and len(errors) == 2


def test_double_publishing_is_reported(pair: Pair) -> None:
    pair.run.stop()
    pair.run.start("--duplicates", "publish")
    try:
        poll(
            lambda: (
                "cpu-numa0" in devices_of(slices_of(pair.cluster, pair.node.name, "toposlice.dev"))
            ),
            timeout=30,
            what="toposlice's CPUs published",
        )
        assert 'action="published",driver="dra.cpu"' in pair.run.http("/metrics")
        rc, report = pair.doctor("--kubeconfig", str(pair.cluster.kubeconfig))
        doubled = {
            (f["driver"], f["device"])
            for f in report["findings"]
            if f["check"] == "double-published"
        }
        assert ("toposlice.dev", "cpu-numa0") in doubled and rc == 1
        assert any(d == "dra.cpu" for d, _dev in doubled)
    finally:
        pair.run.stop()
        pair.run.start()
    poll(
        lambda: (
            "cpu-numa0" not in devices_of(slices_of(pair.cluster, pair.node.name, "toposlice.dev"))
        ),
        timeout=30,
        what="toposlice's CPUs left to dra.cpu again",
    )
