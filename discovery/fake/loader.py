"""The YAML loader of fake machines: validates a machine file into a :class:`MachineSpec`.

The YAML format is documented in docs/fake-hardware.md. The loader validates
everything it reads and raises :class:`ValueError` naming the file and the exact
place of the problem (unknown key, missing field, malformed PCI bus id, dangling
reference). Templates are merged and ids derived here, so the sysfs builder and the
fake NVML only read the dataclasses.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from discovery.fake import ids
from discovery.fake.pci_checks import check_bus_ranges, check_nvswitch_links, check_root_numa
from discovery.fake.spec import (
    NVML_FUNCTIONS,
    AmdGpuSpec,
    AmdSpec,
    CacheSpec,
    CoreSpec,
    CpuSpec,
    FabricSpec,
    MachineSpec,
    NetSpec,
    NumaNodeSpec,
    NvidiaGpuSpec,
    NvLinkSpec,
    NvmlSpec,
    PciDeviceSpec,
    RdmaPortSpec,
    RdmaSpec,
    bdf_key,
)
from discovery.fake.switches import expand_pci
from discovery.fake.yaml_lines import load as load_yaml_text
from discovery.fake.yaml_lines import where_at
from discovery.nvml_codes import FABRIC_STATES, NVLINK_VERSION_ENUM, NVML_ERROR_CODES
from discovery.readers import format_cpulist

__all__ = ["load_file", "load_yaml", "parse_bdf", "parse_machine"]

_BDF_RE = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def parse_bdf(text: Any, where: str) -> str:
    """Validate a PCI bus id and return it in sysfs form (``dddd:bb:dd.f``)."""
    if not isinstance(text, str):
        raise ValueError(f"{where}: bad PCI bus id {text!r} (want a string 'dddd:bb:dd.f')")
    m = _BDF_RE.match(text.strip())
    if not m:
        raise ValueError(f"{where}: bad PCI bus id {text!r} (want 'dddd:bb:dd.f', hex)")
    dom, bus, dev, fn = (int(g, 16) for g in m.groups())
    if dev > 0x1F:
        raise ValueError(f"{where}: bad PCI bus id {text!r} (device number > 0x1f)")
    return f"{dom:04x}:{bus:02x}:{dev:02x}.{fn:x}"


def _parse_list(text: Any, where: str) -> tuple[int, ...]:
    if isinstance(text, int) and not isinstance(text, bool):
        return (int(text),)
    if not isinstance(text, str):
        raise ValueError(f"{where}: want a list string like '0-3,8', got {text!r}")
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi < lo:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
        except ValueError:
            raise ValueError(f"{where}: malformed list {text!r}") from None
    return tuple(sorted(out))


class _Node:
    """A YAML mapping with the path used in error messages and key checking."""

    def __init__(self, data: Any, where: str, allowed: set[str] | None = None) -> None:
        if not isinstance(data, dict):
            raise ValueError(f"{where}: want a mapping, got {type(data).__name__}")
        self.data: dict[str, Any] = data
        self.where = where
        if allowed is not None:
            unknown = sorted(str(k) for k in data if k not in allowed)
            if unknown:
                raise ValueError(
                    f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})"
                )

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def raw(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def req(self, key: str) -> Any:
        if key not in self.data or self.data[key] is None:
            raise ValueError(f"{self.where}: missing required key {key!r}")
        return self.data[key]

    def get_int(self, key: str, default: int | None = None, required: bool = False) -> int:
        value = self.req(key) if required or default is None else self.data.get(key, default)
        if value is None:
            value = default
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, str):
                try:
                    return int(value, 0)
                except ValueError:
                    pass
            raise ValueError(f"{self.where}: {key} must be an integer, got {value!r}")
        return int(value)  # a plain int: the spelling stays in the loader

    def opt_int(self, key: str) -> int | None:
        if not self.has(key):
            return None
        return self.get_int(key, required=True)

    def get_str(self, key: str, default: str | None = None) -> str:
        value = self.req(key) if default is None else self.data.get(key, default)
        if value is None:
            value = default
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ValueError(f"{self.where}: {key} must be a string, got {value!r}")
        return str(value)

    def opt_float(self, key: str) -> float | None:
        if not self.has(key):
            return None
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{self.where}: {key} must be a number, got {value!r}")
        return float(value)

    def get_list(self, key: str) -> list[Any]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise ValueError(f"{self.where}: {key} must be a list, got {type(value).__name__}")
        return value


_TOP_KEYS = {
    "name",
    "hostname",
    "cpu",
    "numa",
    "device_types",
    "pci",
    "nvml",
    "amd",
    "net",
    "rdma",
}
_REGULAR_CPU_KEYS = {
    "sockets",
    "cores_per_socket",
    "threads_per_core",
    "numbering",
    "l1d_kb",
    "l2_kb",
    "l3_kb",
    "l2_cores",
    "l3_cores",
}
"""The compact CPU layout; an explicit ``cores`` list replaces all of them."""
_CPU_KEYS = {"cores", "caches", "cpuinfo", "max_mhz", "model", "arch", "vendor"} | (
    _REGULAR_CPU_KEYS
)
_NUMA_KEYS = {"nodes", "distances"}
_NODE_KEYS = {"id", "ids", "cpus", "memory_mb", "memory_kb", "socket", "gpu"}
_CORE_KEYS = {"cpus", "socket", "die", "cluster", "core"}
_CACHE_KEYS = {"cpus", "level", "type", "size_kb", "size_bytes", "id"}
_DIST_KEYS = {"local", "same_socket", "remote", "overrides"}
_DEVICE_KEYS = {
    "bdf",
    "type",
    "parent",
    "class",
    "vendor",
    "device",
    "subsystem_vendor",
    "subsystem_device",
    "revision",
    "driver",
    "numa_node",
    "link_speed",
    "link_width",
    "max_link_speed",
    "max_link_width",
    "sriov_totalvfs",
    "sriov_numvfs",
    "physfn",
    "net",
    "net_defaults",
    "rdma",
    "rdma_defaults",
    "nvidia",
    "amd",
    "iommu_group",
    "local_cpus",
    "udev_names",
}
_NET_KEYS = {"name", "address", "mtu", "operstate", "speed", "type"}
_RDMA_KEYS = {
    "name",
    "node_guid",
    "sys_image_guid",
    "fw_ver",
    "board_id",
    "hca_type",
    "ports",
    "rate",
    "state",
    "phys_state",
    "link_layer",
}
_NVIDIA_KEYS = {
    "name",
    "memory_mib",
    "memory_used_mib",
    "compute_capability",
    "uuid",
    "minor",
    "mig_mode",
    "nvlink_version",
    "nvlinks",
    "nvlinks_down",
    "nvml_errors",
    "fabric",
}
_NVLINK_KEYS = {"remote", "count", "type", "external"}
_FABRIC_KEYS = {"cluster_uuid", "clique_id", "state", "status", "health_mask", "health_summary"}
_AMD_GPU_KEYS = {
    "name",
    "vram_gib",
    "vram_mib",
    "simd_count",
    "simd_per_cu",
    "hive_id",
    "unique_id",
    "gfx_target_version",
}
_NVML_KEYS = {"driver_version", "cuda_driver_version", "nvml_errors", "fabric"}
_AMD_KEYS = {"xgmi", "xgmi_bandwidth_mbps", "pcie_bandwidth_mbps"}
_FABRIC_STATES = {name: value for value, name in enumerate(FABRIC_STATES)}
_NUMBERINGS: dict[str, Literal["linear", "interleaved", "socket_interleaved"]] = {
    "linear": "linear",
    "interleaved": "interleaved",
    "socket_interleaved": "socket_interleaved",
}


def load_file(path: str | Path) -> MachineSpec:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{p}: cannot read machine file: {exc}") from exc
    return load_yaml(text, source=str(p), default_name=p.stem)


def load_yaml(text: str, source: str = "<string>", default_name: str | None = None) -> MachineSpec:
    try:
        data = load_yaml_text(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{source}: not valid YAML: {exc}") from exc
    return parse_machine(data, source=source, default_name=default_name)


def parse_machine(
    data: Any, source: str = "<dict>", default_name: str | None = None
) -> MachineSpec:
    """Validate a decoded YAML document and build the :class:`MachineSpec`."""
    top = _Node(data, source, _TOP_KEYS)
    name = (
        top.get_str("name", default_name)
        if (top.has("name") or default_name)
        else top.get_str("name")
    )
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", name):
        raise ValueError(f"{source}: name {name!r} must be a hostname-like word")
    hostname = top.get_str("hostname", name)
    cpu = _parse_cpu(_Node(top.req("cpu"), f"{source}: cpu", _CPU_KEYS))
    types = _parse_types(top, source)
    nvml_node = _Node(top.raw("nvml") or {}, f"{source}: nvml", _NVML_KEYS)
    fabric = (
        _parse_fabric(_Node(nvml_node.raw("fabric"), f"{source}: nvml.fabric", _FABRIC_KEYS), name)
        if nvml_node.has("fabric")
        else None
    )
    raw_devices = top.get_list("pci")
    pci, explicit_numa, where_of = _parse_pci(raw_devices, types, name, source, fabric)
    numa_nodes, distances = _parse_numa(top, cpu, pci, source)
    check_root_numa(pci, explicit_numa, where_of, sum(1 for n in numa_nodes if n.cpus))
    pci = _finish_pci(pci, numa_nodes, source)

    nvml: NvmlSpec | None = None
    if any(d.nvidia is not None for d in pci) or top.has("nvml"):
        nvml = NvmlSpec(
            driver_version=nvml_node.get_str("driver_version", "570.133.20"),
            cuda_driver_version=nvml_node.get_int("cuda_driver_version", 12080),
            nvml_errors=_parse_errors(nvml_node, "nvml_errors"),
            fabric=fabric,
        )
    amd: AmdSpec | None = None
    if any(d.amd is not None for d in pci) or top.has("amd"):
        an = _Node(top.raw("amd") or {}, f"{source}: amd", _AMD_KEYS)
        xgmi = an.get_str("xgmi", "fully_connected")
        if xgmi not in ("fully_connected", "none"):
            raise ValueError(f"{an.where}: xgmi must be 'fully_connected' or 'none'")
        amd = AmdSpec(
            xgmi="fully_connected" if xgmi == "fully_connected" else "none",
            xgmi_bandwidth_mbps=_pair(an, "xgmi_bandwidth_mbps", (50000, 50000)),
            pcie_bandwidth_mbps=_pair(an, "pcie_bandwidth_mbps", (32000, 64000)),
        )
    net = None
    if top.has("net"):
        holder = _Node({"net": top.raw("net")}, source, {"net"})
        net = tuple(_parse_net(holder, "virtual", name))
        taken = {n.name for d in pci for n in d.net}
        clash = [n.name for n in net if n.name in taken]
        if clash:
            raise ValueError(f"{source}: net: interface {clash[0]!r} is also a PCI function's")
    rdma: tuple[RdmaSpec, ...] = ()
    if top.has("rdma"):
        holder = _Node({"rdma": top.raw("rdma")}, source, {"rdma"})
        rdma = tuple(_parse_rdma(holder, "virtual", name, ()))
        taken = {r.name for d in pci for r in d.rdma}
        clash = [r.name for r in rdma if r.name in taken]
        if clash:
            raise ValueError(f"{source}: rdma: device {clash[0]!r} is also a PCI function's")
    return MachineSpec(
        name=name,
        hostname=hostname,
        source=source,
        cpu=cpu,
        numa_nodes=numa_nodes,
        distances=distances,
        pci=tuple(pci),
        nvml=nvml,
        amd=amd,
        net=net,
        rdma=rdma,
    )


def _pair(node: _Node, key: str, default: tuple[int, int]) -> tuple[int, int]:
    value = node.raw(key)
    if value is None:
        return default
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise ValueError(f"{node.where}: {key} must be [min, max] integers, got {value!r}")
    return (int(value[0]), int(value[1]))


def _parse_cpu(node: _Node) -> CpuSpec:
    if node.has("cores"):
        return _parse_explicit_cpu(node)
    if node.has("caches"):
        raise ValueError(f"{node.where}: caches are given with an explicit cores list only")
    extra = _cpu_extras(node)
    numbering = node.get_str("numbering", "linear")
    if numbering not in _NUMBERINGS:
        raise ValueError(
            f"{node.where}: numbering must be one of {', '.join(_NUMBERINGS)} "
            "(socket_interleaved: CPU n on socket n mod sockets)"
        )
    sockets = node.get_int("sockets", required=True)
    cores = node.get_int("cores_per_socket", required=True)
    threads = node.get_int("threads_per_core", 1)
    if sockets < 1 or cores < 1 or threads < 1:
        raise ValueError(f"{node.where}: sockets, cores_per_socket, threads_per_core must be >= 1")
    arch = node.get_str("arch", "x86_64")
    l3_cores = node.get_int("l3_cores", cores)
    l2_cores = node.get_int("l2_cores", 1)
    if cores % l3_cores or cores % l2_cores:
        raise ValueError(f"{node.where}: l2_cores and l3_cores must divide cores_per_socket")
    return CpuSpec(
        model=node.get_str("model"),
        arch=arch,
        vendor=node.get_str("vendor", "GenuineIntel" if arch == "x86_64" else "ARM"),
        sockets=sockets,
        cores_per_socket=cores,
        threads_per_core=threads,
        numbering=_NUMBERINGS[numbering],
        l1d_kb=node.get_int("l1d_kb", 48),
        l2_kb=node.get_int("l2_kb", 2048),
        l3_kb=node.get_int("l3_kb", 32768),
        l2_cores=l2_cores,
        l3_cores=l3_cores,
        cpuinfo=extra[0],
        max_mhz=extra[1],
    )


def _cpu_extras(node: _Node) -> tuple[tuple[tuple[str, str], ...], int | None]:
    """``cpuinfo`` extra lines and ``max_mhz``."""
    raw = node.raw("cpuinfo") or {}
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str | int | float) and not isinstance(v, bool)
        for k, v in raw.items()
    ):
        raise ValueError(f"{node.where}: cpuinfo must map cpuinfo keys to values")
    lines = tuple((str(k), str(v)) for k, v in raw.items())
    bad = [k for k, v in lines if "\n" in k or "\n" in v or ":" in k]
    if bad:
        raise ValueError(f"{node.where}: cpuinfo key {bad[0]!r} must be one line without ':'")
    mhz = node.opt_int("max_mhz")
    if mhz is not None and mhz <= 0:
        raise ValueError(f"{node.where}: max_mhz must be positive")
    return lines, mhz


def _opt_id(node: _Node, key: str) -> int | None:
    value = node.opt_int(key)
    if value is not None and not 0 <= value < 1 << 31:
        raise ValueError(f"{node.where}: {key} must be between 0 and 2^31-1, got {value}")
    return value


def _parse_explicit_cpu(node: _Node) -> CpuSpec:
    """``cores: [{cpus, socket, die, cluster, core}]`` and ``caches`` (captured machines)."""
    regular = sorted(k for k in node.data if k in _REGULAR_CPU_KEYS)
    if regular:
        raise ValueError(f"{node.where}: {regular[0]!r} does not go with an explicit cores list")
    cores: list[CoreSpec] = []
    seen: set[int] = set()
    for i, entry in enumerate(node.get_list("cores")):
        line = getattr(entry, "line", None)
        at = f"{node.where}: cores[{i}]" + (f" (line {line})" if line else "")
        cn = _Node(entry, at, _CORE_KEYS)
        cpus = _parse_list(cn.req("cpus"), f"{cn.where}: cpus")
        dup = seen.intersection(cpus)
        if dup:
            raise ValueError(f"{cn.where}: CPU {min(dup)} is in two cores")
        if not cpus:
            raise ValueError(f"{cn.where}: no CPUs")
        seen.update(cpus)
        per_cpu = cn.raw("core")
        core_ids = None
        if isinstance(per_cpu, list):
            if len(per_cpu) != len(cpus) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in per_cpu
            ):
                raise ValueError(f"{cn.where}: core must be one id or one per CPU of cpus")
            core_ids = tuple(int(v) for v in per_cpu)
        cores.append(
            CoreSpec(
                cpus=cpus,
                socket=_opt_id(cn, "socket"),
                die=_opt_id(cn, "die"),
                cluster=_opt_id(cn, "cluster"),
                core=None if core_ids is not None else _opt_id(cn, "core"),
                core_ids=core_ids,
            )
        )
    if not cores:
        raise ValueError(f"{node.where}: cores must list at least one core")
    caches: list[CacheSpec] = []
    cached: set[int] = set()
    for i, entry in enumerate(node.get_list("caches")):
        ca = _Node(entry, f"{node.where}: caches[{i}]", _CACHE_KEYS)
        cpus = _parse_list(ca.req("cpus"), f"{ca.where}: cpus")
        if not set(cpus) <= seen or cached.intersection(cpus):
            raise ValueError(f"{ca.where}: cpus must be CPUs of cores, each in one cache")
        cached.update(cpus)
        if ca.has("size_kb") and ca.has("size_bytes"):
            raise ValueError(f"{ca.where}: give size_kb or size_bytes, not both")
        size = ca.opt_int("size_bytes")
        if ca.has("size_kb"):
            size = ca.get_int("size_kb", required=True) * 1024
        caches.append(
            CacheSpec(
                cpus=cpus,
                level=ca.get_int("level", 3),
                type=ca.get_str("type", "Unified"),
                size_bytes=size,
                id=_opt_id(ca, "id"),
            )
        )
    extra = _cpu_extras(node)
    arch = node.get_str("arch", "x86_64")
    sockets = {c.socket for c in cores}
    return CpuSpec(
        model=node.get_str("model"),
        arch=arch,
        vendor=node.get_str("vendor", "GenuineIntel" if arch == "x86_64" else "ARM"),
        sockets=len(sockets),
        cores_per_socket=0,
        threads_per_core=max(len(c.cpus) for c in cores),
        numbering="linear",
        l1d_kb=0,
        l2_kb=0,
        l3_kb=0,
        l2_cores=1,
        l3_cores=1,
        cores=tuple(cores),
        caches=tuple(caches),
        cpuinfo=extra[0],
        max_mhz=extra[1],
    )


def _parse_types(top: _Node, source: str) -> dict[str, dict[str, Any]]:
    raw = top.raw("device_types") or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{source}: device_types must be a mapping of name -> device fields")
    out: dict[str, dict[str, Any]] = {}
    for tname, tdata in raw.items():
        where = f"{source}: device_types.{tname}"
        _Node(tdata, where, _DEVICE_KEYS - {"bdf", "parent", "type", "physfn"})
        out[str(tname)] = dict(tdata)
    return out


def _merge(template: dict[str, Any], dev: dict[str, Any]) -> dict[str, Any]:
    merged = dict(template)
    for key, value in dev.items():
        if key in ("nvidia", "amd", "net_defaults", "rdma_defaults") and isinstance(
            merged.get(key), dict
        ):
            if not isinstance(value, dict):
                merged[key] = value
            else:
                merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


@dataclass
class _RawDevice:
    node: _Node
    bdf: str
    parent: str | None
    numa_node: int | None
    spec: PciDeviceSpec | None = None


def _parse_pci(
    raw_devices: list[Any],
    types: dict[str, dict[str, Any]],
    machine: str,
    source: str,
    machine_fabric: FabricSpec | None,
) -> tuple[list[PciDeviceSpec], set[str], dict[str, str]]:
    """The devices; the bus ids that set ``numa_node`` themselves (or by template); and
    where each device is written (``file:LINE: pci[i] (bdf)``) for later messages."""
    raws: dict[str, _RawDevice] = {}
    order: list[str] = []
    for entry, written in expand_pci(raw_devices, source):
        where = written
        if isinstance(entry, dict) and isinstance(entry.get("bdf"), str):
            where = f"{where} ({entry['bdf']})"
        first = _Node(entry, where, _DEVICE_KEYS)
        bdf = parse_bdf(first.req("bdf"), where)
        data = dict(entry)
        if "type" in data:
            tname = data.pop("type")
            if tname not in types:
                known = ", ".join(sorted(types)) or "none defined"
                raise ValueError(f"{where}: unknown device type {tname!r} (known: {known})")
            data = _merge(types[tname], data)
        node = _Node(data, where, _DEVICE_KEYS)
        if bdf in raws:
            raise ValueError(f"{where}: duplicate PCI bus id {bdf}")
        parent = parse_bdf(node.raw("parent"), f"{where}: parent") if node.has("parent") else None
        numa = node.get_int("numa_node") if node.has("numa_node") else None
        raws[bdf] = _RawDevice(node=node, bdf=bdf, parent=parent, numa_node=numa)
        order.append(bdf)

    # Parents: must exist, be bridges, sit on a lower bus of the same domain; no cycles.
    for bdf in order:
        raw = raws[bdf]
        if raw.parent is None:
            continue
        par = raws.get(raw.parent)
        if par is None:
            raise ValueError(f"{raw.node.where}: parent {raw.parent} is not a device of this file")
        pclass = _class_code(par.node)
        if pclass >> 8 not in (0x0604, 0x0609):
            raise ValueError(
                f"{raw.node.where}: parent {raw.parent} is not a PCI bridge (class 0x{pclass:06x})"
            )
        pdom, pbus = raw.parent.split(":")[:2]
        dom, bus = bdf.split(":")[:2]
        if pdom != dom or int(bus, 16) <= int(pbus, 16):
            raise ValueError(
                f"{raw.node.where}: must sit on a bus below its parent {raw.parent} "
                "(same domain, higher bus number)"
            )

    # Inherit numa_node from the parent chain (kernel: from the host bridge's _PXM).
    def numa_of(bdf: str) -> int:
        raw = raws[bdf]
        if raw.numa_node is not None:
            return raw.numa_node
        return numa_of(raw.parent) if raw.parent is not None else -1

    net_names: set[str] = set()
    rdma_names: set[str] = set()
    out: list[PciDeviceSpec] = []
    for bdf in order:
        raw = raws[bdf]
        node = raw.node
        spec = _build_device(node, bdf, raw.parent, numa_of(bdf), machine, machine_fabric)
        for n in spec.net:
            if n.name in net_names or n.name == "lo":
                raise ValueError(f"{node.where}: duplicate interface name {n.name!r}")
            net_names.add(n.name)
        for r in spec.rdma:
            if r.name in rdma_names:
                raise ValueError(f"{node.where}: duplicate RDMA device name {r.name!r}")
            rdma_names.add(r.name)
        out.append(spec)

    where_of = {bdf: raws[bdf].node.where for bdf in order}
    check_bus_ranges(out, where_of)
    links_at = _nvlink_places(raws, source)
    by_bdf = {d.bdf: d for d in out}
    for dev in out:
        where = where_of[dev.bdf]
        if dev.physfn is not None:
            pf = by_bdf.get(dev.physfn)
            if pf is None:
                raise ValueError(f"{where}: physfn {dev.physfn} is not a device of this file")
            if pf.parent != dev.parent:
                raise ValueError(f"{where}: a VF must have the same parent as its PF {pf.bdf}")
            if pf.sriov_totalvfs is None:
                raise ValueError(f"{where}: physfn {pf.bdf} has no sriov_totalvfs")
        if dev.nvidia is not None:
            for link in dev.nvidia.nvlinks:
                if link.remote_type == "gpu":
                    peer = by_bdf.get(link.remote)
                    if peer is None or peer.nvidia is None:
                        at = links_at.get((dev.bdf, link.remote), where)
                        raise ValueError(
                            f"{at}: nvlink remote {link.remote} is not an NVIDIA GPU here"
                        )
    check_nvswitch_links(out, links_at, where_of)
    vfs_of: dict[str, int] = {}
    for dev in out:
        if dev.physfn is not None:
            vfs_of[dev.physfn] = vfs_of.get(dev.physfn, 0) + 1
    for dev in out:
        if dev.sriov_totalvfs is not None and vfs_of.get(dev.bdf, 0) > dev.sriov_totalvfs:
            raise ValueError(f"{where_of[dev.bdf]}: more VFs than sriov_totalvfs")
    explicit = {bdf for bdf in order if raws[bdf].numa_node is not None}
    return out, explicit, where_of


def _nvlink_places(raws: dict[str, _RawDevice], source: str) -> dict[tuple[str, str], str]:
    """(GPU, remote) -> ``file:LINE: ... nvlinks[k]`` for links not marked ``external``."""
    out: dict[tuple[str, str], str] = {}
    for bdf, raw in raws.items():
        nv = raw.node.raw("nvidia")
        links = nv.get("nvlinks") if isinstance(nv, dict) else None
        if not isinstance(links, list):
            continue
        label = raw.node.where.split(": ", 1)[-1]
        for k, entry in enumerate(links):
            if not isinstance(entry, dict) or entry.get("external") is True:
                continue
            try:
                remote = parse_bdf(entry.get("remote"), "")
            except ValueError:
                continue
            out.setdefault((bdf, remote), f"{where_at(source, entry)}: {label}: nvlinks[{k}]")
    return out


_BASE_CLASSES = frozenset(range(0x01, 0x14)) | {0x40, 0xFF}


def _class_code(node: _Node) -> int:
    """The 24-bit class code; lspci's 16-bit form (``0302``, ``0x0302``) is widened.

    ``0302`` unquoted is octal 194 to YAML 1.1; the loader keeps the spelling, so the
    digits are read as lspci meant them.
    """
    raw = node.req("class")
    text = getattr(raw, "text", None)
    if isinstance(raw, str) or isinstance(text, str):
        spelled = str(text if isinstance(text, str) else raw).strip().lower().replace("_", "")
        digits = spelled[2:] if spelled.startswith("0x") else spelled
        octal_looking = spelled.startswith("0") and spelled.isdigit() and len(spelled) > 1
        if (spelled.startswith("0x") or octal_looking or isinstance(raw, str)) and all(
            c in "0123456789abcdef" for c in digits
        ):
            if len(digits) in (3, 4):
                return int(digits, 16) << 8
            if len(digits) in (5, 6):
                return int(digits, 16)
    value = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
    if value is not None and value > 0xFFFF and value <= 0xFFFFFF:
        return int(value)
    if value is not None and value <= 0xFFFF and value >> 8 in _BASE_CLASSES:
        return int(value) << 8
    raise ValueError(
        f"{node.where}: class {text or raw!r} is not a PCI class code: write the 24-bit code "
        "in hex (class: 0x030200 for a 3D controller) or the 16-bit form lspci prints "
        "(class: 0302 or 0x0302)"
    )


def _build_device(
    node: _Node,
    bdf: str,
    parent: str | None,
    numa: int,
    machine: str,
    machine_fabric: FabricSpec | None,
) -> PciDeviceSpec:
    where = node.where
    class_code = _class_code(node)
    vendor = None if _null(node, "vendor") else node.get_int("vendor", required=True)
    device = None if _null(node, "device") else node.get_int("device", required=True)
    physfn = parse_bdf(node.raw("physfn"), f"{where}: physfn") if node.has("physfn") else None
    link_speed = node.opt_float("link_speed")
    link_width = node.opt_int("link_width")
    net = tuple(_parse_net(node, bdf, machine))
    rdma = tuple(_parse_rdma(node, bdf, machine, net))
    nvidia = None
    if node.has("nvidia"):
        nvidia = _parse_nvidia(
            _Node(node.raw("nvidia"), f"{where}: nvidia", _NVIDIA_KEYS),
            bdf,
            machine,
            machine_fabric,
        )
    amd = None
    if node.has("amd"):
        amd = _parse_amd_gpu(_Node(node.raw("amd"), f"{where}: amd", _AMD_GPU_KEYS), bdf, machine)
    total = node.opt_int("sriov_totalvfs")
    numvfs = node.opt_int("sriov_numvfs")
    if numvfs is not None and total is None:
        raise ValueError(f"{where}: sriov_numvfs needs sriov_totalvfs")
    local = None
    if node.has("local_cpus"):
        local = _parse_list(node.raw("local_cpus"), f"{where}: local_cpus")
    names = node.raw("udev_names")
    if names is not None and (
        not isinstance(names, dict)
        or set(names) - {"vendor", "device"}
        or not all(isinstance(v, str) for v in names.values())
    ):
        raise ValueError(f"{where}: udev_names must be {{vendor: text, device: text}}")
    iommu = node.opt_int("iommu_group")
    if iommu is not None and not 0 <= iommu < 1 << 31:
        raise ValueError(f"{where}: iommu_group must be a group number >= 0, got {iommu}")
    return PciDeviceSpec(
        bdf=bdf,
        parent=parent,
        class_code=class_code,
        vendor=vendor,
        device=device,
        subsystem_vendor=(
            None
            if _null(node, "subsystem_vendor")
            or (vendor is None and not node.has("subsystem_vendor"))
            else node.get_int("subsystem_vendor", vendor if vendor is not None else 0)
        ),
        subsystem_device=(
            None if _null(node, "subsystem_device") else node.get_int("subsystem_device", 0)
        ),
        revision=node.get_int("revision", 0),
        driver=node.get_str("driver") if node.has("driver") else None,
        numa_node=numa,
        link_speed=link_speed,
        link_width=link_width,
        max_link_speed=node.opt_float("max_link_speed") or link_speed,
        max_link_width=node.opt_int("max_link_width") or link_width,
        sriov_totalvfs=total,
        sriov_numvfs=(numvfs or 0) if total is not None else None,
        physfn=physfn,
        net=net,
        rdma=rdma,
        nvidia=nvidia,
        amd=amd,
        iommu_group=iommu,
        local_cpus=local,
        udev_names=(names.get("vendor"), names.get("device")) if names is not None else None,
    )


def _entries(node: _Node, key: str, keys: set[str]) -> Iterator[tuple[str, _Node]]:
    """(where, entry) of a ``net``/``rdma`` list: a bare name or a mapping, over the
    device's ``<key>_defaults``."""
    defaults = _Node(node.raw(f"{key}_defaults") or {}, f"{node.where}: {key}_defaults", keys)
    for i, entry in enumerate(node.get_list(key)):
        where = f"{node.where}: {key}[{i}]"
        if isinstance(entry, str):
            entry = {"name": entry}
        yield where, _Node({**defaults.data, **_Node(entry, where, keys).data}, where, keys)


