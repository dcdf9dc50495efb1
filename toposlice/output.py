"""Rendering of command results: JSON, YAML and the readable inventory table."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from discovery.model import Inventory


def dump(data: Any, fmt: str, out: TextIO | None = None) -> None:
    out = sys.stdout if out is None else out
    if fmt == "json":
        # Indented for a person at a terminal; compact (and C-encoded, several times
        # faster) when piped to a program.
        pretty = out.isatty()
        out.write(json.dumps(data, indent=2 if pretty else None))
        out.write("\n")
    elif fmt == "yaml":
        import yaml

        docs = data if isinstance(data, list) else [data]
        yaml.safe_dump_all(docs, out, sort_keys=False, default_flow_style=False)
    else:
        raise ValueError(f"unknown output format {fmt!r}")


def _cpus(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out: list[str] = []
    start = prev = None
    for c in cpus:
        if prev is not None and c == prev + 1:
            prev = c
            continue
        if start is not None:
            out.append(f"{start}-{prev}" if start != prev else f"{start}")
        start = prev = c
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else f"{start}")
    return ",".join(out) or "-"


def inventory_table(inv: Inventory) -> str:
    lines = [f"host: {inv.hostname or '-'}   source: {inv.source}"]
    packages = {c.package for c in inv.cpus if c.package is not None}
    lines.append(
        f"cpus: {len(inv.cpus)} online in {len(packages)} package(s); "
        f"{len(inv.numa_nodes)} NUMA node(s); {len(inv.pci_devices)} PCI functions"
    )
    lines.append("")
    lines.append(f"{'NUMA':<6}{'PKG':<5}{'MEMORY':>12}  CPUS")
    for n in inv.numa_nodes:
        mem = f"{n.memory_bytes / 2**30:.1f}GiB" if n.memory_bytes else "-"
        tag = f"  (memory of GPU {n.gpu_bus_id})" if n.gpu_bus_id else ""
        pkg = "-" if n.package is None else str(n.package)
        lines.append(f"{n.id:<6}{pkg:<5}{mem:>12}  {_cpus(n.cpus)}{tag}")
    if inv.gpus:
        lines.append("")
        lines.append(f"{'GPU':<15}{'VENDOR':<9}{'NUMA':<6}{'ROOT':<13}{'LINKS':<7}MODEL")
        for g in inv.gpus:
            dev = inv.pci(g.bus_id)
            numa = "-" if dev is None or dev.numa_node is None else str(dev.numa_node)
            root = (dev.pcie_root if dev else None) or "-"
            lines.append(
                f"{g.bus_id:<15}{g.vendor:<9}{numa:<6}{root:<13}{len(g.nvlinks):<7}{g.model or '-'}"
            )
    if inv.nics:
        lines.append("")
        lines.append(f"{'NIC':<15}{'NUMA':<6}{'ROOT':<13}{'RDMA':<10}{'NETDEV':<16}MODEL")
        for nic in inv.nics:
            dev = inv.pci(nic.bus_id)
            numa = "-" if dev is None or dev.numa_node is None else str(dev.numa_node)
            root = (dev.pcie_root if dev else None) or "-"
            rdma = ",".join(nic.rdma_devices) or "-"
            net = ",".join(nic.netdevs) or "-"
            model = nic.model or "-"
            lines.append(f"{nic.bus_id:<15}{numa:<6}{root:<13}{rdma:<10}{net:<16}{model}")
    lines.append("")
    lines.append("probes: " + ", ".join(f"{p.name}={p.state}" for p in inv.probes))
    for w in inv.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines) + "\n"
