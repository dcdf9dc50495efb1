"""CDI spec files (container-device-interface SPEC.md; see ../shared/reference/cdi.md).

One transient spec per claim, named ``<vendor>-<class>_<claim uid>.json`` like the CDI
library's ``GenerateTransientSpecName``; device names carry the claim UID so a runtime
caching specs never sees one name with two meanings. ``cdiVersion`` is the minimum the
content needs, so runtimes with older CDI libraries still accept the file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from driver.plumbing.atomic import write_atomic

CLASS = "claim"

_VENDOR = re.compile(r"^[A-Za-z]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._:-]*[A-Za-z0-9])?$")

ContainerEdits = dict[str, Any]


def vendor_for(driver: str) -> str:
    """``k8s.<driver>`` as the example driver does: always starts with a letter."""
    return f"k8s.{driver}"


def kind_for(driver: str) -> str:
    return f"{vendor_for(driver)}/{CLASS}"


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


def spec_file_prefix(kind: str) -> str:
    """What every transient spec file name of ``kind`` starts with."""
    vendor, _, cls = kind.partition("/")
    return f"{vendor}-{cls}_"


def spec_file_name(kind: str, claim_uid: str) -> str:
    return f"{spec_file_prefix(kind)}{claim_uid.replace('/', '_')}.json"


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


def build_spec(
    kind: str,
    devices: dict[str, ContainerEdits],
    common: ContainerEdits | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A spec with one entry per device name; ``common`` edits apply once when any device
    of the file is requested. Refuses empty per-device edits (the CDI library does)."""
    check_kind(kind)
    if not devices:
        raise ValueError("a CDI spec needs at least one device")
    entries = []
    for name, edits in devices.items():
        check_device_name(name)
        if not any(edits.values()):
            raise ValueError(f"CDI device {name!r} has empty containerEdits")
        entries.append({"name": name, "containerEdits": edits})
    spec: dict[str, Any] = {"cdiVersion": "", "kind": kind, "devices": entries}
    if common and any(common.values()):
        spec["containerEdits"] = common
    if annotations:
        spec["annotations"] = dict(annotations)
    spec["cdiVersion"] = min_version(spec)
    return spec


def write_spec(path: Path, spec: dict[str, Any], *, sync: bool = True) -> None:
    write_atomic(path, json.dumps(spec).encode() + b"\n", mode=0o644, sync=sync)
