"""Claims that fail fast (issue #31), on the real kube-scheduler v1.36.2.

Every shape toposlice writes (`toposlice claim` over its flags, `score --emit-claim` over
examples/requests, examples/) is run on the node where the allocator model
(bench/claim_worst_case.py) finds its worst case, with a pod pinned there: the scheduler's
attempt must stay under ``BOUND_MS`` and never hit the DynamicResources filter timeout. And
on a mixed cluster (PCIe boxes with free GPUs, DGX nodes that fit) the 8-GPU, NIC-per-GPU
pods bind, and plain pods created beside them bind as fast as without them.

The cluster is this module's own (bench/claim_worst_case_real.py starts it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from bench import claim_worst_case as wc
from bench.claim_worst_case_real import NodeCase, WorstCluster, pick, plain, worst_cluster
from tests.e2e.cluster import find_assets

pytestmark = pytest.mark.e2e

#: The scheduler attempt on one node, milliseconds, beyond the plain count's: the cliff this
#: guards against was 10 s timeouts. The 50 ms target of the issue is a bench figure
#: (docs/performance.md): some 4-GPU NIC shapes one NIC short measure 47.5-266.5 ms on the
#: 2-core VM, and a loaded CI machine runs slower still.
BOUND_MS = 500.0
HEAVY = (
    "claim --gpus 8 --nics-per-gpu 1",
    "claim --gpus 8 --nics-per-gpu 1 --pattern tensor-parallel",
    "claim --gpus 4 --nics-per-gpu 2",
)


@pytest.fixture(scope="module")
def worst(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorstCluster]:
    if find_assets() is None:
        pytest.skip("no kube binaries")
    with worst_cluster(tmp_path_factory.mktemp("worst")) as c:
        yield c


def test_every_shape_stays_bounded_on_its_worst_node(worst: WorstCluster) -> None:
    machines = wc.machines()
    shapes = wc.gather_shapes(["claim", "emit", "examples"], machines)
    slices = {m: wc.machine_slices(m) for m in machines}
    cases = wc.run_model(shapes, slices, draws=1, cap=wc.CAP)
    chosen = pick(cases, 1)
    empties = [NodeCase(m, "empty", ()) for m in ("dgx-h100", "pcie-8gpu")]
    worst.add_nodes([*empties, *(nc for ncs in chosen.values() for nc in ncs)])
    base = [worst.measure("plain 2 GPUs", plain(2), nc) for nc in empties]
    overhead = min(r.ms for r in base)
    slow: list[str] = []
    for shape, ncs in chosen.items():
        for nc in ncs:
            r = worst.measure(shape, shapes[shape], nc)
            if r.outcome in ("timed out", "pending") or r.ms - overhead > BOUND_MS:
                slow.append(f"{shape} on {nc.machine} {nc.occupancy}: {r.ms:.0f} ms, {r.outcome}")
    assert not slow, slow


def _bind_times(c: WorstCluster, names: list[str], timeout: float = 60) -> dict[str, float]:
    out: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(out) < len(names) and time.monotonic() < deadline:
        for n in names:
            if n in out:
                continue
            got = c.api.call("GET", f"/api/v1/namespaces/worst/pods/{n}")
            if got["spec"].get("nodeName"):
                out[n] = time.monotonic()
        time.sleep(0.05)
    return out


def _pod(c: WorstCluster, name: str, spec: dict[str, Any], machine: str | None = None) -> None:
    claim: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim"}
    claim.update(metadata={"name": name}, spec=spec)
    selector = {"worst.toposlice.dev/mixed": "yes"}
    if machine:
        selector["bench.toposlice.dev/machine"] = machine
    c.api.call("POST", "/apis/resource.k8s.io/v1/namespaces/worst/resourceclaims", claim)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": selector,
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "c", "resourceClaimName": name}],
            "containers": [
                {"name": "c", "image": "pause", "resources": {"claims": [{"name": "c"}]}}
            ],
        },
    }
    c.api.call("POST", "/api/v1/namespaces/worst/pods", pod)


def test_heavy_shapes_bind_on_a_mixed_cluster_and_do_not_stall_plain_pods(
    worst: WorstCluster,
) -> None:
    shapes = wc.claim_shapes()
    machines = ["pcie-8gpu"] * 4 + ["dgx-h100"] * 2
    cases = [NodeCase(m, f"mixed-{i}", ()) for i, m in enumerate(machines)]
    worst.add_nodes(cases)
    for nc in cases:
        node = worst.nodes[nc]
        worst.api.call(
            "PATCH",
            f"/api/v1/nodes/{node}",
            {"metadata": {"labels": {"worst.toposlice.dev/mixed": "yes"}}},
        )
    time.sleep(1)

    def plain_round(tag: str) -> float:
        names = [f"plain-{tag}-{i}" for i in range(6)]
        t0 = time.monotonic()
        for n in names:
            _pod(worst, n, plain(1), "pcie-8gpu")  # the DGX nodes stay whole for the 8-GPU pods
        bound = _bind_times(worst, names)
        assert len(bound) == len(names), f"{tag}: {len(bound)} of {len(names)} plain pods bound"
        return max(bound.values()) - t0

    alone = plain_round("alone")
    heavy = [f"heavy-{i}" for i in range(2)]
    for n, shape in zip(heavy, HEAVY[:2], strict=True):
        _pod(worst, n, shapes[shape])
    time.sleep(1)
    beside = plain_round("beside")
    bound = _bind_times(worst, heavy)
    assert set(bound) == set(heavy), "an 8-GPU pod with a NIC per GPU did not bind"
    for n in heavy:
        got = worst.api.call("GET", f"/api/v1/namespaces/worst/pods/{n}")
        assert got["spec"]["nodeName"] in {worst.nodes[c] for c in cases if c.machine == "dgx-h100"}
    # Plain pods beside them bind as fast as without them (1 s of slack for a loaded VM).
    assert beside <= 2 * alone + 1.0, (alone, beside)