def _parse_net(node: _Node, bdf: str, machine: str) -> Iterator[NetSpec]:
    for where, item in _entries(node, "net", _NET_KEYS):
        name = item.get_str("name")
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$", name):
            raise ValueError(f"{where}: bad interface name {name!r}")
        ntype = 1 if _null(item, "type") else item.get_int("type", 1)
        seed = ids.digest("net", machine, bdf, name)
        default_addr = ids.ipoib_address(seed[:8]) if ntype == 32 else ids.mac(seed)
        speed: int | None = item.get_int("speed") if item.has("speed") else None
        yield NetSpec(
            name=name,
            address=None if _null(item, "address") else item.get_str("address", default_addr),
            mtu=None if _null(item, "mtu") else item.get_int("mtu", 4092 if ntype == 32 else 1500),
            operstate=None if _null(item, "operstate") else item.get_str("operstate", "up"),
            speed=speed,
            type=None if _null(item, "type") else ntype,
        )


def _null(node: _Node, key: str) -> bool:
    """``key: null`` written out: the file is absent (captured dumps)."""
    return key in node.data and node.data[key] is None


def _parse_rdma(
    node: _Node, bdf: str, machine: str, net: tuple[NetSpec, ...]
) -> Iterator[RdmaSpec]:
    for where, item in _entries(node, "rdma", _RDMA_KEYS):
        name = item.get_str("name")
        seed = ids.digest("rdma", machine, bdf, name)
        guid = ids.guid(seed)
        link_layer = item.get_str("link_layer", "InfiniBand")
        if not re.match(r"^[A-Za-z][A-Za-z0-9 _.-]{0,31}$", link_layer):
            raise ValueError(
                f"{where}: link_layer {link_layer!r} must be a word such as InfiniBand, "
                "Ethernet or Unknown (what EFA ports report)"
            )
        nports = item.get_int("ports", 1)
        ports = tuple(
            RdmaPortSpec(
                port=p,
                rate=item.get_str("rate", "400 Gb/sec (4X NDR)"),
                state=item.get_str("state", "4: ACTIVE"),
                phys_state=item.get_str("phys_state", "5: LinkUp"),
                link_layer=link_layer,
                netdev=(net[p - 1].name if link_layer == "Ethernet" and len(net) >= p else None),
            )
            for p in range(1, nports + 1)
        )
        defaults_of = {
            "node_guid": guid,
            "sys_image_guid": guid,
            "fw_ver": "28.39.1002",
            "board_id": "MT_0000000838",
            "hca_type": "MT4129",
        }
        values = {
            key: None if _null(item, key) else item.get_str(key, default)
            for key, default in defaults_of.items()
        }
        yield RdmaSpec(name=name, ports=ports, **values)


