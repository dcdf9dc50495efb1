"""Checks of a machine file's PCI tree that catch what used to load silently wrong.

Each one was a real mistake while describing servers from ``lspci``/``nvidia-smi``
output: two bridges claiming the same bus numbers (a typo in one bus id), a root port
without ``numa_node`` (its whole subtree reports -1), an NVLink to a misspelt NVSwitch
bus id (a phantom switch appeared). The messages name the line to fix.
"""

from __future__ import annotations

from collections.abc import Mapping

from discovery.fake.spec import PciDeviceSpec

__all__ = ["check_bus_ranges", "check_nvswitch_links", "check_root_numa"]

NVIDIA_VENDOR = 0x10DE
NVSWITCH_CLASS = 0x0680


def _bus(bdf: str) -> tuple[str, int]:
    dom, bus, _ = bdf.split(":")
    return dom, int(bus, 16)


def check_bus_ranges(devices: list[PciDeviceSpec], where: Mapping[str, str]) -> None:
    """Every bus number belongs to one bridge (or one root bus): refuse overlaps."""
    children: dict[str, list[str]] = {}
    owner: dict[tuple[str, int], str | None] = {}
    for dev in devices:
        if dev.parent is not None:
            children.setdefault(dev.parent, []).append(dev.bdf)
        key = _bus(dev.bdf)
        if key in owner and owner[key] != dev.parent:
            other = next(d.bdf for d in devices if _bus(d.bdf) == key and d.parent == owner[key])
            raise ValueError(
                f"{where[dev.bdf]}: bus {key[1]:02x} of domain {key[0]} is already the bus of "
                f"{other} (below {owner[key] or 'the root complex'}), but this device sits below "
                f"{dev.parent or 'the root complex'}: a bus has one bridge above it"
            )
        owner[key] = dev.parent

    ranges: dict[str, tuple[int, int]] = {}

    def subtree(bdf: str) -> tuple[int, int] | None:
        if bdf in ranges:
            return ranges[bdf]
        buses = []
        for child in children.get(bdf, []):
            buses.append(_bus(child)[1])
            sub = subtree(child)
            if sub is not None:
                buses.extend(sub)
        if not buses:
            return None
        ranges[bdf] = (min(buses), max(buses))
        return ranges[bdf]

    by_parent: dict[tuple[str, str | None, int], list[str]] = {}
    for dev in devices:
        if subtree(dev.bdf) is not None:
            dom, bus = _bus(dev.bdf)
            # Siblings: same parent bridge, or side by side on one root bus.
            by_parent.setdefault((dom, dev.parent, bus if dev.parent is None else -1), []).append(
                dev.bdf
            )
    for group in by_parent.values():
        spans = sorted((ranges[b], b) for b in group)
        for (lo_a, hi_a), a in spans:
            for (lo_b, hi_b), b in spans:
                if a < b and lo_b <= hi_a and lo_a <= hi_b:
                    later, first = (b, a) if list(where).index(b) > list(where).index(a) else (a, b)
                    lf, hf = ranges[first]
                    ll, hl = ranges[later]
                    raise ValueError(
                        f"{where[later]}: the buses below {later} ({ll:02x}-{hl:02x}) overlap "
                        f"those below its sibling {first} ({lf:02x}-{hf:02x}, {where[first]}): "
                        "each bridge owns its own range of bus numbers"
                    )


def check_root_numa(
    devices: list[PciDeviceSpec],
    explicit_numa: set[str],
    where: Mapping[str, str],
    numa_nodes: int,
) -> None:
    """On a multi-node machine a root port must say its node: -1 is then a choice."""
    if numa_nodes < 2:
        return
    parents = {dev.parent for dev in devices if dev.parent is not None}
    for dev in devices:
        if dev.parent is None and dev.bdf in parents and dev.bdf not in explicit_numa:
            raise ValueError(
                f"{where[dev.bdf]}: root port {dev.bdf} has no numa_node, so every device below "
                f"it would report numa_node -1 on this {numa_nodes}-node machine; write "
                "numa_node: <node id> (or numa_node: -1 if the machine really reports that)"
            )


def check_nvswitch_links(
    devices: list[PciDeviceSpec], external: Mapping[tuple[str, str], str], where: Mapping[str, str]
) -> None:
    """An NVLink to a switch must reach one of this machine's NVSwitches, unless the
    machine has none (switch trays, GB200) or the link says ``external: true``.

    ``external`` maps (GPU bus id, remote bus id) -> where the link is written, for the
    links *not* marked external.
    """
    switches = sorted(
        d.bdf for d in devices if d.vendor == NVIDIA_VENDOR and d.class_code >> 8 == NVSWITCH_CLASS
    )
    if not switches:
        return
    known = set(switches)
    for dev in devices:
        if dev.nvidia is None:
            continue
        for link in dev.nvidia.nvlinks:
            if link.remote_type != "switch" or link.remote in known:
                continue
            at = external.get((dev.bdf, link.remote))
            if at is None:
                continue
            raise ValueError(
                f"{at}: NVLink remote {link.remote} of GPU {dev.bdf} is not one of this "
                f"machine's NVSwitches ({', '.join(switches)}); fix the bus id, or write "
                "external: true for a switch outside this host"
            )
