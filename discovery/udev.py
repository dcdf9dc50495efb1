"""Human names of PCI devices from udev's hardware database (live host only).

sysfs only has numeric ids; udev's hwdb (``ID_VENDOR_FROM_DATABASE``,
``ID_MODEL_FROM_DATABASE``) turns ``15b3:1021`` into "MT2910 Family [ConnectX-7]".
It needs libudev and the host's ``/run/udev`` database, so a dump or fake machine
never has it, and a container without them just gets no names.
"""

from __future__ import annotations

import os

from discovery.readers import read_text


def pci_names() -> dict[str, tuple[str | None, str | None]]:
    """bus id -> (vendor name, device name) for every PCI device udev knows."""
    try:
        import pyudev
    except ImportError:
        return {}
    out: dict[str, tuple[str | None, str | None]] = {}
    try:
        for dev in pyudev.Context().list_devices(subsystem="pci"):
            props = dev.properties
            vendor = props.get("ID_VENDOR_FROM_DATABASE")
            model = props.get("ID_MODEL_FROM_DATABASE")
            if vendor or model:
                out[str(dev.sys_name).lower()] = (vendor, model)
    except Exception:  # libudev missing or unreadable database: names are optional
        return {}
    return out


def udev_db_names(root: str, bus_ids: list[str]) -> dict[str, tuple[str | None, str | None]]:
    """The same names from udev's database files under ``root`` (a dump or gathered archive).

    ``<root>/run/udev/data/+pci:<bus id>`` holds the device's properties as
    ``E:KEY=value`` lines; ``toposlice gather`` keeps the two name lines of each.
    """
    base = os.path.join(root, "run", "udev", "data")
    if not os.path.isdir(base):
        return {}
    out: dict[str, tuple[str | None, str | None]] = {}
    for bus_id in bus_ids:
        text = read_text(os.path.join(base, f"+pci:{bus_id}"))
        if not text:
            continue
        props = dict(line[2:].partition("=")[::2] for line in text.splitlines() if line[:2] == "E:")
        vendor = props.get("ID_VENDOR_FROM_DATABASE") or None
        model = props.get("ID_MODEL_FROM_DATABASE") or None
        if vendor or model:
            out[bus_id] = (vendor, model)
    return out
