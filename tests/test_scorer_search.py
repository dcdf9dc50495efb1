"""The search finds the brute-force optimum on every shipped machine with ≤ 8 GPUs, and the
claim emitted for it lands on the chosen devices (or an equal-score set) under the
structured-allocation rules (scorer/allocator.py, the model the examples are checked with;
its CEL, memory ``quantity()`` selectors included, runs on a CEL library)."""

from __future__ import annotations

import itertools
import math

import pytest

from normalize.deviceclasses import device_classes
from scorer.allocator import allocate
from scorer.claim import claim_spec_for
from scorer.request import Occupancy, Request
from scorer.score import NodeState, score_devices, score_set
from scorer.search import domain_placement, node_placements, place
from scorer.topology import NodeTopology, from_graph, rename_graph
from tests.scorer_support import gpu_machines, machine

MACHINES = gpu_machines(8)

VARIANTS = [
    Request(gpus=1, pattern="independent", cpus=8),
    Request(gpus=1, pattern="tensor-parallel", nics_per_gpu=1),
    Request(gpus=1, pattern="tensor-parallel", bound="communication"),
    Request(gpus=1, pattern="data-parallel", nics_per_gpu=1, bound="communication"),
    Request(gpus=1, pattern="inference-decode", bound="memory"),
    Request(gpus=1, pattern="pipeline-parallel", nics_per_gpu=1, cpus=4),
]


def _occupancies(name: str) -> list[Occupancy]:
    """Empty, and one with a GPU and a NIC taken and a GPU running memory-bound work."""
    t = machine(name).topo()
    occ = Occupancy()
    if len(t.gpus) >= 4:
        busy = t.gpus[-1].dra_device
        occ.allocated[t.pool] = {t.gpus[1].dra_device, busy}
        occ.memory_bound[t.pool] = {busy}
        if t.nics:
            occ.allocated[t.pool].add(t.nics[0].dra_device)
    return [Occupancy(), occ]


def _cases() -> list[tuple[str, int, int, int]]:
    out = []
    for name in MACHINES:
        n = len(machine(name).topo().gpus)
        for k in range(1, n + 1):
            for v in range(len(VARIANTS)):
                for o in range(2):
                    out.append((name, k, v, o))
    return out


def test_every_small_machine_is_covered() -> None:
    assert {"dgx-h100", "pcie-8gpu", "mi300x-8", "gb200-nvl72-tray", "cloud-vm-1gpu"} <= set(
        MACHINES
    )


@pytest.mark.parametrize(("name", "k", "variant", "occ_index"), _cases())
def test_search_equals_brute_force(name: str, k: int, variant: int, occ_index: int) -> None:
    m = machine(name)
    topo = m.topo()
    req = VARIANTS[variant].with_gpus(k)
    occ = _occupancies(name)[occ_index]
    state = NodeState(topo, occ, req)
    brute = [score_set(state, req, list(c)) for c in itertools.combinations(state.free_gpus, k)]
    feasible = [p for p in brute if p is not None]
    found = node_placements(topo, occ, req, top=1)
    if not feasible:
        assert found == []
        return
    best = max(p.score for p in feasible)
    assert found, f"{name} k={k}: search found nothing, brute force {best:.3f}"
    assert math.isclose(found[0].score, best, abs_tol=1e-9)
    # The claim lands on the chosen devices or a set of the same score.
    spec = claim_spec_for(topo, req, occ, found[0], m.slices)
    in_use = [(topo.driver, topo.pool, d) for d in occ.used(topo.pool)]
    got = [
        r.device for r in allocate(spec, m.slices, device_classes(topo.driver), in_use, topo.pool)
    ]
    assert not set(got) & set(occ.used(topo.pool))
    if sorted(got) != sorted(found[0].devices):
        assert math.isclose(score_devices(topo, occ, req, got).score, best, abs_tol=1e-6)


def test_general_claim_used_where_it_lands_right_and_pinned_elsewhere() -> None:
    """On an empty DGX the general claim already lands a best set (NVSwitch: all equal), so
    no pinning selectors; on the PCIe box a 3-GPU set needs pinning (first-fit would take a
    whole switch pair plus a far GPU with different NICs)."""
    m = machine("dgx-h100")
    t = m.topo()
    req = Request(gpus=4, nics_per_gpu=1, pattern="tensor-parallel")
    p = node_placements(t, None, req, 1)[0]
    spec = claim_spec_for(t, req, None, p, m.slices)
    text = str(spec)
    assert "pciBusID" not in text
    assert "resource.kubernetes.io/pcieRoot" in text
    m2 = machine("pcie-8gpu")
    t2 = m2.topo()
    occ = Occupancy(allocated={t2.pool: {t2.gpus[0].dra_device}})
    req2 = Request(gpus=2, pattern="tensor-parallel")
    p2 = node_placements(t2, occ, req2, 1)[0]
    spec2 = claim_spec_for(t2, req2, occ, p2, m2.slices)
    # GPU0 is taken: first-fit would pair GPU1 with GPU2 across switches; the best pair is
    # a whole free switch, so the claim must pin it.
    switches = {t2.gpu(v).switch for v in p2.gpus}
    assert len(switches) == 1 and switches != {t2.gpus[0].switch}
    assert "pciBusID" in str(spec2)


