"""The real dra-driver-cpu's slices (recorded by the interop tier, tests/data/foreign-slices/
recorded/) against toposlice's view of the same machine: the doctor matches them without a
false alarm, finds what is planted in them, and sees when two drivers publish the same CPUs;
``run``'s neighbourhood (which devices to leave out, which dialect to speak) follows."""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.publisher.neighbours import NeighbourWatch
from normalize.crossdriver import Neighbourhood, neighbourhood, normalization_report
from normalize.dialects import bridge_devices
from normalize.options import NormalizeOptions
from normalize.slices import build_slices
from normalize.snapshot import build_snapshot
from tests.exporter_view import snapshot_of

RECORDED = Path(__file__).parent / "data" / "foreign-slices" / "recorded"
NODE = "dgx-h100"
PCIE = "resource.kubernetes.io/pcieRoot"


def recorded(mode: str) -> list[dict[str, Any]]:
    with open(RECORDED / f"dra-cpu-{mode}.yaml", encoding="utf-8") as fh:
        return [d for d in yaml.safe_load_all(fh) if d]


def own(bridges: tuple[str, ...] = ("dra.cpu",), publish_cpus: bool = True) -> list[dict]:
    snap = snapshot_of(NODE, NODE)
    slices = build_slices(snap.inventory, NODE, NormalizeOptions(bridges=bridges))
    if not publish_cpus:
        for s in slices:
            s["spec"]["devices"] = [
                d for d in s["spec"]["devices"] if d["attributes"]["type"]["string"] != "cpu"
            ]
    return slices


def findings(report: Any, *severities: str) -> list[tuple[str, str | None, str]]:
    return [(f.driver, f.device, f.check) for f in report.findings if f.severity in severities]


def device(slices: list[dict], name: str) -> dict:
    return next(d for s in slices for d in s["spec"]["devices"] if d["name"] == name)


@pytest.mark.parametrize("mode", ["grouped", "individual"])
def test_the_real_pair_raises_no_alarm(mode: str) -> None:
    snap = snapshot_of(NODE, NODE)
    peer = recorded(mode)
    slices = peer + own(publish_cpus=False)
    report = normalization_report(snap, slices, NODE, ["dra.cpu", "toposlice.dev"], (1, 36))
    assert findings(report, "error", "warning") == []
    cpu_devices = sum(len(s["spec"]["devices"]) for s in peer)
    assert cpu_devices == (2 if mode == "grouped" else 224)
    matched = [m for m in report.matches if m.identity.driver == "dra.cpu"]
    assert len(matched) == cpu_devices and all(m.vertex for m in matched)
    # grouped devices land on their own NUMA node's group; individual CPUs by their id
    for m in matched:
        dev = device(peer, m.identity.device)
        numa = dev["attributes"]["dra.cpu/numaNodeID"]["int"]
        assert m.vertex == f"cpu_group:cpu-numa{numa}"
    notes = {f.check for f in report.findings if f.severity == "info"}
    assert notes == {"dialect", "scalar-vs-list"}


def test_list_advice_follows_the_schedulers_version() -> None:
    snap = snapshot_of(NODE, NODE)
    slices = recorded("grouped") + own()

    def advice(version: tuple[int, int] | None) -> str:
        report = normalization_report(snap, slices, NODE, None, version)
        return next(f.message for f in report.findings if f.check == "scalar-vs-list")

    assert "never allocates on this cluster's scheduler" in advice((1, 36))
    assert "DRAListTypeAttributes" not in advice((1, 36))
    assert "needs the DRAListTypeAttributes gate" in advice((1, 37))
    assert "1.37" in advice(None) and "DRAListTypeAttributes" in advice(None)


