"""PCI backend: every function and bridge under ``<root>/sys/bus/pci/devices``.

The PCIe tree comes from the resolved sysfs path of each function, exactly the way
Kubernetes' ``deviceattribute`` helpers derive ``pcieRoot``: the first component
under ``devices/`` is the root complex, the functions between it and the device are
its upstream bridges. Dumps whose entries are plain directories (no symlinks) give
no tree; those devices get no ``pcie_root`` rather than a guessed one.
"""

from __future__ import annotations

import os
import re

from discovery.bounds import MAX_LINK_WIDTH, MAX_NUMA_NODES
from discovery.model import PciDevice, PciLink
from discovery.readers import (
    DirReader,
    normalize_bdf,
    parse_cpulist,
    parse_cpumask,
    parse_int,
    parse_link_speed,
)
from discovery.root import Root
from discovery.warning_log import Warnings

BDF_RE = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
ROOT_RE = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")
BRIDGE_CLASSES = {"0x0604", "0x0609"}


def _hex_id(text: str | None, digits: int, what: str, bdf: str, warn: Warnings) -> str | None:
    if text is None:
        return None
    value = parse_int(text, 16)
    if value is None or not 0 <= value < 1 << (4 * digits):
        warn.add(f"pci {bdf}: malformed {what} {text[:40]!r}")
        return None
    return f"0x{value:0{digits}x}"


def resolve_pci_path(
    root: Root, pci_dir: str, entry: str
) -> tuple[str | None, list[str], str] | None:
    """(pcie_root, upstream_bridges, function dir) from the ``bus/pci/devices`` symlink.

    None when the entry is not a symlink into ``devices/``. A host bridge registered
    below a platform device (``devices/platform/soc/…/pci0000:00/…``, Arm SoCs) still
    gives the bridge chain, but no ``pcie_root``: the Kubernetes rule takes only a
    ``pci*`` directory directly under ``devices/``.
    """
    try:
        target = os.readlink(os.path.join(pci_dir, entry))
    except OSError:
        return None
    rel = os.path.normpath(os.path.join("bus/pci/devices", target))
    parts = [p for p in rel.split("/") if p]
    # Normalised relative to sys/: expect ["devices", "pciDDDD:BB", ..., entry].
    try:
        start = parts.index("devices")
    except ValueError:
        return None
    chain = parts[start + 1 :]
    if not chain or chain[-1] != entry:
        return None
    host = next((i for i, p in enumerate(chain) if ROOT_RE.match(p)), None)
    if host is None:
        return None
    bridges = [p for p in chain[host + 1 : -1] if BDF_RE.match(p)]
    return (chain[0] if host == 0 else None), bridges, root.sys_path(rel)


def discover_pci(root: Root, warn: Warnings) -> list[PciDevice]:
    pci_dir = root.sys_path("bus", "pci", "devices")
    try:
        entries = sorted(os.listdir(pci_dir))
    except OSError:
        return []
    devices = []
    unlocated = []
    names = set(entries)
    for entry in entries:
        bdf = entry.lower()
        if not BDF_RE.match(bdf):
            warn.add(f"pci: ignoring unexpected entry {entry[:60]!r} in bus/pci/devices")
            continue
        canonical = normalize_bdf(bdf) if len(bdf) > 12 else bdf  # a domain of > 4 digits
        if canonical is not None and canonical != bdf and canonical in names:
            # `00000000:98:00.0` beside `0000:98:00.0`: one function under two names.
            warn.add(f"pci: ignoring {entry[:60]!r}, an alias of {canonical}")
            continue
        dev, located = _read_function(root, pci_dir, entry, bdf, warn)
        devices.append(dev)
        if not located:
            unlocated.append((entry, dev))
    if unlocated:
        _chains_from_config(pci_dir, unlocated, devices)
    return devices


def _bus_range(pci_dir: str, entry: str) -> tuple[int, int] | None:
    """(secondary, subordinate) bus of a type-1 (bridge) header from ``config``."""
    try:
        with open(os.path.join(pci_dir, entry, "config"), "rb") as fh:
            head = fh.read(64)
    except OSError:
        return None
    if len(head) < 0x1B or head[0x0E] & 0x7F != 1:
        return None
    secondary, subordinate = head[0x19], head[0x1A]
    return (secondary, subordinate) if 0 < secondary <= subordinate else None


def _chains_from_config(
    pci_dir: str, unlocated: list[tuple[str, PciDevice]], devices: list[PciDevice]
) -> None:
    """Upstream bridges from config-space bus ranges, for dumps without symlinks.

    Such dumps cannot give ``pcie_root`` the Kubernetes way (it stays None), but the
    bridge chain is still knowable the way hwloc builds it: a function on bus B sits
    below every bridge of its domain whose [secondary, subordinate] range holds B.
    """
    entry_of = {dev.bus_id: entry for entry, dev in unlocated}
    ranges: dict[str, tuple[str, int, int]] = {}
    for dev in devices:
        if dev.is_bridge and dev.bus_id in entry_of:
            rng = _bus_range(pci_dir, entry_of[dev.bus_id])
            if rng is not None:
                ranges[dev.bus_id] = (dev.bus_id.rsplit(":", 2)[0], *rng)
    if not ranges:
        return
    for _, dev in unlocated:
        domain, bus_text, _ = dev.bus_id.rsplit(":", 2)
        bus = int(bus_text, 16)
        above = [
            (sub - sec, bdf)
            for bdf, (dom, sec, sub) in ranges.items()
            if dom == domain and sec <= bus <= sub and bdf != dev.bus_id
        ]
        dev.upstream_bridges = [bdf for _, bdf in sorted(above, reverse=True)]


