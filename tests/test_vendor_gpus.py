"""GPUs another driver publishes (NVIDIA's ``gpu.nvidia.com``) beside toposlice's NICs and
CPUs: the mock-NVML profile of a fake machine, the claim ``toposlice claim --gpus-from``
writes, and the NCCL file of a claim that holds the vendor's GPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from discovery.fake import load_machine
from discovery.fake.mock_nvml_profile import architecture, mock_nvml_profile
from driver.kubelet.state import ClaimRef, DriverState
from normalize.deviceclasses import device_classes
from normalize.vendor_view import beside_vendor, vendor_device_class
from scorer.allocator import Allocator
from scorer.vendor_ladder import VendorGpus, vendor_gpu_spec
from tests.driver_support import FakeClaims, claim, make_state, snapshot

REPO = Path(__file__).resolve().parent.parent
RECORDED = REPO / "tests" / "data" / "foreign-slices" / "recorded"
VENDOR = "gpu.nvidia.com"
STD = "resource.kubernetes.io"


def toposlice(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toposlice", "-q", *args],
        capture_output=True,
        text=True,
        check=check,
        cwd=REPO,
    )


# --------------------------------------------------------------------------- profile


@pytest.mark.parametrize("machine", ["dgx-h100", "gb200-nvl72-tray", "pcie-8gpu"])
def test_the_profile_describes_the_machines_gpus(machine: str) -> None:
    spec = load_machine(machine)
    prof = mock_nvml_profile(spec)
    gpus = spec.nvidia_gpus()
    assert [d["pci"]["bus_id"] for d in prof["devices"]] == [g.bdf.upper() for g in gpus]
    assert [d["index"] for d in prof["devices"]] == list(range(len(gpus)))
    assert len({d["uuid"] for d in prof["devices"]}) == len(gpus)
    assert prof["system"]["driver_version"] == spec.nvml.driver_version  # type: ignore[union-attr]
    first = gpus[0].nvidia
    assert first is not None
    assert prof["device_defaults"]["memory"]["total_bytes"] == first.memory_bytes
    assert prof["device_defaults"]["name"] == first.name


def test_the_profile_uuids_are_the_ones_toposlice_publishes() -> None:
    text = toposlice("slices", "--fake", "dgx-h100", "-o", "json").stdout
    ours = {
        d["attributes"][f"{STD}/pciBusID"]["string"].upper(): d["attributes"]["uuid"]["string"]
        for s in json.loads(text)["items"]
        for d in s["spec"]["devices"]
        if d["attributes"]["type"]["string"] == "gpu"
    }
    prof = yaml.safe_load(toposlice("machines", "mock-nvml", "dgx-h100").stdout)
    assert {d["pci"]["bus_id"]: d["uuid"] for d in prof["devices"]} == ours


def test_the_profile_agrees_with_what_the_real_plugin_published() -> None:
    """The recorded slices came from the plugin reading this profile: same UUIDs, bus ids,
    memory and driver version."""
    for machine, name in (
        ("dgx-h100", "nvidia-gpu.yaml"),
        ("gb200-nvl72-tray", "nvidia-gpu-gb200.yaml"),
    ):
        prof = mock_nvml_profile(load_machine(machine))
        rec = [
            d
            for s in yaml.safe_load_all((RECORDED / name).read_text())
            if s
            for d in s["spec"]["devices"]
        ]
        assert {d["attributes"]["uuid"]["string"] for d in rec} == {
            d["uuid"] for d in prof["devices"]
        }
        assert {d["attributes"][f"{STD}/pciBusID"]["string"].upper() for d in rec} == {
            d["pci"]["bus_id"] for d in prof["devices"]
        }
        semver = ".".join(str(int(p)) for p in prof["system"]["driver_version"].split("."))
        assert {d["attributes"]["driverVersion"]["version"] for d in rec} == {semver}
        mib = prof["device_defaults"]["memory"]["total_bytes"] // (1 << 20)
        assert {d["capacity"]["memory"]["value"] for d in rec} == {f"{mib}Mi"}


def test_architecture_words() -> None:
    assert [architecture(c) for c in ((7, 0), (7, 5), (8, 0), (8, 9), (9, 0), (10, 0))] == [
        "volta", "turing", "ampere", "ada", "hopper", "blackwell",
    ]  # fmt: skip


def test_a_machine_without_nvidia_gpus_has_no_profile(tmp_path: Path) -> None:
    res = toposlice("machines", "mock-nvml", "mi300x-8", check=False)
    assert res.returncode == 2 and "no NVIDIA GPUs" in res.stderr
    out = tmp_path / "p.yaml"
    toposlice("machines", "mock-nvml", "gb200-nvl72-tray", "--output-file", str(out))
    assert yaml.safe_load(out.read_text())["device_defaults"]["architecture"] == "blackwell"
    assert [p.name for p in tmp_path.iterdir()] == ["p.yaml"]  # no temp file left


# --------------------------------------------------------------------------- claims


def view(machine: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    text = toposlice("slices", "--fake", machine, "--node-name", "n1", "-o", "json").stdout
    name = {"dgx-h100": "nvidia-gpu.yaml", "gb200-nvl72-tray": "nvidia-gpu-gb200.yaml"}[machine]
    theirs = [d for d in yaml.safe_load_all((RECORDED / name).read_text()) if d]
    slices = beside_vendor(json.loads(text)["items"], VENDOR, "n1", theirs)
    return slices, [*device_classes("toposlice.dev"), vendor_device_class(VENDOR)]


def attrs(slices: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(d["attributes"] for s in slices for d in s["spec"]["devices"] if d["name"] == name)


@pytest.mark.parametrize("machine", ["dgx-h100", "gb200-nvl72-tray"])
@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_each_vendor_gpu_gets_its_closest_nic_and_cpus_on_its_node(machine: str, gpus: int) -> None:
    slices, classes = view(machine)
    spec = vendor_gpu_spec(VendorGpus(VENDOR, gpus, 1, 1))
    got = Allocator(slices, classes, "n1").allocate(spec)
    assert got is not None
    by = {r.request.split("/")[0]: r.device for r in got}
    rungs = {r.request for r in got if "/" in r.request}
    for i in range(gpus):
        g, n = attrs(slices, by[f"gpu-{i}"]), attrs(slices, by[f"nic-{i}"])
        same_root = g[f"{STD}/pcieRoot"] == n[f"{STD}/pcieRoot"]
        assert same_root == (machine == "dgx-h100")  # the tray has no NIC on a GPU's root
        assert (f"nic-{i}/root" in rungs) == same_root
        assert g[f"{STD}/numaNode"] == n[f"{STD}/numaNode"]
    cpu = attrs(slices, by["cpu"])
    assert cpu[f"{STD}/numaNode"] == attrs(slices, by["gpu-0"])[f"{STD}/numaNode"]


def test_a_gpu_whose_root_nic_is_taken_gets_one_on_its_numa_node() -> None:
    slices, classes = view("dgx-h100")
    root_nics = {
        d["name"]
        for s in slices
        for d in s["spec"]["devices"]
        if "nicAffinity" in d["attributes"]  # the eight NICs on a GPU's root
    }
    for s in slices:  # every root NIC taken: each GPU falls back to its NUMA node
        s["spec"]["devices"] = [d for d in s["spec"]["devices"] if d["name"] not in root_nics]
    got = Allocator(slices, classes, "n1").allocate(vendor_gpu_spec(VendorGpus(VENDOR, 2, 1)))
    assert got is not None
    assert {r.request for r in got if r.request.startswith("nic-")} == {"nic-0/numa", "nic-1/numa"}


def test_the_claim_command_refuses_what_it_cannot_keep_short() -> None:
    res = toposlice("claim", "--gpus-from", VENDOR, "--gpus", "8", check=False)
    assert res.returncode == 2 and "at most 4 GPU-NIC pairs" in res.stderr
    res = toposlice(
        "claim", "--gpus-from", VENDOR, "--gpus", "2", "--pattern", "tensor-parallel", check=False
    )
    assert res.returncode == 2 and "carry none of toposlice's attributes" in res.stderr
    ok = toposlice(
        "claim", "--gpus-from", VENDOR, "--gpus", "8", "--nics-per-gpu", "0", "-o", "json"
    )
    items = json.loads(ok.stdout)["items"]
    req = items[0]["spec"]["spec"]["devices"]["requests"]
    assert req == [
        {
            "name": "gpus",
            "exactly": {"deviceClassName": VENDOR, "allocationMode": "ExactCount", "count": 8},
        }
    ]
    # the vendor's DeviceClass comes with its chart: not in the list
    assert [i["kind"] for i in items] == ["ResourceClaimTemplate"]


def test_the_claim_command_shows_the_pick_beside_the_vendor() -> None:
    res = toposlice("claim", "--gpus-from", VENDOR, "--gpus", "2", "--fake", "gb200-nvl72-tray")
    assert "# gb200-nvl72-tray: beside gpu.nvidia.com" in res.stderr
    assert "nic-0/numa = " in res.stderr and "nic-1/numa = " in res.stderr


# --------------------------------------------------------------------------- NCCL file


def test_the_nccl_file_names_the_vendors_gpus_beside_toposlices_nics(tmp_path: Path) -> None:
    snap = snapshot()
    gpu_bus = "0000:1b:00.0"
    nic = next(d["name"] for d in snap.devices if d["name"].startswith("nic-0000-18"))
    theirs = [d for d in yaml.safe_load_all((RECORDED / "nvidia-gpu.yaml").read_text()) if d]
    vendor_gpu = next(
        d["name"] for s in theirs for d in s["spec"]["devices"]
        if d["attributes"][f"{STD}/pciBusID"]["string"] == gpu_bus
    )  # fmt: skip
    for s in theirs:
        s["spec"]["pool"]["name"] = snap.node_name
    reader = FakeClaims()
    extra = [
        {"request": "gpu", "driver": VENDOR, "pool": snap.node_name, "device": vendor_gpu},
        {"request": "gpu", "driver": VENDOR, "pool": snap.node_name, "device": "gpu-99"},
    ]
    c = reader.add(claim("u-v", [nic], extra_results=extra))
    state: DriverState = make_state(tmp_path, reader)
    state.other_slices = lambda: theirs
    meta = c["metadata"]
    res = state.prepare([ClaimRef(meta["namespace"], meta["name"], meta["uid"])])["u-v"]
    assert res.error == ""
    xml = state.topo_path("u-v").read_text()
    assert f'busid="{gpu_bus}"' in xml and 'busid="0000:18:00.0"' in xml
    assert xml.count("<gpu ") == 1  # gpu-99 is in no slice: left out, not invented

    def broken() -> list[dict[str, Any]]:
        raise RuntimeError("the slice watch has not synced yet")

    other_nic = next(d["name"] for d in snap.devices if d["name"].startswith("nic-0000-40"))
    c2 = reader.add(claim("u-w", [other_nic], extra_results=extra[:1]))
    state.other_slices = broken
    meta = c2["metadata"]
    assert (
        state.prepare([ClaimRef(meta["namespace"], meta["name"], meta["uid"])])["u-w"].error == ""
    )
    assert "<gpu " not in state.topo_path("u-w").read_text()