@pytest.mark.parametrize(
    ("mode", "name", "attribute", "value", "check"),
    [
        ("grouped", "cpudevnuma001", "dra.cpu/numaNodeID", {"int": 0}, "disagrees-with-hardware"),
        ("grouped", "cpudevnuma001", "dra.net/numaNode", {"int": 0}, "disagrees-with-hardware"),
        ("grouped", "cpudevnuma000", "dra.cpu/socketID", {"int": 1}, "disagrees-with-hardware"),
        (
            "grouped",
            "cpudevnuma000",
            PCIE,
            {"strings": ["pci0000:00", "pci0000:bd"]},
            "cpu-pcieRoot-wider-than-pinned",
        ),
        ("individual", "cpudev005", "dra.cpu/numaNodeID", {"int": 1}, "disagrees-with-hardware"),
        (
            "individual",
            "cpudev200",
            PCIE,
            {"strings": ["pci0000:15"]},
            "cpu-pcieRoot-wider-than-pinned",
        ),
    ],
)
def test_a_planted_defect_in_the_real_slices_is_reported(
    mode: str, name: str, attribute: str, value: dict, check: str
) -> None:
    snap = snapshot_of(NODE, NODE)
    peer = copy.deepcopy(recorded(mode))
    device(peer, name)["attributes"][attribute] = value
    report = normalization_report(snap, peer + own(publish_cpus=False), NODE, None, (1, 36))
    assert findings(report, "error") == [("dra.cpu", name, check)]


@pytest.mark.parametrize("mode", ["grouped", "individual"])
def test_two_drivers_publishing_the_same_cpus_is_an_error(mode: str) -> None:
    snap = snapshot_of(NODE, NODE)
    report = normalization_report(snap, recorded(mode) + own(), NODE, None, (1, 36))
    doubled = {(d, dev) for d, dev, c in findings(report, "error") if c == "double-published"}
    assert {("toposlice.dev", "cpu-numa0"), ("toposlice.dev", "cpu-numa1")} <= doubled
    assert {d for d, _dev in doubled} == {"toposlice.dev", "dra.cpu"}
    assert set(report.double_published()) == {"cpu_group:cpu-numa0", "cpu_group:cpu-numa1"}


@pytest.mark.parametrize("mode", ["grouped", "individual"])
def test_the_neighbourhood_leaves_the_cpus_to_dra_cpu(mode: str) -> None:
    snap = snapshot_of(NODE, NODE)
    near = neighbourhood(snap, recorded(mode) + own(), ["dra.cpu", "toposlice.dev"])
    assert near.drivers == ("dra.cpu",) and near.bridges == ("dra.cpu",)
    assert set(near.taken) == {"cpu-numa0", "cpu-numa1"}
    assert "cpu-numa0" in near.message() and "dra.cpu" in near.message()
    # A driver whose slices outlived its registration takes nothing.
    gone = neighbourhood(snap, recorded(mode), ["toposlice.dev"])
    assert gone == Neighbourhood()


def test_l3_groups_overlapping_a_numa_device_are_all_left_out() -> None:
    snap = build_snapshot(snapshot_of(NODE).inventory, NODE, NormalizeOptions(cpu_grouping="l3"))
    cpu_names = {d["name"] for d in snap.devices if d["attributes"]["type"]["string"] == "cpu"}
    near = neighbourhood(snap, recorded("grouped"))
    assert set(near.taken) == cpu_names and len(cpu_names) >= 2


def test_bridge_is_idempotent_and_keeps_type_first() -> None:
    snap = snapshot_of(NODE, NODE)
    once = bridge_devices(list(snap.devices), ("dra.cpu",))
    assert bridge_devices(once, ("dra.cpu",)) == once
    for d in once:
        assert next(iter(d["attributes"])) == "type"
        assert (
            d["attributes"]["dra.net/numaNode"]
            == d["attributes"]["resource.kubernetes.io/numaNode"]
        )
    assert all("dra.net/numaNode" not in d["attributes"] for d in snap.devices)


def test_the_watch_keeps_its_answer_when_the_api_fails() -> None:
    snap = snapshot_of(NODE, NODE)
    answers: list[Any] = [recorded("grouped"), RuntimeError("API down"), []]
    changes: list[Neighbourhood] = []

    def source() -> list[dict]:
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    watch = NeighbourWatch(source, lambda: snap, changes.append, registry_dir=None)
    assert set(watch.read_once().taken) == {"cpu-numa0", "cpu-numa1"}
    assert set(watch.read_once().taken) == {"cpu-numa0", "cpu-numa1"}  # kept
    assert "API down" in watch.last_error
    assert watch.read_once() == Neighbourhood()  # dra.cpu gone: publish the CPUs again
    assert [bool(c.taken) for c in changes] == [True, False]
    assert not any(t.name == "neighbours" for t in threading.enumerate())