def test_node_label_filter_applies_before_scoring() -> None:
    g = machine("dgx-h100").graph
    eu = from_graph(rename_graph(g, "eu-1"), {"region": "eu"})
    us = from_graph(rename_graph(g, "us-1"), {"region": "us"})
    req = Request(gpus=2, pattern="tensor-parallel", node_labels={"region": "eu"})
    out = place([us, eu], None, req, top=10)
    assert out and {p.node for c in out for p in c.pods} == {"eu-1"}
    none = Request(gpus=2, node_labels={"region": "mars"})
    assert place([us, eu], None, none) == []


def test_min_gpu_memory_and_gpu_attributes_filter() -> None:
    t = machine("pcie-8gpu").topo()
    assert node_placements(t, None, Request(gpus=1, min_gpu_memory=80 * 2**30)) == []
    assert node_placements(t, None, Request(gpus=1, gpu_attributes={"model": "NVIDIA L40S"}))
    assert node_placements(t, None, Request(gpus=1, gpu_attributes={"model": "H100"})) == []


def _rack(trays: int) -> list:
    g = machine("gb200-nvl72-tray").graph
    return [from_graph(rename_graph(g, f"tray-{i:02d}")) for i in range(trays)]


def test_domain_search_equals_brute_force_over_trays() -> None:
    """Four trays of one NVLink domain with some GPUs taken: the DP's choice scores as well as
    the best of every GPU subset split into per-tray pods."""
    from scorer.search import _combine

    nodes = _rack(4)
    occ = Occupancy()
    occ.allocated["tray-00"] = {nodes[0].gpus[0].dra_device}
    occ.allocated["tray-02"] = {nodes[2].gpus[0].dra_device, nodes[2].gpus[3].dra_device}
    for k in (5, 6, 9):
        req = Request(gpus=k, pattern="tensor-parallel", bound="communication")
        got = domain_placement(nodes, occ, req)
        assert got is not None
        states = {t.name: NodeState(t, occ, req) for t in nodes}
        free = [(t.name, g) for t in nodes for g in states[t.name].free_gpus]
        bw = min(g.nvswitch_gbps for _, g in free)
        best = -math.inf
        for combo in itertools.combinations(free, k):
            pods = []
            for t in nodes:
                mine = [g for n, g in combo if n == t.name]
                if mine:
                    p = score_set(states[t.name], req.with_gpus(len(mine)), mine, bw)
                    assert p is not None
                    pods.append(p)
            best = max(best, _combine(pods, req, bw, "nvlink-domain").score)
        assert math.isclose(got.score, best, abs_tol=1e-9), (k, got.score, best)


def test_rack_of_72_is_fast_and_prefers_whole_trays() -> None:
    import time

    nodes = _rack(18)
    req = Request(gpus=16, nics_per_gpu=0, pattern="tensor-parallel")
    t0 = time.perf_counter()
    out = place(nodes, None, req, 3)
    assert time.perf_counter() - t0 < 5.0
    assert out[0].kind == "nvlink-domain"
    assert sorted(len(p.gpus) for p in out[0].pods) == [4, 4, 4, 4]


def test_jobs_beyond_a_node_use_whole_nodes_with_aligned_nics() -> None:
    g = machine("dgx-h100").graph
    nodes = [from_graph(rename_graph(g, f"dgx-{i}")) for i in range(3)]
    req = Request(gpus=16, nics_per_gpu=1, pattern="data-parallel")
    out = place(nodes, None, req, 1)
    assert out and out[0].kind == "multi-node" and len(out[0].pods) == 2
    # One GPU per NIC on its own PCIe switch (PXB on DGX): 50 GB/s × 0.92 per GPU.
    assert math.isclose(out[0].parts["busbw_gbps"], 400 / 8 * 0.92)


