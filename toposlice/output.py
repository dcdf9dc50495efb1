"""Rendering of command results: JSON, YAML and the readable inventory table."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, TextIO

from discovery.model import Gpu, Inventory
from discovery.readers import format_cpulist
from discovery.words import plural


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


#: The one flag name of every command that writes its result to a file (``-o`` is the
#: format everywhere): ``gather``, ``machines capture``, ``nccl-topo``.
OUTPUT_FILE = "--output-file"


def add_output_file_arg(
    p: argparse.ArgumentParser, what: str, *, required: bool = False, stdout: str = "-"
) -> None:
    """``--output-file FILE``: where the command writes ``what`` (atomically)."""
    p.add_argument(
        OUTPUT_FILE,
        required=required,
        metavar="FILE",
        help=f"write {what} to FILE, atomically (its directory must exist); "
        + ("- = standard output" if required else "default: standard output"),
    )


def check_output_file(flag: str, path: str) -> None:
    """Refuse a file to write, before any work, in one line naming the flag and the path:
    a directory (not the temporary file's name an open() of it would give), a missing
    directory (never created for a typo)."""
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path}: is a directory; give the file's name")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        why = "not a directory" if os.path.exists(parent) else "no such directory"
        raise ValueError(f"{flag} {path}: {parent}: {why}")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"{flag} {path}: {parent}: not writable")


def write_output_file(flag: str, path: str, data: bytes) -> None:
    """``data`` to ``path`` atomically (temp + fsync + rename), errors naming ``flag``."""
    from pathlib import Path

    from driver.plumbing.atomic import write_atomic

    check_output_file(flag, path)
    try:
        write_atomic(Path(path), data)
    except OSError as exc:
        raise ValueError(f"{flag} {path}: {exc.strerror or exc}") from exc


def object_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Several Kubernetes objects as one ``v1 List``, the form ``kubectl get -o json``
    prints them in and ``kubectl create/apply -f`` reads."""
    return {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items}


def _locality(inv: Inventory, bus_id: str) -> tuple[str, str]:
    """(kernel NUMA node, PCIe root) of a device, ``-`` when unknown."""
    dev = inv.pci(bus_id)
    numa = "-" if dev is None or dev.numa_node is None else str(dev.numa_node)
    return numa, (dev.pcie_root if dev else None) or "-"


def _gib(size: int) -> str:
    try:
        return f"{size / 2**30:.1f}GiB"
    except OverflowError:  # a saved inventory can hold any integer
        return f"{size >> 30}GiB"


#: How the table names each kind of source (``Inventory.source`` keys).
_SOURCE_WORDS = {"fake": "fake machine", "sysfs_root": "sysfs under", "gathered": "archive"}


def source_text(source: dict[str, Any]) -> str:
    """``{"fake": "dgx-h100"}`` as ``fake machine dgx-h100``; ``-`` when unknown."""
    return ", ".join(f"{_SOURCE_WORDS.get(k, k)} {v}" for k, v in source.items()) or "-"


def _links(gpu: Gpu) -> str:
    """GPU-to-GPU links: NVLinks (NVIDIA), else xGMI links (AMD)."""
    return str(len(gpu.nvlinks) or len(gpu.xgmi_links))


def _probe_text(name: str, state: str, detail: str | None) -> str:
    return f"{name}={state}" if state == "ok" or not detail else f"{name}={state} ({detail})"


def inventory_table(inv: Inventory) -> str:
    lines = [f"host: {inv.hostname or '-'}   source: {source_text(inv.source)}"]
    packages = {c.package for c in inv.cpus if c.package is not None}
    lines.append(
        f"cpus: {len(inv.cpus)} online in {plural(len(packages), 'package')}; "
        f"{plural(len(inv.numa_nodes), 'NUMA node')}; "
        f"{plural(len(inv.pci_devices), 'PCI function')}"
    )
    lines.append("")
    lines.append(f"{'NUMA':<6}{'PKG':<5}{'MEMORY':>12}  CPUS")
    for n in inv.numa_nodes:
        mem = _gib(n.memory_bytes) if n.memory_bytes else "-"
        tag = f"  (memory of GPU {n.gpu_bus_id})" if n.gpu_bus_id else ""
        pkg = "-" if n.package is None else str(n.package)
        lines.append(f"{n.id:<6}{pkg:<5}{mem:>12}  {format_cpulist(n.cpus) or '-'}{tag}")
    if inv.gpus:
        lines.append("")
        lines.append(f"{'GPU':<15}{'VENDOR':<9}{'NUMA':<6}{'ROOT':<13}{'LINKS':<7}MODEL")
        for g in inv.gpus:
            numa, root = _locality(inv, g.bus_id)
            links = _links(g)
            lines.append(
                f"{g.bus_id:<15}{g.vendor:<9}{numa:<6}{root:<13}{links:<7}{g.model or '-'}"
            )
    if inv.nics:
        lines.append("")
        lines.append(f"{'NIC':<15}{'NUMA':<6}{'ROOT':<13}{'RDMA':<10}{'NETDEV':<16}MODEL")
        for nic in inv.nics:
            numa, root = _locality(inv, nic.bus_id)
            rdma = ",".join(nic.rdma_devices) or "-"
            net = ",".join(nic.netdevs) or "-"
            model = nic.model or "-"
            lines.append(f"{nic.bus_id:<15}{numa:<6}{root:<13}{rdma:<10}{net:<16}{model}")
    lines.append("")
    # A probe that is not "ok" says why ("pci=unavailable" under listed PCI NICs only means
    # the accelerator probe found no accelerator).
    lines.append("probes: " + ", ".join(_probe_text(p.name, p.state, p.detail) for p in inv.probes))
    for w in inv.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines) + "\n"