def _parse_errors(node: _Node, key: str) -> dict[str, int]:
    raw = node.raw(key) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{node.where}: {key} must map pynvml function names to error codes")
    out: dict[str, int] = {}
    for fn, code in raw.items():
        if fn not in NVML_FUNCTIONS:
            raise ValueError(
                f"{node.where}: {key}: unknown NVML function {fn!r} "
                f"(known: {', '.join(NVML_FUNCTIONS)})"
            )
        out[str(fn)] = _error_code(code, f"{node.where}: {key}.{fn}")
    return out


def _error_code(code: Any, where: str) -> int:
    if isinstance(code, int) and not isinstance(code, bool):
        if code <= 0:
            raise ValueError(f"{where}: error code must be a positive NVML return code")
        return int(code)
    if isinstance(code, str):
        name = code.strip().upper()
        name = name.removeprefix("NVML_ERROR_")
        if name in NVML_ERROR_CODES:
            return NVML_ERROR_CODES[name]
    raise ValueError(
        f"{where}: unknown NVML error code {code!r} "
        "(use a name such as NOT_SUPPORTED or GPU_IS_LOST, or a number)"
    )


def _parse_fabric(node: _Node, machine: str) -> FabricSpec:
    raw_uuid = node.raw("cluster_uuid", "auto")
    if raw_uuid == "auto":
        cluster = ids.nonzero_bytes(ids.digest("fabric", machine)[:16])
    else:
        hexed = str(raw_uuid).replace("-", "")
        if not re.match(r"^[0-9a-fA-F]{32}$", hexed):
            raise ValueError(f"{node.where}: cluster_uuid must be 'auto' or a UUID")
        cluster = bytes.fromhex(hexed)
    state_raw = node.raw("state", "completed")
    if isinstance(state_raw, str):
        if state_raw not in _FABRIC_STATES:
            raise ValueError(f"{node.where}: state must be one of {', '.join(_FABRIC_STATES)}")
        state = _FABRIC_STATES[state_raw]
    else:
        state = node.get_int("state")
    status = node.raw("status", 0)
    return FabricSpec(
        cluster_uuid=cluster,
        clique_id=node.get_int("clique_id", 0),
        state=state,
        status=0 if status in (0, "SUCCESS") else _error_code(status, f"{node.where}: status"),
        health_mask=node.get_int("health_mask", 0),
        health_summary=node.get_int("health_summary", 1),
    )


