"""Human names of PCI devices from udev's hardware database (live host only).

sysfs only has numeric ids; udev's hwdb (``ID_VENDOR_FROM_DATABASE``,
``ID_MODEL_FROM_DATABASE``) turns ``15b3:1021`` into "MT2910 Family [ConnectX-7]".
It needs libudev and the host's ``/run/udev`` database, so a dump or fake machine
never has it, and a container without them just gets no names.
"""

from __future__ import annotations


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
