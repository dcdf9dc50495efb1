"""A thousand functions (issue #9): VFs stay out of the relation matrix, inherit their
PF's place, and the graph stays small enough to serve. Timings are in bench/vfs.py."""

from __future__ import annotations

import json

from discovery.fake import fake_host
from discovery.root import Root
from hack.vf_machine import vf_machine
from normalize.graph import build_graph
from normalize.options import NormalizeOptions
from normalize.slices import build_slices
from normalize.validation import validate_pool
from toposlice.discover import discover_root


def test_thousand_vfs_keep_the_graph_small() -> None:
    with fake_host(vf_machine(16, 8, 125)) as host:
        inv = discover_root(Root(host.root, live=False))
    assert len(inv.gpus) == 16
    assert len([n for n in inv.nics if n.is_vf]) == 1000
    graph = build_graph(inv)
    rel = graph["relations"]
    assert len(rel["labels"]) == 16 + 8  # GPUs and physical NICs, as nvidia-smi lists them
    assert len(json.dumps(graph)) < 1 << 20
    # Every VF is still a vertex, reached through its PF's PCIe path.
    vf_vertices = [v for v in graph["vertices"] if v["kind"] == "nic" and v["attrs"].get("is_vf")]
    assert len(vf_vertices) == 1000
    slices = build_slices(inv, "node-a")
    assert validate_pool(slices) == []
    assert sum(len(s["spec"]["devices"]) for s in slices) == 16 + 8 + 1000 + 2


def test_all_nics_option_lists_every_function() -> None:
    with fake_host(vf_machine(2, 2, 3)) as host:
        inv = discover_root(Root(host.root, live=False))
    everything = build_graph(inv, NormalizeOptions(matrix_nics="all"))
    assert len(everything["relations"]["labels"]) == 2 + 2 + 6
    assert len(build_graph(inv)["relations"]["labels"]) == 2 + 2
