"""NVIDIA GPUs published without NVML are said loudly (driver/health/nvml_gap.py): the gap is
detected from the inventory, and a running daemon reports it on /readyz, in its metrics
and as a Warning Event on its Node, once per distinct reason."""

from __future__ import annotations

import copy
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from discovery.model import Inventory, ProbeStatus
from driver.daemon import Daemon
from driver.health.nvml_gap import REASON, missing_gpus, node_event, nvml_gap
from tests.kubeapi import KubeAPIServer
from tests.kubelet import register, wait_for
from tests.test_driver_daemon import DRIVER, NODE, config
from toposlice.discover import discover


@pytest.fixture(scope="module")
def dgx() -> Inventory:
    return discover("/", fake="dgx-h100")


def without_nvml(inv: Inventory, state: str = "unavailable") -> Inventory:
    out = copy.deepcopy(inv)
    out.probes = [p for p in out.probes if p.name != "nvidia"]
    out.probes.append(ProbeStatus("nvidia", state, "libnvidia-ml.so.1: cannot open"))  # type: ignore[arg-type]
    return out


def test_no_gap_when_nvml_answers(dgx: Inventory) -> None:
    assert any(p.name == "nvidia" and p.state == "ok" for p in dgx.probes)
    assert nvml_gap(dgx) == "" and missing_gpus(dgx) == 0


@pytest.mark.parametrize("state", ["unavailable", "error"])
def test_gap_names_the_gpus_the_cause_and_the_remedy(dgx: Inventory, state: str) -> None:
    inv = without_nvml(dgx, state)
    gpus = sum(1 for g in inv.gpus if g.vendor == "nvidia")
    assert gpus == 8 and missing_gpus(inv) == 8
    line = nvml_gap(inv)
    assert "\n" not in line
    assert f"{state}: libnvidia-ml.so.1" in line and "8 NVIDIA GPU(s)" in line
    assert "runtimeClassName: nvidia" in line and "privileged: true" in line


def test_no_gap_without_nvidia_gpus_or_when_the_probe_was_left_out(dgx: Inventory) -> None:
    amd = without_nvml(discover("/", fake="mi300x-8"))
    assert amd.gpus and nvml_gap(amd) == ""
    left_out = copy.deepcopy(dgx)
    left_out.probes = [p for p in left_out.probes if p.name != "nvidia"]
    assert nvml_gap(left_out) == ""


def test_event_is_a_valid_node_warning() -> None:
    node = {"metadata": {"name": "gpu-7", "uid": "u-1"}}
    ev = node_event(node, "x" * 5000, "toposlice.dev-kubelet-plugin")
    assert ev["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "gpu-7",
        "uid": "u-1",
    }
    assert (ev["type"], ev["reason"]) == ("Warning", REASON)
    assert len(ev["message"]) == 1024 and ev["metadata"]["name"].startswith("gpu-7.")


@pytest.fixture
def base() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ts-n-") as d:
        yield Path(d)


def test_daemon_reports_the_gap_on_readyz_metrics_and_one_event(dgx: Inventory, base: Path) -> None:
    inv = without_nvml(dgx)
    with KubeAPIServer() as api:
        api.add_node(NODE)
        kubeconfig = api.write_kubeconfig(base / "kubeconfig")
        cfg = config(base, kubeconfig, http_addr="127.0.0.1:0")
        daemon = Daemon(cfg, lambda: copy.deepcopy(inv))
        daemon.start()
        try:

            def events() -> list[dict[str, Any]]:
                found = api.store.select("events", "default", None, None)[0]
                return [e for e in found if e["reason"] == REASON]

            assert wait_for(events, timeout=10)
            (ev,) = events()
            assert ev["reason"] == REASON and ev["involvedObject"]["name"] == NODE
            assert ev["message"] == nvml_gap(inv)
            # First of the gaps (the vendor CDI gap follows: no vendor spec here either).
            assert daemon.status().details["degraded"].startswith(nvml_gap(inv))
            daemon.rediscover()  # same reason: no second Event
            assert len(events()) == 1
            with urllib.request.urlopen(f"{daemon.http.url}/metrics", timeout=5) as resp:
                assert "toposlice_nvml_missing_gpus 8.0" in resp.read().decode()
            register(base / "reg" / f"{DRIVER}-reg.sock")  # as the kubelet does
            assert wait_for(lambda: _readyz(daemon), timeout=10)
            assert str(_readyz(daemon)).startswith("ok, degraded: NVML unavailable")
        finally:
            daemon.stop(grace=0)


def _readyz(daemon: Daemon) -> str | None:
    try:
        with urllib.request.urlopen(f"{daemon.http.url}/readyz", timeout=5) as resp:
            return resp.read().decode() if resp.status == 200 else None
    except OSError:
        return None
