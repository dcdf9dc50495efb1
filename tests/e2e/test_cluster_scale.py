"""bench/cluster_scale.py's N=100 case on the real scheduler: 100 nodes (half dgx-h100, half
pcie-8gpu) with the slices `toposlice slices` prints, every example and `toposlice claim`
kind on an empty and on a 90 %-full cluster. Asserted: the allocations, not the timings —
every pod binds, every claim's devices are what the allocator model (scorer/allocator.py)
allocates on that node with the rest of the node in use (so selectors, constraints and the
chosen rungs all hold), and on the empty cluster every ladder lands its first rung. The
nodes carry the labels NFD would give them and the pods the example Pod's node affinity, so
a kind that fits only the DGX half is also checked to land only where its affinity lets it.

The cluster is its own (node-lifecycle controller off, so 100 Node objects stay Ready
without Lease renewals), started and stopped by this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import cluster_scale as cs
from normalize.deviceclasses import device_classes
from normalize.node_feature import admits
from scorer.allocator import Allocator
from scorer.ladder import rung_of
from tests.e2e.cluster import find_assets

pytestmark = pytest.mark.e2e

NODES = 100
PODS = 6
PODS_FULL = 3


@pytest.fixture(scope="module")
def scale(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[cs.Api, cs.Populated]]:
    if find_assets() is None:
        pytest.skip(cs.SKIP_REASON)
    cluster = cs.start_cluster(tmp_path_factory.mktemp("scale"))
    try:
        api = cs.Api(cluster)
        yield api, cs.populate(api, NODES)
    finally:
        cluster.stop()


def _fill_devices(api: cs.Api) -> dict[str, set[str]]:
    path = f"/apis/resource.k8s.io/v1/namespaces/{cs.NAMESPACE}/resourceclaims"
    out: dict[str, set[str]] = {}
    for c in api.call("GET", f"{path}?labelSelector=bench=fill")["items"]:
        for r in c["status"]["allocation"]["devices"]["results"]:
            out.setdefault(r["pool"], set()).add(r["device"])
    return out


def _check(
    pop: cs.Populated,
    spec: dict[str, Any],
    r: cs.KindResult,
    busy: dict[str, set[str]],
    affinity: dict[str, Any] | None = None,
) -> None:
    assert r.bound == r.pods, f"{r.kind} at {r.fill}%: {r.bound}/{r.pods} bound"
    assert len(r.allocations) == r.pods
    classes = device_classes(cs.DRIVER)
    machine = dict(pop.nodes)
    for a in r.allocations:
        node = a["node"]
        assert admits(affinity, cs.node_labels(node, machine[node])), (r.kind, node)
        mine = {d for _, d in a["results"]}
        every = {d["name"] for s in pop.slices[node] for d in s["spec"]["devices"]}
        others = every - mine
        model = Allocator(pop.slices[node], classes, node).allocate(
            spec, [(cs.DRIVER, node, d) for d in others]
        )
        assert model is not None, f"{r.kind} on {node}: the model cannot allocate {a}"
        assert sorted((m.request, m.device) for m in model) == [tuple(x) for x in a["results"]]
        assert not mine & busy.get(node, set()), f"{r.kind} on {node}: took a busy device"


def _first_rungs(spec: dict[str, Any]) -> dict[str, str]:
    return {
        req["name"]: req["firstAvailable"][0]["name"]
        for req in spec["devices"]["requests"]
        if "firstAvailable" in req
    }


def test_every_kind_allocates_on_100_nodes(scale: tuple[cs.Api, cs.Populated]) -> None:
    api, pop = scale
    # The heavy shapes fit few nodes of a 90 %-full cluster of 100: their bounds and binds
    # are tests/e2e/test_claim_worst_case.py's.
    kinds = {k: v for k, v in cs.new_claims().items() if k not in cs.HEAVY_SHAPES}
    affinities = cs.example_affinities()
    assert {"gpus-nvlink-domain", "gpu-nic-same-pcie-root"} <= set(affinities)
    for fill_pct, pods in ((0, PODS), (90, PODS_FULL)):
        cs.fill(api, pop, fill_pct)
        busy = _fill_devices(api)
        for kind, spec in kinds.items():
            aff = affinities.get(kind)
            r = cs.run_kind(api, kind, "new", spec, pods, fill_pct, "raised", 60, 15, affinity=aff)
            _check(pop, spec, r, busy, aff)
            if fill_pct == 0 and kind.startswith(("claim", "gpus-2-nics-ladder")):
                want = _first_rungs(spec)
                for a in r.allocations:
                    got = rung_of([req for req, _ in a["results"]])
                    assert got == want, (kind, a)
        cs.unfill(api)


def test_slices_are_what_the_cli_prints(scale: tuple[cs.Api, cs.Populated]) -> None:
    api, pop = scale
    name, machine = pop.nodes[1]
    listed = api.call(
        "GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={name}"
    )["items"]
    want = cs.node_slices([(name, machine)])[name]
    assert [s["spec"]["devices"] for s in listed] == [s["spec"]["devices"] for s in want]
    node = api.call("GET", f"/api/v1/nodes/{name}")
    labels = {k: v for k, v in node["metadata"]["labels"].items() if k.startswith("toposlice.")}
    assert labels == cs.node_labels(name, machine) and labels["toposlice.dev/gpu.count"] == "8"
    assert Path(cs.OLD_CLAIMS).is_file()


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_profile_of_a_kind_splits_filter_cpu(
    scale: tuple[cs.Api, cs.Populated], tmp_path: Path
) -> None:
    """``--profile``: the real kube-scheduler's CPU profile of a run, kept on disk, gives the
    DynamicResources Filter CPU per bound pod and the CEL share inside it."""
    api, _ = scale
    spec = cs.new_claims()["whole-node"]
    r = cs.run_kind(api, "whole-node", "new", spec, 4, 0, "raised", 60, 15, profile_dir=tmp_path)
    assert r.bound == 4
    files = sorted(tmp_path.glob("fill0-raised-whole-node-new-*.pb.gz"))
    assert files and not list(tmp_path.glob(".*.tmp"))
    assert r.filter_cpu_ms_per_pod is not None and r.filter_cpu_ms_per_pod > 0
    assert r.cel_share is not None and 0 < r.cel_share <= 1
    whole = cs.pprof.merge(cs.pprof.parse(f.read_bytes()) for f in files)
    assert whole.seconds_under(cs.FILTER_FRAME) * 1000 / r.bound == pytest.approx(
        r.filter_cpu_ms_per_pod, rel=0.01
    )