def _parse_nvidia(
    node: _Node, bdf: str, machine: str, machine_fabric: FabricSpec | None
) -> NvidiaGpuSpec:
    cc_text = node.get_str("compute_capability", "9.0")
    m = re.match(r"^(\d+)\.(\d+)$", cc_text)
    if not m:
        raise ValueError(f"{node.where}: compute_capability must look like '9.0'")
    version = node.get_str("nvlink_version") if node.has("nvlink_version") else None
    if version is not None and version not in NVLINK_VERSION_ENUM:
        raise ValueError(
            f"{node.where}: nvlink_version {version!r} unknown "
            f"(known: {', '.join(NVLINK_VERSION_ENUM)})"
        )
    down = set(_parse_list(node.raw("nvlinks_down", ""), f"{node.where}: nvlinks_down"))
    links: list[NvLinkSpec] = []
    for i, entry in enumerate(node.get_list("nvlinks")):
        ln = _Node(entry, f"{node.where}: nvlinks[{i}]", _NVLINK_KEYS)
        remote = parse_bdf(ln.req("remote"), f"{ln.where}: remote")
        rtype = ln.get_str("type", "switch")
        if rtype not in ("gpu", "switch"):
            raise ValueError(f"{ln.where}: type must be 'gpu' or 'switch'")
        for _ in range(ln.get_int("count", 1)):
            idx = len(links)
            links.append(
                NvLinkSpec(
                    link=idx,
                    remote=remote,
                    remote_type="gpu" if rtype == "gpu" else "switch",
                    active=idx not in down,
                )
            )
    if links and version is None:
        raise ValueError(f"{node.where}: nvlinks need nvlink_version")
    if len(links) > 18:
        raise ValueError(f"{node.where}: {len(links)} NVLinks; NVML has at most 18 per GPU")
    mig_raw = node.raw("mig_mode", [0, 0])
    mig: tuple[int, int] | None
    if mig_raw == "unsupported":
        mig = None
    elif isinstance(mig_raw, list) and len(mig_raw) == 2 and all(v in (0, 1) for v in mig_raw):
        mig = (int(mig_raw[0]), int(mig_raw[1]))
    else:
        raise ValueError(f"{node.where}: mig_mode must be [current, pending] or 'unsupported'")
    fabric = machine_fabric
    if node.has("fabric"):
        fraw = node.raw("fabric")
        fabric = (
            None
            if fraw == "not_supported"
            else _parse_fabric(_Node(fraw, f"{node.where}: fabric", _FABRIC_KEYS), machine)
        )
    mib = 1 << 20
    memory = node.req("memory_mib")
    if isinstance(memory, float) and memory > 0:
        memory_bytes = round(memory * mib)  # captured totals that are not whole MiB
    else:
        memory_bytes = node.get_int("memory_mib", required=True) * mib
    return NvidiaGpuSpec(
        name=node.get_str("name"),
        memory_bytes=memory_bytes,
        memory_used_bytes=node.get_int("memory_used_mib", 0) * mib,
        compute_capability=(int(m.group(1)), int(m.group(2))),
        uuid=node.get_str("uuid", ids.gpu_uuid(machine, bdf)),
        minor=node.get_int("minor", -1),
        mig_mode=mig,
        nvlink_version=version,
        nvlinks=tuple(links),
        nvml_errors=_parse_errors(node, "nvml_errors"),
        fabric=fabric,
    )


