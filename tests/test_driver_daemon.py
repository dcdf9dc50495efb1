"""The daemon in-process: rediscovery, health events and --publish, counted in API writes."""

from __future__ import annotations

import copy
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from discovery.model import Inventory
from driver.config import DaemonConfig
from driver.daemon import Daemon, StartupError
from driver.health.monitor import HealthEvent, xid_event
from driver.kubelet.checkpoint import ClaimRecord, load_checkpoint, read_boot_id, save_checkpoint
from normalize.options import NormalizeOptions
from tests.kubeapi import KubeAPIServer
from tests.kubelet import NodeClient, allocated_claim, register, wait_for
from toposlice.discover import discover

DRIVER = "toposlice.dev"
NODE = "n1"


@pytest.fixture(scope="module")
def inventory() -> Inventory:
    return discover("/", fake="dgx-h100")


@pytest.fixture
def api() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as server:
        server.add_node(NODE)
        yield server


@pytest.fixture
def base() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ts-d-") as d:
        yield Path(d)


def config(base: Path, kubeconfig: Path, **kw: Any) -> DaemonConfig:
    fields: dict[str, Any] = {
        "node_name": NODE,
        "driver_name": DRIVER,
        "kubeconfig": str(kubeconfig),
        "registrar_dir": str(base / "reg"),
        "plugins_dir": str(base / "plug"),
        "cdi_root": str(base / "cdi"),
        "state_dir": str(base / "state"),
        "http_addr": None,
        "publish": frozenset({"gpu", "nic", "cpu"}),
        "root": "/",
        "live": False,
        "normalize": NormalizeOptions(driver=DRIVER),
        "resync_interval": 0.2,
        "rediscover_interval": 3600,
        "startup_timeout": 0,
    }
    fields.update(kw)
    return DaemonConfig(**fields)


class Events:
    """An EventSource fed by the test."""

    def __init__(self) -> None:
        self.queue: list[HealthEvent] = []
        self.lock = threading.Lock()
        self.closed = False

    def push(self, ev: HealthEvent) -> None:
        with self.lock:
            self.queue.append(ev)

    def poll(self, timeout: float) -> list[HealthEvent]:
        with self.lock:
            out, self.queue = self.queue, []
        if not out:
            time.sleep(min(timeout, 0.05))
        return out

    def close(self) -> None:
        self.closed = True


def pool(api: KubeAPIServer) -> list[dict[str, Any]]:
    return [d for s in api.slices(DRIVER, NODE) for d in s["spec"]["devices"]]


def test_rediscovery_and_health_are_one_write_each(
    api: KubeAPIServer, base: Path, inventory: Inventory
) -> None:
    current = {"inv": inventory}
    events = Events()
    cfg = config(base, api.write_kubeconfig(base / "kc"))
    daemon = Daemon(cfg, lambda: current["inv"], event_sources=[events])
    daemon.start()
    try:
        assert daemon.publisher is not None
        assert wait_for(lambda: daemon.publisher is not None and daemon.publisher.synced)
        names = [d["name"] for d in pool(api)]
        assert len(names) == 22
        api.reset_counters()
        time.sleep(1.0)  # five resyncs
        assert api.writes() == 0

        # A NIC disappears: one write; it stays in the pool, tainted NoExecute.
        gone = inventory.nics[-1].bus_id
        smaller = copy.deepcopy(inventory)
        smaller.nics = [n for n in smaller.nics if n.bus_id != gone]
        current["inv"] = smaller
        assert daemon.rediscover()
        assert wait_for(lambda: api.writes() == 1 and daemon.publisher.synced)
        lost = {d["name"]: d for d in pool(api) if d.get("taints")}
        assert len(lost) == 1
        ((name, dev),) = lost.items()
        assert dev["taints"][0]["effect"] == "NoExecute"
        assert dev["taints"][0]["key"] == f"{DRIVER}/gone"
        assert {h.device: h.status for h in daemon.health()}[name] == "Unhealthy"

        # An XID on a GPU: one more write.
        gpu_bus = inventory.gpus[0].bus_id
        ev = xid_event(f"gpu:{gpu_bus}", 79)
        assert ev is not None
        events.push(ev)
        assert wait_for(lambda: api.writes() == 2 and daemon.publisher.synced)
        time.sleep(0.6)
        assert api.writes() == 2
        tainted = sorted(d["name"] for d in pool(api) if d.get("taints"))
        assert len(tainted) == 2
        assert daemon.status().publisher_synced
    finally:
        daemon.stop(grace=1)
    assert events.closed
    assert not (base / "reg" / f"{DRIVER}-reg.sock").exists()