def _read_function(
    root: Root, pci_dir: str, entry: str, bdf: str, warn: Warnings
) -> tuple[PciDevice, bool]:
    """The function's facts, and whether its place in the tree came from a symlink."""
    dev = PciDevice(bus_id=bdf)
    located = resolve_pci_path(root, pci_dir, entry)
    path = os.path.join(pci_dir, entry)
    if located is not None:
        dev.pcie_root, dev.upstream_bridges, path = located
    with DirReader(path) as rd:
        _fill(dev, rd, warn)
    return dev, located is not None


def _from_uevent(dev: PciDevice, text: str | None) -> bool:
    """Identity and driver from ``uevent`` (one read instead of six); False if unusable."""
    if not text:
        return False
    keys = dict(line.partition("=")[::2] for line in text.splitlines())
    try:
        value = int(keys["PCI_CLASS"], 16)
        vendor, device = (int(x, 16) for x in keys["PCI_ID"].split(":"))
        sub_v, sub_d = (int(x, 16) for x in keys.get("PCI_SUBSYS_ID", "").split(":"))
    except (KeyError, ValueError):
        return False
    if value > 0xFFFFFF or max(vendor, device, sub_v, sub_d) > 0xFFFF:
        return False
    dev.class_code = f"0x{value >> 8:04x}"
    dev.prog_if = f"0x{value & 0xFF:02x}"
    dev.vendor, dev.device = f"0x{vendor:04x}", f"0x{device:04x}"
    dev.subsystem_vendor, dev.subsystem_device = f"0x{sub_v:04x}", f"0x{sub_d:04x}"
    dev.driver = keys.get("DRIVER") or None
    return True


def _fill(dev: PciDevice, rd: DirReader, warn: Warnings) -> None:
    if not _from_uevent(dev, rd.text("uevent")):
        _fill_ids(dev, rd, warn)
    dev.is_bridge = dev.class_code in BRIDGE_CLASSES
    _fill_locality(dev, rd, warn)


def _fill_ids(dev: PciDevice, rd: DirReader, warn: Warnings) -> None:
    bdf = dev.bus_id
    cls = rd.text("class")
    if cls is not None:
        value = parse_int(cls, 16)
        if value is not None and 0 <= value <= 0xFFFFFF:
            dev.class_code = f"0x{value >> 8:04x}"
            dev.prog_if = f"0x{value & 0xFF:02x}"
        else:
            warn.add(f"pci {bdf}: malformed class {cls[:40]!r}")
    dev.vendor = _hex_id(rd.text("vendor"), 4, "vendor", bdf, warn)
    dev.device = _hex_id(rd.text("device"), 4, "device", bdf, warn)
    dev.subsystem_vendor = _hex_id(rd.text("subsystem_vendor"), 4, "subsystem_vendor", bdf, warn)
    dev.subsystem_device = _hex_id(rd.text("subsystem_device"), 4, "subsystem_device", bdf, warn)
    dev.driver = rd.link("driver")


def _fill_locality(dev: PciDevice, rd: DirReader, warn: Warnings) -> None:
    bdf = dev.bus_id
    numa = rd.text("numa_node")
    if numa is not None:
        node = parse_int(numa)
        if node is None or node >= MAX_NUMA_NODES:
            warn.add(f"pci {bdf}: malformed numa_node {numa[:40]!r}")
        else:
            dev.numa_node = node if node >= 0 else None

    cpus = parse_cpulist(rd.text("local_cpulist"))
    if cpus is None:
        cpus = parse_cpumask(rd.text("local_cpus"))
    dev.local_cpus = cpus or []

    dev.link = PciLink(
        current_speed_gts=parse_link_speed(rd.text("current_link_speed")),
        current_width=_width(rd.text("current_link_width")),
        max_speed_gts=parse_link_speed(rd.text("max_link_speed")),
        max_width=_width(rd.text("max_link_width")),
    )
    dev.iommu_group = _int_or_none(rd.link("iommu_group"))
    physfn = rd.link("physfn")
    dev.physfn = physfn if physfn and BDF_RE.match(physfn) else None
    total = rd.text("sriov_totalvfs")
    if total is not None:
        dev.sriov_totalvfs = _int_or_none(total)
        dev.sriov_numvfs = _int_or_none(rd.text("sriov_numvfs"))
        vfs = []
        for name in rd.names:
            if name.startswith("virtfn") and name[6:].isdigit():
                target = rd.link(name)
                if target and BDF_RE.match(target):
                    vfs.append((int(name[6:]), target))
        dev.virtfns = [vf for _, vf in sorted(vfs)]


def _int_or_none(text: str | None) -> int | None:
    value = parse_int(text)
    return value if value is not None and 0 <= value < 1 << 31 else None


def _width(text: str | None) -> int | None:
    """Link lanes; a width no PCIe link has is dropped (as ``Unknown`` would be)."""
    value = parse_int(text)
    return value if value is not None and 0 < value <= MAX_LINK_WIDTH else None