def _parse_amd_gpu(node: _Node, bdf: str, machine: str) -> AmdGpuSpec:
    seed = ids.digest("amd", machine, bdf)
    return AmdGpuSpec(
        name=node.get_str("name") if node.has("name") else None,
        vram_bytes=_vram_bytes(node),
        simd_count=node.get_int("simd_count", 1216),
        simd_per_cu=node.get_int("simd_per_cu", 4),
        hive_id=node.get_int("hive_id", int.from_bytes(ids.digest("hive", machine)[:8], "big") | 1),
        unique_id=node.get_int("unique_id", int.from_bytes(seed[:8], "big") | 1),
        gfx_target_version=node.get_int("gfx_target_version", 90402),
        card=-1,
        render_minor=-1,
    )


def _vram_bytes(node: _Node) -> int:
    """``vram_gib`` (fractions allowed: 191.98) or ``vram_mib``, in bytes."""
    if node.has("vram_gib") == node.has("vram_mib"):
        raise ValueError(f"{node.where}: give exactly one of vram_gib or vram_mib")
    if node.has("vram_mib"):
        mib = node.get_int("vram_mib", required=True)
        if mib <= 0:
            raise ValueError(f"{node.where}: vram_mib must be positive")
        return mib << 20
    gib = node.opt_float("vram_gib")
    if gib is None or not 0 < gib < 1 << 20:
        raise ValueError(f"{node.where}: vram_gib must be a positive number of GiB")
    value = node.raw("vram_gib")
    if isinstance(value, int):
        return value << 30
    return round(gib * (1 << 30) / 4096) * 4096


