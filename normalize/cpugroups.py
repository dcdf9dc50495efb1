"""CPU groups: the CPU devices toposlice publishes (per NUMA node, per L3 group or per core)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from discovery.model import Cpu, Inventory, PciDevice
from discovery.readers import format_cpulist

from . import names
from .options import CpuGrouping


@dataclass(frozen=True)
class CpuGroup:
    name: str
    """DRA device name (stable, DNS label)."""
    kind: CpuGrouping
    numa_node: int | None
    package: int | None
    cpus: tuple[int, ...]
    pcie_roots: tuple[str, ...] = field(default_factory=tuple)
    """PCIe roots whose devices are local to this group's NUMA node."""
    l3_id: int | None = None
    core: int | None = None
    memory_bytes: int | None = None


def device_numa(pci: PciDevice) -> int | None:
    """The kernel NUMA node of a PCI function, else its hwloc-style locality node."""
    return pci.numa_node if pci.numa_node is not None else pci.locality_numa_node


def local_pcie_roots(inv: Inventory, numa: int | None) -> tuple[str, ...]:
    if numa is None:
        return ()
    roots = {p.pcie_root for p in inv.pci_devices if p.pcie_root and device_numa(p) == numa}
    return tuple(sorted(roots))


def cpu_list_text(cpus: tuple[int, ...] | list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5`` (the kernel's cpulist format)."""
    return format_cpulist(cpus)


def _cpu_numa(inv: Inventory) -> dict[int, int]:
    """CPU id -> NUMA node, from Cpu.numa_node, else NumaNode.cpus, else node 0."""
    owner: dict[int, int] = {}
    for node in inv.numa_nodes:
        for c in node.cpus:
            owner.setdefault(c, node.id)
    out: dict[int, int] = {}
    for cpu in inv.cpus:
        if cpu.numa_node is not None:
            out[cpu.id] = cpu.numa_node
        elif cpu.id in owner:
            out[cpu.id] = owner[cpu.id]
        else:
            out[cpu.id] = 0
    for c, n in owner.items():
        out.setdefault(c, n)
    return out


def _package_of(
    inv: Inventory, numa: int, cpus: list[int], cpu_package: dict[int, int]
) -> int | None:
    """The node's package, else the one package all ``cpus`` share (``cpu_package``: CPU id
    -> package, built once per inventory so this stays linear in the CPUs asked about)."""
    node = inv.numa(numa)
    if node is not None and node.package is not None:
        return node.package
    pkgs = {cpu_package[c] for c in cpus if c in cpu_package}
    return next(iter(pkgs)) if len(pkgs) == 1 else None


def cpu_groups(inv: Inventory, grouping: CpuGrouping = "numa") -> list[CpuGroup]:
    """CPU groups ordered by NUMA node, then by their first CPU; names are unique."""
    cpu_numa = _cpu_numa(inv)
    cpu_package = {c.id: c.package for c in inv.cpus if c.package is not None}
    by_numa: dict[int, list[int]] = {}
    for c, n in cpu_numa.items():
        by_numa.setdefault(n, []).append(c)
    groups: list[CpuGroup] = []
    if grouping == "numa":
        for numa, cpus in by_numa.items():
            node = inv.numa(numa)
            groups.append(
                CpuGroup(
                    name=names.cpu_numa_name(numa),
                    kind="numa",
                    numa_node=numa,
                    package=_package_of(inv, numa, cpus, cpu_package),
                    cpus=tuple(sorted(cpus)),
                    pcie_roots=local_pcie_roots(inv, numa),
                    memory_bytes=node.memory_bytes if node is not None else None,
                )
            )
    elif grouping == "l3":
        groups = _l3_groups(inv, cpu_numa, cpu_package)
    else:
        groups = _core_groups(inv, cpu_numa, cpu_package)
    groups.sort(key=lambda g: (g.numa_node if g.numa_node is not None else -1, g.cpus, g.name))
    unique = names.unique_names([(g.name, f"{g.kind}:{g.cpus}") for g in groups])
    return [g if g.name == n else replace(g, name=n) for g, n in zip(groups, unique, strict=True)]


def _l3_groups(
    inv: Inventory, cpu_numa: dict[int, int], cpu_package: dict[int, int]
) -> list[CpuGroup]:
    buckets: dict[tuple[int, int | None], list[int]] = {}
    by_id: dict[int, Cpu] = {c.id: c for c in inv.cpus}
    for c, numa in cpu_numa.items():
        cpu = by_id.get(c)
        l3 = cpu.l3 if cpu is not None else None
        if l3 is not None and not 0 <= l3 < len(inv.caches):
            l3 = None
        buckets.setdefault((numa, l3), []).append(c)
    out = []
    for (numa, l3), cpus in buckets.items():
        cache_id: int | None = None
        if l3 is not None:
            cache = inv.caches[l3]
            cache_id = cache.id if cache.id is not None else l3
        name = (
            names.cpu_l3_name(numa, cache_id) if cache_id is not None else names.cpu_numa_name(numa)
        )
        out.append(
            CpuGroup(
                name=name,
                kind="l3",
                numa_node=numa,
                package=_package_of(inv, numa, cpus, cpu_package),
                cpus=tuple(sorted(cpus)),
                pcie_roots=local_pcie_roots(inv, numa),
                l3_id=cache_id,
            )
        )
    return out


def _core_groups(
    inv: Inventory, cpu_numa: dict[int, int], cpu_package: dict[int, int]
) -> list[CpuGroup]:
    buckets: dict[tuple[int, int | None, int | None], list[int]] = {}
    by_id: dict[int, Cpu] = {c.id: c for c in inv.cpus}
    for c, numa in cpu_numa.items():
        cpu = by_id.get(c)
        if cpu is None or cpu.core is None:
            key: tuple[int, int | None, int | None] = (numa, None, c)  # one group per CPU
        else:
            key = (numa, cpu.package if cpu.package is not None else 0, cpu.core)
        buckets.setdefault(key, []).append(c)
    out = []
    for (numa, pkg, core), cpus in buckets.items():
        if pkg is None:
            name = names.to_label(f"cpu-numa{numa}-cpu-{core}")
            core_id = None
        else:
            name = names.cpu_core_name(numa, pkg, core if core is not None else 0)
            core_id = core
        out.append(
            CpuGroup(
                name=name,
                kind="core",
                numa_node=numa,
                package=pkg if pkg is not None else _package_of(inv, numa, cpus, cpu_package),
                cpus=tuple(sorted(cpus)),
                pcie_roots=local_pcie_roots(inv, numa),
                core=core_id,
            )
        )
    return out
