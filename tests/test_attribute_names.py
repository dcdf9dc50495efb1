"""docs/attributes.md documents exactly the attribute names normalize/attribute_names.py
declares, and the devices toposlice builds use no other names."""

from __future__ import annotations

import re
from pathlib import Path

from normalize import attribute_names as an
from normalize.devices import build_devices
from normalize.options import NormalizeOptions
from toposlice.discover import discover

DOC = Path(__file__).resolve().parent.parent / "docs" / "attributes.md"


def documented(section: str) -> set[str]:
    """Backticked names in the first column of the tables under ``## <section>``."""
    text = DOC.read_text(encoding="utf-8")
    body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in body.splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split("|")[1]
        names.update(re.findall(r"`([^`]+)`", first))
    return names


def test_standard_attributes_are_documented() -> None:
    declared = {name.removeprefix(f"{an.STANDARD_DOMAIN}/") for name in an.STANDARD_ATTRIBUTES}
    assert documented("Standard attributes") == declared


def test_driver_attributes_are_documented() -> None:
    declared = set(an.DRIVER_ATTRIBUTES) | set(an.LEGACY_ATTRIBUTES)
    assert documented("Driver attributes") == declared


def test_published_names_are_declared() -> None:
    """Every attribute a device carries on the shipped machines, with every option on, is
    one of the declared names (so the docs cover what is published)."""
    declared = set(an.STANDARD_ATTRIBUTES) | set(an.DRIVER_ATTRIBUTES) | set(an.LEGACY_ATTRIBUTES)
    seen: set[str] = set()
    for machine in ("dgx-h100", "mi300x-8", "cloud-vm-1gpu"):
        inv = discover(fake=machine)
        for grouping in ("numa", "l3", "core"):
            o = NormalizeOptions(
                numa_list=True, bridges=("dra.cpu", "dra.net"), cpu_grouping=grouping
            )
            for dev in build_devices(inv, o):
                seen.update(dev["attributes"])
                assert set(dev.get("capacity", {})) <= set(an.CAPACITIES)
    assert seen <= declared, sorted(seen - declared)
    assert len(seen) > 30  # the machines exercise nearly every name
