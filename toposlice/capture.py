"""``toposlice machines capture``: a fake-machine YAML file from an inventory.

The file, loaded with ``--fake FILE``, generates a sysfs tree and a fake NVML that
discovery reads back as the same inventory -- so a user's own fleet becomes CI
fixtures. It uses the format's explicit forms (``cpu.cores``, ``cpu.caches``,
``local_cpus``, ``net``, ...) wherever the compact ones cannot say what the host said.
What the format cannot carry is listed in docs/fake-hardware.md ("Captured machines")
and masked by :func:`capture_differences`.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from discovery.fake.spec import CpuSpec
from discovery.model import Gpu, Inventory, NetInterface, PciDevice, RdmaDevice
from discovery.nvml_codes import FABRIC_HEALTH
from discovery.readers import format_cpulist
from plugins.cpu import ARM_IMPLEMENTERS, X86_VENDORS

__all__ = ["NOT_CAPTURED", "capture_differences", "capture_machine", "capture_yaml"]

_RDMA_STATES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}

#: Inventory fields a captured machine does not reproduce (docs/fake-hardware.md).
NOT_CAPTURED: dict[str, tuple[str, ...]] = {
    "": ("source", "warnings"),
    "gpus": ("index",),
}
#: ... and fields it reproduces only where the source had them: a dump without the
#: ``bus/pci/devices`` symlinks has no ``pcie_root``; a generated tree always has links.
CAPTURED_WHEN_PRESENT: dict[str, tuple[str, ...]] = {"pci_devices": ("pcie_root",)}


def _name(inv: Inventory) -> str:
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", inv.hostname or "").strip("-._")
    return text or "captured"


def _hex(text: str | None, default: int = 0xFFFF) -> str:
    try:
        return f"0x{int(text, 16):04x}" if text else f"0x{default:04x}"
    except ValueError:
        return f"0x{default:04x}"


def _cpuinfo(host: dict[str, str]) -> tuple[str, dict[str, str]]:
    """(cpu.arch, extra cpuinfo lines) that make the cpu probe report ``host`` again."""
    arch = host.get("arch", "")
    vendor = host.get("cpu_vendor", "")
    raw_vendor = {v: k for k, v in X86_VENDORS.items()}.get(vendor, vendor)
    lines: dict[str, str] = {}
    if arch in ("x86_64", "i686"):
        if vendor:
            lines["vendor_id"] = raw_vendor
        if arch == "i686":
            lines["flags"] = "fpu"
    elif arch == "s390x":
        lines["vendor_id"] = "IBM/S390"
    elif arch in ("aarch64", "armv7l"):
        implementer = {v: k for k, v in ARM_IMPLEMENTERS.items()}.get(vendor)
        if implementer is None and vendor.startswith("0x"):
            implementer = int(vendor, 16)
        if implementer is not None:
            lines["CPU implementer"] = f"0x{implementer:02x}"
            lines["CPU architecture"] = "8" if arch == "aarch64" else "7"
    elif arch == "ia64":
        lines["arch"] = "IA-64"
        if vendor:
            lines["vendor"] = raw_vendor
    elif arch == "ppc64le":
        lines["cpu"] = host.get("cpu_model") or "POWER"
    elif arch.startswith("riscv"):
        lines["isa"] = "rv64imafdc" if arch == "riscv64" else "rv32imafdc"
    return arch or "unknown", lines


def _cpu(inv: Inventory) -> dict[str, Any]:
    arch, lines = _cpuinfo(inv.host)
    out: dict[str, Any] = {"model": inv.host.get("cpu_model", ""), "arch": arch}
    if lines:
        out["cpuinfo"] = lines
    mhz = inv.host.get("cpu_freq_max_mhz")
    if mhz and mhz.isdigit() and int(mhz) > 0:
        out["max_mhz"] = int(mhz)
    compact = _compact_layout(inv)
    if compact is not None:
        out.update(compact)
        return out
    by_id = {c.id: c for c in inv.cpus}
    cores: list[dict[str, Any]] = []
    done: set[int] = set()
    for cpu in inv.cpus:
        if cpu.id in done:
            continue
        group = [c for c in (cpu.siblings or [cpu.id]) if c in by_id and c not in done]
        if cpu.id not in group:
            group = [cpu.id]
        done.update(group)
        group.sort()
        entry: dict[str, Any] = {"cpus": format_cpulist(group)}
        for key, value in (
            ("socket", cpu.package),
            ("die", cpu.die),
            ("cluster", cpu.cluster),
            ("core", cpu.core),
        ):
            if value is not None:
                entry[key] = value
        core_ids = [by_id[c].core for c in group]
        if len(set(core_ids)) > 1 and None not in core_ids:
            entry["core"] = core_ids  # siblings with their own core ids (AMD modules)
        cores.append(entry)
    out["cores"] = cores
    caches = []
    for cache in inv.caches:
        item: dict[str, Any] = {
            "cpus": format_cpulist(cache.cpus),
            "level": cache.level,
            "type": cache.type,
        }
        if cache.size_bytes is not None:
            item["size_bytes"] = cache.size_bytes
        if cache.id is not None:
            item["id"] = cache.id
        caches.append(item)
    if caches:
        out["caches"] = caches
    return out


def _compact_layout(inv: Inventory) -> dict[str, Any] | None:
    """``sockets``/``cores_per_socket``/... when the generated regular layout gives exactly
    these CPUs and last-level caches (the inverse of the builder's numbering); else None."""
    cpus = inv.cpus
    if not cpus or any(c.die != 0 or c.package is None or c.core is None for c in cpus):
        return None
    sockets = len({c.package for c in cpus})
    by_core: dict[tuple[int, int], list[int]] = {}
    for c in cpus:
        by_core.setdefault((c.package or 0, c.core or 0), []).append(c.id)
    threads = len(next(iter(by_core.values())))
    per_socket = len(by_core) // sockets
    expected_keys = {(s, k) for s in range(sockets) for k in range(per_socket)}
    if set(by_core) != expected_keys or any(len(v) != threads for v in by_core.values()):
        return None
    for numbering in ("linear", "interleaved", "socket_interleaved"):
        spec = {
            "sockets": sockets,
            "cores_per_socket": per_socket,
            "threads_per_core": threads,
            "numbering": numbering,
        }
        layout = CpuSpec(
            model="",
            arch="",
            vendor="",
            sockets=sockets,
            cores_per_socket=per_socket,
            threads_per_core=threads,
            numbering=numbering,
            l1d_kb=0,
            l2_kb=0,
            l3_kb=0,
            l2_cores=1,
            l3_cores=1,
        )
        if any(
            sorted(ids) != [layout.cpu_id(s, k, t) for t in range(threads)]
            for (s, k), ids in by_core.items()
        ):
            continue
        extra = _compact_caches(inv, sockets, per_socket, threads)
        if extra is None:
            return None
        if any(c.siblings != sorted(by_core[(c.package or 0, c.core or 0)]) for c in cpus):
            return None
        return spec | extra
    return None


def _compact_caches(
    inv: Inventory, sockets: int, per_socket: int, threads: int
) -> dict[str, Any] | None:
    """``l2_cores`` (from the cluster ids) and ``l3_kb``/``l3_cores`` the builder would
    need to write these clusters and L3 groups; None when no choice does."""
    out: dict[str, Any] = {}
    l2 = next(
        (
            n
            for n in range(1, per_socket + 1)
            if per_socket % n == 0
            and all(
                c.cluster == (c.package or 0) * (per_socket // n) + (c.core or 0) // n
                for c in inv.cpus
            )
        ),
        None,
    )
    if l2 is None:
        return None
    if l2 != 1:
        out["l2_cores"] = l2
    caches = inv.caches
    sizes = {c.size_bytes for c in caches}
    if not caches or any(c.level != 3 or c.type != "Unified" for c in caches) or len(sizes) != 1:
        return None
    size = sizes.pop()
    if size is None or size % 1024:
        return None
    l3 = len(caches[0].cpus) // threads
    if l3 < 1 or per_socket % l3 or len(caches) != sockets * (per_socket // l3):
        return None
    for cpu in inv.cpus:
        group = (cpu.core or 0) // l3
        want_id = (cpu.package or 0) * (per_socket // l3) + group
        cache = caches[cpu.l3] if cpu.l3 is not None else None
        if cache is None or cache.id != want_id:
            return None
    out["l3_kb"] = size // 1024
    if l3 != per_socket:
        out["l3_cores"] = l3
    return out


def _numa(inv: Inventory) -> dict[str, Any]:
    nodes = []
    for node in inv.numa_nodes:
        entry: dict[str, Any] = {"id": node.id}
        if node.cpus:
            entry["cpus"] = format_cpulist(node.cpus)
        else:
            entry["socket"] = node.package if node.package is not None else 0
        if node.memory_bytes:
            entry["memory_kb"] = node.memory_bytes // 1024
        if node.gpu_bus_id:
            entry["gpu"] = node.gpu_bus_id
        nodes.append(entry)
    ids = [n.id for n in inv.numa_nodes]
    matrix = [
        [n.distances.get(other, 10 if other == n.id else 20) for other in ids]
        for n in inv.numa_nodes
    ]
    return {"nodes": nodes, "distances": matrix}


def _net(iface: NetInterface) -> dict[str, Any]:
    """An interface; ``null`` for a file the host did not have."""
    entry: dict[str, Any] = {
        "name": iface.name,
        "address": iface.address,
        "mtu": iface.mtu,
        "operstate": iface.operstate,
        "type": iface.type,
    }
    if iface.speed_mbps is not None:
        entry["speed"] = iface.speed_mbps
    return entry


def _rdma(rd: RdmaDevice) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": rd.name}
    for key in ("node_guid", "sys_image_guid", "fw_ver", "board_id"):
        entry[key] = getattr(rd, key)
    ports = sorted(rd.ports, key=lambda p: p.port)
    entry["ports"] = len(ports)
    if ports:
        first = ports[0]
        if first.rate_gbps is not None:
            entry["rate"] = f"{first.rate_gbps:g} Gb/sec"
        if first.state is not None:
            code = _RDMA_STATES.get(first.state.upper())
            entry["state"] = f"{code}: {first.state}" if code else first.state
        if first.link_layer is not None:
            entry["link_layer"] = first.link_layer
    return entry


def _nvlinks(gpu: Gpu, switches: set[str]) -> dict[str, Any]:
    links = sorted(gpu.nvlinks, key=lambda link: link.link)
    if not links:
        return {}
    by_number = {link.link: link for link in links}
    runs: list[dict[str, Any]] = []
    down: list[int] = []
    last = links[0]
    for number in range(links[-1].link + 1):
        link = by_number.get(number)
        if link is None:
            down.append(number)
            link = last
        last = link
        remote = link.remote_bus_id or "0000:00:00.0"
        rtype = "gpu" if link.remote_type == "gpu" else "switch"
        if runs and runs[-1]["remote"] == remote and runs[-1].get("type", "switch") == rtype:
            runs[-1]["count"] += 1
            continue
        run: dict[str, Any] = {"remote": remote, "count": 1}
        if rtype == "gpu":
            run["type"] = "gpu"
        elif remote not in switches:
            run["external"] = True
        runs.append(run)
    out: dict[str, Any] = {"nvlink_version": links[0].version or "4.0", "nvlinks": runs}
    if down:
        out["nvlinks_down"] = format_cpulist(down)
    return out


def _nvidia(gpu: Gpu, switches: set[str]) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": gpu.model or ""}
    memory = gpu.memory_bytes or 0
    mib, rest = divmod(memory, 1 << 20)
    entry["memory_mib"] = mib if not rest else memory / (1 << 20)
    if gpu.compute_capability:
        entry["compute_capability"] = gpu.compute_capability
    if gpu.uuid:
        entry["uuid"] = gpu.uuid
    if gpu.minor is not None:
        entry["minor"] = gpu.minor
    entry["mig_mode"] = "unsupported" if gpu.mig_mode is None else [int(gpu.mig_mode)] * 2
    entry.update(_nvlinks(gpu, switches))
    fabric = gpu.fabric
    if fabric is None or fabric.state is None:
        entry["fabric"] = "not_supported"
    else:
        fab: dict[str, Any] = {"state": fabric.state}
        if fabric.cluster_uuid:
            fab["cluster_uuid"] = fabric.cluster_uuid
        if fabric.clique_id is not None:
            fab["clique_id"] = fabric.clique_id
        if fabric.status:
            fab["status"] = fabric.status
        if fabric.health in FABRIC_HEALTH:
            fab["health_summary"] = FABRIC_HEALTH.index(fabric.health)
        entry["fabric"] = fab
    return entry


def _gfx_version(arch: str | None) -> int | None:
    m = re.match(r"^gfx(\d+)([0-9a-f])([0-9a-f])$", arch or "")
    if not m:
        return None
    return int(m.group(1)) * 10000 + int(m.group(2), 16) * 100 + int(m.group(3), 16)


def _amd(gpu: Gpu) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    if gpu.model:
        entry["name"] = gpu.model
    memory = gpu.memory_bytes or 0
    if memory % (1 << 30) == 0:
        entry["vram_gib"] = memory >> 30
    elif memory % (1 << 20) == 0:
        entry["vram_mib"] = memory >> 20
    else:
        entry["vram_gib"] = memory / (1 << 30)
    if gpu.xgmi_hive_id:
        entry["hive_id"] = int(gpu.xgmi_hive_id, 16)
    if gpu.uuid and gpu.uuid.startswith("0x"):
        entry["unique_id"] = int(gpu.uuid, 16)
    version = _gfx_version(gpu.architecture)
    if version is not None:
        entry["gfx_target_version"] = version
    return entry


def _device(
    dev: PciDevice,
    inv: Inventory,
    parent_numa: dict[str, int],
    node_cpus: dict[int, list[int]],
    switches: set[str],
) -> dict[str, Any]:
    entry: dict[str, Any] = {"bdf": dev.bus_id}
    parent = dev.upstream_bridges[-1] if dev.upstream_bridges else None
    if parent is not None:
        entry["parent"] = parent
    cls = (
        (int(dev.class_code, 16) << 8 | int(dev.prog_if or "0", 16)) if dev.class_code else 0xFF0000
    )
    entry["class"] = f"0x{cls:06x}"
    entry["vendor"] = _hex(dev.vendor) if dev.vendor else None
    entry["device"] = _hex(dev.device) if dev.device else None
    if dev.subsystem_vendor is None or dev.subsystem_vendor != dev.vendor:
        entry["subsystem_vendor"] = _hex(dev.subsystem_vendor) if dev.subsystem_vendor else None
    if dev.subsystem_device is None or int(dev.subsystem_device, 16):
        entry["subsystem_device"] = _hex(dev.subsystem_device) if dev.subsystem_device else None
    if dev.driver:
        entry["driver"] = dev.driver
    numa = dev.numa_node if dev.numa_node is not None else -1
    if parent is None or parent_numa.get(parent) != numa:
        entry["numa_node"] = numa
    parent_numa[dev.bus_id] = numa
    default_local = node_cpus.get(numa) or sorted(c.id for c in inv.cpus)
    if sorted(dev.local_cpus) != default_local:
        entry["local_cpus"] = format_cpulist(dev.local_cpus)
    link = dev.link
    if link.current_speed_gts is not None:
        entry["link_speed"] = link.current_speed_gts
    if link.current_width is not None:
        entry["link_width"] = link.current_width
    if link.max_speed_gts is not None and link.max_speed_gts != link.current_speed_gts:
        entry["max_link_speed"] = link.max_speed_gts
    if link.max_width is not None and link.max_width != link.current_width:
        entry["max_link_width"] = link.max_width
    if dev.iommu_group is not None:
        entry["iommu_group"] = dev.iommu_group
    if dev.sriov_totalvfs is not None:
        entry["sriov_totalvfs"] = dev.sriov_totalvfs
        if dev.sriov_numvfs:
            entry["sriov_numvfs"] = dev.sriov_numvfs
    if dev.physfn:
        entry["physfn"] = dev.physfn
    if dev.vendor_name or dev.device_name:
        names = {"vendor": dev.vendor_name, "device": dev.device_name}
        entry["udev_names"] = {k: v for k, v in names.items() if v}
    nets = [_net(n) for n in inv.net_interfaces if n.bus_id == dev.bus_id]
    if nets:
        entry["net"] = nets
    rdmas = [_rdma(r) for r in inv.rdma_devices if r.bus_id == dev.bus_id]
    if rdmas:
        entry["rdma"] = rdmas
    for gpu in inv.gpus:
        if gpu.bus_id != dev.bus_id:
            continue
        if gpu.probe == "nvidia":
            entry["nvidia"] = _nvidia(gpu, switches)
        elif gpu.vendor == "amd" and gpu.memory_bytes:
            entry["amd"] = _amd(gpu)
    return entry


def capture_machine(inv: Inventory) -> dict[str, Any]:
    """The machine-file document (a dict ready for YAML) reproducing ``inv``."""
    doc: dict[str, Any] = {"name": _name(inv)}
    doc["hostname"] = inv.hostname or ""
    doc["cpu"] = _cpu(inv)
    doc["numa"] = _numa(inv)
    drivers = [g.driver_version for g in inv.gpus if g.probe == "nvidia" and g.driver_version]
    if drivers:
        doc["nvml"] = {"driver_version": drivers[0]}
    amd = [g for g in inv.gpus if g.vendor == "amd" and g.memory_bytes]
    if amd:
        others = {g.bus_id for g in amd}
        full = all(set(g.xgmi_peers) == others - {g.bus_id} for g in amd) and len(amd) > 1
        section: dict[str, Any] = {"xgmi": "fully_connected" if full else "none"}
        link = next((x for g in amd for x in g.xgmi_links), None)
        if link is not None and link.min_bandwidth_mbps is not None:
            section["xgmi_bandwidth_mbps"] = [link.min_bandwidth_mbps, link.max_bandwidth_mbps]
        doc["amd"] = section
    switches = {s.bus_id for s in inv.nvswitches}
    node_cpus = {n.id: sorted(n.cpus) for n in inv.numa_nodes if n.cpus}
    parent_numa: dict[str, int] = {}
    depth = {d.bus_id: len(d.upstream_bridges) for d in inv.pci_devices}
    ordered = sorted(inv.pci_devices, key=lambda d: (depth[d.bus_id], d.bus_id))
    entries = {d.bus_id: _device(d, inv, parent_numa, node_cpus, switches) for d in ordered}
    doc["pci"] = [entries[d.bus_id] for d in inv.pci_devices]
    doc["net"] = [_net(n) for n in inv.net_interfaces if n.bus_id is None]
    virtual_rdma = [_rdma(r) for r in inv.rdma_devices if r.bus_id is None]
    if virtual_rdma:
        doc["rdma"] = virtual_rdma
    return doc


class _Dumper(yaml.SafeDumper):
    pass


def _mapping(dumper: yaml.SafeDumper, data: dict[str, Any]) -> yaml.MappingNode:
    # Short mappings of scalars on one line (a PCI function, a core, a NUMA node).
    flow = all(not isinstance(v, dict | list) for v in data.values()) and len(data) <= 12
    return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=flow)


def _sequence(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.SequenceNode:
    # A list of scalars (a SLIT row, per-CPU ids, a port's [min, max]) on one line.
    flow = all(not isinstance(v, dict | list) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(dict, _mapping)
_Dumper.add_representer(list, _sequence)


def capture_yaml(inv: Inventory, origin: str) -> str:
    """The machine file as text, with the header comments the format asks for."""
    doc = capture_machine(inv)
    header = (
        f"# {doc['name']}: captured by `toposlice machines capture` from {origin}.\n"
        "#\n"
        "# Every value comes from the inventory; nothing is assumed except what the format\n"
        '# cannot carry (docs/fake-hardware.md, "Captured machines").\n'
    )
    body = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
    return header + body


def capture_differences(original: Inventory, replayed: Inventory) -> list[str]:
    """Inventory sections where the machine generated from a capture differs from the
    original, leaving out the fields the format does not capture."""
    a, b = original.to_dict(), replayed.to_dict()
    diffs = []
    for key in sorted(set(a) | set(b)):
        if key in NOT_CAPTURED[""]:
            continue
        left, right = a.get(key), b.get(key)
        masked = NOT_CAPTURED.get(key, ())
        if masked and isinstance(left, list) and isinstance(right, list):
            left = [{k: v for k, v in x.items() if k not in masked} for x in left]
            right = [{k: v for k, v in x.items() if k not in masked} for x in right]
        present = CAPTURED_WHEN_PRESENT.get(key, ())
        if present and isinstance(left, list) and isinstance(right, list):
            right = [
                {k: (None if k in present and x.get(k) is None else v) for k, v in y.items()}
                for x, y in zip(left, right, strict=False)
            ] + right[len(left) :]
        if left != right:
            diffs.append(key)
    return diffs