def _parse_numa(
    top: _Node, cpu: CpuSpec, pci: list[PciDeviceSpec], source: str
) -> tuple[tuple[NumaNodeSpec, ...], tuple[tuple[int, ...], ...]]:
    numa = _Node(top.raw("numa") or {}, f"{source}: numa", _NUMA_KEYS)
    socket_of = {cid: s for cid, s, _, _ in cpu.layout()}
    all_cpus = set(socket_of)
    nodes: dict[int, NumaNodeSpec] = {}
    raw_nodes = numa.get_list("nodes")
    if not raw_nodes:
        # Default: one node per socket holding that socket's CPUs.
        raw_nodes = [
            {"id": s, "cpus": format_cpulist(c for c, sk in socket_of.items() if sk == s)}
            for s in range(cpu.sockets)
        ]
    gpu_bdfs = {d.bdf for d in pci if d.nvidia is not None or d.amd is not None}
    for i, entry in enumerate(raw_nodes):
        nn = _Node(entry, f"{source}: numa.nodes[{i}]", _NODE_KEYS)
        if nn.has("id") == nn.has("ids"):
            raise ValueError(f"{nn.where}: give exactly one of 'id' or 'ids'")
        ids = (
            (nn.get_int("id"),) if nn.has("id") else _parse_list(nn.raw("ids"), f"{nn.where}: ids")
        )
        cpus = _parse_list(nn.raw("cpus", ""), f"{nn.where}: cpus")
        if len(ids) > 1 and cpus:
            raise ValueError(f"{nn.where}: 'ids' is only for CPU-less nodes")
        bad = [c for c in cpus if c not in all_cpus]
        if bad:
            raise ValueError(f"{nn.where}: CPU {bad[0]} does not exist (cpu section)")
        sockets = {socket_of[c] for c in cpus}
        if nn.has("socket"):
            socket = nn.get_int("socket")
            if sockets and socket not in sockets:
                raise ValueError(f"{nn.where}: socket {socket} disagrees with its CPUs")
        elif len(sockets) == 1:
            socket = sockets.pop()
        elif not cpus:
            raise ValueError(f"{nn.where}: CPU-less node needs 'socket'")
        elif cpu.cores is not None:
            socket = min(sockets)  # captured machines: a node may span packages
        else:
            raise ValueError(f"{nn.where}: CPUs span several sockets")
        gpu = parse_bdf(nn.raw("gpu"), f"{nn.where}: gpu") if nn.has("gpu") else None
        if gpu is not None and gpu not in gpu_bdfs:
            raise ValueError(f"{nn.where}: gpu {gpu} is not a GPU of this file")
        if nn.has("memory_mb") and nn.has("memory_kb"):
            raise ValueError(f"{nn.where}: give memory_mb or memory_kb, not both")
        memory_kb = nn.get_int("memory_mb", 0) * 1024
        if nn.has("memory_kb"):
            memory_kb = nn.get_int("memory_kb")
        for nid in ids:
            if nid in nodes:
                raise ValueError(f"{nn.where}: duplicate NUMA node {nid}")
            nodes[nid] = NumaNodeSpec(
                id=nid, cpus=cpus, memory_kb=memory_kb, socket=socket, gpu=gpu
            )
    ordered = tuple(nodes[k] for k in sorted(nodes))
    seen: set[int] = set()
    for n in ordered:
        dup = seen.intersection(n.cpus)
        if dup:
            raise ValueError(f"{source}: numa: CPU {min(dup)} is in two nodes")
        seen.update(n.cpus)
    if seen != all_cpus:
        raise ValueError(
            f"{source}: numa: CPUs {format_cpulist(all_cpus - seen)} belong to no node"
        )
    return ordered, _parse_distances(numa, ordered)


