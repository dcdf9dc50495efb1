"""bench/allocator_cost.py's per-pod model honours a pod's node affinity the way
kube-scheduler does: NodeAffinity runs before DynamicResources, so a node it refuses costs
the allocator nothing and is not one DynamicResources filtered, while the scheduler still
needs as many feasible nodes as before (docs/performance.md quotes these figures); and
bench/cluster_scale.py measures a kind whose pod affinity changed as old and new."""

from __future__ import annotations

from typing import Any

import pytest

from bench import allocator_cost as ac
from bench import cluster_scale as cs
from normalize.deviceclasses import device_classes


@pytest.fixture(scope="module")
def classes() -> dict[str, Any]:
    return {c["metadata"]["name"]: c for c in device_classes(cs.DRIVER)}


@pytest.fixture(scope="module")
def empty() -> list[ac.NodeState]:
    return ac.node_states(0)


def test_dgx_only_kind_filters_half_the_nodes_with_its_affinity(
    classes: dict[str, Any], empty: list[ac.NodeState]
) -> None:
    spec = cs.new_claims()["gpus-nvlink-domain"]
    affinity = cs.example_affinities()["gpus-nvlink-domain"]
    without = ac.pod_cost(spec, empty, classes, 1000)
    with_aff = ac.pod_cost(spec, empty, classes, 1000, affinity)
    # Half the nodes fit either way: the scheduler visits 840 to find 420 feasible ones.
    assert without.feasible == with_aff.feasible == 0.5
    assert without.nodes == pytest.approx(840) and with_aff.nodes == pytest.approx(420)
    # The 420 pcie-8gpu nodes NodeAffinity refused cost no CEL evaluation: what is left is
    # the DGX nodes' search, which is a plain 4-GPU count's there.
    dgx = next(s for s in empty if s[3]["toposlice.dev/gpus-per-nvlink-domain"] == "8")
    plain_dgx = ac.search_cost(cs.plain_spec(4), dgx[1], dgx[2], classes).cel
    assert with_aff.evaluations == pytest.approx(420 * plain_dgx)
    assert with_aff.evaluations < without.evaluations / 2


def test_an_affinity_every_node_passes_changes_nothing(
    classes: dict[str, Any], empty: list[ac.NodeState]
) -> None:
    spec = cs.plain_spec(2)
    anything = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "toposlice.dev/gpu.count", "operator": "Exists"}]}
                ]
            }
        }
    }
    assert ac.pod_cost(spec, empty, classes, 1000, anything) == ac.pod_cost(
        spec, empty, classes, 1000
    )


def test_a_kind_whose_affinity_changed_runs_old_and_new(tmp_path: Any) -> None:
    """The frozen copy has no affinities: a kind whose claim is the same but whose pod now
    carries one is measured twice (without and with it), an unchanged kind once; and a
    copy frozen now keeps the affinities."""
    plan = cs.Plan(
        nodes=10,
        claims="both",
        pods=1,
        pods_full=1,
        fills=[0],
        kinds=["gpus-nvlink-domain", "gpus-cpu-same-numa"],
        run_timeout=1,
        stall=1,
        default_limits=False,
    )
    runs = {(k, c): aff for k, c, _, aff in cs.kinds_to_run(plan)}
    assert runs[("gpus-nvlink-domain", "old")] is None
    assert runs[("gpus-nvlink-domain", "new")] == cs.example_affinities()["gpus-nvlink-domain"]
    assert ("gpus-cpu-same-numa", "same") in runs
    frozen = tmp_path / "old.json"
    cs.freeze(frozen, "test")
    assert cs.old_affinities(frozen) == cs.example_affinities()
    assert cs.old_claims(frozen) == cs.new_claims()


def test_all_requests_are_validated_on_every_device_before_the_search(
    classes: dict[str, Any],
) -> None:
    """Upstream runs an ``All`` request's selectors on every device of the node before it
    searches, in use or not, and for every such request even when the first cannot be met:
    three per-kind ``All`` requests cost three scans where the one over
    ``device.toposlice.dev`` costs one (the real scheduler's CPU profile agrees:
    docs/performance.md)."""
    slices = ac.machine_slices()["dgx-h100"]
    n = sum(len(s["spec"]["devices"]) for s in slices)
    old = cs.old_claims()["whole-node"]  # three All requests, one per kind
    new = cs.new_claims()["whole-node"]
    gpu0 = next(
        d["name"] for s in slices for d in s["spec"]["devices"] if d["name"].startswith("gpu-")
    )
    for busy in (set(), {gpu0}):
        got_old = ac.search_cost(old, slices, busy, classes)
        got_new = ac.search_cost(new, slices, busy, classes)
        assert got_old.cel == 3 * n and got_new.cel == n
        assert got_old.ok == got_new.ok == (not busy)


def test_cpu_group_at_moves_the_group_within_its_numa_node_only() -> None:
    """``--cpu-group-at K`` reorders each NUMA node's run of devices and nothing else: the
    same devices, every run still one NUMA node, its CPU group at position K (or last)."""
    numa = "resource.kubernetes.io/numaNode"

    def runs(devs: list[dict[str, Any]]) -> list[list[str]]:
        out: list[list[str]] = []
        last: object = object()
        for d in devs:
            n = d["attributes"].get(numa, {}).get("int")
            if n != last:
                out.append([])
                last = n
            out[-1].append(d["name"])
        return out

    base = ac.machine_slices()
    for k in (0, 3, 99):
        moved = ac.machine_slices(k)
        for machine, slices in base.items():
            before = [d for s in slices for d in s["spec"]["devices"]]
            after = [d for s in moved[machine] for d in s["spec"]["devices"]]
            assert sorted(d["name"] for d in after) == sorted(d["name"] for d in before)
            for was, now in zip(runs(before), runs(after), strict=True):
                cpus = [n for n in was if n.startswith("cpu-")]
                rest = [n for n in was if not n.startswith("cpu-")]
                assert now == rest[:k] + cpus + rest[k:], (machine, k)
