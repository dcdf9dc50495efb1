"""A node as it looks with a vendor GPU driver publishing its GPUs beside toposlice.

toposlice's ``--fake`` machines have no vendor driver on them; to show what a claim for
vendor GPUs (``toposlice claim --gpus-from gpu.nvidia.com --fake M``) gets, its GPUs are
re-published in the vendor's shape: NVIDIA's DRA driver names a GPU ``gpu-<NVML index>``
and carries the standard ``pciBusID`` / ``pcieRoot`` / ``numaNode``, ``uuid`` and ``type``
(what the real plugin published on the fake dgx-h100 and GB200 tray,
tests/data/foreign-slices/recorded/), and toposlice keeps its NICs and CPUs.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from normalize.attribute_names import NUMA_NODE, PCI_BUS_ID, PCIE_ROOT

#: What a vendor GPU keeps of toposlice's attributes (the rest is toposlice's own).
KEPT = ("uuid", PCI_BUS_ID, PCIE_ROOT, NUMA_NODE)


def _kind(device: Mapping[str, Any]) -> str:
    return str((device.get("attributes") or {}).get("type", {}).get("string", ""))


def vendor_slice(slices: Sequence[Mapping[str, Any]], vendor: str, node: str) -> dict[str, Any]:
    """toposlice's GPUs of ``slices`` as one ResourceSlice of ``vendor`` on ``node``,
    named by their NVML index (toposlice's ``ordinal`` among GPUs: bus order)."""
    theirs: list[dict[str, Any]] = []
    for sl in slices:
        for d in sl["spec"]["devices"]:
            if _kind(d) != "gpu":
                continue
            a = d["attributes"]
            keep = {k: copy.deepcopy(a[k]) for k in KEPT if k in a}
            index = a.get("ordinal", {}).get("int", len(theirs))
            theirs.append(
                {"name": f"gpu-{index}", "attributes": {**keep, "type": {"string": "gpu"}}}
            )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{vendor}"},
        "spec": {
            "driver": vendor,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": theirs,
        },
    }


def beside_vendor(
    slices: Sequence[Mapping[str, Any]],
    vendor: str,
    node: str,
    theirs: Sequence[Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """toposlice's slices without GPUs, then the vendor's: ``theirs`` (recorded from the
    real driver, node renamed to ``node``) or :func:`vendor_slice` of toposlice's GPUs."""
    ours = copy.deepcopy([dict(s) for s in slices])
    if theirs is None:
        vendor_slices = [vendor_slice(ours, vendor, node)]
    else:
        vendor_slices = copy.deepcopy([dict(s) for s in theirs])
        for s in vendor_slices:
            s["spec"]["nodeName"] = node
            s["spec"]["pool"]["name"] = node
    for sl in ours:
        sl["spec"]["devices"] = [d for d in sl["spec"]["devices"] if _kind(d) != "gpu"]
    return [*ours, *vendor_slices]


def vendor_device_class(vendor: str) -> dict[str, Any]:
    """The vendor's GPU DeviceClass as its chart installs it (NVIDIA's ``gpu.nvidia.com``:
    the driver and ``type == 'gpu'``), for models of a node beside it."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": vendor},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": f"device.driver == '{vendor}' && "
                        f"device.attributes['{vendor}'].type == 'gpu'"
                    }
                }
            ]
        },
    }
