from __future__ import annotations

from typing import Any

import pytest

from discovery.model import Gpu, Inventory, Nic, PciDevice
from normalize.attributes import (
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    a_string,
    a_version,
    numa_list,
    to_semver,
)
from normalize.devices import build_devices, build_devices_reported, quantity
from normalize.options import NormalizeOptions
from tests.inventories import amd, dgx, gb200, snc


def _dev(devs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(d for d in devs if d["name"] == name)


def test_gpu_standard_and_driver_attributes() -> None:
    dev = _dev(build_devices(dgx()), "gpu-0000-1a-00-0")
    a = dev["attributes"]
    assert a[PCI_BUS_ID] == {"string": "0000:1a:00.0"}
    assert a[PCIE_ROOT] == {"string": "pci0000:17"}
    assert a[NUMA_NODE] == {"int": 0}
    assert a["type"] == {"string": "gpu"}
    assert a["index"] == {"int": 0}
    assert a["computeCapability"] == {"version": "9.0.0"}
    assert a["driverVersion"] == {"version": "550.54.15"}
    assert a["nvlinkVersion"] == {"version": "4.0.0"}
    assert a["nvlinkLinks"] == {"int": 18}
    assert a["nvlinkDomain"] == {"string": "dgx-01-nvswitch"}  # all-zero cluster: no clique
    assert "nvlinkClique" not in a
    assert a["migMode"] == {"bool": False}
    assert a["pcieGen"] == {"int": 5} and a["pcieWidth"] == {"int": 16}
    # Gen5 x16: 32 GT/s x 128/130 / 8 bits x 16 lanes = 63.015 GB/s per direction.
    assert a["pcieBandwidthMBps"] == {"int": 63015}
    assert a["pcieSwitch"] == {"string": "0000:18:00.0"}
    assert dev["capacity"] == {"memory": {"value": "80Gi"}}
    for attr in a.values():
        assert len(attr) == 1


def test_gb200_clique_and_invalid_semver_driver() -> None:
    a = _dev(build_devices(gb200()), "gpu-0008-01-00-0")["attributes"]
    clique = "7f1e0a4c-2b3d-4e5f-8a9b-0c1d2e3f4a5b.32766"
    assert a["nvlinkClique"] == {"string": clique}
    assert a["nvlinkDomain"] == {"string": clique}
    # 570.124.06 is not semver (a leading zero): the same version without it, as NVIDIA's
    # DRA driver publishes it
    assert a["driverVersion"] == {"version": "570.124.6"}
    assert a["memoryNumaNode"] == {"int": 2}


def test_numa_omitted_when_unknown_and_5_digit_domain() -> None:
    devs = build_devices(gb200())
    a = _dev(devs, "nic-10000-01-00-0")["attributes"]
    assert PCI_BUS_ID not in a
    assert NUMA_NODE not in a
    assert a[PCIE_ROOT] == {"string": "pci10000:00"}


def test_numa_minus_one_is_none_in_model_and_not_published() -> None:
    inv = Inventory(hostname="h")
    inv.pci_devices.append(PciDevice(bus_id="0000:01:00.0", numa_node=None, locality_numa_node=0))
    inv.nics.append(Nic(bus_id="0000:01:00.0", probe="x"))
    a = build_devices(inv, NormalizeOptions(numa_list=True))[0]["attributes"]
    assert NUMA_NODE not in a
    assert PCIE_ROOT not in a  # no pcie_root known


def test_list_form_numa_snc() -> None:
    inv = snc()
    assert numa_list(inv, 3) == [3, 2]
    assert numa_list(inv, 0) == [0, 1]
    a = build_devices(inv, NormalizeOptions(numa_list=True))[0]["attributes"]
    assert a[NUMA_NODE] == {"ints": [3, 2]}
    a = build_devices(inv)[0]["attributes"]
    assert a[NUMA_NODE] == {"int": 3}


def test_list_form_gpu_memory_node_gb200() -> None:
    devs = build_devices(gb200(), NormalizeOptions(numa_list=True))
    # Kernel (Grace) node first; memory-only nodes are not host peers; then the GPU's memory.
    assert _dev(devs, "gpu-0008-01-00-0")["attributes"][NUMA_NODE] == {"ints": [0, 2]}
    assert _dev(devs, "gpu-0019-01-00-0")["attributes"][NUMA_NODE] == {"ints": [1, 5]}
    assert _dev(devs, "nic-0000-03-00-0")["attributes"][NUMA_NODE] == {"ints": [0]}


def test_cpu_group_pcie_roots_scalar_and_list() -> None:
    devs = build_devices(dgx())
    cpu0 = _dev(devs, "cpu-numa0")
    roots = "pci0000:00,pci0000:17,pci0000:29,pci0000:39,pci0000:5c"
    assert cpu0["attributes"]["pcieRoots"] == {"string": roots}
    assert cpu0["attributes"][NUMA_NODE] == {"int": 0}
    assert PCIE_ROOT not in cpu0["attributes"]
    assert cpu0["capacity"] == {"cpus": {"value": "16"}, "memory": {"value": "1Ti"}}
    devs = build_devices(dgx(), NormalizeOptions(numa_list=True))
    cpu0 = _dev(devs, "cpu-numa0")
    assert cpu0["attributes"]["pcieRoots"] == {"strings": roots.split(",")}
    assert cpu0["attributes"][PCIE_ROOT] == {"strings": roots.split(",")}


def _roots_inventory(count: int) -> Inventory:
    inv = snc()
    for i in range(count):
        inv.pci_devices.append(
            PciDevice(bus_id=f"0000:{i:02x}:00.0", numa_node=0, pcie_root=f"pci0000:{i:02x}")
        )
    return inv


def test_cpu_group_pcie_roots_too_long_split_at_roots_and_not_reported() -> None:
    """10 roots (109 characters): five in pcieRoots, five in pcieRoots2, nothing lost, nothing
    reported."""
    devices, dropped = build_devices_reported(_roots_inventory(10))
    attrs = _dev(devices, "cpu-numa0")["attributes"]
    assert attrs["pcieRoots"] == {"string": ",".join(f"pci0000:{i:02x}" for i in range(5))}
    assert attrs["pcieRoots2"] == {"string": ",".join(f"pci0000:{i:02x}" for i in range(5, 10))}
    assert attrs["pcieRootsTruncated"] == {"bool": True}
    assert "pcieRoots3" not in attrs
    assert [d for d in dropped if d.device == "cpu-numa0"] == []
    listed = build_devices(_roots_inventory(10), NormalizeOptions(numa_list=True))
    assert len(_dev(listed, "cpu-numa0")["attributes"]["pcieRoots"]["strings"]) == 10


def test_cpu_group_pcie_roots_over_every_part_cut_at_a_root_and_reported() -> None:
    devices, dropped = build_devices_reported(_roots_inventory(23))
    attrs = _dev(devices, "cpu-numa0")["attributes"]
    parts = [attrs[k]["string"] for k in ("pcieRoots", "pcieRoots2", "pcieRoots3", "pcieRoots4")]
    assert all(len(p) <= 64 for p in parts)
    assert ",".join(parts) == ",".join(f"pci0000:{i:02x}" for i in range(20))
    assert attrs["pcieRootsTruncated"] == {"bool": True}
    (drop,) = [d for d in dropped if d.device == "cpu-numa0"]
    assert drop.attribute == "pcieRoots" and "23 values in 252 characters" in drop.reason
    assert drop.published == (
        "the first 20 in pcieRoots, pcieRoots2, pcieRoots3, pcieRoots4 and pcieRootsTruncated=true"
    )


def test_every_limit_that_keeps_a_value_out_is_reported() -> None:
    """Each way a known value can miss the slice gives a report naming device and name."""
    inv = dgx()
    gpu = inv.gpus[0]
    gpu.uuid = "GPU-" + "f" * 70
    gpu.driver_version = "535.104.05-beta"  # a leading zero and a suffix: no version
    gpu.model = "M" * 80
    nic = inv.nics[0]
    nic.netdevs = ["n" * 65]
    devices, dropped = build_devices_reported(inv)
    by_attr = {(d.device, d.attribute): d for d in dropped}
    g = "gpu-0000-1a-00-0"
    assert "uuid" not in _dev(devices, g)["attributes"]
    assert by_attr[(g, "uuid")].published is None and "74 characters" in by_attr[(g, "uuid")].reason
    assert "not a semantic version" in by_attr[(g, "driverVersion")].reason
    assert by_attr[(g, "model")].published == "its first 64 characters"
    nic_name = "nic-" + nic.bus_id.replace(":", "-").replace(".", "-")
    assert "netdev" not in _dev(devices, nic_name)["attributes"]
    assert (nic_name, "netdev") in by_attr
    # Over the per-device budget: the attributes left out are named too.
    from normalize.devices import _Builder

    report: list[Any] = []
    b = _Builder("dev-x", report)
    for i in range(40):
        b.int(f"a{i}", i)
    b.int("huge", 2**64)
    dev = b.device_dict({})
    assert len(dev["attributes"]) == 32
    assert {d.attribute for d in report} == {"huge", *(f"a{i}" for i in range(32, 40))}


def test_bridges_put_the_neighbours_numa_name_on_every_device() -> None:
    devs = build_devices(dgx(), NormalizeOptions(bridges=("dra.cpu",)))
    for name in ("nic-0000-9d-00-0", "gpu-0000-9c-00-0", "cpu-numa1"):
        attrs = _dev(devs, name)["attributes"]
        assert attrs["dra.net/numaNode"] == attrs["resource.kubernetes.io/numaNode"] == {"int": 1}
        # right behind the type and numbering: the budget drops other attributes first
        assert list(attrs).index("dra.net/numaNode") <= 3
    assert _dev(devs, "cpu-numa1")["attributes"]["dra.cpu/numaNodeID"] == {"int": 1}
    devs = build_devices(dgx(), NormalizeOptions(bridges=("dra.net",)))
    assert "dra.cpu/numaNodeID" not in _dev(devs, "cpu-numa1")["attributes"]
    devs = build_devices(dgx())
    assert all("dra.net/numaNode" not in d["attributes"] for d in devs)
    with pytest.raises(ValueError, match="unknown bridge"):
        NormalizeOptions(bridges=("gpu.nvidia.com",))


def test_nic_attributes_and_vf() -> None:
    inv = dgx()
    inv.pci_devices.append(PciDevice(bus_id="0000:1b:00.1", numa_node=0, physfn="0000:1b:00.0"))
    inv.nics.append(Nic(bus_id="0000:1b:00.1", probe="rdma", is_vf=True, netdevs=["ib0v0"]))
    devs = build_devices(inv)
    pf = _dev(devs, "nic-0000-1b-00-0")["attributes"]
    assert pf["rdmaDevice"] == {"string": "mlx5_0"}
    assert pf["netdev"] == {"string": "ibp27s0"}
    assert pf["speedMbps"] == {"int": 400000}
    assert pf["linkLayer"] == {"string": "InfiniBand"}
    assert pf["sriovVF"] == {"bool": False}
    vf = _dev(devs, "nic-0000-1b-00-1")["attributes"]
    assert vf["sriovVF"] == {"bool": True}
    assert vf["sriovPF"] == {"string": "0000:1b:00.0"}


def test_amd_model_truncated_and_hive() -> None:
    a = _dev(build_devices(amd()), "gpu-0000-05-00-0")["attributes"]
    assert len(a["model"]["string"]) <= 64
    assert a["xgmiHive"] == {"string": "0x1f2e3d4c5b6a7988"}
    assert "nvlinkDomain" not in a


def test_helpers() -> None:
    assert to_semver("4.0") == "4.0.0"
    assert to_semver("9") == "9.0.0"
    assert to_semver("1.2.3-rc.1") == "1.2.3-rc.1"
    assert to_semver("535.104.05") == "535.104.5"
    assert to_semver("535.104.05-beta") is None
    assert a_version("580.105.08", lenient=False) == {"version": "580.105.8"}
    assert a_version("550.54", lenient=False) is None
    assert a_version("550.54", lenient=True) == {"version": "550.54.0"}
    assert a_string("x" * 65) is None
    assert a_string("x" * 65, truncate=True) == {"string": "x" * 64}
    assert quantity(80 << 30) == "80Gi"
    assert quantity(1000) == "1000"
    assert quantity(3 << 10) == "3Ki"


def test_device_order_and_budget() -> None:
    inv = gb200()
    devs = build_devices(inv)
    gpu_names = [d["name"] for d in devs if d["name"].startswith("gpu-")]
    assert gpu_names == sorted(gpu_names)
    # NUMA node by NUMA node, each node's CPU groups after its GPUs and NICs.
    numa = "resource.kubernetes.io/numaNode"
    blocks = [d["attributes"].get(numa, {}).get("int") for d in devs]
    assert all(blocks.index(b) == i or blocks[i - 1] == b for i, b in enumerate(blocks))
    for i, d in enumerate(devs):
        if d["attributes"]["type"]["string"] == "cpu" and i + 1 < len(devs):
            assert blocks[i + 1] != blocks[i]
    for d in devs:
        assert len(d["attributes"]) + len(d.get("capacity", {})) <= 32


def test_direct_nvlink_domain() -> None:
    from discovery.model import NvLink

    inv = Inventory(hostname="pair")
    a, b = "0000:01:00.0", "0000:02:00.0"
    inv.gpus = [
        Gpu(
            bus_id=a,
            vendor="nvidia",
            probe="x",
            nvlinks=[NvLink(link=0, remote_bus_id=b, remote_type="gpu")],
        ),
        Gpu(
            bus_id=b,
            vendor="nvidia",
            probe="x",
            nvlinks=[NvLink(link=0, remote_bus_id=a, remote_type="gpu")],
        ),
    ]
    devs = build_devices(inv)
    doms = {d["attributes"]["nvlinkDomain"]["string"] for d in devs if d["name"].startswith("gpu")}
    assert doms == {"pair-nvlink-0000-01-00-0"}


def test_to_semver_refuses_non_ascii_digits() -> None:
    """``str.isdigit`` accepts superscripts and other scripts' digits that ``int`` refuses."""
    from normalize.attributes import to_semver

    assert to_semver("\u00b2") is None
    assert to_semver("1.\u0663") is None  # ARABIC-INDIC DIGIT THREE
    assert to_semver("4.0") == "4.0.0"


def test_each_gpu_is_followed_by_its_closest_nics() -> None:
    """The first-fit allocator tries devices in slice order: a GPU's own NICs right behind
    it make a GPU+NIC pair request find its NIC at the first device it evaluates."""
    devs = build_devices(dgx())
    names = [d["name"] for d in devs]
    aff = [d["attributes"].get("nicAffinity", {}).get("string") for d in devs]
    for i, d in enumerate(devs):
        if d["attributes"]["type"]["string"] == "gpu" and aff[i] is not None:
            group = [j for j, a in enumerate(aff) if a == aff[i] and j != i]
            assert group and min(group) == i + 1, (names[i], [names[j] for j in group])


def _kinds_in_order(machine: str) -> list[tuple[str, str]]:
    """(type, name) of each device of a fake machine, in the published order."""
    from tests.driver_support import snapshot

    return [(d["attributes"]["type"]["string"], d["name"]) for d in snapshot(machine).devices]


def test_cpu_group_sits_before_the_nics_no_gpu_is_close_to() -> None:
    """dgx-h100: each socket's CPU group right behind its last GPU's NIC, before the storage
    NICs, so a CPU request after that socket's GPUs passes no NIC a GPU pair would not take;
    a GB200 tray's NICs are close to no GPU, so pairs take them and they stay in front."""
    dgx_order = _kinds_in_order("dgx-h100")
    names = [n for _, n in dgx_order]
    cpu0 = names.index("cpu-numa0")
    assert names[cpu0 - 2 : cpu0 + 3] == [
        "gpu-0000-61-00-0",
        "nic-0000-5e-00-0",
        "cpu-numa0",
        "nic-0000-29-00-0",
        "nic-0000-29-00-1",
    ]
    tray = [t for t, _ in _kinds_in_order("gb200-nvl72-tray")]
    first_cpu = tray.index("cpu")
    assert tray[:first_cpu] == ["gpu", "gpu", "nic", "nic", "nic", "nic"]
    # A node without GPUs keeps its NICs first, as before.
    assert [t for t, _ in _kinds_in_order("cpu-2s")][:5] == ["nic"] * 4 + ["cpu"]
