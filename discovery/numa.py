"""NUMA backend: nodes, their online CPUs, memory and the SLIT distance rows."""

from __future__ import annotations

import os
import re

from discovery.bounds import MAX_BYTES, MAX_NUMA_NODES
from discovery.model import Cpu, NumaNode
from discovery.readers import parse_cpulist, parse_cpumask, read_text
from discovery.root import Root
from discovery.warning_log import Warnings

_NODE_DIR = re.compile(r"^node(\d+)$")
_MEMTOTAL = re.compile(r"MemTotal:\s*(\d+)\s*kB")


def discover_numa(root: Root, online: list[int], warn: Warnings) -> list[NumaNode]:
    base = root.sys_path("devices", "system", "node")
    try:
        ids = sorted(
            int(m.group(1))
            for n in os.listdir(base)
            if (m := _NODE_DIR.match(n)) and len(m.group(1)) <= 4
        )
        ids = [i for i in ids if i < MAX_NUMA_NODES]
    except OSError:
        ids = []
    online_text = read_text(os.path.join(base, "online"))
    online_nodes = parse_cpulist(online_text, MAX_NUMA_NODES) if online_text is not None else None
    if online_nodes is not None and ids:
        kept = [i for i in ids if i in set(online_nodes)]
        ids = kept or ids
    if not ids:
        # Kernels without NUMA support still have one memory node, as hwloc reports it.
        return [NumaNode(id=0, cpus=list(online))]

    online_set = set(online)
    nodes = []
    for nid in ids:
        ndir = os.path.join(base, f"node{nid}")
        cpus = parse_cpulist(read_text(os.path.join(ndir, "cpulist")))
        if cpus is None:
            cpus = parse_cpumask(read_text(os.path.join(ndir, "cpumap")))
        if cpus is None:
            warn.add(f"numa node{nid}: no readable cpulist/cpumap")
            cpus = []
        node = NumaNode(id=nid, cpus=sorted(set(cpus) & online_set))
        node.memory_only = not node.cpus
        meminfo = read_text(os.path.join(ndir, "meminfo"))
        if meminfo:
            m = _MEMTOTAL.search(meminfo)
            if m:
                digits = m.group(1)
                size = int(digits) * 1024 if len(digits) <= 20 else MAX_BYTES
                if size < MAX_BYTES:
                    node.memory_bytes = size
                else:
                    warn.add(f"numa node{nid}: MemTotal {m.group(1)[:24]} kB is out of range")
        dist = read_text(os.path.join(ndir, "distance"))
        if dist:
            try:
                row = [int(x) for x in dist.split()]
            except ValueError:
                warn.add(f"numa node{nid}: malformed distance {dist[:60]!r}")
                row = []
            if row and len(row) == len(ids):
                node.distances = dict(zip(ids, row, strict=True))
            elif row:
                warn.add(
                    f"numa node{nid}: distance row has {len(row)} entries for {len(ids)} nodes"
                )
        nodes.append(node)
    return nodes


def assign_packages(nodes: list[NumaNode], cpus: list[Cpu]) -> None:
    """Fill ``Cpu.numa_node`` and ``NumaNode.package`` (CPU-less nodes: nearest CPU node's)."""
    by_id = {c.id: c for c in cpus}
    for node in nodes:
        for cid in node.cpus:
            cpu = by_id.get(cid)
            if cpu is not None:
                cpu.numa_node = node.id
                if node.package is None:
                    node.package = cpu.package
    cpu_nodes = [n for n in nodes if n.cpus]
    for node in nodes:
        if node.cpus or not cpu_nodes:
            continue
        nearest = min(cpu_nodes, key=lambda n: (node.distances.get(n.id, 1 << 30), n.id))
        if nearest.id in node.distances:
            node.package = nearest.package
