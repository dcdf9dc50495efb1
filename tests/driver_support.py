"""Test doubles for the driver's node side: a ClaimReader over a dict, a HealthFeed, claim
builders, and DriverState on a fake machine in a temp dir."""

from __future__ import annotations

import threading
from functools import cache
from pathlib import Path
from typing import Any

from driver.interfaces import ClaimNotFound, DeviceHealth
from driver.kubelet.state import DriverState, FailPoint
from driver.kubelet.vendor_cdi import VendorCdi
from normalize.snapshot import Snapshot, build_snapshot
from toposlice.sources import add_source_args, load_inventory

DRIVER = "toposlice.dev"
NODE = "n1"


@cache
def snapshot(machine: str = "dgx-h100", node: str = NODE) -> Snapshot:
    import argparse

    parser = argparse.ArgumentParser()
    add_source_args(parser)
    return build_snapshot(load_inventory(parser.parse_args(["--fake", machine])), node)


def device_names(snap: Snapshot, prefix: str) -> list[str]:
    return [d["name"] for d in snap.devices if d["name"].startswith(prefix)]


def claim(
    uid: str,
    devices: list[str],
    *,
    name: str | None = None,
    namespace: str = "default",
    pool: str = NODE,
    driver: str = DRIVER,
    request: str = "req",
    allocated: bool = True,
    extra_results: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A ResourceClaim in API JSON form, allocated to ``devices`` of ``pool``."""
    results = [
        {"request": request, "driver": driver, "pool": pool, "device": d} for d in devices
    ] + list(extra_results or [])
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name or f"claim-{uid}", "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": [{"name": request}]}},
        "status": {},
    }
    if allocated:
        obj["status"]["allocation"] = {"devices": {"results": results}}
    return obj


class FakeClaims:
    """ClaimReader over an in-memory dict; counts reads; can be told to fail."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0
        self.error: Exception | None = None
        self._lock = threading.Lock()

    def add(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = obj
        return obj

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            self.reads += 1
        if self.error is not None:
            raise self.error
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise ClaimNotFound(f"{namespace}/{name}") from None


class FakeHealth:
    """HealthFeed: a list of DeviceHealth and a version bumped on every change."""

    def __init__(self, items: list[DeviceHealth]) -> None:
        self.items = list(items)
        self.version = 1
        self._cond = threading.Condition()

    def set(self, items: list[DeviceHealth]) -> None:
        with self._cond:
            self.items = list(items)
            self.version += 1
            self._cond.notify_all()

    def current(self) -> list[DeviceHealth]:
        with self._cond:
            return list(self.items)

    def wait_change(self, version: int, timeout: float) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self.version != version, timeout)
            return self.version


def device_node_paths(snap: Snapshot) -> list[str]:
    """Every device node a claim of the machine's GPUs and NICs could name."""
    from driver.kubelet.container_edits import gpu_edits, nic_edits

    inv = snap.inventory
    edits = [gpu_edits(inv, g.bus_id, g) for g in inv.gpus]
    edits += [nic_edits(inv, n.bus_id, n) for n in inv.nics]
    return sorted({n["path"] for e in edits for n in e.get("deviceNodes", [])})


def make_state(
    tmp: Path,
    reader: FakeClaims,
    *,
    machine: str = "dgx-h100",
    boot_id: str | None = "boot-1",
    fail_point: FailPoint | None = None,
    dev_nodes: bool = True,
    vendor_cdi: VendorCdi | None = None,
) -> DriverState:
    """DriverState with cdi/, state/ and a fake root (boot id file) under ``tmp``; with
    ``dev_nodes``, the root has a file for every device node of the machine's GPUs and
    NICs (CDI specs name only nodes that exist under ``<root>/dev``)."""
    root = tmp / "root"
    if boot_id is not None:
        (root / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
        (root / "proc/sys/kernel/random/boot_id").write_text(boot_id + "\n")
    snap = snapshot(machine)
    if dev_nodes:
        for path in device_node_paths(snap):
            (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (root / path.lstrip("/")).touch()
    kwargs: dict[str, Any] = {} if fail_point is None else {"fail_point": fail_point}
    if vendor_cdi is not None:
        kwargs["vendor_cdi"] = vendor_cdi
    return DriverState(
        DRIVER, NODE, tmp / "cdi", tmp / "state", root, reader, lambda: snap, **kwargs
    )
