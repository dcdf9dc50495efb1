"""CPU backend: online CPUs, their package/die/cluster/core and last-level cache groups.

Reads are shared across siblings (a core's sibling list and a cache's
``shared_cpu_list`` are read once per group, not once per CPU): on 128-CPU machines
this is most of the discovery time.
"""

from __future__ import annotations

import os
import re

from discovery.bounds import MAX_BYTES, MAX_CPUS
from discovery.model import CacheGroup, Cpu
from discovery.readers import parse_cpulist, parse_cpumask, read_int, read_text
from discovery.root import Root
from discovery.warning_log import Warnings

_CPU_DIR = re.compile(r"^cpu(\d{1,5})$")
_SIZE = re.compile(r"^(\d{1,20})\s*([KMG]?)")


def online_cpus(root: Root, warn: Warnings) -> list[int]:
    """Online CPUs: ``cpu/online`` when present, else the ``cpuN`` dirs not marked offline."""
    base = root.sys_path("devices", "system", "cpu")
    text = read_text(os.path.join(base, "online"))
    if text is not None:
        cpus = parse_cpulist(text)
        if cpus is not None:
            return cpus
        warn.add(f"cpu/online: malformed {text[:40]!r}; using cpu directories")
    out = []
    try:
        names = os.listdir(base)
    except OSError:
        return []
    for name in names:
        m = _CPU_DIR.match(name)
        if m and int(m.group(1)) < MAX_CPUS:
            if read_text(os.path.join(base, name, "online")) != "0":
                out.append(int(m.group(1)))
    return sorted(out)


def _size_bytes(text: str | None) -> int | None:
    if not text:
        return None
    m = _SIZE.match(text)
    if not m:
        return None
    size = int(m.group(1)) * {"": 1, "K": 1024, "M": 1 << 20, "G": 1 << 30}[m.group(2)]
    return size if size < MAX_BYTES else None


def _cpuset(topo: str, list_name: str, mask_name: str) -> list[int] | None:
    cpus = parse_cpulist(read_text(os.path.join(topo, list_name)))
    if cpus is None:
        cpus = parse_cpumask(read_text(os.path.join(topo, mask_name)))
    return cpus


def _llc_index(cache_dir: str) -> str | None:
    """Name of the highest-level data/unified cache index dir (``index3`` usually)."""
    try:
        names = sorted(n for n in os.listdir(cache_dir) if n.startswith("index"))
    except OSError:
        return None
    best: tuple[int, str] | None = None
    for name in names:
        level = read_int(os.path.join(cache_dir, name, "level"))
        kind = read_text(os.path.join(cache_dir, name, "type"))
        if level is None or kind == "Instruction":
            continue
        if best is None or level > best[0]:
            best = (level, name)
    return best[1] if best else None


def discover_cpus(
    root: Root, online: list[int], warn: Warnings
) -> tuple[list[Cpu], list[CacheGroup]]:
    base = root.sys_path("devices", "system", "cpu")
    online_set = set(online)
    cpus: dict[int, Cpu] = {}
    siblings_of: dict[int, list[int]] = {}
    package_of: dict[int, frozenset[int] | None] = {}
    caches: list[CacheGroup] = []
    cache_of: dict[int, int] = {}
    llc_name: str | None = None
    llc_checked = False

    for cid in online:
        cdir = os.path.join(base, f"cpu{cid}")
        topo = os.path.join(cdir, "topology")
        cpu = Cpu(id=cid)
        pkg = read_int(os.path.join(topo, "physical_package_id"))
        cpu.package = pkg if pkg is not None and pkg >= 0 else None
        die = read_int(os.path.join(topo, "die_id"))
        cpu.die = die if die is not None and die >= 0 else None
        cluster = read_int(os.path.join(topo, "cluster_id"))
        cpu.cluster = cluster if cluster is not None and cluster >= 0 else None
        core = read_int(os.path.join(topo, "core_id"))
        cpu.core = core if core is not None and core >= 0 else None

        if cid in siblings_of:
            cpu.siblings = siblings_of[cid]
        else:
            sib = _cpuset(topo, "core_cpus_list", "core_cpus")
            if sib is None:
                sib = _cpuset(topo, "thread_siblings_list", "thread_siblings")
            sib = sorted(set(sib or [cid]) & online_set | {cid})
            for s in sib:
                siblings_of.setdefault(s, sib)
            cpu.siblings = sib

        if cid not in package_of:
            # core_siblings is the kernel's older name of package_cpus (same mask); old
            # dumps have only it, so it is read first to spare them failing opens.
            members = _cpuset(topo, "core_siblings_list", "core_siblings")
            if members is None:
                members = _cpuset(topo, "package_cpus_list", "package_cpus")
            package = frozenset(set(members) & online_set | {cid}) if members else None
            for m in package or (cid,):
                package_of.setdefault(m, package)

        if cid in cache_of:
            cpu.l3 = cache_of[cid]
        else:
            cache_dir = os.path.join(cdir, "cache")
            if not llc_checked or llc_name is None:
                llc_name = _llc_index(cache_dir)
                llc_checked = True
            if llc_name is not None:
                idx = os.path.join(cache_dir, llc_name)
                shared = _cpuset(idx, "shared_cpu_list", "shared_cpu_map")
                if shared:
                    members = sorted(set(shared) & online_set | {cid})
                    group = CacheGroup(
                        level=read_int(os.path.join(idx, "level")) or 0,
                        cpus=members,
                        id=read_int(os.path.join(idx, "id")),
                        size_bytes=_size_bytes(read_text(os.path.join(idx, "size"))),
                        type=read_text(os.path.join(idx, "type")) or "Unified",
                    )
                    caches.append(group)
                    for m in members:
                        cache_of.setdefault(m, len(caches) - 1)
                    cpu.l3 = cache_of[cid]
        cpus[cid] = cpu
    _packages_from_masks(cpus, package_of)
    return [cpus[c] for c in online], caches


def _packages_from_masks(
    cpus: dict[int, Cpu], package_of: dict[int, frozenset[int] | None]
) -> None:
    """Count packages as hwloc does: by the ``package_cpus``/``core_siblings`` masks.

    ``physical_package_id`` is kept when it agrees with the masks (one id per mask group,
    a different id per group). When it does not -- ``-1`` everywhere (s390x), or one id
    shared by sockets whose masks are disjoint (some Itanium dumps) -- the groups are
    numbered in CPU order instead. Without masks for every CPU the ids stay as read.
    """
    groups: dict[frozenset[int], set[int | None]] = {}
    for cid, cpu in cpus.items():
        group = package_of.get(cid)
        if group is None:
            return
        groups.setdefault(group, set()).add(cpu.package)
    ids = [next(iter(found)) for found in groups.values() if len(found) == 1]
    consistent = len(ids) == len(groups) and None not in ids and len(set(ids)) == len(ids)
    if consistent:
        return
    for number, group in enumerate(sorted(groups, key=min)):
        for cid in group:
            if cid in cpus:
                cpus[cid].package = number
