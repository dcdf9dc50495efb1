"""The pool plan: which inventory object becomes which DRA device, under which name.

Computed once per inventory and shared by everything that speaks about the pool's
devices -- the device builder, the graph (``dra_device`` of its vertices), the snapshot
(and through it the publisher, exporter and scorer) -- so they cannot disagree about
names or order, and the CPU groups are computed once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from discovery.model import Gpu, Inventory, Nic

from . import names
from .cpugroups import CpuGroup, cpu_groups
from .options import NormalizeOptions

__all__ = ["PoolEntry", "PoolPlan", "plan_pool"]

DeviceKind = Literal["gpu", "nic", "cpu"]


@dataclass(frozen=True)
class PoolEntry:
    """One device of the pool."""

    name: str
    """The published DRA device name (unique in the pool)."""
    vertex: str
    """Graph vertex id: ``gpu:<bdf>``, ``nic:<bdf>`` or ``cpu_group:<group name>``."""
    kind: DeviceKind
    gpu: Gpu | None = None
    nic: Nic | None = None
    cpu_group: CpuGroup | None = None
    """The group as computed (its ``name`` is the unrenamed group name)."""


@dataclass(frozen=True)
class PoolPlan:
    entries: tuple[PoolEntry, ...]
    """Publishing order: GPUs by bus id, NICs by bus id, CPU groups by NUMA node."""
    cpu_groups: tuple[CpuGroup, ...]
    """The CPU groups of the inventory under the options' grouping."""
    names: dict[str, str] = field(default_factory=dict)
    """Graph vertex id -> DRA device name (the first device of a vertex wins)."""

    def device_name(self, vertex: str) -> str | None:
        return self.names.get(vertex)


def plan_pool(inv: Inventory, opts: NormalizeOptions | None = None) -> PoolPlan:
    opts = opts or NormalizeOptions()
    gpus = sorted(inv.gpus, key=lambda g: g.bus_id.lower())
    nics = sorted(inv.nics, key=lambda n: n.bus_id.lower())
    groups = cpu_groups(inv, opts.cpu_grouping)
    pairs = [(names.gpu_name(g.bus_id), f"gpu:{g.bus_id}") for g in gpus]
    pairs += [(names.nic_name(n.bus_id), f"nic:{n.bus_id}") for n in nics]
    pairs += [(g.name, f"cpu_group:{g.name}:{g.cpus}") for g in groups]
    unique = iter(names.unique_names(pairs))
    entries = [PoolEntry(next(unique), f"gpu:{g.bus_id}", "gpu", gpu=g) for g in gpus]
    entries += [PoolEntry(next(unique), f"nic:{n.bus_id}", "nic", nic=n) for n in nics]
    entries += [PoolEntry(next(unique), f"cpu_group:{g.name}", "cpu", cpu_group=g) for g in groups]
    vertex_names: dict[str, str] = {}
    for entry in entries:
        vertex_names.setdefault(entry.vertex, entry.name)
    return PoolPlan(entries=tuple(entries), cpu_groups=tuple(groups), names=vertex_names)
