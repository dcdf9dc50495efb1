"""Write a Linux-shaped sysfs (and a little procfs) tree for a :class:`MachineSpec`.

The layout follows the kernel's: real directories for PCI functions nested under
their bridges below ``sys/devices/pci<DDDD>:<BB>``, relative symlinks for every
``bus/`` and ``class/`` view, per-CPU topology and cache directories, NUMA nodes,
net/RDMA class devices and the KFD topology of AMD GPUs. Output is deterministic:
the same spec always produces byte-identical files and links.

Besides what toposlice's own discovery reads, the tree carries the files other DRA
drivers read when it is bind-mounted over ``/sys`` (docs/fake-hardware.md, "Running
another driver on a fake machine"): ``pci_bus/<DDDD:BB>/cpulistaffinity`` and
``cpuaffinity`` of every PCI root and ``devices/system/cpu/smt/{control,active}``
(dra-driver-cpu), a ``modalias`` per PCI function and ``hugepages/`` per NUMA node
(dranet, through ghw), and a ``resource`` file per PCI function (the NVIDIA GPU
plugin, through go-nvlib).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from discovery.fake.spec import MachineSpec, NetSpec, PciDeviceSpec, RdmaSpec, bdf_key
from discovery.readers import format_cpulist

__all__ = ["build_sysfs", "cpumask", "function_dir", "modalias"]


def cpumask(cpus: Iterable[int], nr_cpus: int) -> str:
    """Kernel bitmap format: 32-bit hex words, most significant first, comma-separated."""
    value = 0
    for c in cpus:
        value |= 1 << c
    words = max(1, (nr_cpus + 31) // 32)
    return ",".join(f"{(value >> (32 * w)) & 0xFFFFFFFF:08x}" for w in reversed(range(words)))


def function_dir(spec: MachineSpec, bdf: str) -> str:
    """Path of a PCI function's directory relative to ``sys/``."""
    chain = [d.bdf for d in spec.ancestors(bdf)]
    return "/".join(["devices", spec.pcie_root(bdf), *chain, bdf])


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


class _Writer:
    def __init__(self, base: Path) -> None:
        self.base = str(base)
        self.made: set[str] = set()

    def mkdir(self, rel: str) -> str:
        path = os.path.join(self.base, rel)
        if rel not in self.made:
            os.makedirs(path, exist_ok=True)
            self.made.add(rel)
        return path

    def files(self, rel_dir: str, entries: dict[str, str]) -> None:
        dfd = os.open(self.mkdir(rel_dir), os.O_RDONLY | os.O_DIRECTORY)
        try:
            for name, text in entries.items():
                fd = os.open(name, _CREATE, 0o644, dir_fd=dfd)
                try:
                    os.write(fd, (text + "\n").encode())
                finally:
                    os.close(fd)
        finally:
            os.close(dfd)

    def link(self, rel_link: str, rel_target: str) -> None:
        """Symlink ``rel_link`` -> ``rel_target`` (both relative to the base), relative."""
        parent = os.path.dirname(rel_link)
        self.mkdir(parent)
        target = os.path.relpath(rel_target, parent or ".")
        os.symlink(target, os.path.join(self.base, rel_link))


