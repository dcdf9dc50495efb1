"""One call that reads a node: sysfs backends, then every vendor probe.

This is the daemon's rediscovery path and what ``toposlice discover`` runs. It never
raises for a damaged host: problems end up in ``Inventory.warnings`` and in the
probes' statuses.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from discovery.host import discover_host
from discovery.model import Inventory


def discover(
    sysfs_root: str = "/",
    *,
    fake: str | None = None,
    probes: Sequence[str] | None = None,
    nvml: Any | None = None,
) -> Inventory:
    """Inventory of the host under ``sysfs_root``, or of the fake machine ``fake``.

    ``probes`` limits which probes run (names of the ``toposlice.probes`` entry points);
    ``nvml`` injects a pynvml-compatible module (tests, fake hardware).
    """
    if fake is not None:
        from discovery.fake import fake_host

        with fake_host(fake) as host:
            inv = _discover_root(str(host.root), False, probes, host.nvml if nvml is None else nvml)
            inv.source = {"fake": fake}
            return inv
    root = os.path.abspath(sysfs_root)
    return _discover_root(root, root == "/", probes, nvml)


def _discover_root(root: str, live: bool, probes: Sequence[str] | None, nvml: Any) -> Inventory:
    from plugins.base import ProbeContext
    from plugins.registry import apply_reports, load_probes, run_probes

    inv, warn = discover_host(root, live=live)
    ctx = ProbeContext(root=root, host=inv, nvml=nvml, live=live)
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
