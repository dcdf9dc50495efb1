"""Discovery on a ``toposlice gather`` archive (``--gathered FILE``).

The archive is extracted into a temporary directory (safely: discovery.replay) and the
ordinary backends and probes run on it, the nvidia probe against the recorded NVML
answers, so the inventory is the gathered host's.
"""

from __future__ import annotations

from collections.abc import Sequence

from discovery.model import Inventory
from discovery.replay import extract_gathered, gathered_nvml, gathered_root, restore_paths
from toposlice.discover import discover

__all__ = ["discover_gathered"]


def discover_gathered(archive: str, probes: Sequence[str] | None = None) -> Inventory:
    """The inventory of the host a ``toposlice gather`` archive was made on."""
    with extract_gathered(archive) as extracted:
        inv = discover(extracted, probes=probes, nvml=gathered_nvml(extracted), live=False)
        root = gathered_root(extracted)
    if root is not None:
        inv.warnings = restore_paths(inv.warnings, extracted, root)
    inv.source = {"gathered": archive}
    return inv
