"""PCIe link state of the functions that matter for placement, and which links are degraded.

A link trained below its capability (an x16 slot running x8, a Gen5 switch port at Gen3)
halves a GPU's or NIC's host bandwidth without any error anywhere; the exporter shows it as a
metric and as an inventory warning. NVIDIA GPUs lower their link *speed* when idle to save
power, so for GPUs only a narrower *width* counts as degraded; for every other function a
lower speed counts too.
"""

from __future__ import annotations

from dataclasses import dataclass

from discovery.model import Inventory, PciDevice


@dataclass(frozen=True)
class LinkState:
    bus_id: str
    kind: str
    """``gpu``, ``nic``, ``nvswitch`` or ``bridge`` (a bridge on the path to one of them)."""
    speed_gts: float | None
    max_speed_gts: float | None
    width: int | None
    max_width: int | None

    @property
    def degraded(self) -> bool:
        if self.width is not None and self.max_width is not None and self.width < self.max_width:
            return True
        if self.kind == "gpu":
            return False
        return (
            self.speed_gts is not None
            and self.max_speed_gts is not None
            and self.speed_gts < self.max_speed_gts
        )

    def describe(self) -> str:
        return (
            f"PCIe link of {self.kind} {self.bus_id} is degraded: "
            f"{_fmt(self.speed_gts)} GT/s x{self.width or '?'} "
            f"(capable of {_fmt(self.max_speed_gts)} GT/s x{self.max_width or '?'})"
        )


def _fmt(v: float | None) -> str:
    return "?" if v is None else f"{v:g}"


def _state(pci: PciDevice, kind: str) -> LinkState:
    link = pci.link
    return LinkState(
        bus_id=pci.bus_id,
        kind=kind,
        speed_gts=link.current_speed_gts,
        max_speed_gts=link.max_speed_gts,
        width=link.current_width,
        max_width=link.max_width,
    )


def pcie_links(inv: Inventory) -> list[LinkState]:
    """GPUs, NICs and NVSwitches, then the bridges above them (each once), with link facts."""
    out: list[LinkState] = []
    seen: set[str] = set()
    endpoints = [(g.bus_id, "gpu") for g in inv.gpus]
    endpoints += [(n.bus_id, "nic") for n in inv.nics]
    endpoints += [(s.bus_id, "nvswitch") for s in inv.nvswitches]
    bridges: list[str] = []
    for bus, kind in endpoints:
        pci = inv.pci(bus)
        if pci is None or bus in seen:
            continue
        seen.add(bus)
        out.append(_state(pci, kind))
        bridges.extend(pci.upstream_bridges)
    for bus in bridges:
        pci = inv.pci(bus)
        if pci is None or bus in seen:
            continue
        seen.add(bus)
        out.append(_state(pci, "bridge"))
    return out


def degraded_link_warnings(inv: Inventory) -> list[str]:
    return [s.describe() for s in pcie_links(inv) if s.degraded]
