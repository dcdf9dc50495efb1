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
    AttributeDrop,
    Attrs,
    a_bool,
    a_int,
    a_string,
    a_strings,
    a_version,
    int_fits,
    numa_attribute,
    pci_standard_attributes,
    too_long,
    value_count,
)
from .cpugroups import CpuGroup, cpu_list_text
from .dialects import bridge_devices
from .limits import MAX_ATTRIBUTE_VALUES, MAX_ATTRS_AND_CAPACITY, MAX_STRING
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


class _Builder:
    """One device's attributes, recording each known value the API cannot take."""

    def __init__(self, device: str, dropped: list[AttributeDrop]) -> None:
        self.device = device
        self.attrs: Attrs = {}
        self.dropped = dropped

    def drop(self, key: str, reason: str, published: str | None = None) -> None:
        self.dropped.append(AttributeDrop(self.device, key, reason, published))

    def put(self, key: str, value: Attr | None) -> None:
        if value is not None:
            self.attrs[key] = value

    def string(self, key: str, value: str | None, *, truncate: bool = False) -> None:
        text = (value or "").strip()
        if len(text) > MAX_STRING:
            self.drop(
                key, too_long(text), f"its first {MAX_STRING} characters" if truncate else None
            )
        self.put(key, a_string(value, truncate=truncate))

    def int(self, key: str, value: int | None) -> None:
        if value is None:
            return
        if not int_fits(value):
            self.drop(key, f"{value} is outside the int64 range")
            return
        self.attrs[key] = a_int(value)

    def version(self, key: str, text: str | None, *, lenient: bool = True) -> None:
        attr = a_version(text, lenient=lenient)
        if attr is None and text is not None and text.strip():
            self.drop(key, f"{text.strip()!r} is not a semantic version (MAJOR.MINOR.PATCH)")
        self.put(key, attr)

    def strings(self, key: str, values: list[str]) -> None:
        attr = a_strings(values)
        for v in values:
            if len(v) > MAX_STRING:
                self.drop(f"{key}[]", too_long(v), "the list without it" if attr else None)
        self.put(key, attr)

    def joined(self, key: str, values: list[str], flag: str, more: tuple[str, ...] = ()) -> None:
        """``values`` comma-joined into one string. Over the limit, split at value
        boundaries (never inside one): ``key`` holds the leading values that fit, each name
        of ``more`` in turn the next ones, and ``flag`` = true says ``key`` alone is not the
        whole list. Nothing is lost unless even ``more`` runs out: only that is reported."""
        names = (key, *more)
        chunks: list[list[str]] = []
        cur: list[str] = []
        placed = 0
        for v in values:
            if cur and len(",".join([*cur, v])) > MAX_STRING:
                chunks.append(cur)
                cur = []
            if len(v) > MAX_STRING or len(chunks) == len(names):
                break
            cur.append(v)
            placed += 1
        if cur:
            chunks.append(cur)
        for i, chunk in enumerate(chunks):
            self.put(names[i], a_string(",".join(chunk)))
            if i == 0 and len(chunk) < len(values):
                self.attrs[flag] = a_bool(True)
        if placed < len(values):
            used = ", ".join(names[: len(chunks)])
            self.drop(
                key,
                f"lists {len(values)} values in {len(','.join(values))} characters, more "
                f"than {len(names)} attributes of {MAX_STRING} characters hold",
                f"the first {placed} in {used} and {flag}=true" if placed else None,
            )

    def device_dict(self, capacity: dict[str, Any]) -> Device:
        dev: Device = {"name": self.device, "attributes": self._fit(capacity)}
        if capacity:
            dev["capacity"] = capacity
        return dev

    def _fit(self, capacity: dict[str, Any]) -> Attrs:
        kept = fit_budget(self.attrs, capacity)
        values = sum(value_count(v) for v in kept.values())
        for key, val in self.attrs.items():
            if key in kept:
                continue
            if len(kept) + len(capacity) >= MAX_ATTRS_AND_CAPACITY:
                reason = f"is over the {MAX_ATTRS_AND_CAPACITY} attributes-and-capacities limit"
            else:
                reason = (
                    f"({value_count(val)} values) is over the {MAX_ATTRIBUTE_VALUES}-values "
                    f"limit ({values} used)"
                )
            self.drop(key, reason)
        return kept


def _pcie_link_attrs(b: _Builder, pci: PciDevice | None) -> None:
    if pci is None:
        return
    gen = pcie_generation(pci.link.current_speed_gts)
    b.int(an.PCIE_GEN, gen)
    b.int(an.PCIE_WIDTH, pci.link.current_width)
    b.int(an.PCIE_BANDWIDTH_MBPS, pcie_bandwidth_mbps(gen, pci.link.current_width))
    b.string(an.PCIE_SWITCH, pcie_switch(pci))


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


def _alignment_attrs(b: _Builder, align: Alignment | None, bus_id: str) -> None:
    if align is None:
        return
    b.string(an.NIC_AFFINITY, align.nic_affinity.get(bus_id))
    b.int(an.RAIL, align.rail.get(bus_id))


