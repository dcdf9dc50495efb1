"""The expected-completion decision (scorer/completion.py), its run-time model
(scorer/slowdown.py), run-time estimates (scorer/estimate.py) and the extender's wait."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from scorer.cluster_cache import ClusterCache
from scorer.completion import (
    Context,
    Running,
    deadline,
    decide,
    expected_remaining,
    hardware_stretch,
    node_best,
    options_now,
    placement_stretch,
    wait_filter,
)
from scorer.estimate import KUEUE_MAX_EXEC_LABEL, RunEstimator, kueue_hint
from scorer.extender import Extender
from scorer.graph_source import GraphSource
from scorer.request import PROFILE_ANNOTATION, Occupancy, Request, request_from_dict
from scorer.search import ClusterPlacement, node_placements, place
from scorer.slowdown import stretch
from scorer.topology import NodeTopology, from_graph, rename_graph
from tests.scorer_support import machine

TP2 = Request(gpus=2, pattern="tensor-parallel", bound="communication", name="tp2")


@pytest.fixture(scope="module")
def cluster() -> list[NodeTopology]:
    return [
        from_graph(rename_graph(machine("dgx-h100").graph, "dgx")),
        from_graph(rename_graph(machine("pcie-8gpu").graph, "pcie")),
    ]


def _dgx_full(nodes: list[NodeTopology]) -> Occupancy:
    dgx = nodes[0]
    return Occupancy(allocated={dgx.pool: {g.dra_device for g in dgx.gpus}})


# ------------------------------------------------------------------ slowdown


def test_stretch_is_one_on_the_reference_and_follows_the_pattern() -> None:
    assert stretch("tensor-parallel", 2, 370.8, 370.8) == 1.0
    tp = stretch("tensor-parallel", 2, 20.0, 370.8)
    dp = stretch("data-parallel", 2, 20.0, 370.8)
    pp = stretch("pipeline-parallel", 2, 20.0, 370.8)
    # TP's all-reduce is on the critical path; DP's overlaps the backward pass; PP sends little
    assert tp > dp > pp > 1.0
    # one GPU has no in-node collective
    assert stretch("tensor-parallel", 1, 0.0, 370.8) == 1.0
    # a slower NIC path stretches a job with NICs, not one without
    assert stretch("data-parallel", 2, 370.8, 370.8, 20.7, 46.0) > 1.0
    assert stretch("data-parallel", 2, 370.8, 370.8, None, None) == 1.0


def test_memory_bound_neighbours_slow_decode_not_prefill() -> None:
    decode = stretch("inference-decode", 1, 0.0, 0.0, sharing=1.0)
    prefill = stretch("inference-prefill", 1, 0.0, 0.0, sharing=1.0)
    assert decode > 1.0 and prefill == 1.0
    assert stretch("inference-decode", 1, 0.0, 0.0, sharing=2.0) > decode


# ------------------------------------------------------------------ decision


def test_tensor_parallel_waits_for_the_nvswitch_node_freeing_soon(
    cluster: list[NodeTopology],
) -> None:
    occ = _dgx_full(cluster)
    dgx = cluster[0]
    soon = Running(dgx.name, frozenset(g.dra_device for g in dgx.gpus), 600.0)
    ctx = Context(cluster, occ, 0.0, [soon])
    choice = decide(ctx, TP2, 3600.0, deadline(0.0, 3600.0))
    assert choice.placement is None and choice.wait_node == dgx.name, choice
    assert "waiting for dgx" in choice.reason
    # Past its deadline the job takes what is free.
    late = decide(Context(cluster, occ, 4000.0, [soon]), TP2, 3600.0, deadline(0.0, 3600.0))
    assert late.placement is not None and late.placement.pods[0].node == "pcie"
    # A release expected long after waiting stops paying: place now.
    far = Running(dgx.name, soon.devices, 50_000.0)
    now = decide(Context(cluster, occ, 0.0, [far]), TP2, 3600.0, deadline(0.0, 3600.0))
    assert now.placement is not None and now.placement.pods[0].node == "pcie"


def test_one_gpu_job_does_not_wait(cluster: list[NodeTopology]) -> None:
    occ = _dgx_full(cluster)
    dgx = cluster[0]
    soon = Running(dgx.name, frozenset(g.dra_device for g in dgx.gpus), 600.0)
    one = Request(gpus=1, name="one")
    choice = decide(Context(cluster, occ, 0.0, [soon]), one, 3600.0, deadline(0.0, 3600.0))
    assert choice.placement is not None and choice.placement.pods[0].node == "pcie"


def test_a_free_nvswitch_node_is_taken_at_once(cluster: list[NodeTopology]) -> None:
    choice = decide(Context(cluster, Occupancy(), 0.0), TP2, 3600.0, 3600.0)
    assert choice.placement is not None and choice.placement.pods[0].node == "dgx"


def test_kept_search_results_follow_the_occupancy_of_each_node(
    cluster: list[NodeTopology],
) -> None:
    """The decision keeps each node's best set between decisions (one Context per
    decision): a job starting on one node changes that node's answer and no other's, and
    every answer is the one a fresh search gives."""
    dgx, pcie = cluster
    occ = Occupancy()
    first = decide(Context(cluster, occ, 0.0), TP2, 3600.0, 3600.0)
    assert first.placement is not None and first.placement.pods[0].node == "dgx"
    taken = set(first.placement.pods[0].devices)
    before_pcie = node_best(Context(cluster, occ, 0.0), pcie, TP2)
    occ.allocated.setdefault(dgx.pool, set()).update(taken)  # the job starts, in place
    ctx = Context(cluster, occ, 0.0)
    second = node_best(ctx, dgx, TP2)
    assert second is not None and not taken & set(second[0].devices)
    assert node_best(ctx, pcie, TP2) == before_pcie
    for t in cluster:
        fresh = node_placements(t, occ, TP2, 1)[0]
        got = node_best(ctx, t, TP2)
        assert got is not None and got[0] == fresh
        cp = ClusterPlacement((fresh,), fresh.score)
        assert got[1] == placement_stretch(ctx, TP2, cp, occ)
    # every GPU of the DGX in use: the DGX is no option, and the decision says so
    occ.allocated[dgx.pool] |= {g.dra_device for g in dgx.gpus}
    ctx = Context(cluster, occ, 0.0)
    assert node_best(ctx, dgx, TP2) is None
    assert [c.pods[0].node for _, c in options_now(ctx, TP2)] == ["pcie"]


def test_hardware_stretch_is_measured_against_the_cluster_it_is_asked_for(
    cluster: list[NodeTopology],
) -> None:
    """A PCIe pair is the best a PCIe-only cluster offers (stretch 1) and ×5 next to a DGX:
    the kept figure depends on the cluster, not only on the node's layout."""
    pcie = cluster[1]
    with_dgx = hardware_stretch(Context(cluster, Occupancy(), 0.0), pcie, TP2)
    alone = hardware_stretch(Context([pcie], Occupancy(), 0.0), pcie, TP2)
    assert alone == 1.0
    assert with_dgx is not None and with_dgx > 4.0