def build_sysfs(spec: MachineSpec, root: Path) -> None:
    """Create ``root/sys``, ``root/proc/cpuinfo`` and ``root/etc/hostname`` for ``spec``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    if (root / "sys").exists():
        raise FileExistsError(f"{root / 'sys'} already exists")
    w = _Writer(root / "sys")
    _build_cpus(spec, w)
    _build_numa(spec, w)
    _build_pci(spec, w)
    if spec.net is None:
        _build_loopback(w)
    else:
        _build_virtual_net(spec, w)
    for rdma in spec.rdma:
        rel = f"devices/virtual/infiniband/{rdma.name}"
        _write_rdma(rdma, rel, w)
        w.link(f"class/infiniband/{rdma.name}", rel)
    if spec.amd_gpus():
        _build_kfd(spec, w)
    _build_host_files(spec, root)


# --------------------------------------------------------------------------- CPUs


def _build_cpus(spec: MachineSpec, w: _Writer) -> None:
    if spec.cpu.cores is not None:
        _build_explicit_cpus(spec, w)
        return
    cpu = spec.cpu
    n = cpu.count
    all_list = f"0-{n - 1}" if n > 1 else "0"
    w.files(
        "devices/system/cpu",
        {"online": all_list, "possible": all_list, "present": all_list, "offline": ""},
    )
    _write_smt(w, cpu.threads_per_core > 1)
    node_of = {c: node.id for node in spec.numa_nodes for c in node.cpus}
    layout = list(cpu.layout())
    # Groups: SMT siblings per core, package members, L2 and L3 sharing groups.
    core_members: dict[tuple[int, int], list[int]] = {}
    package_members: dict[int, list[int]] = {}
    l2_members: dict[tuple[int, int], list[int]] = {}
    l3_members: dict[tuple[int, int], list[int]] = {}
    for cid, s, c, _t in layout:
        core_members.setdefault((s, c), []).append(cid)
        package_members.setdefault(s, []).append(cid)
        l2_members.setdefault((s, c // cpu.l2_cores), []).append(cid)
        l3_members.setdefault((s, c // cpu.l3_cores), []).append(cid)
    as_list = {k: format_cpulist(v) for k, v in core_members.items()}
    pkg_list = {k: format_cpulist(v) for k, v in package_members.items()}
    l2_list = {k: format_cpulist(v) for k, v in l2_members.items()}
    l3_list = {k: format_cpulist(v) for k, v in l3_members.items()}
    l2_per_socket = cpu.cores_per_socket // cpu.l2_cores
    l3_per_socket = cpu.cores_per_socket // cpu.l3_cores
    for cid, s, c, _t in layout:
        base = f"devices/system/cpu/cpu{cid}"
        core_key = (s, c)
        l2_key = (s, c // cpu.l2_cores)
        l3_key = (s, c // cpu.l3_cores)
        cluster = s * l2_per_socket + l2_key[1]
        w.files(
            f"{base}/topology",
            {
                "physical_package_id": str(s),
                "die_id": "0",
                "core_id": str(c),
                "cluster_id": str(cluster),
                "core_cpus_list": as_list[core_key],
                "thread_siblings_list": as_list[core_key],
                "package_cpus_list": pkg_list[s],
            },
        )
        core_global = s * cpu.cores_per_socket + c
        # index1 (L1 instruction) is left out: no consumer needs it and it is 1/4 of the files.
        caches = [
            (0, 1, "Data", f"{cpu.l1d_kb}K", as_list[core_key], core_global),
            (2, 2, "Unified", f"{cpu.l2_kb}K", l2_list[l2_key], cluster),
            (3, 3, "Unified", f"{cpu.l3_kb}K", l3_list[l3_key], s * l3_per_socket + l3_key[1]),
        ]
        for index, level, ctype, size, shared, cache_id in caches:
            w.files(
                f"{base}/cache/index{index}",
                {
                    "level": str(level),
                    "type": ctype,
                    "size": size,
                    "shared_cpu_list": shared,
                    "id": str(cache_id),
                },
            )
        if cid in node_of:
            os.symlink(
                f"../../node/node{node_of[cid]}",
                os.path.join(w.base, base, f"node{node_of[cid]}"),
            )
        _write_cpufreq(spec, w, base)


def _write_smt(w: _Writer, siblings: bool) -> None:
    """``smt/control`` and ``smt/active`` as the kernel's CPU hotplug code writes them:
    ``on``/``1`` when a core has sibling threads; ``notsupported``/``0`` when none has
    (the kernel's word for a CPU without SMT; its others: ``off``, ``forceoff``,
    ``notimplemented``)."""
    w.files(
        "devices/system/cpu/smt",
        {"control": "on" if siblings else "notsupported", "active": "1" if siblings else "0"},
    )


def _write_cpufreq(spec: MachineSpec, w: _Writer, base: str) -> None:
    if spec.cpu.max_mhz is not None:
        w.files(f"{base}/cpufreq", {"cpuinfo_max_freq": str(spec.cpu.max_mhz * 1000)})


def _build_explicit_cpus(spec: MachineSpec, w: _Writer) -> None:
    """A captured layout: only the files the capture knows (absent ids: no file)."""
    cpu = spec.cpu
    assert cpu.cores is not None
    ids = cpu.ids()
    online = format_cpulist(ids)
    w.files(
        "devices/system/cpu",
        {"online": online, "possible": online, "present": online, "offline": ""},
    )
    _write_smt(w, any(len(core.cpus) > 1 for core in cpu.cores))
    node_of = {c: node.id for node in spec.numa_nodes for c in node.cpus}
    package: dict[int | None, list[int]] = {}
    for core in cpu.cores:
        package.setdefault(core.socket, []).extend(core.cpus)
    cache_of = {c: cache for cache in cpu.caches or () for c in cache.cpus}
    for core in cpu.cores:
        siblings = format_cpulist(core.cpus)
        for cid in core.cpus:
            base = f"devices/system/cpu/cpu{cid}"
            topo = {"core_cpus_list": siblings, "thread_siblings_list": siblings}
            core_id = core.core_ids[core.cpus.index(cid)] if core.core_ids else core.core
            topo |= _present(
                (
                    ("physical_package_id", core.socket),
                    ("die_id", core.die),
                    ("cluster_id", core.cluster),
                    ("core_id", core_id),
                )
            )
            if core.socket is not None:
                topo["package_cpus_list"] = format_cpulist(package[core.socket])
            w.files(f"{base}/topology", topo)
            cache = cache_of.get(cid)
            if cache is not None:
                files = {
                    "level": str(cache.level),
                    "type": cache.type,
                    "shared_cpu_list": format_cpulist(cache.cpus),
                }
                if cache.size_bytes is not None:
                    kib, rest = divmod(cache.size_bytes, 1024)
                    files["size"] = f"{kib}K" if not rest else str(cache.size_bytes)
                if cache.id is not None:
                    files["id"] = str(cache.id)
                w.files(f"{base}/cache/index{cache.level}", files)
            if cid in node_of:
                os.symlink(
                    f"../../node/node{node_of[cid]}",
                    os.path.join(w.base, base, f"node{node_of[cid]}"),
                )
            _write_cpufreq(spec, w, base)


# --------------------------------------------------------------------------- NUMA


def _build_numa(spec: MachineSpec, w: _Writer) -> None:
    nodes = spec.numa_nodes
    ids = [n.id for n in nodes]
    n_cpus = spec.cpu.nr_cpus
    w.files(
        "devices/system/node",
        {
            "online": format_cpulist(ids),
            "possible": format_cpulist(ids),
            "has_cpu": format_cpulist(n.id for n in nodes if n.cpus),
            "has_memory": format_cpulist(n.id for n in nodes if n.memory_kb > 0),
            "has_normal_memory": format_cpulist(n.id for n in nodes if n.memory_kb > 0),
        },
    )
    for i, node in enumerate(nodes):
        total = node.memory_kb
        meminfo = "\n".join(
            [
                f"Node {node.id} MemTotal:       {total:>10} kB",
                f"Node {node.id} MemFree:        {total:>10} kB",
                f"Node {node.id} MemUsed:        {0:>10} kB",
            ]
        )
        w.files(
            f"devices/system/node/node{node.id}",
            {
                "cpulist": format_cpulist(node.cpus),
                "cpumap": cpumask(node.cpus, n_cpus),
                "distance": " ".join(str(d) for d in spec.distances[i]),
                "meminfo": meminfo,
            },
        )
        w.mkdir(f"devices/system/node/node{node.id}/hugepages")  # no pools reserved


# --------------------------------------------------------------------------- PCI


def _hex(value: int, digits: int) -> str:
    return f"0x{value:0{digits}x}"


def _speed(gts: float) -> str:
    return f"{gts:.1f} GT/s PCIe"


def _build_pci(spec: MachineSpec, w: _Writer) -> None:
    n_cpus = spec.cpu.nr_cpus
    all_cpus = spec.cpu.ids()
    node_cpus = {n.id: list(n.cpus) for n in spec.numa_nodes}
    w.mkdir("bus/pci/devices")
    w.mkdir("bus/pci/drivers")
    roots: set[str] = set()
    in_bus_order = sorted(spec.pci, key=bdf_key)
    root_of = {dev.bdf: spec.pcie_root(dev.bdf) for dev in in_bus_order}
    resource = _resource_files(in_bus_order)
    for dev in spec.pci:
        rel = function_dir(spec, dev.bdf)
        root = root_of[dev.bdf]
        if root not in roots:
            roots.add(root)
            w.mkdir(f"devices/{root}")
            affinity = _root_affinity(root, in_bus_order, root_of, node_cpus, all_cpus)
            w.files(
                f"devices/{root}/pci_bus/{root[3:]}",
                {
                    "cpulistaffinity": format_cpulist(affinity),
                    "cpuaffinity": cpumask(affinity, n_cpus),
                },
            )
        local = (
            list(dev.local_cpus)
            if dev.local_cpus is not None
            else node_cpus.get(dev.numa_node) or all_cpus
        )
        ids = (
            ("vendor", dev.vendor),
            ("device", dev.device),
            ("subsystem_vendor", dev.subsystem_vendor),
            ("subsystem_device", dev.subsystem_device),
        )
        files = {"class": _hex(dev.class_code, 6)}
        files |= _present((name, None if v is None else _hex(v, 4)) for name, v in ids)
        files |= {
            "revision": _hex(dev.revision, 2),
            "numa_node": str(dev.numa_node),
            "local_cpus": cpumask(local, n_cpus),
            "local_cpulist": format_cpulist(local),
            "enable": "1",
        }
        if dev.link_speed is not None:
            files["current_link_speed"] = _speed(dev.link_speed)
        if dev.max_link_speed is not None:
            files["max_link_speed"] = _speed(dev.max_link_speed)
        if dev.link_width is not None:
            files["current_link_width"] = str(dev.link_width)
        if dev.max_link_width is not None:
            files["max_link_width"] = str(dev.max_link_width)
        if dev.sriov_totalvfs is not None:
            files["sriov_totalvfs"] = str(dev.sriov_totalvfs)
            files["sriov_numvfs"] = str(dev.sriov_numvfs or 0)
        if dev.amd is not None and dev.amd.name is not None:
            files["product_name"] = dev.amd.name  # amdgpu's marketing name (from the FRU)
        files["modalias"] = modalias(dev)
        files["resource"] = resource[dev.bdf]
        w.files(rel, files)
        if dev.udev_names is not None:
            vendor, model = dev.udev_names
            lines = []
            if vendor is not None:
                lines.append(f"E:ID_VENDOR_FROM_DATABASE={vendor}")
            if model is not None:
                lines.append(f"E:ID_MODEL_FROM_DATABASE={model}")
            udev = os.path.join(os.path.dirname(w.base), "run", "udev", "data")
            os.makedirs(udev, exist_ok=True)
            with open(os.path.join(udev, f"+pci:{dev.bdf}"), "w", encoding="utf-8") as fh:
                fh.write("\n".join(lines) + "\n")
        if dev.iommu_group is not None:
            group = f"kernel/iommu_groups/{dev.iommu_group}"
            w.link(f"{rel}/iommu_group", group)
            w.link(f"{group}/devices/{dev.bdf}", rel)
        w.link(f"bus/pci/devices/{dev.bdf}", rel)
        w.link(f"{rel}/subsystem", "bus/pci")
        if dev.driver is not None:
            w.mkdir(f"bus/pci/drivers/{dev.driver}")
            w.link(f"{rel}/driver", f"bus/pci/drivers/{dev.driver}")
        _build_net(dev, rel, w)
        _build_rdma(dev, rel, w)
        if dev.amd is not None:
            w.mkdir(f"{rel}/drm/card{dev.amd.card}")
            w.mkdir(f"{rel}/drm/renderD{dev.amd.render_minor}")
            w.link(f"class/drm/card{dev.amd.card}", f"{rel}/drm/card{dev.amd.card}")
            w.link(
                f"class/drm/renderD{dev.amd.render_minor}",
                f"{rel}/drm/renderD{dev.amd.render_minor}",
            )
    # SR-IOV links once every function directory exists.
    for dev in spec.pci:
        if dev.sriov_totalvfs is None:
            continue
        pf_rel = function_dir(spec, dev.bdf)
        vfs = sorted((v for v in spec.pci if v.physfn == dev.bdf), key=lambda v: v.bdf)
        for i, vf in enumerate(vfs):
            vf_rel = function_dir(spec, vf.bdf)
            w.link(f"{pf_rel}/virtfn{i}", vf_rel)
            w.link(f"{vf_rel}/physfn", pf_rel)


def _root_affinity(
    root: str,
    in_bus_order: list[PciDeviceSpec],
    root_of: dict[str, str],
    node_cpus: dict[int, list[int]],
    all_cpus: list[int],
) -> list[int]:
    """CPUs of a PCI root bus (``pci_bus/<DDDD:BB>/cpulistaffinity``): those of the NUMA
    node of its devices (the first, in bus order, that has one); every CPU when none has
    a node (-1) or the node has no CPUs, as the kernel gives the online mask then."""
    for dev in in_bus_order:
        if root_of[dev.bdf] == root and dev.numa_node >= 0:
            return node_cpus.get(dev.numa_node) or all_cpus
    return all_cpus


def modalias(dev: PciDeviceSpec) -> str:
    """The kernel's ``modalias`` of a PCI function (``pci:v…d…sv…sd…bc…sc…i…``); an id
    whose file is absent reads 0."""
    cls = dev.class_code
    return (
        f"pci:v{dev.vendor or 0:08X}d{dev.device or 0:08X}"
        f"sv{dev.subsystem_vendor or 0:08X}sd{dev.subsystem_device or 0:08X}"
        f"bc{(cls >> 16) & 0xFF:02X}sc{(cls >> 8) & 0xFF:02X}i{cls & 0xFF:02X}"
    )


#: ``resource`` flags (IORESOURCE_* bits and the BAR's own low bits), as Linux prints them.
_MEM32 = 0x40200  # 32-bit memory BAR
_MEM64 = 0x140204  # 64-bit memory BAR
_MEM64_PREF = 0x14220C  # 64-bit prefetchable memory BAR
_MiB = 1 << 20
_GiB = 1 << 30


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _bars(dev: PciDeviceSpec) -> dict[int, tuple[int, int]]:
    """BAR index -> (size, flags) of a function: what its kind of device has on real
    hardware (sizes of the common parts), nothing for bridges."""
    base_class = dev.class_code >> 16
    if dev.is_bridge:
        return {}
    if dev.vendor == 0x10DE and base_class == 0x03:  # NVIDIA GPU: registers, FB aperture
        fb = dev.nvidia.memory_bytes if dev.nvidia is not None else 0
        return {
            0: (16 * _MiB, _MEM32),
            1: (_pow2_at_least(fb) if fb else 128 * _GiB, _MEM64_PREF),
            3: (32 * _MiB, _MEM64_PREF),
        }
    if dev.amd is not None:  # amdgpu: VRAM (resizable BAR), doorbells, registers
        return {
            0: (_pow2_at_least(dev.amd.vram_bytes), _MEM64_PREF),
            2: (2 * _MiB, _MEM64_PREF),
            5: (512 * 1024, _MEM32),
        }
    if base_class == 0x02:  # network (ConnectX, E810: 64-bit prefetchable)
        return {0: ((2 if dev.physfn is not None else 32) * _MiB, _MEM64_PREF)}
    if base_class == 0x01:  # storage (NVMe)
        return {0: (16 * 1024, _MEM64)}
    return {0: (32 * _MiB if dev.vendor == 0x10DE else _MiB, _MEM32)}


def _resource_files(in_bus_order: list[PciDeviceSpec]) -> dict[str, str]:
    """Bus id -> the function's ``resource`` file: one ``start end flags`` line per
    resource, 6 BARs, the ROM and 6 SR-IOV BARs (a bridge: and its 4 windows); unused
    ones read zeros. Addresses are distinct and naturally aligned, handed out in bus
    order: 32-bit BARs below 4 GiB (from 2 GiB), 64-bit ones from 32 TiB."""
    low, low_end, high = 0x80000000, 0xFEC00000, 0x200000000000
    out: dict[str, str] = {}
    for dev in in_bus_order:
        bars = _bars(dev)
        lines = []
        for index in range(17 if dev.is_bridge else 13):
            start = end = flags = 0
            if index in bars:
                size, flags = bars[index]
                if flags == _MEM32 and -(-low // size) * size + size <= low_end:
                    start = -(-low // size) * size
                    low = start + size
                else:
                    if flags == _MEM32:
                        flags = _MEM64  # the 32-bit window is full: placed above 4 GiB
                    start = -(-high // size) * size
                    high = start + size
                end = start + size - 1
            lines.append(f"0x{start:016x} 0x{end:016x} 0x{flags:016x}")
        out[dev.bdf] = "\n".join(lines)
    return out


def _build_net(dev: PciDeviceSpec, rel: str, w: _Writer) -> None:
    for ifindex, net in enumerate(dev.net, start=2):
        nrel = f"{rel}/net/{net.name}"
        files = _net_files(net, ifindex)
        files["carrier"] = "1" if net.operstate == "up" else "0"
        w.files(nrel, files)
        w.link(f"{nrel}/device", rel)
        w.link(f"{nrel}/subsystem", "class/net")
        w.link(f"class/net/{net.name}", nrel)


def _present(values: Iterable[tuple[str, object]]) -> dict[str, str]:
    """File name -> text for the values that exist (None: the file is absent)."""
    return {name: str(value) for name, value in values if value is not None}


def _net_files(net: NetSpec, ifindex: int) -> dict[str, str]:
    return {"ifindex": str(ifindex)} | _present(
        (
            ("address", net.address),
            ("mtu", net.mtu),
            ("operstate", net.operstate),
            ("type", net.type),
            ("speed", net.speed),
        )
    )


def _build_rdma(dev: PciDeviceSpec, rel: str, w: _Writer) -> None:
    for rdma in dev.rdma:
        irel = f"{rel}/infiniband/{rdma.name}"
        _write_rdma(rdma, irel, w)
        w.link(f"{irel}/device", rel)
        w.link(f"class/infiniband/{rdma.name}", irel)


def _write_rdma(rdma: RdmaSpec, irel: str, w: _Writer) -> None:
    files = _present(
        (
            ("node_guid", rdma.node_guid),
            ("sys_image_guid", rdma.sys_image_guid),
            ("fw_ver", rdma.fw_ver),
            ("board_id", rdma.board_id),
            ("hca_type", rdma.hca_type),
        )
    )
    w.files(irel, files | {"node_type": "1: CA"})
    for port in rdma.ports:
        prel = f"{irel}/ports/{port.port}"
        w.files(
            prel,
            {
                "rate": port.rate,
                "state": port.state,
                "phys_state": port.phys_state,
                "link_layer": port.link_layer,
            },
        )
        if port.netdev is not None:
            w.files(f"{prel}/gid_attrs/ndevs", {"0": port.netdev, "1": port.netdev})
            w.files(f"{prel}/gid_attrs/types", {"0": "IB/RoCE v1", "1": "RoCE v2"})


def _build_virtual_net(spec: MachineSpec, w: _Writer) -> None:
    """Interfaces on no PCI function, as captured (bridges, VLANs, ``lo``)."""
    for ifindex, net in enumerate(spec.net or (), start=1):
        rel = f"devices/virtual/net/{net.name}"
        w.files(rel, _net_files(net, ifindex))
        w.link(f"class/net/{net.name}", rel)
    w.mkdir("class/net")


def _build_loopback(w: _Writer) -> None:
    rel = "devices/virtual/net/lo"
    w.files(
        rel,
        {
            "address": "00:00:00:00:00:00",
            "mtu": "65536",
            "operstate": "unknown",
            "type": "772",
            "ifindex": "1",
            "carrier": "1",
        },
    )
    w.link("class/net/lo", rel)


# --------------------------------------------------------------------------- KFD


def _props(entries: list[tuple[str, int | str]]) -> str:
    return "\n".join(f"{k} {v}" for k, v in entries)


def _build_kfd(spec: MachineSpec, w: _Writer) -> None:
    assert spec.amd is not None
    amd = spec.amd
    base = "class/kfd/kfd/topology"
    cpu_nodes = [n for n in spec.numa_nodes if n.cpus]
    gpus = spec.amd_gpus()
    w.files(base, {"generation_id": "1", "system_properties": "platform_oem 0"})
    kfd_of_numa = {n.id: i for i, n in enumerate(cpu_nodes)}
    first_gpu = len(cpu_nodes)
    gpu_node = {g.bdf: first_gpu + i for i, g in enumerate(gpus)}
    # Directed io_links: GPU -> its CPU node (PCIe), GPU -> every other GPU (xGMI);
    # CPU -> each local GPU (PCIe).
    links: dict[int, list[tuple[int, int, int, int, int, int]]] = {}
    for g in gpus:
        me = gpu_node[g.bdf]
        cpu_node = kfd_of_numa.get(g.numa_node, 0)
        lo, hi = amd.pcie_bandwidth_mbps
        links.setdefault(me, []).append((2, me, cpu_node, 20, lo, hi))
        links.setdefault(cpu_node, []).append((2, cpu_node, me, 20, lo, hi))
        if amd.xgmi == "fully_connected":
            for peer in gpus:
                if peer.bdf != g.bdf:
                    xl, xh = amd.xgmi_bandwidth_mbps
                    links[me].append((11, me, gpu_node[peer.bdf], 15, xl, xh))
    for i, node in enumerate(cpu_nodes):
        ndir = f"{base}/nodes/{i}"
        w.files(
            ndir,
            {
                "properties": _props(
                    [
                        ("cpu_cores_count", len(node.cpus)),
                        ("simd_count", 0),
                        ("mem_banks_count", 1),
                        ("io_links_count", len(links.get(i, []))),
                        ("drm_render_minor", 0),
                        ("vendor_id", 0),
                        ("device_id", 0),
                        ("location_id", 0),
                        ("domain", 0),
                        ("hive_id", 0),
                        ("unique_id", 0),
                    ]
                ),
                "gpu_id": "0",
                "name": "",
            },
        )
        w.files(
            f"{ndir}/mem_banks/0",
            {"properties": _props([("size_in_bytes", node.memory_kb * 1024)])},
        )
        _write_links(w, ndir, links.get(i, []))
    for g in gpus:
        assert g.amd is not None
        me = gpu_node[g.bdf]
        ndir = f"{base}/nodes/{me}"
        location = (g.bus << 8) | (g.dev << 3) | g.fn
        w.files(
            ndir,
            {
                "properties": _props(
                    [
                        ("cpu_cores_count", 0),
                        ("simd_count", g.amd.simd_count),
                        ("mem_banks_count", 1),
                        ("io_links_count", len(links.get(me, []))),
                        ("simd_per_cu", g.amd.simd_per_cu),
                        ("drm_render_minor", g.amd.render_minor),
                        ("vendor_id", g.vendor or 0),
                        ("device_id", g.device or 0),
                        ("location_id", location),
                        ("domain", g.domain),
                        ("hive_id", g.amd.hive_id if amd.xgmi == "fully_connected" else 0),
                        ("unique_id", g.amd.unique_id),
                        ("gfx_target_version", g.amd.gfx_target_version),
                        ("num_sdma_xgmi_engines", 6),
                    ]
                ),
                "gpu_id": str(0x1000 + (g.amd.unique_id & 0xEFFF)),
                "name": "gfx942",
            },
        )
        w.files(
            f"{ndir}/mem_banks/0", {"properties": _props([("size_in_bytes", g.amd.vram_bytes)])}
        )
        _write_links(w, ndir, links.get(me, []))


def _write_links(w: _Writer, ndir: str, links: list[tuple[int, int, int, int, int, int]]) -> None:
    w.mkdir(f"{ndir}/io_links")
    for m, (ltype, src, dst, weight, min_bw, max_bw) in enumerate(links):
        w.files(
            f"{ndir}/io_links/{m}",
            {
                "properties": _props(
                    [
                        ("type", ltype),
                        ("version_major", 0),
                        ("version_minor", 0),
                        ("node_from", src),
                        ("node_to", dst),
                        ("weight", weight),
                        ("min_latency", 0),
                        ("max_latency", 0),
                        ("min_bandwidth", min_bw),
                        ("max_bandwidth", max_bw),
                        ("recommended_transfer_size", 0),
                        ("flags", 1),
                    ]
                ),
            },
        )


# --------------------------------------------------------------------------- /proc, /etc


def _build_host_files(spec: MachineSpec, root: Path) -> None:
    cpu = spec.cpu
    lines: list[str] = []
    extra = dict(cpu.cpuinfo)
    for cid in cpu.ids():
        lines.append(f"processor\t: {cid}")
        if cpu.arch == "x86_64" and "vendor_id" not in extra:
            lines.append(f"vendor_id\t: {cpu.vendor}")
        lines.append(f"model name\t: {cpu.model}")
        lines.extend(f"{key}\t: {value}" for key, value in cpu.cpuinfo)
        lines.append("")
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc" / "cpuinfo").write_text("\n".join(lines) + "\n")
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc" / "hostname").write_text(spec.hostname + "\n")