def test_publish_only_nics(api: KubeAPIServer, base: Path, inventory: Inventory) -> None:
    cfg = config(base, api.write_kubeconfig(base / "kc"), publish=frozenset({"nic"}))
    daemon = Daemon(cfg, lambda: inventory)
    daemon.start()
    try:
        assert wait_for(lambda: daemon.publisher is not None and daemon.publisher.synced)
        kinds = {d["attributes"]["type"]["string"] for d in pool(api)}
        assert kinds == {"nic"}
        reg = register(base / "reg" / f"{DRIVER}-reg.sock")
        gpu = next(name for v, name in _all_names(inventory).items() if v.startswith("gpu:"))
        nic = pool(api)[0]["name"]
        bad = api.add_claim(allocated_claim("g", [gpu], pool=NODE, driver=DRIVER))
        good = api.add_claim(allocated_claim("n", [nic], pool=NODE, driver=DRIVER))
        with NodeClient(reg.info.endpoint) as kubelet:
            resp = kubelet.prepare(
                [
                    ("default", "g", bad["metadata"]["uid"]),
                    ("default", "n", good["metadata"]["uid"]),
                ]
            )
        assert resp.claims[bad["metadata"]["uid"]].error  # not a device of this driver
        assert resp.claims[good["metadata"]["uid"]].error == ""
        assert daemon.allocated() == {nic: good["metadata"]["uid"]}
    finally:
        daemon.stop(grace=1)


def _all_names(inventory: Inventory) -> dict[str, str]:
    from normalize.snapshot import build_snapshot

    return build_snapshot(inventory, NODE).vertex_devices


def test_missing_node_stops_cleanly(api: KubeAPIServer, base: Path, inventory: Inventory) -> None:
    cfg = config(base, api.write_kubeconfig(base / "kc"), node_name="elsewhere")
    daemon = Daemon(cfg, lambda: inventory)
    with pytest.raises(StartupError, match="not found"):
        daemon.start()
    assert not (base / "reg" / f"{DRIVER}-reg.sock").exists()
    assert not (base / "plug" / "dra.sock").exists()
    assert api.writes() == 0
    # The directories and the (empty) checkpoint this start made are gone again.
    assert sorted(os.listdir(base)) == ["kc"]


def test_failed_start_keeps_what_was_there(
    api: KubeAPIServer, base: Path, inventory: Inventory
) -> None:
    """Directories that existed before, and a checkpoint with claims, survive a failed
    start; only what the start itself created (and is empty) goes."""
    (base / "cdi").mkdir()
    record = ClaimRecord(uid="u1", namespace="default", name="c", state="PrepareCompleted")
    save_checkpoint(base / "state" / "checkpoint.json", read_boot_id(Path("/")), {"u1": record})
    cfg = config(base, api.write_kubeconfig(base / "kc"), node_name="elsewhere")
    daemon = Daemon(cfg, lambda: inventory)
    with pytest.raises(StartupError, match="not found"):
        daemon.start()
    assert sorted(os.listdir(base)) == ["cdi", "kc", "state"]
    assert os.listdir(base / "cdi") == []
    assert os.listdir(base / "state") == ["checkpoint.json"]  # its nccl/ was this start's
    claims, status = load_checkpoint(base / "state" / "checkpoint.json", read_boot_id(Path("/")))
    assert (status, list(claims)) == ("ok", ["u1"])


def test_bad_rediscovery_keeps_the_last_snapshot(
    api: KubeAPIServer, base: Path, inventory: Inventory
) -> None:
    calls = {"n": 0}

    def flaky() -> Inventory:
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError("sysfs went away")
        return inventory

    daemon = Daemon(config(base, api.write_kubeconfig(base / "kc")), flaky)
    daemon.start()
    try:
        snap = daemon.snapshot()
        assert not daemon.rediscover()
        assert daemon.snapshot() is snap
        assert "sysfs went away" in daemon.status().last_error
    finally:
        daemon.stop(grace=1)
