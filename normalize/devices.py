"""Inventory -> DRA Device dicts (``{"name", "attributes", "capacity"}``, API JSON form)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Any

from discovery.bandwidth import pcie_generation, pcie_link_gbps
from discovery.model import Gpu, Inventory, Nic, PciDevice

from . import attribute_names as an
from . import names
from .alignment import Alignment, alignment
from .attributes import (
    Attr,
    Attrs,
    a_bool,
    a_int,
    a_string,
    a_strings,
    a_version,
    int_fits,
    numa_attribute,
    pci_standard_attributes,
    value_count,
)
from .cpugroups import CpuGroup, cpu_list_text
from .limits import MAX_ATTRIBUTE_VALUES, MAX_ATTRS_AND_CAPACITY
from .options import NormalizeOptions
from .pool import PoolPlan, plan_pool

Device = dict[str, Any]


def pcie_bandwidth_mbps(gen: int | None, width: int | None) -> int | None:
    """Per-direction link throughput in MB/s (DRA attributes have no floats)."""
    gbps = pcie_link_gbps(gen, width)
    return None if gbps is None else int(gbps * 1000 + 0.5)


def quantity(n: int) -> str:
    """Exact bytes (or a count) as a Quantity string: binary suffix when divisible."""
    if n <= 0:
        return str(max(n, 0))
    for suffix, power in (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n % (1 << power) == 0:
            return f"{n >> power}{suffix}"
    return str(n)


def pcie_switch(pci: PciDevice | None) -> str | None:
    """Bus id of the upstream port of the nearest PCIe switch above the device, if any."""
    if pci is None or len(pci.upstream_bridges) < 2:
        return None
    return pci.upstream_bridges[-2]


def nvlink_domain(inv: Inventory, gpu: Gpu) -> str | None:
    """Fabric clique when ready; else a node-local id for NVSwitch / direct-NVLink GPUs."""
    if gpu.fabric is not None and gpu.fabric.clique is not None:
        return gpu.fabric.clique
    host = inv.hostname or "localhost"
    if any(link.remote_type == "switch" for link in gpu.nvlinks):
        return _node_domain(host, "nvswitch")
    gpu_links = {link.remote_bus_id for link in gpu.nvlinks if link.remote_type == "gpu"}
    if not gpu_links - {None}:
        return None
    # Direct NVLink (no switch): the connected component, named after its lowest bus id.
    component = _nvlink_component(inv, gpu.bus_id)
    return _node_domain(host, f"nvlink-{names.bdf_slug(min(component))}")


def _node_domain(host: str, tail: str) -> str:
    text = f"{host}-{tail}"
    if len(text) <= 64:
        return text
    keep = 64 - len(tail) - 10
    return f"{host[:keep]}-{names.short_hash(host)}-{tail}"


def _nvlink_component(inv: Inventory, start: str) -> set[str]:
    adj: dict[str, set[str]] = {g.bus_id: set() for g in inv.gpus}
    for g in inv.gpus:
        for link in g.nvlinks:
            if link.remote_type == "gpu" and link.remote_bus_id in adj:
                adj[g.bus_id].add(link.remote_bus_id)
                adj[link.remote_bus_id].add(g.bus_id)
    seen = {start}
    todo = [start]
    while todo:
        for peer in adj.get(todo.pop(), ()):
            if peer not in seen:
                seen.add(peer)
                todo.append(peer)
    return seen


def _put(attrs: Attrs, key: str, value: Attr | None) -> None:
    if value is not None:
        attrs[key] = value


def _put_int(attrs: Attrs, key: str, value: int | None) -> None:
    if value is not None and int_fits(value):
        attrs[key] = a_int(value)


def _pcie_link_attrs(attrs: Attrs, pci: PciDevice | None) -> None:
    if pci is None:
        return
    gen = pcie_generation(pci.link.current_speed_gts)
    _put_int(attrs, an.PCIE_GEN, gen)
    _put_int(attrs, an.PCIE_WIDTH, pci.link.current_width)
    _put_int(attrs, an.PCIE_BANDWIDTH_MBPS, pcie_bandwidth_mbps(gen, pci.link.current_width))
    _put(attrs, an.PCIE_SWITCH, a_string(pcie_switch(pci)))


def fit_budget(attrs: Attrs, capacity: dict[str, Any]) -> Attrs:
    """Drop trailing (lowest-priority) attributes until the per-device limits hold."""
    kept: Attrs = {}
    values = 0
    for key, val in attrs.items():
        n = value_count(val)
        if len(kept) + len(capacity) + 1 > MAX_ATTRS_AND_CAPACITY:
            break
        if values + n > MAX_ATTRIBUTE_VALUES:
            continue
        kept[key] = val
        values += n
    return kept


def _device(name: str, attrs: Attrs, capacity: dict[str, Any]) -> Device:
    dev: Device = {"name": name, "attributes": fit_budget(attrs, capacity)}
    if capacity:
        dev["capacity"] = capacity
    return dev


def _alignment_attrs(attrs: Attrs, align: Alignment | None, bus_id: str) -> None:
    if align is None:
        return
    _put(attrs, an.NIC_AFFINITY, a_string(align.nic_affinity.get(bus_id)))
    _put_int(attrs, an.RAIL, align.rail.get(bus_id))


def gpu_device(
    inv: Inventory, gpu: Gpu, opts: NormalizeOptions, name: str, align: Alignment | None = None
) -> Device:
    pci = inv.pci(gpu.bus_id)
    attrs: Attrs = {an.TYPE: {"string": "gpu"}}
    attrs.update(pci_standard_attributes(inv, gpu.bus_id, opts, gpu))
    _put(attrs, an.VENDOR, a_string(gpu.vendor))
    _put(attrs, an.MODEL, a_string(gpu.model, truncate=True))
    _put(attrs, an.UUID, a_string(gpu.uuid))
    _put_int(attrs, an.INDEX, gpu.index)
    _put_int(attrs, an.MINOR, gpu.minor)
    _put(attrs, an.ARCHITECTURE, a_string(gpu.architecture, truncate=True))
    _put(attrs, an.COMPUTE_CAPABILITY, a_version(gpu.compute_capability))
    _put(attrs, an.DRIVER_VERSION, a_version(gpu.driver_version, lenient=False))
    if gpu.mig_mode is not None:
        attrs[an.MIG_MODE] = a_bool(gpu.mig_mode)
    _pcie_link_attrs(attrs, pci)
    _alignment_attrs(attrs, align, gpu.bus_id)
    if gpu.nvlinks:
        versions = Counter(link.version for link in gpu.nvlinks if link.version)
        if versions:
            _put(attrs, an.NVLINK_VERSION, a_version(versions.most_common(1)[0][0]))
        attrs[an.NVLINK_LINKS] = a_int(len(gpu.nvlinks))
    _put(attrs, an.NVLINK_DOMAIN, a_string(nvlink_domain(inv, gpu)))
    if gpu.fabric is not None:
        _put(attrs, an.NVLINK_CLIQUE, a_string(gpu.fabric.clique))
    if gpu.xgmi_hive_id and gpu.xgmi_hive_id.strip("0x") != "":
        _put(attrs, an.XGMI_HIVE, a_string(gpu.xgmi_hive_id))
    if gpu.memory_numa_node is not None:
        attrs[an.MEMORY_NUMA_NODE] = a_int(gpu.memory_numa_node)
    capacity: dict[str, Any] = {}
    if gpu.memory_bytes:
        capacity[an.CAPACITY_MEMORY] = {"value": quantity(gpu.memory_bytes)}
    return _device(name, attrs, capacity)


def nic_device(
    inv: Inventory, nic: Nic, opts: NormalizeOptions, name: str, align: Alignment | None = None
) -> Device:
    pci = inv.pci(nic.bus_id)
    attrs: Attrs = {an.TYPE: {"string": "nic"}}
    attrs.update(pci_standard_attributes(inv, nic.bus_id, opts))
    _put(attrs, an.VENDOR, a_string(nic.vendor, truncate=True))
    _put(attrs, an.MODEL, a_string(nic.model, truncate=True))
    _put(attrs, an.NETDEV, a_string(nic.netdevs[0] if nic.netdevs else None))
    _put(attrs, an.RDMA_DEVICE, a_string(nic.rdma_devices[0] if nic.rdma_devices else None))
    _put(attrs, an.LINK_LAYER, a_string(nic.link_layer))
    speed = nic.speed_mbps
    if (speed is None or speed <= 0) and nic.rate_gbps and math.isfinite(nic.rate_gbps):
        speed = round(nic.rate_gbps * 1000)
    if speed is not None and speed > 0:
        _put_int(attrs, an.SPEED_MBPS, speed)
    attrs[an.SRIOV_VF] = a_bool(nic.is_vf)
    if pci is not None and nic.is_vf and pci.physfn:
        _put(attrs, an.SRIOV_PF, a_string(pci.physfn))
    _put(attrs, an.NODE_GUID, a_string(nic.node_guid))
    _pcie_link_attrs(attrs, pci)
    _alignment_attrs(attrs, align, nic.bus_id)
    if opts.legacy_aliases and pci is not None and pci.numa_node is not None:
        attrs[an.LEGACY_NIC_NUMA] = a_int(pci.numa_node)
    return _device(name, attrs, {})


def cpu_device(inv: Inventory, group: CpuGroup, opts: NormalizeOptions) -> Device:
    attrs: Attrs = {an.TYPE: {"string": "cpu"}}
    _put(attrs, an.NUMA_NODE, numa_attribute(inv, group.numa_node, opts))
    if opts.numa_list and group.pcie_roots:
        _put(attrs, an.PCIE_ROOT, a_strings(list(group.pcie_roots)))
    _put(attrs, an.VENDOR, a_string(inv.host.get("cpu_vendor"), truncate=True))
    _put(attrs, an.MODEL, a_string(inv.host.get("cpu_model"), truncate=True))
    _put(attrs, an.GROUPING, a_string(group.kind))
    _put_int(attrs, an.PACKAGE, group.package)
    _put_int(attrs, an.L3_CACHE, group.l3_id)
    _put_int(attrs, an.CORE, group.core)
    _put(attrs, an.CPU_LIST, a_string(cpu_list_text(group.cpus)))
    if group.pcie_roots:
        if opts.numa_list:
            _put(attrs, an.PCIE_ROOTS, a_strings(list(group.pcie_roots)))
        else:
            _put(attrs, an.PCIE_ROOTS, a_string(",".join(group.pcie_roots)))
    if opts.legacy_aliases and group.numa_node is not None:
        attrs[an.LEGACY_CPU_NUMA] = a_int(group.numa_node)
    capacity: dict[str, Any] = {an.CAPACITY_CPUS: {"value": str(len(group.cpus))}}
    if group.memory_bytes:
        capacity[an.CAPACITY_MEMORY] = {"value": quantity(group.memory_bytes)}
    return _device(group.name, attrs, capacity)


def device_names(inv: Inventory, opts: NormalizeOptions | None = None) -> dict[str, str]:
    """Map graph vertex ids (``gpu:<bus>``, ``nic:<bus>``, ``cpu_group:<group name>``) to the
    published DRA device names."""
    return plan_pool(inv, opts).names


def build_devices(
    inv: Inventory, opts: NormalizeOptions | None = None, plan: PoolPlan | None = None
) -> list[Device]:
    """All devices of the pool in :func:`allocation_order`. Names are unique within the
    pool (``plan``: the pool plan, when the caller already has it)."""
    opts = opts or NormalizeOptions()
    plan = plan or plan_pool(inv, opts)
    out: list[Device] = []
    align = alignment(inv)
    for entry in plan.entries:
        if entry.gpu is not None:
            out.append(gpu_device(inv, entry.gpu, opts, entry.name, align))
        elif entry.nic is not None:
            out.append(nic_device(inv, entry.nic, opts, entry.name, align))
        elif entry.cpu_group is not None:
            group = entry.cpu_group
            if entry.name != group.name:
                group = replace(group, name=entry.name)
            out.append(cpu_device(inv, group, opts))
    return allocation_order(out)


def _value(dev: Device, key: str) -> Any:
    attr = dev["attributes"].get(key) or {}
    for kind in ("string", "int"):
        if kind in attr:
            return attr[kind]
    ints = attr.get("ints") or attr.get("list") or []
    return ints[0] if isinstance(ints, list) and ints else None


def allocation_order(devices: list[Device]) -> list[Device]:
    """The order devices are published in, which is the order the scheduler's first-fit
    allocator tries them (docs/performance.md#claims-at-cluster-size): NUMA node by NUMA
    node (in the order the GPUs, then the NICs, then the CPU groups name them; devices
    without a NUMA node last), and in each, every GPU (bus-id order) followed by the NICs
    of its closest-NIC group (``nicAffinity``), then the node's other NICs, then its CPU
    groups. Every device a request skips costs the allocator a CEL evaluation, and one it
    already took costs nothing: with each GPU's NICs right behind it, the NIC request of
    a GPU+NIC pair finds its NIC at the first device it evaluates; with the CPU group
    behind its NUMA node's devices, a CPU request after GPUs of that node is a few
    devices away. GPUs keep their bus-id order, so plain GPU counts pick the same GPUs."""
    kinds = {"gpu": 0, "nic": 1, "cpu": 2}
    by_kind: list[list[Device]] = [[], [], []]
    rest: list[Device] = []
    for d in devices:
        k = kinds.get(str(_value(d, an.TYPE)))
        (by_kind[k] if k is not None else rest).append(d)
    gpus, nics, cpus = by_kind
    blocks: list[Any] = []
    for d in gpus + nics + cpus:
        numa = _value(d, an.NUMA_NODE)
        if numa is not None and numa not in blocks:
            blocks.append(numa)
    blocks.append(None)
    out: list[Device] = []
    placed: set[int] = set()
    for block in blocks:
        for g in gpus:
            if _value(g, an.NUMA_NODE) != block:
                continue
            out.append(g)
            group = _value(g, an.NIC_AFFINITY)
            for n in nics if group is not None else ():
                if id(n) not in placed and _value(n, an.NIC_AFFINITY) == group:
                    out.append(n)
                    placed.add(id(n))
        for n in nics:
            if id(n) not in placed and _value(n, an.NUMA_NODE) == block:
                out.append(n)
                placed.add(id(n))
        out += [c for c in cpus if _value(c, an.NUMA_NODE) == block]
    return out + rest
