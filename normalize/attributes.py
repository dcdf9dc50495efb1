"""DeviceAttribute values and the standard ``resource.kubernetes.io/*`` attributes.

Attribute values are plain dicts in the API's JSON form: ``{"int": 3}``, ``{"string": "x"}``,
``{"bool": True}``, ``{"version": "1.2.3"}``, ``{"ints": [...]}``, ``{"strings": [...]}``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from discovery.model import Gpu, Inventory, NumaNode, PciDevice

from .attribute_names import (
    BRIDGE_NUMA,
    LEGACY_CPU_NUMA,
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    STANDARD_DOMAIN,
)
from .limits import INT64_MAX, INT64_MIN, MAX_STRING
from .options import NormalizeOptions

__all__ = [
    "BRIDGE_NUMA",
    "LEGACY_CPU_NUMA",
    "NUMA_NODE",
    "PCIE_ROOT",
    "PCI_BUS_ID",
    "STANDARD_DOMAIN",
    "Attr",
    "AttributeDrop",
    "Attrs",
    "a_bool",
    "a_int",
    "a_ints",
    "a_string",
    "a_strings",
    "a_version",
    "int_fits",
    "is_list_attr",
    "is_semver",
    "numa_attribute",
    "numa_list",
    "pci_standard_attributes",
    "to_semver",
    "value_count",
]

Attr = dict[str, Any]
Attrs = dict[str, Attr]

LIST_KEYS = frozenset({"ints", "bools", "strings", "versions"})

PCI_BUS_ID_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$")
SEMVER_RE = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


@dataclass(frozen=True)
class AttributeDrop:
    """An attribute toposlice knows a value for but cannot publish as it is (over an API
    limit, or not in the API's form). Each one is reported (daemon log, ``slices``'
    standard error, ``doctor``, ``/v1/normalization``): a claim that relies on the
    attribute must not just silently match nothing."""

    device: str
    attribute: str
    reason: str
    """Why, with the value's size or form: ``is 65 characters, over the 64-character limit``."""
    published: str | None = None
    """What was published instead (``the first 5 roots, and pcieRootsTruncated``); None:
    the attribute is left out."""

    def message(self) -> str:
        instead = f"published {self.published}" if self.published else "left out"
        return f"{self.device}: {self.attribute} {self.reason}; {instead}"

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def too_long(value: str) -> str:
    """The reason for a string over the limit, with enough of it to recognise."""
    head = value if len(value) <= 24 else value[:24] + "…"
    return f"{head!r} is {len(value)} characters, over the {MAX_STRING}-character limit"


def a_int(value: int) -> Attr:
    return {"int": int(value)}


def a_bool(value: bool) -> Attr:
    return {"bool": bool(value)}


def a_ints(values: list[int]) -> Attr:
    return {"ints": [int(v) for v in values]}


def a_string(value: str | None, *, truncate: bool = False) -> Attr | None:
    """A string attribute, or None when empty or longer than 64 characters.

    ``truncate`` cuts over-long free text (model names) instead of dropping it; never use it for
    identifiers, whose prefix would be a different identifier.
    """
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    if len(value) > MAX_STRING:
        if not truncate:
            return None
        value = value[:MAX_STRING].rstrip()
    return {"string": value}


def a_strings(values: list[str]) -> Attr | None:
    kept = [v for v in values if v and len(v) <= MAX_STRING]
    return {"strings": kept} if kept else None


def is_semver(text: str) -> bool:
    return len(text) <= MAX_STRING and bool(SEMVER_RE.match(text))


def _numeric_version(text: str, *, parts: range) -> str | None:
    """``X[.Y[.Z]]`` of ASCII digits as semver: each number without its leading zeros
    (``580.105.08`` -> ``580.105.8``, the same version to every semver comparison, and what
    NVIDIA's DRA driver publishes), padded with ``.0`` to three numbers; else None."""
    nums = text.split(".")
    if len(nums) not in parts or not all(n.isascii() and n.isdigit() for n in nums):
        return None
    candidate = ".".join([str(int(n)) for n in nums] + ["0"] * (3 - len(nums)))
    return candidate if is_semver(candidate) else None


def to_semver(text: str | None) -> str | None:
    """``4.0`` -> ``4.0.0``, ``9`` -> ``9.0.0``, ``535.104.05`` -> ``535.104.5``; strict
    semver is kept; anything else is None."""
    if text is None:
        return None
    text = text.strip().removeprefix("v")
    if is_semver(text):
        return text
    return _numeric_version(text, parts=range(1, 4))


