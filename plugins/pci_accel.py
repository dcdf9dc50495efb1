"""Generic PCI accelerators from sysfs: AMD, Intel, NVIDIA and any other GPU-class device.

Reads only what sysfs discovery already put into ``ctx.host.pci_devices`` plus, for AMD
GPUs, the KFD topology under ``/sys/class/kfd/kfd/topology/nodes`` (VRAM size, xGMI hive
and direct xGMI peers, unique id, gfx target). No vendor library is needed, so this probe
also works on a replayed sysfs dump.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from discovery.model import Gpu, PciDevice, XgmiLink
from discovery.pci_ids import class_code, parse_id, vendor_word
from discovery.readers import read_text
from discovery.root import Root
from discovery.words import plural
from plugins.base import ProbeContext, ProbeReport, ProbeUnavailable

__all__ = ["GPU_MODELS", "PciAcceleratorProbe", "is_accelerator"]

# Display controllers that are BMC consoles or emulated VGA, never accelerators.
_CONSOLE_VENDORS: frozenset[int] = frozenset(
    {
        0x1A03,  # ASPEED (BMC)
        0x102B,  # Matrox (G200 on server BMCs)
        0x1013,  # Cirrus Logic (emulated)
        0x1B36,  # Red Hat (QXL)
        0x1234,  # QEMU/bochs stdvga
        0x15AD,  # VMware SVGA
        0x80EE,  # VirtualBox
        0x1414,  # Microsoft Hyper-V
        0x1AF4,  # virtio-gpu
        0x1D0F,  # Amazon EC2 VGA
    }
)
# Single console devices of vendors that also make accelerators.
_CONSOLE_DEVICES: frozenset[tuple[int, int]] = frozenset(
    {
        (0x19E5, 0x1711),  # HiSilicon Hi171x BMC VGA
        (0x1002, 0x515E),  # ATI ES1000 (old server boards)
    }
)

GPU_MODELS: dict[tuple[int, int], str] = {
    # AMD Instinct
    (0x1002, 0x74A1): "AMD Instinct MI300X",
    (0x1002, 0x74A2): "AMD Instinct MI308X",
    (0x1002, 0x74A0): "AMD Instinct MI300A",
    (0x1002, 0x74A5): "AMD Instinct MI325X",
    (0x1002, 0x740F): "AMD Instinct MI210",
    (0x1002, 0x740C): "AMD Instinct MI250X/MI250",
    (0x1002, 0x738C): "AMD Instinct MI100",
    # NVIDIA data centre
    (0x10DE, 0x2330): "NVIDIA H100 80GB HBM3",
    (0x10DE, 0x2331): "NVIDIA H100 PCIe",
    (0x10DE, 0x2335): "NVIDIA H200",
    (0x10DE, 0x2342): "NVIDIA GH200",
    (0x10DE, 0x2901): "NVIDIA B200",
    (0x10DE, 0x20B0): "NVIDIA A100-SXM4-40GB",
    (0x10DE, 0x20B2): "NVIDIA A100-SXM4-80GB",
    (0x10DE, 0x20B5): "NVIDIA A100 80GB PCIe",
    (0x10DE, 0x20F1): "NVIDIA A100-PCIE-40GB",
    (0x10DE, 0x2236): "NVIDIA A10",
    (0x10DE, 0x2237): "NVIDIA A10G",
    (0x10DE, 0x26B5): "NVIDIA L40",
    (0x10DE, 0x26B9): "NVIDIA L40S",
    (0x10DE, 0x27B8): "NVIDIA L4",
    (0x10DE, 0x1EB8): "Tesla T4",
    (0x10DE, 0x1DB1): "Tesla V100-SXM2-16GB",
    (0x10DE, 0x1DB4): "Tesla V100-PCIE-16GB",
    (0x10DE, 0x1DB5): "Tesla V100-SXM2-32GB",
    # Intel
    (0x8086, 0x0BD5): "Intel Data Center GPU Max 1550",
    (0x8086, 0x0BDA): "Intel Data Center GPU Max 1100",
    (0x8086, 0x56C0): "Intel Data Center GPU Flex 170",
    (0x8086, 0x56C1): "Intel Data Center GPU Flex 140",
    # Habana
    (0x1DA3, 0x1000): "Habana Gaudi",
    (0x1DA3, 0x1020): "Habana Gaudi2",
}

_KFD_XGMI_LINK = 11


def is_accelerator(dev: PciDevice) -> bool:
    """Display-class device that is not a console, or a processing accelerator."""
    cls = class_code(dev)
    if cls is None:
        return False
    if cls == 0x1200:
        return True
    if cls >> 8 != 0x03:
        return False
    vendor = parse_id(dev.vendor)
    device = parse_id(dev.device)
    if vendor in _CONSOLE_VENDORS:
        return False
    return not (vendor is not None and device is not None and (vendor, device) in _CONSOLE_DEVICES)


def gfx_name(target_version: int) -> str | None:
    """KFD ``gfx_target_version`` (``90402``) -> LLVM target (``gfx942``)."""
    if target_version <= 0:
        return None
    major, rest = divmod(target_version, 10000)
    minor, stepping = divmod(rest, 100)
    if minor > 15 or stepping > 15:
        return None
    return f"gfx{major}{minor:x}{stepping:x}"


def _read_properties(path: str, warnings: list[str]) -> dict[str, int] | None:
    """KFD ``key value`` file -> dict; None (plus a warning) when unreadable or malformed."""
    text = read_text(path)
    if text is None:
        return None
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split()
        try:
            if len(parts) != 2 or not parts[0].isidentifier():
                raise ValueError(line)
            out[parts[0]] = int(parts[1], 10)
        except ValueError:
            warnings.append(f"pci: ignoring malformed KFD file {path}: {line[:60]!r}")
            return None
    return out


@dataclass
class _KfdNode:
    node_id: int
    bus_id: str
    props: dict[str, int]
    links_to: list[int] = field(default_factory=list)
    link_props: dict[int, dict[str, int]] = field(default_factory=dict)
    memory_bytes: int | None = None


def _kfd_bus_id(props: dict[str, int]) -> str | None:
    domain = props.get("domain", 0)
    location = props.get("location_id")
    if location is None or not 0 <= location <= 0xFFFF or not 0 <= domain <= 0xFFFFFFFF:
        return None
    bus, devfn = location >> 8, location & 0xFF
    return f"{domain:04x}:{bus:02x}:{devfn >> 3:02x}.{devfn & 7:x}"


def _numeric_dirs(path: str) -> list[tuple[int, str]]:
    try:
        names = os.listdir(path)
    except OSError:
        return []
    return sorted((int(n), os.path.join(path, n)) for n in names if n.isdigit())


def _read_kfd(root: Root, gpu_bus_ids: set[str], warnings: list[str]) -> dict[str, _KfdNode]:
    """GPU KFD nodes keyed by the PCI bus id they belong to (only known accelerators)."""
    nodes_dir = root.sys_path("class", "kfd", "kfd", "topology", "nodes")
    by_bus: dict[str, _KfdNode] = {}
    for node_id, node_dir in _numeric_dirs(nodes_dir):
        props = _read_properties(os.path.join(node_dir, "properties"), warnings)
        if props is None or props.get("drm_render_minor", 0) <= 0:
            continue
        bus_id = _kfd_bus_id(props)
        if bus_id is None:
            warnings.append(f"pci: KFD node {node_id} has no usable PCI location")
            continue
        if bus_id not in gpu_bus_ids:
            continue
        if bus_id in by_bus:
            warnings.append(
                f"pci: KFD nodes {by_bus[bus_id].node_id} and {node_id} both map to {bus_id}"
                " (GPU partitions?); using the first"
            )
            continue
        node = _KfdNode(node_id, bus_id, props)
        bank = _read_properties(os.path.join(node_dir, "mem_banks", "0", "properties"), warnings)
        if bank is not None and bank.get("size_in_bytes", 0) > 0:
            node.memory_bytes = bank["size_in_bytes"]
        for sub in ("io_links", "p2p_links"):
            for _, link_dir in _numeric_dirs(os.path.join(node_dir, sub)):
                link = _read_properties(os.path.join(link_dir, "properties"), warnings)
                if link is None or link.get("type") != _KFD_XGMI_LINK:
                    continue
                peer = link.get("node_to")
                if peer is not None and peer != node_id and peer not in node.links_to:
                    node.links_to.append(peer)
                    node.link_props[peer] = link
        by_bus[bus_id] = node
    return by_bus


def _apply_kfd(gpu: Gpu, node: _KfdNode, node_bus: dict[int, str]) -> None:
    props = node.props
    gpu.memory_bytes = node.memory_bytes
    hive = props.get("hive_id", 0)
    if hive > 0:
        gpu.xgmi_hive_id = f"0x{hive:016x}"
    unique = props.get("unique_id", 0)
    if unique > 0:
        gpu.uuid = f"0x{unique:016x}"
    gpu.architecture = gfx_name(props.get("gfx_target_version", 0))
    links = []
    for peer in node.links_to:
        peer_bus = node_bus.get(peer)
        if peer_bus is None or peer_bus == gpu.bus_id:
            continue
        lp = node.link_props.get(peer, {})
        links.append(
            XgmiLink(
                peer_bus_id=peer_bus,
                weight=lp.get("weight"),
                min_bandwidth_mbps=lp.get("min_bandwidth"),
                max_bandwidth_mbps=lp.get("max_bandwidth"),
            )
        )
    gpu.xgmi_links = sorted(links, key=lambda link: link.peer_bus_id)
    gpu.xgmi_peers = [link.peer_bus_id for link in gpu.xgmi_links]


_AMD_VENDOR = 0x1002


def _product_name(root: Root, bus_id: str) -> str | None:
    """amdgpu's ``product_name`` (the board's own marketing name, from its FRU), if any."""
    text = read_text(root.sys_path("bus", "pci", "devices", bus_id, "product_name"))
    if not text or len(text) > 128 or not text.isprintable():
        return None
    return text


class PciAcceleratorProbe:
    name = "pci"

    def probe(self, ctx: ProbeContext) -> ProbeReport:
        report = ProbeReport()
        gpus: dict[str, Gpu] = {}
        for dev in ctx.host.pci_devices:
            if not is_accelerator(dev) or dev.bus_id in gpus:
                continue
            vendor = parse_id(dev.vendor)
            device = parse_id(dev.device)
            model = _product_name(ctx.root, dev.bus_id) if vendor == _AMD_VENDOR else None
            if model is None and vendor is not None and device is not None:
                model = GPU_MODELS.get((vendor, device))
            model = model or dev.device_name
            gpus[dev.bus_id] = Gpu(
                bus_id=dev.bus_id, vendor=vendor_word(vendor), probe=self.name, model=model
            )
        if not gpus:
            raise ProbeUnavailable("no PCI accelerators")

        kfd = _read_kfd(ctx.root, set(gpus), report.warnings)
        node_bus = {node.node_id: bus for bus, node in kfd.items()}
        for bus_id, node in kfd.items():
            _apply_kfd(gpus[bus_id], node, node_bus)

        report.gpus = sorted(gpus.values(), key=lambda g: g.bus_id)
        counts: dict[str, int] = {}
        for gpu in report.gpus:
            counts[gpu.vendor] = counts.get(gpu.vendor, 0) + 1
        parts = [f"{n} {v}" for v, n in sorted(counts.items())]
        report.detail = f"{plural(len(report.gpus), 'accelerator')} ({', '.join(parts)})"
        if kfd:
            report.detail += f", {len(kfd)} with KFD topology"
        return report
