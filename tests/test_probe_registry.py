"""Third-party probes arrive through the ``toposlice.probes`` entry-point group."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins import registry
from toposlice.discover import discover

PROBE_SRC = """
from discovery.model import Gpu
from plugins.base import ProbeReport


class AcmeProbe:
    name = "acme"

    def probe(self, ctx):
        # Enrich a GPU the generic probe also sees, and add a host fact.
        bus = next(d.bus_id for d in ctx.host.pci_devices if d.class_code == "0x0302")
        return ProbeReport(gpus=[Gpu(bus_id=bus, vendor="nvidia", probe="acme",
                                     model="Acme-tuned")], host={"acme": "yes"}, detail="1 GPU")


class BrokenProbe:
    name = "broken"

    def probe(self, ctx):
        raise RuntimeError("vendor library exploded")
"""


@pytest.fixture
def third_party(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "acme_probe.py").write_text(PROBE_SRC)
    dist = tmp_path / "acme_probe-1.0.dist-info"
    dist.mkdir()
    (dist / "entry_points.txt").write_text(
        "[console_scripts]\nacme = acme_probe:main\n\n"
        "[toposlice.probes]\nacme = acme_probe:AcmeProbe\nbroken = acme_probe:BrokenProbe\n"
        "missing = acme_probe_nope:Probe\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.scan_entry_points.cache_clear()
    yield tmp_path
    registry.scan_entry_points.cache_clear()
    sys.modules.pop("acme_probe", None)


def test_scan_finds_group_entries_only(third_party: Path) -> None:
    found = registry.scan_entry_points(registry.GROUP)
    assert found["acme"] == "acme_probe:AcmeProbe"
    assert "main" not in found.values() and "acme_probe:main" not in found.values()
    assert {"nvidia", "pci", "rdma", "cpu"} <= set(registry.BUILTIN)


def test_third_party_probe_runs_and_failures_are_contained(third_party: Path) -> None:
    inv = discover(fake="cloud-vm-1gpu")
    states = {p.name: p for p in inv.probes}
    assert states["acme"].state == "ok" and states["acme"].detail == "1 GPU"
    assert states["broken"].state == "error"
    assert "vendor library exploded" in states["broken"].detail
    assert states["missing"].state == "error" and "cannot load" in states["missing"].detail
    # The built-ins still ran; NVML's model wins the merge (vendor library first).
    assert states["nvidia"].state == "ok"
    (gpu,) = inv.gpus
    assert gpu.uuid is not None and gpu.model != "Acme-tuned"
    assert inv.host["acme"] == "yes"


def test_probe_selection(third_party: Path) -> None:
    inv = discover(fake="cloud-vm-1gpu", probes=["acme"])
    assert [p.name for p in inv.probes] == ["acme"]
    assert [g.model for g in inv.gpus] == ["Acme-tuned"]