def a_version(text: str | None, *, lenient: bool = True) -> Attr | None:
    """A version attribute; ``lenient`` pads ``X.Y`` to ``X.Y.0``; strict takes semver or
    three numbers (leading zeros dropped: ``580.105.08`` -> ``580.105.8``), nothing shorter."""
    if text is None:
        return None
    if lenient:
        value = to_semver(text)
    else:
        text = text.strip()
        value = text if is_semver(text) else _numeric_version(text, parts=range(3, 4))
    return {"version": value} if value else None


def value_count(attr: Attr) -> int:
    """Number of values an attribute contributes to the 48-per-device budget."""
    for key, val in attr.items():
        if key in LIST_KEYS and isinstance(val, list):
            return len(val)
    return 1


def is_list_attr(attr: Attr) -> bool:
    return any(k in LIST_KEYS for k in attr)


def int_fits(value: int) -> bool:
    return INT64_MIN <= value <= INT64_MAX


def numa_list(inv: Inventory, node: int) -> list[int]:
    """KEP-6072 list form for a device on NUMA node ``node``.

    ``[node]`` followed by the other nodes of the same socket (``NumaNode.package``) at the
    minimum SLIT distance from ``node``. Only nodes with CPUs are candidates: memory-only nodes
    (CXL, a GPU's own memory) are not part of the host locality of a PCI device; the KEP leaves
    them unspecified. Without SLIT or socket data the list is just ``[node]``.
    """
    me = inv.numa(node)
    if me is None or me.package is None or not me.distances:
        return [node]
    peers: list[tuple[int, NumaNode]] = []
    for other in inv.numa_nodes:
        if other.id == node or other.package != me.package:
            continue
        if other.memory_only or other.gpu_bus_id is not None or not other.cpus:
            continue
        dist = me.distances.get(other.id)
        if dist is None:
            continue
        peers.append((dist, other))
    if not peers:
        return [node]
    best = min(d for d, _ in peers)
    return [node, *sorted(o.id for d, o in peers if d == best)]


def gpu_numa_list(inv: Inventory, kernel_node: int, gpu: Gpu | None) -> list[int]:
    """List form for a GPU: the host list of its kernel node, then its own memory node (GB200)."""
    out = numa_list(inv, kernel_node)
    if gpu is not None and gpu.memory_numa_node is not None and gpu.memory_numa_node not in out:
        out.append(gpu.memory_numa_node)
    return out


def numa_attribute(
    inv: Inventory, node: int | None, opts: NormalizeOptions, gpu: Gpu | None = None
) -> Attr | None:
    """``resource.kubernetes.io/numaNode`` value for a device on kernel NUMA node ``node``."""
    if node is None or node < 0:
        return None
    if not opts.numa_list:
        return a_int(node)
    return a_ints(gpu_numa_list(inv, node, gpu))


def pci_standard_attributes(
    inv: Inventory,
    bus_id: str,
    opts: NormalizeOptions,
    gpu: Gpu | None = None,
    dropped: list[AttributeDrop] | None = None,
    device: str = "",
) -> Attrs:
    """The three standard attributes of a PCI function, each only when derivable; a known
    value the API cannot take is recorded in ``dropped`` (as ``device``)."""
    attrs: Attrs = {}
    drops = dropped if dropped is not None else []
    if PCI_BUS_ID_RE.match(bus_id):
        attrs[PCI_BUS_ID] = {"string": bus_id}
    else:
        drops.append(
            AttributeDrop(
                device,
                PCI_BUS_ID,
                f"{bus_id!r} is not in the standard DDDD:BB:DD.F form (a 5-digit VMD domain?)",
            )
        )
    pci: PciDevice | None = inv.pci(bus_id)
    if pci is None:
        return attrs
    if pci.pcie_root:
        root = a_string(pci.pcie_root)
        if root is not None:
            attrs[PCIE_ROOT] = root
        elif pci.pcie_root.strip():
            drops.append(AttributeDrop(device, PCIE_ROOT, too_long(pci.pcie_root.strip())))
    numa = numa_attribute(inv, pci.numa_node, opts, gpu)
    if numa is not None:
        attrs[NUMA_NODE] = numa
    return attrs