def gpu_device(
    inv: Inventory,
    gpu: Gpu,
    opts: NormalizeOptions,
    name: str,
    align: Alignment | None = None,
    dropped: list[AttributeDrop] | None = None,
) -> Device:
    pci = inv.pci(gpu.bus_id)
    b = _Builder(name, dropped if dropped is not None else [])
    b.put(an.TYPE, {"string": "gpu"})
    b.attrs.update(pci_standard_attributes(inv, gpu.bus_id, opts, gpu, b.dropped, name))
    b.string(an.VENDOR, gpu.vendor)
    b.string(an.MODEL, gpu.model, truncate=True)
    b.string(an.UUID, gpu.uuid)
    b.int(an.INDEX, gpu.index)
    b.int(an.MINOR, gpu.minor)
    b.string(an.ARCHITECTURE, gpu.architecture, truncate=True)
    b.version(an.COMPUTE_CAPABILITY, gpu.compute_capability)
    b.version(an.DRIVER_VERSION, gpu.driver_version, lenient=False)
    if gpu.mig_mode is not None:
        b.put(an.MIG_MODE, a_bool(gpu.mig_mode))
    _pcie_link_attrs(b, pci)
    _alignment_attrs(b, align, gpu.bus_id)
    if gpu.nvlinks:
        versions = Counter(link.version for link in gpu.nvlinks if link.version)
        if versions:
            b.version(an.NVLINK_VERSION, versions.most_common(1)[0][0])
        b.put(an.NVLINK_LINKS, a_int(len(gpu.nvlinks)))
    b.string(an.NVLINK_DOMAIN, nvlink_domain(inv, gpu))
    if gpu.fabric is not None:
        b.string(an.NVLINK_CLIQUE, gpu.fabric.clique)
    if gpu.xgmi_hive_id and gpu.xgmi_hive_id.strip("0x") != "":
        b.string(an.XGMI_HIVE, gpu.xgmi_hive_id)
    if gpu.memory_numa_node is not None:
        b.int(an.MEMORY_NUMA_NODE, gpu.memory_numa_node)
    capacity: dict[str, Any] = {}
    if gpu.memory_bytes:
        capacity[an.CAPACITY_MEMORY] = {"value": quantity(gpu.memory_bytes)}
    return b.device_dict(capacity)


def nic_device(
    inv: Inventory,
    nic: Nic,
    opts: NormalizeOptions,
    name: str,
    align: Alignment | None = None,
    dropped: list[AttributeDrop] | None = None,
) -> Device:
    pci = inv.pci(nic.bus_id)
    b = _Builder(name, dropped if dropped is not None else [])
    b.put(an.TYPE, {"string": "nic"})
    b.attrs.update(pci_standard_attributes(inv, nic.bus_id, opts, None, b.dropped, name))
    b.string(an.VENDOR, nic.vendor, truncate=True)
    b.string(an.MODEL, nic.model, truncate=True)
    b.string(an.NETDEV, nic.netdevs[0] if nic.netdevs else None)
    b.string(an.RDMA_DEVICE, nic.rdma_devices[0] if nic.rdma_devices else None)
    b.string(an.LINK_LAYER, nic.link_layer)
    speed = nic.speed_mbps
    if (speed is None or speed <= 0) and nic.rate_gbps and math.isfinite(nic.rate_gbps):
        speed = round(nic.rate_gbps * 1000)
    if speed is not None and speed > 0:
        b.int(an.SPEED_MBPS, speed)
    b.put(an.SRIOV_VF, a_bool(nic.is_vf))
    if pci is not None and nic.is_vf and pci.physfn:
        b.string(an.SRIOV_PF, pci.physfn)
    b.string(an.NODE_GUID, nic.node_guid)
    _pcie_link_attrs(b, pci)
    _alignment_attrs(b, align, nic.bus_id)
    return b.device_dict({})


def cpu_device(
    inv: Inventory,
    group: CpuGroup,
    opts: NormalizeOptions,
    dropped: list[AttributeDrop] | None = None,
) -> Device:
    b = _Builder(group.name, dropped if dropped is not None else [])
    b.put(an.TYPE, {"string": "cpu"})
    b.put(an.NUMA_NODE, numa_attribute(inv, group.numa_node, opts))
    if opts.numa_list and group.pcie_roots:
        b.strings(an.PCIE_ROOT, list(group.pcie_roots))
    b.string(an.VENDOR, inv.host.get("cpu_vendor"), truncate=True)
    b.string(an.MODEL, inv.host.get("cpu_model"), truncate=True)
    b.string(an.GROUPING, group.kind)
    b.int(an.PACKAGE, group.package)
    b.int(an.L3_CACHE, group.l3_id)
    b.int(an.CORE, group.core)
    b.string(an.CPU_LIST, cpu_list_text(group.cpus))
    if group.pcie_roots:
        if opts.numa_list:
            b.strings(an.PCIE_ROOTS, list(group.pcie_roots))
        else:
            roots = list(group.pcie_roots)
            b.joined(an.PCIE_ROOTS, roots, an.PCIE_ROOTS_TRUNCATED, an.PCIE_ROOTS_MORE)
    capacity: dict[str, Any] = {an.CAPACITY_CPUS: {"value": str(len(group.cpus))}}
    if group.memory_bytes:
        capacity[an.CAPACITY_MEMORY] = {"value": quantity(group.memory_bytes)}
    return b.device_dict(capacity)