def _parse_distances(numa: _Node, nodes: tuple[NumaNodeSpec, ...]) -> tuple[tuple[int, ...], ...]:
    raw = numa.raw("distances")
    n = len(nodes)
    if isinstance(raw, list):
        rows = raw
        if len(rows) != n or not all(isinstance(r, list) and len(r) == n for r in rows):
            raise ValueError(f"{numa.where}: distances must be a {n}x{n} matrix")
        return tuple(tuple(int(v) for v in r) for r in rows)
    dn = _Node(raw or {}, f"{numa.where}: distances", _DIST_KEYS)
    local = dn.get_int("local", 10)
    same = dn.get_int("same_socket", 11)
    remote = dn.get_int("remote", 21)
    matrix = [
        [local if a.id == b.id else same if a.socket == b.socket else remote for b in nodes]
        for a in nodes
    ]
    index = {node.id: i for i, node in enumerate(nodes)}
    for j, ov in enumerate(dn.get_list("overrides")):
        if (
            not isinstance(ov, list)
            or len(ov) != 3
            or ov[0] not in index
            or ov[1] not in index
            or not isinstance(ov[2], int)
        ):
            raise ValueError(f"{dn.where}: overrides[{j}] must be [node, node, distance]")
        a, b = index[ov[0]], index[ov[1]]
        matrix[a][b] = matrix[b][a] = int(ov[2])
    return tuple(tuple(r) for r in matrix)


