from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from discovery.model import Inventory, Nic, PciDevice
from normalize.options import NormalizeOptions
from normalize.slices import build_slices, slice_name_prefix, split_devices, to_models
from normalize.validation import validate_pool, validate_slice
from tests.inventories import amd, dgx, gb200, snc

K8S_VERSION = "1.37"  # newest schema set shipped with kubernetes-validate (has resource.k8s.io/v1)

OPTION_SETS = [
    NormalizeOptions(),
    NormalizeOptions(numa_list=True, bridges=("dra.cpu", "dra.net")),
    NormalizeOptions(cpu_grouping="l3"),
    NormalizeOptions(cpu_grouping="core", numa_list=True),
]


def _check(slices: list[dict[str, Any]]) -> None:
    assert validate_pool(slices) == []
    for s in slices:
        assert validate_slice(s) == []
        kubernetes_validate.validate(s, K8S_VERSION, strict=True)


@pytest.mark.parametrize("make", [dgx, gb200, amd, snc])
@pytest.mark.parametrize("opts", OPTION_SETS)
def test_slices_valid(make: Any, opts: NormalizeOptions) -> None:
    inv = make()
    slices = build_slices(inv, inv.hostname, opts)
    _check(slices)
    spec = slices[0]["spec"]
    assert spec["driver"] == opts.driver
    assert spec["nodeName"] == inv.hostname
    assert spec["pool"] == {"name": inv.hostname, "generation": 1, "resourceSliceCount": 1}


def test_empty_inventory_has_one_slice() -> None:
    slices = build_slices(Inventory(), "node-a")
    assert len(slices) == 1
    assert slices[0]["spec"]["devices"] == []
    _check(slices)


def _many_nics(n: int) -> Inventory:
    inv = Inventory(hostname="big")
    for i in range(n):
        bus = f"0000:{i // 8:02x}:{i % 8:02x}.0"
        inv.pci_devices.append(PciDevice(bus_id=bus, numa_node=0, pcie_root="pci0000:00"))
        inv.nics.append(Nic(bus_id=bus, probe="x", netdevs=[f"eth{i}"]))
    return inv


def test_split_300_nics() -> None:
    slices = build_slices(_many_nics(300), "big", generation=4)
    assert len(slices) == 3
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    names = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert len(names) == len(set(names)) == 300
    for s in slices:
        assert s["spec"]["pool"] == {"name": "big", "generation": 4, "resourceSliceCount": 3}
    assert [s["metadata"]["generateName"] for s in slices] == [
        "00000-toposlice.dev-big-",
        "00001-toposlice.dev-big-",
        "00002-toposlice.dev-big-",
    ]
    _check(slices)


def test_split_list_attributes_at_64() -> None:
    slices = build_slices(_many_nics(300), "big", NormalizeOptions(numa_list=True))
    assert [len(s["spec"]["devices"]) for s in slices] == [64] * 4 + [44]
    _check(slices)


def test_split_mixed_restricted() -> None:
    devs: list[dict[str, Any]] = [{"name": f"d{i}", "attributes": {}} for i in range(100)]
    devs.append({"name": "t", "attributes": {}, "taints": [{"key": "k", "effect": "NoSchedule"}]})
    chunks = split_devices(devs)
    assert [len(c) for c in chunks] == [100, 1]
    assert [len(c) for c in split_devices([], 128)] == [0]
    assert [len(c) for c in split_devices(devs[:10], 4)] == [4, 4, 2]


def test_prefix_width() -> None:
    assert slice_name_prefix(0, 1, "d.x", "n") == "00000-d.x-n-"
    assert slice_name_prefix(0x1A, 0x100000 + 1, "d.x", "n") == "00001a-d.x-n-"


def test_to_models() -> None:
    inv = gb200()
    models = to_models(build_slices(inv, "gb", NormalizeOptions(numa_list=True)))
    assert models[0].spec.driver == "toposlice.dev"
    dev = models[0].spec.devices[0]
    assert dev.attributes["resource.kubernetes.io/numaNode"].ints == [0, 2]
    assert dev.capacity["memory"].value == "185030976Ki"
