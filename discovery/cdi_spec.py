"""The rules of the container-device-interface spec format that the CDI library checks
when it loads a spec file (../shared/reference/cdi.md): kind and device names, fully
qualified device ids, and the lowest ``cdiVersion`` a spec's content needs.

The one copy for both sides of the format: reading the vendor's specs on the host
(discovery/vendor_cdi.py) and writing toposlice's own (driver/kubelet/cdi.py).
"""

from __future__ import annotations

import re
from typing import Any

_VENDOR = re.compile(r"^[A-Za-z]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._:-]*[A-Za-z0-9])?$")


def check_kind(kind: str) -> None:
    vendor, _, cls = kind.partition("/")
    if not _VENDOR.match(vendor) or not _CLASS.match(cls) or "/" in cls:
        raise ValueError(f"invalid CDI kind {kind!r}")


def check_device_name(name: str) -> None:
    if not _NAME.match(name):
        raise ValueError(f"invalid CDI device name {name!r}")


def qualified(kind: str, name: str) -> str:
    """Fully qualified CDI device id ``vendor/class=name``."""
    return f"{kind}={name}"


def min_version(spec: dict[str, Any]) -> str:
    """The lowest cdiVersion that accepts what ``spec`` uses (cdi.md section 4)."""
    edits = [spec.get("containerEdits") or {}]
    edits += [d.get("containerEdits") or {} for d in spec.get("devices", [])]
    version = (0, 3, 0)
    if any(m.get("type") for e in edits for m in e.get("mounts", [])):
        version = max(version, (0, 4, 0))
    if any("hostPath" in n for e in edits for n in e.get("deviceNodes", [])) or any(
        d["name"][:1].isdigit() for d in spec.get("devices", [])
    ):
        version = max(version, (0, 5, 0))
    cls = spec["kind"].partition("/")[2]
    if (
        "." in cls
        or spec.get("annotations")
        or any(d.get("annotations") for d in spec.get("devices", []))
    ):
        version = max(version, (0, 6, 0))
    if any(e.get("additionalGids") or e.get("intelRdt") for e in edits):
        version = max(version, (0, 7, 0))
    if any(e.get("netDevices") for e in edits):
        version = max(version, (1, 1, 0))
    return ".".join(map(str, version))
