"""Find probes (Python entry points, group ``toposlice.probes``) and run them safely.

Third parties add a probe by declaring an entry point in that group; the object it
names is either a probe class (instantiated with no arguments) or a probe instance.
When toposlice runs from a source tree without being installed, the built-in probes
are used directly so ``python -m toposlice`` still works.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from discovery.model import Gpu, Inventory, Nic, NvSwitch, ProbeStatus
from plugins.base import Probe, ProbeContext, ProbeReport, ProbeUnavailable

GROUP = "toposlice.probes"

# Vendor-library probes first: on merge the first non-empty value of a field wins,
# so NVML's facts about a GPU take precedence over what sysfs alone can say.
BUILTIN: dict[str, str] = {
    "nvidia": "plugins.nvidia:NvidiaProbe",
    "pci": "plugins.pci_accel:PciAcceleratorProbe",
    "rdma": "plugins.rdma:RdmaProbe",
    "cpu": "plugins.cpu:CpuProbe",
}


@functools.cache
def scan_entry_points(group: str) -> dict[str, str]:
    """``name -> "module:attr"`` of one entry-point group across ``sys.path``.

    Same data as ``importlib.metadata.entry_points(group=...)``, read directly from
    the ``*.dist-info/entry_points.txt`` files (start-up cost: docs/performance.md).
    Cached for the process: installed probes do not change between rediscoveries.
    """
    found: dict[str, str] = {}
    header = f"[{group}]"
    for base in sys.path:
        try:
            names = os.listdir(base or ".")
        except OSError:
            continue
        for dist in names:
            if not dist.endswith((".dist-info", ".egg-info")):
                continue
            try:
                with open(os.path.join(base, dist, "entry_points.txt"), encoding="utf-8") as fh:
                    text = fh.read()
            except OSError:
                continue
            if header not in text:
                continue
            in_group = False
            for raw in text.splitlines():
                line = raw.strip()
                if line.startswith("["):
                    in_group = line == header
                elif in_group and "=" in line and not line.startswith(("#", ";")):
                    key, _, value = line.partition("=")
                    found.setdefault(key.strip(), value.split("[")[0].strip())
    return found


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _instantiate(obj: Any) -> Probe:
    probe: Probe = obj() if isinstance(obj, type) else obj
    return probe


def load_probes(names: Sequence[str] | None = None) -> list[tuple[str, Probe | Exception]]:
    """Probes in run order; a probe that fails to load is returned as its exception."""
    targets: dict[str, str] = dict(BUILTIN)
    out: list[tuple[str, Probe | Exception]] = []
    try:
        for name, value in dict(scan_entry_points(GROUP)).items():
            targets.setdefault(name, value)
    except Exception as exc:  # a broken distribution must not hide the built-ins
        out.append(("entry-points", exc))
    for name, target in targets.items():
        if names is not None and name not in names:
            continue
        try:
            obj = _load(target)
            out.append((name, _instantiate(obj)))
        except Exception as exc:
            out.append((name, exc))
    return out


def run_probes(
    ctx: ProbeContext, probes: Iterable[tuple[str, Probe | Exception]]
) -> tuple[list[ProbeStatus], list[ProbeReport]]:
    statuses: list[ProbeStatus] = []
    reports: list[ProbeReport] = []
    for name, probe in probes:
        if isinstance(probe, Exception):
            statuses.append(ProbeStatus(name, "error", f"cannot load probe: {probe}"))
            continue
        try:
            report = probe.probe(ctx)
        except ProbeUnavailable as exc:
            statuses.append(ProbeStatus(name, "unavailable", str(exc)))
            continue
        except Exception as exc:
            statuses.append(ProbeStatus(name, "error", f"{type(exc).__name__}: {exc}"))
            continue
        statuses.append(ProbeStatus(name, "ok", report.detail))
        reports.append(report)
    return statuses, reports


def _merge_into(first: Any, later: Any) -> None:
    """Fill fields of ``first`` that are empty (None, [], {}) from ``later``."""
    for f in dataclasses.fields(first):
        if getattr(first, f.name) in (None, [], {}):
            setattr(first, f.name, getattr(later, f.name))


def _merge_by_bus(items: Iterable[Gpu | Nic | NvSwitch]) -> list[Any]:
    merged: dict[str, Any] = {}
    for item in items:
        if item.bus_id in merged:
            _merge_into(merged[item.bus_id], item)
        else:
            merged[item.bus_id] = item
    return sorted(merged.values(), key=lambda d: d.bus_id)


def apply_reports(inv: Inventory, statuses: list[ProbeStatus], reports: list[ProbeReport]) -> None:
    inv.probes = statuses
    inv.warnings.extend(f"probe {s.name}: {s.detail}" for s in statuses if s.state == "error")
    inv.gpus = _merge_by_bus(g for r in reports for g in r.gpus)
    inv.nics = _merge_by_bus(n for r in reports for n in r.nics)
    inv.nvswitches = _merge_by_bus(s for r in reports for s in r.nvswitches)
    for r in reports:
        for k, v in r.host.items():
            inv.host.setdefault(k, v)
        inv.warnings.extend(r.warnings)
