"""Other DRA drivers' dialects, and the bridge that lets a claim tie their devices to ours.

``matchAttribute`` compares one fully-qualified attribute across every device of the listed
requests, and fails on a device that lacks it. The standard
``resource.kubernetes.io/numaNode`` would be the common language, but the real neighbours of
Kubernetes 1.36 do not publish it: dra-driver-cpu v0.2.0 names a CPU group's NUMA node
``dra.cpu/numaNodeID`` *and* ``dra.net/numaNode``; dranet v1.4.0 names a NIC's
``dra.net/numaNode``. Their ``pcieRoot`` cannot be the bridge either: dra-driver-cpu
publishes it as a list, and v1.36's scheduler never selects the list-capable allocator
(kubernetes#139332). So toposlice speaks their dialect: with a bridge on, every toposlice
device with a NUMA node also carries ``dra.net/numaNode``, the one name both neighbours
share, and ``matchAttribute: dra.net/numaNode`` over a toposlice GPU and dra.cpu's CPUs (or
dranet's NICs) is a constraint the stock scheduler evaluates. Pure: devices in, devices out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from . import attribute_names as an
from .limits import MAX_ATTRS_AND_CAPACITY

Device = dict[str, Any]


@dataclass(frozen=True)
class Dialect:
    """How one neighbour driver names the facts a claim aligns on."""

    driver: str
    numa: tuple[str, ...]
    """Its attributes holding a device's NUMA node (int), most widely shared first."""
    kinds: tuple[str, ...]
    """The device kinds (toposlice's ``type``) it publishes: what double booking means."""
    cpu_numa: str | None = None
    """Its CPU-group NUMA attribute, also put on toposlice's CPU devices (so a selector
    written for its CPUs reads toposlice's too)."""
    device_class: str | None = None
    """The DeviceClass its install creates (what a claim names)."""
    cpu_capacity: str | None = None
    """Its consumable CPU capacity (grouped mode: one shared device per NUMA node, a claim
    asks for a number of CPUs of it)."""
    bus_id: str | None = None
    """Its attribute holding a device's PCI address (``0000:18:00.0``), where it does not
    publish the standard ``pciBusID``."""

    def names(self) -> tuple[str, ...]:
        """Its own names for standard facts: not look-alikes, not missing standards."""
        return self.numa + ((self.bus_id,) if self.bus_id else ())


DRA_CPU = Dialect(
    driver="dra.cpu",
    numa=(an.BRIDGE_NUMA, an.LEGACY_CPU_NUMA),
    kinds=("cpu",),
    cpu_numa=an.LEGACY_CPU_NUMA,
    device_class="dra.cpu",
    cpu_capacity="dra.cpu/cpu",
)
DRANET = Dialect(
    driver="dra.net",
    numa=(an.BRIDGE_NUMA,),
    kinds=("nic",),
    device_class="dra.net",
    bus_id="dra.net/pciAddress",
)
NVIDIA_GPU = Dialect(
    driver="gpu.nvidia.com", numa=(an.NUMA_NODE,), kinds=("gpu",), device_class="gpu.nvidia.com"
)
"""Speaks the standard names already: no bridge needed, listed for double booking."""

DIALECTS: dict[str, Dialect] = {d.driver: d for d in (DRA_CPU, DRANET, NVIDIA_GPU)}
BRIDGEABLE = tuple(d for d, dia in DIALECTS.items() if an.BRIDGE_NUMA in dia.numa)
"""Drivers whose dialect ``--bridge`` can speak."""
CPU_DRIVERS = tuple(d for d, dia in DIALECTS.items() if dia.cpu_capacity)
"""Drivers ``toposlice claim --cpus-from`` can take CPUs from."""
NIC_DRIVERS = tuple(d for d, dia in DIALECTS.items() if "nic" in dia.kinds)
GPU_DRIVERS = tuple(d for d, dia in DIALECTS.items() if "gpu" in dia.kinds)
"""Drivers ``toposlice claim --nics-from`` can take NICs from."""


def check_bridges(names: Iterable[str]) -> tuple[str, ...]:
    """The bridge names, sorted and unique; ValueError naming an unknown one."""
    out = sorted(set(names))
    unknown = [n for n in out if n not in BRIDGEABLE]
    if unknown:
        raise ValueError(
            f"unknown bridge {', '.join(unknown)}: one of {', '.join(BRIDGEABLE)} (a driver "
            "that already speaks resource.kubernetes.io/numaNode needs none)"
        )
    return tuple(out)


def _numa(dev: Device) -> int | None:
    attr = (dev.get("attributes") or {}).get(an.NUMA_NODE) or {}
    if isinstance(attr.get("int"), int):
        return int(attr["int"])
    ints = attr.get("ints")
    if isinstance(ints, list) and len(ints) == 1 and isinstance(ints[0], int):
        return int(ints[0])
    return None


def _kind(dev: Device) -> str | None:
    attr = (dev.get("attributes") or {}).get(an.TYPE) or {}
    kind = attr.get("string")
    return kind if isinstance(kind, str) else None


def bridge_attributes(dev: Device, bridges: Sequence[str]) -> dict[str, Any]:
    """The attributes ``bridges`` add to one toposlice device (none without a single NUMA
    node: a device spanning nodes must not match either)."""
    numa = _numa(dev)
    if numa is None or not bridges:
        return {}
    out: dict[str, Any] = {an.BRIDGE_NUMA: {"int": numa}}
    if _kind(dev) == "cpu":
        for name in bridges:
            cpu_numa = DIALECTS[name].cpu_numa
            if cpu_numa:
                out[cpu_numa] = {"int": numa}
    return out


def bridge_devices(devices: Sequence[Device], bridges: Sequence[str]) -> list[Device]:
    """``devices`` with the bridge attributes placed right behind ``type`` and the ladder's
    numbering (so a device at the attribute limit drops its lowest-priority attribute, not
    the bridge). Idempotent; the input is not modified."""
    if not bridges:
        return list(devices)
    out: list[Device] = []
    lead = (an.TYPE, an.ORDINAL, an.TYPE_COUNT)
    for dev in devices:
        extra = bridge_attributes(dev, bridges)
        if not extra:
            out.append(dev)
            continue
        old = dev.get("attributes") or {}
        attrs = {k: v for k, v in old.items() if k in lead}
        attrs.update(extra)
        attrs.update((k, v) for k, v in old.items() if k not in attrs)
        room = MAX_ATTRS_AND_CAPACITY - len(dev.get("capacity") or {})
        if len(attrs) > room:
            attrs = dict(list(attrs.items())[:room])
        out.append({**dev, "attributes": attrs})
    return out