def _finish_pci(
    pci: list[PciDeviceSpec],
    nodes: tuple[NumaNodeSpec, ...],
    source: str,
) -> list[PciDeviceSpec]:
    """Second pass: NUMA ids exist; NVML minors and memory nodes; AMD card numbers."""

    node_ids = {n.id for n in nodes}
    memory_node_of = {n.gpu: n.id for n in nodes if n.gpu is not None}
    for dev in pci:
        if dev.numa_node != -1 and dev.numa_node not in node_ids:
            raise ValueError(f"{source}: pci ({dev.bdf}): numa_node {dev.numa_node} does not exist")
    by_bdf = {d.bdf: d for d in pci}
    nvidia = sorted((d for d in pci if d.nvidia is not None), key=bdf_key)
    for index, dev in enumerate(nvidia):
        assert dev.nvidia is not None
        gpu = replace(
            dev.nvidia,
            minor=dev.nvidia.minor if dev.nvidia.minor >= 0 else index,
            numa_memory_node=memory_node_of.get(dev.bdf),
        )
        by_bdf[dev.bdf] = replace(dev, nvidia=gpu)
    amd = sorted((d for d in pci if d.amd is not None), key=bdf_key)
    for index, dev in enumerate(amd):
        assert dev.amd is not None
        by_bdf[dev.bdf] = replace(
            dev, amd=replace(dev.amd, card=index + 1, render_minor=128 + index)
        )
    return [by_bdf[d.bdf] for d in pci]
