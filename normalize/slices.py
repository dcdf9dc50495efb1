"""Inventory -> resource.k8s.io/v1 ResourceSlice objects (plain dicts, API JSON form)."""

from __future__ import annotations

from typing import Any

from discovery.model import Inventory

from .attributes import AttributeDrop
from .devices import Device, build_devices_reported
from .limits import MAX_DEVICES_PER_SLICE, MAX_DEVICES_PER_SLICE_RESTRICTED
from .options import NormalizeOptions
from .validation import device_is_restricted

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"


def slice_name_prefix(index: int, count: int, driver: str, node_name: str) -> str:
    """``generateName`` of slice ``index`` of ``count`` as the 1.36+ Go controller builds it:
    ``<index hex, zero-padded to max(5, hexdigits(count-1))>-<driver>-<node>-``."""
    width = max(5, len(f"{max(count - 1, 0):x}"))
    return f"{index:0{width}x}-{driver}-{node_name}-"


def split_devices(
    devices: list[Device], max_per_slice: int = MAX_DEVICES_PER_SLICE
) -> list[list[Device]]:
    """Split devices, in order, into chunks that respect the per-slice limits: at most
    ``max_per_slice`` (≤ 128), and at most 64 when any device in the chunk has taints, counters
    or list attributes. Always returns at least one (possibly empty) chunk."""
    plain_limit = max(1, min(max_per_slice, MAX_DEVICES_PER_SLICE))
    restricted_limit = max(1, min(max_per_slice, MAX_DEVICES_PER_SLICE_RESTRICTED))
    chunks: list[list[Device]] = []
    current: list[Device] = []
    restricted = False
    for dev in devices:
        dev_restricted = device_is_restricted(dev)
        limit = restricted_limit if (restricted or dev_restricted) else plain_limit
        if len(current) >= limit:
            chunks.append(current)
            current, restricted = [], False
        current.append(dev)
        restricted = restricted or dev_restricted
    if current or not chunks:
        chunks.append(current)
    return chunks


def build_slices(
    inv: Inventory,
    node_name: str,
    opts: NormalizeOptions | None = None,
    generation: int = 1,
) -> list[dict[str, Any]]:
    """The node's pool (named after the node) as ResourceSlice dicts, preferred devices first.

    Objects carry ``metadata.generateName`` (no ``name``, no owner reference: the publisher
    adds those) and ``spec`` {driver, pool {name, generation, resourceSliceCount}, nodeName,
    devices}. There is always at least one slice, even without devices.
    """
    return build_slices_reported(inv, node_name, opts, generation)[0]


def build_slices_reported(
    inv: Inventory,
    node_name: str,
    opts: NormalizeOptions | None = None,
    generation: int = 1,
) -> tuple[list[dict[str, Any]], list[AttributeDrop]]:
    """:func:`build_slices`, and the attribute values its devices do not carry as
    discovered (over an API limit), for the caller to report."""
    opts = opts or NormalizeOptions()
    devices, dropped = build_devices_reported(inv, opts)
    chunks = split_devices(devices, opts.max_devices_per_slice)
    count = len(chunks)
    out: list[dict[str, Any]] = []
    for i, devices in enumerate(chunks):
        out.append(
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {"generateName": slice_name_prefix(i, count, opts.driver, node_name)},
                "spec": {
                    "driver": opts.driver,
                    "pool": {
                        "name": node_name,
                        "generation": generation,
                        "resourceSliceCount": count,
                    },
                    "nodeName": node_name,
                    "devices": devices,
                },
            }
        )
    return out, dropped


def to_models(slices: list[dict[str, Any]]) -> list[Any]:
    """Convert slice dicts to ``kubernetes.client.V1ResourceSlice`` models."""
    from kubernetes.client import V1ResourceSlice  # slow import: only when asked

    return [V1ResourceSlice.from_dict(s) for s in slices]