def device_names(inv: Inventory, opts: NormalizeOptions | None = None) -> dict[str, str]:
    """Map graph vertex ids (``gpu:<bus>``, ``nic:<bus>``, ``cpu_group:<group name>``) to the
    published DRA device names."""
    return plan_pool(inv, opts).names


def build_devices(
    inv: Inventory, opts: NormalizeOptions | None = None, plan: PoolPlan | None = None
) -> list[Device]:
    """All devices of the pool in :func:`allocation_order`. Names are unique within the
    pool (``plan``: the pool plan, when the caller already has it)."""
    return build_devices_reported(inv, opts, plan)[0]


def build_devices_reported(
    inv: Inventory, opts: NormalizeOptions | None = None, plan: PoolPlan | None = None
) -> tuple[list[Device], list[AttributeDrop]]:
    """:func:`build_devices`, and every known attribute value that is not published as it
    is (over an API limit, or not in the API's form), in device order."""
    opts = opts or NormalizeOptions()
    plan = plan or plan_pool(inv, opts)
    out: list[Device] = []
    dropped: list[AttributeDrop] = []
    align = alignment(inv)
    for entry in plan.entries:
        if entry.gpu is not None:
            out.append(gpu_device(inv, entry.gpu, opts, entry.name, align, dropped))
        elif entry.nic is not None:
            out.append(nic_device(inv, entry.nic, opts, entry.name, align, dropped))
        elif entry.cpu_group is not None:
            group = entry.cpu_group
            if entry.name != group.name:
                group = replace(group, name=entry.name)
            out.append(cpu_device(inv, group, opts, dropped))
    numbered = number_by_type(allocation_order(out), dropped)
    return bridge_devices(numbered, opts.bridges), dropped


def number_by_type(devices: list[Device], dropped: list[AttributeDrop]) -> list[Device]:
    """Give each GPU and NIC its ``ordinal`` among the node's devices of its type (in
    published order) and that type's ``typeCount``, right behind ``type`` so that the
    budget (:func:`fit_budget`) keeps them: the ladder claims' windows need them on every
    device, and an attribute dropped for them is reported like any other."""
    totals = Counter(str(_value(d, an.TYPE)) for d in devices)
    seen: dict[str, int] = {}
    out: list[Device] = []
    for d in devices:
        kind = str(_value(d, an.TYPE))
        if kind not in ("gpu", "nic"):
            out.append(d)
            continue
        ordinal = seen.get(kind, 0)
        seen[kind] = ordinal + 1
        attrs: Attrs = {}
        for key, val in d["attributes"].items():
            attrs[key] = val
            if key == an.TYPE:
                attrs[an.ORDINAL] = a_int(ordinal)
                attrs[an.TYPE_COUNT] = a_int(totals[kind])
        capacity = d.get("capacity") or {}
        kept = fit_budget(attrs, capacity)
        for key in attrs:
            if key not in kept:
                reason = f"is over the {MAX_ATTRS_AND_CAPACITY} attributes-and-capacities limit"
                dropped.append(AttributeDrop(d["name"], key, reason))
        out.append({**d, "attributes": kept})
    return out


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
    of its closest-NIC group (``nicAffinity``), then the node's CPU groups and its other
    NICs. Every device a request skips costs the allocator a CEL evaluation, and one it
    already took costs nothing: with each GPU's NICs right behind it, the NIC request of
    a GPU+NIC pair finds its NIC at the first device it evaluates; with the CPU group
    right behind its NUMA node's GPUs and their NICs, a CPU request after GPUs of that
    node is a few devices away, and no GPU count passes it before it has passed the
    node's GPUs. GPUs keep their bus-id order, so plain GPU counts pick the same GPUs."""
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
        placed_before = len(placed)
        for g in gpus:
            if _value(g, an.NUMA_NODE) != block:
                continue
            out.append(g)
            group = _value(g, an.NIC_AFFINITY)
            for n in nics if group is not None else ():
                if id(n) not in placed and _value(n, an.NIC_AFFINITY) == group:
                    out.append(n)
                    placed.add(id(n))
        paired = len(placed) > placed_before
        rest_nics = [n for n in nics if id(n) not in placed and _value(n, an.NUMA_NODE) == block]
        placed.update(id(n) for n in rest_nics)
        block_cpus = [c for c in cpus if _value(c, an.NUMA_NODE) == block]
        # Where the node's GPUs have close NICs, its other NICs (storage, management) are
        # what a pair's request does not want, and the CPU group goes before them; where no
        # NIC is close to a GPU (GB200 trays) the NICs are what pairs take, so they go first.
        out += block_cpus + rest_nics if paired else rest_nics + block_cpus
    return out + rest
