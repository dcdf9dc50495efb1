"""CDI spec files (container-device-interface SPEC.md; see ../shared/reference/cdi.md).

One transient spec per claim, named ``<vendor>-<class>_<claim uid>.json`` like the CDI
library's ``GenerateTransientSpecName``; device names carry the claim UID so a runtime
caching specs never sees one name with two meanings. ``cdiVersion`` is the minimum the
content needs, so runtimes with older CDI libraries still accept the file. The format's
name and version rules are discovery/cdi_spec.py's (the vendor spec reader shares them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from discovery.cdi_spec import check_device_name as check_device_name
from discovery.cdi_spec import check_kind as check_kind
from discovery.cdi_spec import min_version as min_version
from discovery.cdi_spec import qualified as qualified
from driver.plumbing.atomic import write_atomic

CLASS = "claim"

ContainerEdits = dict[str, Any]


def vendor_for(driver: str) -> str:
    """``k8s.<driver>`` as the example driver does: always starts with a letter."""
    return f"k8s.{driver}"


def kind_for(driver: str) -> str:
    return f"{vendor_for(driver)}/{CLASS}"


def spec_file_prefix(kind: str) -> str:
    """What every transient spec file name of ``kind`` starts with."""
    vendor, _, cls = kind.partition("/")
    return f"{vendor}-{cls}_"


def spec_file_name(kind: str, claim_uid: str) -> str:
    return f"{spec_file_prefix(kind)}{claim_uid.replace('/', '_')}.json"


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
