"""One call that reads a node: the sysfs backends, then every vendor probe.

This is the daemon's rediscovery path and what ``toposlice discover`` runs. It sits
above both ``discovery/`` (backends) and ``plugins/`` (probes) because it runs both;
neither of those imports it. It never raises for a damaged host: problems end up in
``Inventory.warnings`` and in the probes' statuses.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from discovery.host import discover_host
from discovery.model import Inventory
from discovery.root import Root

__all__ = ["discover", "discover_root"]


def discover(
    root: Root | str | os.PathLike[str] = "/",
    *,
    fake: str | None = None,
    probes: Sequence[str] | None = None,
    nvml: Any | None = None,
    live: bool | None = None,
) -> Inventory:
    """Inventory of the host under ``root``, or of the fake machine ``fake``.

    ``probes`` limits which probes run (names of the ``toposlice.probes`` entry points);
    ``nvml`` injects a pynvml-compatible module (tests, fake hardware, gathered
    answers). ``live`` overrides whether ``root`` counts as the running host (default:
    it is ``/``); ``toposlice gather`` reads ``/`` with ``live=False`` so that it sees
    only what a replay will see.
    """
    if fake is not None:
        # The generated tree is kept between runs (discovery/fake/cache.py): read only.
        from discovery.fake.cache import cached_host

        with cached_host(fake) as host:
            inv = discover_root(Root(host.root, False), probes, host.nvml if nvml is None else nvml)
            inv.source = {"fake": fake}
            return inv
    if not isinstance(root, Root) or live is not None:
        root = Root(root, live)
    return discover_root(root, probes, nvml)


def discover_root(root: Root, probes: Sequence[str] | None = None, nvml: Any = None) -> Inventory:
    """Backends then probes on an already-resolved :class:`Root`."""
    from plugins.base import ProbeContext
    from plugins.registry import apply_reports, load_probes, run_probes

    inv, warn = discover_host(root)
    ctx = ProbeContext(root=root, host=inv, nvml=nvml)
    statuses, reports = run_probes(ctx, load_probes(probes))
    apply_reports(inv, statuses, reports)
    warn.extend(inv.warnings)
    inv.warnings = warn.result()

    for gpu in inv.gpus:
        if gpu.memory_numa_node is not None:
            node = inv.numa(gpu.memory_numa_node)
            if node is not None:
                node.gpu_bus_id = gpu.bus_id
    return inv