def test_the_nvidia_drivers_gpus_take_toposlices_gpus() -> None:
    from tests.exporter_view import FOREIGN_SLICE_FILES

    nvidia = next(f for f in FOREIGN_SLICE_FILES if f.endswith("/nvidia-gpu.yaml"))
    with open(nvidia, encoding="utf-8") as fh:
        slices = [d for d in yaml.safe_load_all(fh) if d]
    snap = snapshot_of(NODE, NODE)
    near = neighbourhood(snap, slices, ["gpu.nvidia.com"])
    gpus = {d["name"] for d in snap.devices if d["attributes"]["type"]["string"] == "gpu"}
    # by bus id, by UUID where the bus id is missing or spelled NVML's way
    assert set(near.taken) == gpus and near.bridges == ()


def recorded_dranet() -> list[dict[str, Any]]:
    with open(RECORDED / "dranet.yaml", encoding="utf-8") as fh:
        return [d for d in yaml.safe_load_all(fh) if d]


def test_the_real_dranet_raises_no_alarm_and_its_nics_are_left_to_it() -> None:
    snap = snapshot_of(NODE, NODE)
    peer = recorded_dranet()
    report = normalization_report(snap, peer + own(("dra.net",)), NODE, None, (1, 36))
    doubled = {dev for d, dev, c in findings(report, "error") if c == "double-published"}
    assert len([d for d in doubled if d.startswith("nic-")]) == 12  # toposlice publishes them
    near = neighbourhood(snap, peer, ["dra.net"])
    assert {n for n in near.taken if n.startswith("nic-")} == {
        d["name"] for d in snap.devices if d["attributes"]["type"]["string"] == "nic"
    }
    without_own_nics = [
        {**s, "spec": {**s["spec"], "devices": [
            d for d in s["spec"]["devices"] if d["attributes"]["type"]["string"] != "nic"
        ]}}
        for s in own(("dra.net",))
    ]  # fmt: skip
    report = normalization_report(snap, peer + without_own_nics, NODE, None, (1, 36))
    assert findings(report, "error", "warning") == []
    assert all(m.by == "pciBusID" for m in report.matches if m.identity.driver == "dra.net")


@pytest.mark.parametrize(
    ("attribute", "value"),
    [(PCIE, {"string": "pci0000:97"}), ("dra.net/numaNode", {"int": 1})],
)
def test_a_wrong_root_or_numa_node_in_dranets_slice_is_reported(
    attribute: str, value: dict
) -> None:
    snap = snapshot_of(NODE, NODE)
    peer = copy.deepcopy(recorded_dranet())
    device(peer, "pci-0000-18-00-0")["attributes"][attribute] = value
    report = normalization_report(snap, peer, NODE, None, (1, 36))
    assert findings(report, "error") == [("dra.net", "pci-0000-18-00-0", "disagrees-with-hardware")]


def test_the_real_nvidia_plugin_raises_no_alarm_and_its_gpus_are_left_to_it() -> None:
    snap = snapshot_of(NODE, NODE)
    with open(RECORDED / "nvidia-gpu.yaml", encoding="utf-8") as fh:
        peer = [d for d in yaml.safe_load_all(fh) if d]
    gpus = {d["name"] for d in snap.devices if d["attributes"]["type"]["string"] == "gpu"}
    assert set(neighbourhood(snap, peer, ["gpu.nvidia.com"]).taken) == gpus
    mine = [
        {**s, "spec": {**s["spec"], "devices": [
            d for d in s["spec"]["devices"] if d["attributes"]["type"]["string"] != "gpu"
        ]}}
        for s in own(())
    ]  # fmt: skip
    report = normalization_report(snap, peer + mine, NODE, None, (1, 36))
    assert findings(report, "error", "warning") == []
    matched = [m for m in report.matches if m.identity.driver == "gpu.nvidia.com"]
    assert len(matched) == 8 and all(m.by == "pciBusID" for m in matched)
    report = normalization_report(snap, peer + own(()), NODE, None, (1, 36))
    doubled = [f for f in report.findings if f.check == "double-published"]
    assert len(doubled) == 16  # each GPU, once per driver