def test_a_job_larger_than_every_node_is_ranked_as_search_place_ranks_it() -> None:
    """A 16-GPU job on two DGXs and five trays of one NVLink domain: the decision's options
    are place()'s placements, best per first node, in place()'s order."""
    import copy

    tray = machine("gb200-nvl72-tray").graph
    nodes = [from_graph(rename_graph(machine("dgx-h100").graph, f"dgx-{i}")) for i in range(2)]
    for i in range(5):
        g = copy.deepcopy(rename_graph(tray, f"tray-{i}"))
        for v in g["vertices"]:
            if v["kind"] == "gpu":
                v["attrs"]["nvlink_clique"] = "rack-0.32766"
        nodes.append(from_graph(g))
    req = Request(gpus=16, nics_per_gpu=1, pattern="data-parallel", name="dp16")
    occ = Occupancy(allocated={nodes[2].pool: {nodes[2].gpus[0].dra_device}})
    expected, seen = [], set()
    for c in place(nodes, occ, req, top=4 * len(nodes)):
        if c.pods[0].node not in seen:
            seen.add(c.pods[0].node)
            expected.append(c)
    got = options_now(Context(nodes, occ, 0.0), req)
    assert [c for _, c in got] == expected and {c.kind for c in expected} == {
        "nvlink-domain",
        "multi-node",
    }


def test_remaining_time_of_a_job_past_its_estimate_grows_with_its_age() -> None:
    assert expected_remaining(100.0, 40.0) == 60.0
    assert expected_remaining(100.0, 400.0) == 200.0


