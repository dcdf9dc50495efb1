"""Shared, per-session builds for the scorer tests: each fake machine is discovered once."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from discovery.fake import list_machines
from normalize.graph import build_graph
from normalize.slices import build_slices
from scorer.topology import NodeTopology, from_graph
from toposlice.discover import discover


@dataclass(frozen=True)
class Machine:
    name: str
    graph: dict[str, Any]
    slices: list[dict[str, Any]]

    def topo(self) -> NodeTopology:
        return from_graph(self.graph)


@functools.cache
def machine(name: str) -> Machine:
    inv = discover("/", fake=name)
    graph = build_graph(inv)
    node = str(graph["node"])
    return Machine(name, graph, build_slices(inv, node))


def gpu_machines(max_gpus: int = 8) -> list[str]:
    """Shipped fake machines with 1..max_gpus GPUs (by their YAML, without discovery)."""
    from discovery.fake import load_machine

    out = []
    for name in list_machines():
        spec = load_machine(name)
        n = sum(1 for d in spec.pci if getattr(d, "nvidia", None) or getattr(d, "amd", None))
        if 0 < n <= max_gpus:
            out.append(name)
    return out
