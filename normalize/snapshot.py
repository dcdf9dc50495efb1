"""One consistent view of a node at one discovery: inventory, its DRA devices and graph.

The daemon (publisher, health, exporter) and the scorer consume a ``Snapshot`` and never
run discovery or probes themselves; the CLI builds one per rediscovery and hands it down.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from discovery.model import Inventory

from .attributes import AttributeDrop
from .devices import Device, build_devices_reported
from .graph import build_graph
from .options import NormalizeOptions
from .pool import PoolPlan, plan_pool


@dataclass(frozen=True)
class Snapshot:
    inventory: Inventory
    node_name: str
    """Kubernetes node name; also the name of the node's resource pool."""
    options: NormalizeOptions
    devices: tuple[Device, ...]
    """The pool's devices in publishing order (API JSON form, no taints)."""
    graph: dict[str, Any]
    """``toposlice.graph/v1`` of the inventory."""
    vertex_devices: dict[str, str] = field(default_factory=dict)
    """Graph vertex id (``gpu:<bdf>``, ``nic:<bdf>``, ``cpu_group:<name>``) -> DRA device name."""
    plan: PoolPlan | None = None
    """The pool plan devices and graph were built from (which object is which device)."""
    dropped: tuple[AttributeDrop, ...] = ()
    """Known attribute values the devices do not carry as they are (over an API limit)."""

    @property
    def driver(self) -> str:
        return self.options.driver

    @property
    def pool(self) -> str:
        return self.node_name


def build_snapshot(
    inv: Inventory, node_name: str, opts: NormalizeOptions | None = None
) -> Snapshot:
    opts = opts or NormalizeOptions()
    plan = plan_pool(inv, opts)
    devices, dropped = build_devices_reported(inv, opts, plan)
    return Snapshot(
        inventory=inv,
        node_name=node_name,
        options=opts,
        devices=tuple(devices),
        graph=build_graph(inv, opts, plan, node_name=node_name),
        vertex_devices=plan.names,
        plan=plan,
        dropped=tuple(dropped),
    )