def _big_graph(n: int = 72) -> dict:
    """One graph with ``n`` NVLink-5 GPUs on one crossbar, 4 per PCIe switch, 2 NUMA nodes —
    the single-graph view of an NVL72 domain."""
    verts: list[dict] = [
        {"id": "machine", "kind": "machine", "attrs": {"cpu_model": "Neoverse-V2"}}
    ]
    edges: list[dict] = []
    devices = []
    for i in range(n):
        bus = f"{i // 4:04x}:01:{i % 4:02x}.0"
        root, sw = f"pci{i // 4:04x}:00", f"bridge:{i // 4:04x}:00:00.0"
        gid = f"gpu:{bus}"
        verts.append(
            {
                "id": gid,
                "kind": "gpu",
                "label": f"GPU{i}",
                "attrs": {
                    "bus_id": bus,
                    "dra_device": f"gpu-{i}",
                    "pcie_root": root,
                    "numa_node": 0 if i < n // 2 else 1,
                    "memory_bytes": 192 << 30,
                    "nvlink_clique": "rack.1",
                },
            }
        )
        edges.append({"source": f"pcie_root:{root}", "target": sw, "kind": "pcie", "attrs": {}})
        edges.append(
            {"source": sw, "target": gid, "kind": "pcie", "attrs": {"gen": 5, "width": 16}}
        )
        edges.append(
            {
                "source": gid,
                "target": "nvswitch:fabric",
                "kind": "nvlink",
                "attrs": {"links": 18, "version": "5.0.0"},
            }
        )
        devices.append({"label": f"GPU{i}", "id": gid, "numa_affinity": 0 if i < n // 2 else 1})
    labels = [d["label"] for d in devices]
    matrix = [["X" if a == b else "NV18" for b in labels] for a in labels]
    return {
        "schema": "toposlice.graph/v1",
        "node": "big",
        "vertices": verts,
        "edges": edges,
        "devices": devices,
        "relations": {"labels": labels, "legend": {}, "matrix": matrix},
    }


def test_72_gpu_graph_structured_search_is_fast_and_beats_sampling() -> None:
    import random
    import time

    t = from_graph(_big_graph())
    rng = random.Random(5)
    occ = Occupancy(allocated={"big": {g.dra_device for g in rng.sample(list(t.gpus), 30)}})
    req = Request(gpus=8, pattern="tensor-parallel", bound="communication")
    t0 = time.perf_counter()
    found = node_placements(t, occ, req, 1)
    assert time.perf_counter() - t0 < 5.0
    assert found
    state = NodeState(t, occ, req)
    assert math.comb(len(state.free_gpus), 8) > 10**6  # no brute force was possible
    for _ in range(1500):
        p = score_set(state, req, rng.sample(list(state.free_gpus), 8))
        assert p is not None and p.score <= found[0].score + 1e-9


def test_structured_search_matches_brute_force_where_both_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import scorer.search as search

    monkeypatch.setattr(search, "EXACT_LIMIT", 1)
    search._NODE_CACHE.clear()
    try:
        for name in ("pcie-8gpu", "dgx-h100", "mi300x-8"):
            t = machine(name).topo()
            for k in (2, 3, 4, 6):
                req = Request(gpus=k, pattern="tensor-parallel")
                state = NodeState(t, None, req)
                best = max(
                    p.score
                    for c in itertools.combinations(state.free_gpus, k)
                    if (p := score_set(state, req, list(c))) is not None
                )
                got = node_placements(t, None, req, 1)[0].score
                assert got >= best - 0.5, (name, k, got, best)
    finally:
        search._NODE_CACHE.clear()


def _mixed_nodes() -> list[NodeTopology]:
    nodes = []
    for name, count in (("dgx-h100", 2), ("pcie-8gpu", 2), ("mi300x-8", 1)):
        g = machine(name).graph
        nodes += [from_graph(rename_graph(g, f"{name}-{i}")) for i in range(count)]
    return nodes


def _take(occ: Occupancy, t: NodeTopology, gpus: int, nics: int) -> None:
    occ.allocated.setdefault(t.pool, set()).update(
        [g.dra_device for g in t.gpus[:gpus]] + [n.dra_device for n in t.nics[:nics]]
    )


@pytest.mark.parametrize("k", [2, 4])
def test_small_nic_jobs_fill_a_used_nvswitch_node_before_pcie_or_a_whole_one(k: int) -> None:
    """Mixed cluster (bench/placement.py --cluster mixed): a 2- or 4-GPU job with a NIC per
    GPU goes to an NVSwitch node while one has room — the partly used one, so the other stays
    whole for an 8-GPU job — and to PCIe only when neither has room."""
    nodes = _mixed_nodes()
    by = {t.name: t for t in nodes}
    req = Request(gpus=k, nics_per_gpu=1, pattern="tensor-parallel", bound="communication")
    occ = Occupancy()
    _take(occ, by["dgx-h100-1"], 8 - k, 8 - k)
    best = place(nodes, occ, req, 1)[0]
    assert best.pods[0].node == "dgx-h100-1"
    assert math.isclose(best.parts["busbw_gbps"], 370.8, rel_tol=1e-3)
    _take(occ, by["dgx-h100-1"], 8, 8)
    _take(occ, by["dgx-h100-0"], 8 - k + 1, 8 - k + 1)
    best = place(nodes, occ, req, 1)[0]
    assert not best.pods[0].node.startswith("dgx-h100")
    assert best.parts["busbw_gbps"] < 50
