"""Network and RDMA backend: interfaces and RDMA devices bound to their PCI functions.

An interface belongs to the *nearest* PCI function on its device path (a virtio NIC's
netdev hangs off ``0000:00:03.0/virtio2/net/eth0``). Interfaces with no PCI function
on their path (lo, bridges, VLANs, tunnels) are kept with ``bus_id = None``.
"""

from __future__ import annotations

import os
import re

from discovery.bounds import MAX_NET_SPEED_MBPS, MAX_RDMA_RATE_GBPS
from discovery.model import NetInterface, RdmaDevice, RdmaPort
from discovery.pci import BDF_RE
from discovery.readers import read_int, read_text
from discovery.root import Root
from discovery.warning_log import Warnings

_RATE = re.compile(r"^\s*([0-9]{1,9}(?:\.[0-9]{1,9})?)\s*Gb/sec")


def _device_path(class_rel: str, class_dir: str, name: str) -> str | None:
    """The entry's real location relative to ``sys/`` (following the class symlink);
    ``class_rel`` is ``class_dir`` relative to ``sys/`` (``class/net``)."""
    entry = os.path.join(class_dir, name)
    try:
        return os.path.normpath(os.path.join(class_rel, os.readlink(entry)))
    except OSError:
        pass
    # Old layouts: a plain class directory with a ``device`` link to the function.
    try:
        target = os.readlink(os.path.join(entry, "device"))
        return os.path.normpath(os.path.join(class_rel, name, target))
    except OSError:
        return None


def nearest_pci(rel_path: str | None) -> str | None:
    if not rel_path:
        return None
    parts = rel_path.split("/")
    if len(parts) < 2 or parts[0] != "devices" or not parts[1].startswith("pci"):
        return None
    for part in reversed(parts):
        if BDF_RE.match(part):
            return part
    return None


def discover_net(root: Root, warn: Warnings) -> list[NetInterface]:
    class_dir = root.sys_path("class", "net")
    try:
        names = sorted(os.listdir(class_dir))
    except OSError:
        return []
    stats = _psutil_stats() if root.live else {}
    out = []
    for name in names:
        rel = _device_path("class/net", class_dir, name)
        iface = NetInterface(name=name, bus_id=nearest_pci(rel))
        base = os.path.join(class_dir, name)
        iface.address = read_text(os.path.join(base, "address"))
        speed = read_int(os.path.join(base, "speed"))
        iface.speed_mbps = speed if speed is not None and 0 < speed <= MAX_NET_SPEED_MBPS else None
        iface.mtu = read_int(os.path.join(base, "mtu"))
        iface.operstate = read_text(os.path.join(base, "operstate"))
        iface.type = read_int(os.path.join(base, "type"))
        st = stats.get(name)
        if st is not None:
            # psutil reads the same kernel state through ioctls that still answer when
            # the sysfs ``speed`` file fails (EINVAL on a down link).
            if iface.speed_mbps is None and st[0] > 0:
                iface.speed_mbps = st[0]
            if iface.mtu is None:
                iface.mtu = st[1]
        out.append(iface)
    return out


def _psutil_stats() -> dict[str, tuple[int, int]]:
    try:
        import psutil

        return {n: (s.speed, s.mtu) for n, s in psutil.net_if_stats().items()}
    except Exception:
        return {}


def discover_rdma(root: Root, warn: Warnings) -> list[RdmaDevice]:
    class_dir = root.sys_path("class", "infiniband")
    try:
        names = sorted(os.listdir(class_dir))
    except OSError:
        return []
    out = []
    for name in names:
        base = os.path.join(class_dir, name)
        dev = RdmaDevice(
            name=name, bus_id=nearest_pci(_device_path("class/infiniband", class_dir, name))
        )
        dev.node_guid = read_text(os.path.join(base, "node_guid"))
        dev.sys_image_guid = read_text(os.path.join(base, "sys_image_guid"))
        dev.fw_ver = read_text(os.path.join(base, "fw_ver"))
        dev.board_id = read_text(os.path.join(base, "board_id"))
        ports_dir = os.path.join(base, "ports")
        try:
            ports = sorted((p for p in os.listdir(ports_dir) if _port_dir(p)), key=int)
        except OSError:
            ports = []
        for p in ports:
            pdir = os.path.join(ports_dir, p)
            rate_text = read_text(os.path.join(pdir, "rate"))
            rate = None
            if rate_text:
                m = _RATE.match(rate_text)
                if m and 0 < float(m.group(1)) <= MAX_RDMA_RATE_GBPS:
                    rate = float(m.group(1))
                else:
                    warn.add(f"rdma {name} port {p}: malformed rate {rate_text[:40]!r}")
            state = read_text(os.path.join(pdir, "state"))
            if state and ":" in state:
                state = state.split(":", 1)[1].strip()
            ndev = read_text(os.path.join(pdir, "gid_attrs", "ndevs", "0"))
            dev.ports.append(
                RdmaPort(
                    port=int(p),
                    rate_gbps=rate,
                    state=state,
                    link_layer=read_text(os.path.join(pdir, "link_layer")),
                    netdev=ndev or None,
                )
            )
        out.append(dev)
    return out


def _port_dir(name: str) -> bool:
    """``ports/1``: an ASCII port number (RDMA ports are u8 + 1)."""
    return name.isascii() and name.isdigit() and len(name) <= 3