def test_wait_filter_refuses_slow_nodes_only_within_the_bound() -> None:
    refused = wait_filter({"pcie": 5.0}, {"pcie": 5.0, "dgx": 1.0}, 100.0, 10.0)
    assert set(refused) == {"pcie"} and "dgx" in refused["pcie"]
    assert wait_filter({"pcie": 5.0}, {"pcie": 5.0, "dgx": 1.0}, 100.0, 100.0) == {}
    # the fast node fits now: nothing to wait for
    assert wait_filter({"pcie": 5.0, "dgx": 1.0}, {"pcie": 5.0, "dgx": 1.0}, 100.0, 0.0) == {}
    # a small gain does not pay for waiting the rest of the bound
    assert wait_filter({"pcie": 1.5}, {"pcie": 1.5, "dgx": 1.0}, 100.0, 0.0) == {}


# ------------------------------------------------------------------ estimates and hints


def test_learned_estimate_per_shape_and_hints() -> None:
    est = RunEstimator(use_hints=True)
    big = Request(gpus=8, pattern="data-parallel", expected_run_s=7200.0)
    assert est.expected(big) == 7200.0
    no_hints = RunEstimator(use_hints=False)
    prior = no_hints.expected(big)
    for _ in range(20):
        no_hints.observe(big, 100.0)
    assert no_hints.expected(big) < prior and no_hints.expected(big) < 500.0
    # another shape is pulled toward the all-shapes mean, not left at the prior
    assert no_hints.expected(TP2) < prior


def test_kueue_hint_from_label_or_workload() -> None:
    assert kueue_hint({"metadata": {"labels": {KUEUE_MAX_EXEC_LABEL: "3600"}}}) == 3600.0
    wl = {"kind": "Workload", "metadata": {}, "spec": {"maximumExecutionTimeSeconds": 60}}
    assert kueue_hint(wl) == 60.0
    assert kueue_hint({"metadata": {"labels": {KUEUE_MAX_EXEC_LABEL: "soon"}}}) is None


def test_request_document_states_its_run_time() -> None:
    req = request_from_dict({"gpus": 2, "expectedRunSeconds": 5400})
    assert req.expected_run_s == 5400.0 and req.with_gpus(1).expected_run_s == 5400.0
    with pytest.raises(ValueError, match="expectedRunSeconds"):
        request_from_dict({"gpus": 2, "expectedRunSeconds": "1h"})
    with pytest.raises(ValueError, match="expectedRunSeconds"):
        request_from_dict({"gpus": 2, "expectedRunSeconds": -1})


# ------------------------------------------------------------------ extender hook


def _pod(workload: dict[str, Any], age_s: float) -> dict[str, Any]:
    created = datetime.fromtimestamp(time.time() - age_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "metadata": {
            "name": "tp",
            "namespace": "ml",
            "creationTimestamp": created,
            "annotations": {PROFILE_ANNOTATION: json.dumps(workload)},
        },
        "spec": {},
    }


def _node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {}}}


@pytest.mark.parametrize(("age", "held"), [(5.0, True), (200.0, False)])
def test_extender_filter_holds_a_hinted_pod_off_pcie_within_its_bound(
    cluster: list[NodeTopology], age: float, held: bool
) -> None:
    dgx = cluster[0]
    graphs = GraphSource(
        static={
            "dgx": rename_graph(machine("dgx-h100").graph, "dgx"),
            "pcie": rename_graph(machine("pcie-8gpu").graph, "pcie"),
        }
    )
    cache = ClusterCache("toposlice.dev", graphs)
    # The DGX is full: one allocated claim holds its eight GPUs (as the informer sees it).
    results = [
        {"request": "g", "driver": "toposlice.dev", "pool": dgx.pool, "device": g.dra_device}
        for g in dgx.gpus
    ]
    cache.apply(
        "ResourceClaim",
        "ADDED",
        {
            "metadata": {"namespace": "ml", "name": "taken", "resourceVersion": "1"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results}}},
        },
    )
    ext = Extender(cache)
    workload = {"gpus": 2, "pattern": "tensor-parallel", "expectedRunSeconds": 100}
    # The scheduler's own DRA filter already dropped the full DGX: only PCIe is sent.
    out = ext.filter({"Pod": _pod(workload, age), "Nodes": {"items": [_node("pcie")]}})
    names = [n["metadata"]["name"] for n in out["Nodes"]["items"]]
    if held:
        assert names == [] and "faster placement" in out["FailedNodes"]["pcie"]
        assert dgx.name in out["FailedNodes"]["pcie"]
    else:
        assert names == ["pcie"] and out["FailedNodes"] == {}
    # Without a stated run time nothing is held.
    del workload["expectedRunSeconds"]
    out = ext.filter({"Pod": _pod(workload, age), "Nodes": {"items": [_node("pcie")]}})
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["pcie"]
