"""nfd-master (the kit's NFD build, API as upstream v0.18) turning toposlice's NodeFeatures
into Node labels: under the strict NodeFeature schema that older NFDs and the fork still
run, and under NFD's ``denyNodeFeatureLabels`` hardening, where only the chart's
NodeFeatureRule brings the labels back."""

from __future__ import annotations

import json
import time

import pytest

from tests.consumers.readers import CLIQUES, DGX, FIGURES, Fleet, wait
from tests.e2e.toposlice_setup import NAMESPACE, chart_objects

pytestmark = pytest.mark.consumers

DENY = json.dumps({"restrictions": {"denyNodeFeatureLabels": True}})


def _want(fleet: Fleet) -> dict[str, dict[str, str]]:
    return {node: fleet.node_feature(node)["spec"]["labels"] for node in fleet.drivers}


def _labelled(fleet: Fleet, want: dict[str, dict[str, str]]) -> bool:
    return all(fleet.toposlice_labels(node) == labels for node, labels in want.items())


def test_labels_under_the_strict_schema_and_under_deny_mode(fleet: Fleet) -> None:
    # The strict schema (spec.features.{attributes,flags,instances} required) took every
    # node's NodeFeature: toposlice's writers never got a 422.
    for node in fleet.drivers:
        wait(lambda n=node: fleet.get("nodefeature", f"toposlice-{n}", "-n", NAMESPACE), 60,
             f"NodeFeature of {node}")  # fmt: skip
    want = _want(fleet)
    assert all(labels for labels in want.values())
    t0 = time.monotonic()
    fleet.down("nfd-master")  # an earlier module may have started it
    fleet.up("nfd-master", env={"NFD_CRDS": "none"})
    wait(lambda: _labelled(fleet, want), 60, "toposlice.dev labels on every node")
    FIGURES["nfd-master start to labels on 6 nodes"] = f"{time.monotonic() - t0:.1f} s"

    # What a Topology reads: one NVLink domain per clique, each DGX its own.
    domain = {n: want[n]["toposlice.dev/nvlink-domain"] for n in want}
    for trays in CLIQUES.values():
        assert len({domain[t] for t in trays}) == 1
    assert len({domain[CLIQUES["a"][0]], domain[CLIQUES["b"][0]], *(domain[d] for d in DGX)}) == 4
    assert all(want[t]["toposlice.dev/gpus-per-nvlink-domain"] == "4" for t in CLIQUES["a"])

    # Deny mode: the NodeFeatures' labels are dropped...
    fleet.down("nfd-master")
    fleet.up("nfd-master", "-options", DENY, env={"NFD_CRDS": "none"})
    wait(lambda: all(not fleet.toposlice_labels(n) for n in want), 60, "labels dropped")
    # ...and the chart's NodeFeatureRule makes the same ones from the features.
    (rule,) = [
        o
        for o in chart_objects({"integrations": {"nodeFeature": {"enabled": True, "rule": True}}})
        if o["kind"] == "NodeFeatureRule"
    ]
    t0 = time.monotonic()
    fleet.apply([rule])
    wait(lambda: _labelled(fleet, want), 60, "labels back from the NodeFeatureRule")
    FIGURES["deny mode: rule applied to labels on 6 nodes"] = f"{time.monotonic() - t0:.1f} s"
    # Kept for the readers of the labels (Kueue) in the modules after this one.


def test_gpu_clique_rule_example_labels_the_trays(fleet: Fleet) -> None:
    """examples/integrations/nfd-gpu-clique-rule.yaml applied to the real nfd-master: the
    trays get nvidia.com/gpu.clique (their clique), the DGX nodes (no clique) do not."""
    import yaml

    from tests.consumers.readers import REPO

    fleet.ensure_labels()
    path = REPO / "examples" / "integrations" / "nfd-gpu-clique-rule.yaml"
    (rule,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    fleet.apply([rule])
    try:
        for trays in CLIQUES.values():
            for tray in trays:
                want = fleet.node_feature(tray)["spec"]["labels"]["toposlice.dev/gpu.clique"]
                wait(lambda t=tray, w=want: fleet.node_labels(t).get("nvidia.com/gpu.clique") == w,
                     60, f"nvidia.com/gpu.clique on {tray}")  # fmt: skip
        for node in DGX:
            assert "nvidia.com/gpu.clique" not in fleet.node_labels(node)
    finally:
        fleet.cluster.kubectl("delete", "nodefeaturerule", rule["metadata"]["name"],
                              "--ignore-not-found")  # fmt: skip
