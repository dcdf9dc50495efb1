"""PCI accelerator, RDMA/NIC and CPU probes on hand-built inventories and tiny sysfs trees."""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from discovery.model import (
    Cpu,
    Inventory,
    NetInterface,
    NumaNode,
    PciDevice,
    RdmaDevice,
    RdmaPort,
)
from discovery.root import Root
from plugins.base import ProbeContext, ProbeReport, ProbeUnavailable
from plugins.cpu import CpuProbe, parse_cpuinfo
from plugins.pci_accel import PciAcceleratorProbe, gfx_name, is_accelerator
from plugins.rdma import RdmaProbe
from tests.conftest import examples

# --------------------------------------------------------------------------- pci


def pci(bus: str, cls: str, vendor: str, device: str, **kw: Any) -> PciDevice:
    return PciDevice(bus_id=bus, class_code=cls, vendor=vendor, device=device, **kw)


def amd_host() -> Inventory:
    inv = Inventory()
    inv.pci_devices = [
        pci("0000:00:01.0", "0x0604", "0x1022", "0x14ab", is_bridge=True),
        pci("0000:02:00.0", "0x0300", "0x1a03", "0x2000"),  # ASPEED BMC
        pci("0000:05:00.0", "0x1200", "0x1002", "0x74a1"),  # MI300X
        pci("0000:26:00.0", "0x1200", "0x1002", "0x74a1"),
        pci("0000:46:00.1", "0x0380", "0x1002", "0x7777"),  # unknown AMD, function 1
        pci("0000:60:00.0", "0x010802", "0x144d", "0xa80a"),  # NVMe
    ]
    return inv


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def kfd_node(root: Path, node: int, props: dict[str, int]) -> Path:
    base = root / "sys/class/kfd/kfd/topology/nodes" / str(node)
    write(base / "properties", "".join(f"{k} {v}\n" for k, v in props.items()))
    return base


def kfd_link(node_dir: Path, index: int, kind: int, node_to: int, sub: str = "io_links") -> None:
    write(
        node_dir / sub / str(index) / "properties",
        f"type {kind}\nversion_major 0\nnode_from 0\nnode_to {node_to}\nweight 15\n",
    )


def amd_kfd(root: Path) -> None:
    kfd_node(root, 0, {"cpu_cores_count": 96, "simd_count": 0, "drm_render_minor": 0})
    hive = 0x1234_5678_9ABC_DEF0
    n1 = kfd_node(
        root,
        1,
        {
            "simd_count": 1216,
            "drm_render_minor": 128,
            "location_id": 0x0500,
            "domain": 0,
            "hive_id": hive,
            "unique_id": 12345678901234567,
            "gfx_target_version": 90402,
        },
    )
    write(n1 / "mem_banks/0/properties", "heap_type 1\nsize_in_bytes 206141652992\n")
    kfd_link(n1, 0, 2, 0)
    kfd_link(n1, 1, 11, 2)
    kfd_link(n1, 2, 11, 1)  # self: ignored
    kfd_link(n1, 3, 11, 42)  # unknown node: ignored
    n2 = kfd_node(
        root,
        2,
        {
            "drm_render_minor": 136,
            "location_id": 0x2600,
            "domain": 0,
            "hive_id": hive,
            "unique_id": 0,
            "gfx_target_version": 90402,
        },
    )
    write(n2 / "mem_banks/0/properties", "size_in_bytes 206141652992\n")
    kfd_link(n2, 0, 11, 1, sub="p2p_links")
    # function 1 on bus 0x46: devfn = (0 << 3) | 1
    kfd_node(root, 3, {"drm_render_minor": 144, "location_id": 0x4601, "domain": 0})
    # a GPU KFD node whose PCI function is not in the inventory
    kfd_node(root, 4, {"drm_render_minor": 152, "location_id": 0x9900, "domain": 0})


def run_pci(root: Path, inv: Inventory) -> ProbeReport:
    return PciAcceleratorProbe().probe(ProbeContext(root=Root(root), host=inv))


def test_pci_amd_with_kfd(tmp_path: Path) -> None:
    amd_kfd(tmp_path)
    report = run_pci(tmp_path, amd_host())
    assert report.warnings == []
    assert [g.bus_id for g in report.gpus] == ["0000:05:00.0", "0000:26:00.0", "0000:46:00.1"]
    g0, g1, g2 = report.gpus
    assert (g0.vendor, g0.probe, g0.model) == ("amd", "pci", "AMD Instinct MI300X")
    assert g0.memory_bytes == 206141652992
    assert g0.xgmi_hive_id == "0x123456789abcdef0" == g1.xgmi_hive_id
    assert g0.uuid == f"0x{12345678901234567:016x}"
    assert g1.uuid is None
    assert g0.architecture == "gfx942"
    assert g0.xgmi_peers == ["0000:26:00.0"]
    assert g1.xgmi_peers == ["0000:05:00.0"]
    assert (g2.model, g2.xgmi_hive_id, g2.xgmi_peers, g2.memory_bytes) == (None, None, [], None)
    assert report.detail == "3 accelerators (3 amd), 3 with KFD topology"


def test_pci_without_kfd_and_other_vendors(tmp_path: Path) -> None:
    inv = Inventory()
    inv.pci_devices = [
        pci("0000:1b:00.0", "0x0302", "0x10de", "0x2330"),
        pci("0000:2a:00.0", "0x1200", "0x1da3", "0x1020"),
        pci("0000:3a:00.0", "0x120000", "0xabcd", "0x0001"),
        pci("0000:4a:00.0", "0x0380", "0x8086", "0x0bd5"),
        pci("0000:03:00.0", "0x0300", "0x102b", "0x0536"),  # Matrox BMC
        pci("0000:04:00.0", "0x0300", "0x19e5", "0x1711"),  # HiSilicon BMC VGA
        pci("0000:05:00.0", "0x0300", "0x1234", "0x1111"),  # QEMU stdvga
    ]
    report = run_pci(tmp_path, inv)
    got = [(g.bus_id, g.vendor, g.model) for g in report.gpus]
    assert got == [
        ("0000:1b:00.0", "nvidia", "NVIDIA H100 80GB HBM3"),
        ("0000:2a:00.0", "habana", "Habana Gaudi2"),
        ("0000:3a:00.0", "0xabcd", None),
        ("0000:4a:00.0", "intel", "Intel Data Center GPU Max 1550"),
    ]
    assert report.warnings == []


def test_pci_no_accelerators(tmp_path: Path) -> None:
    inv = Inventory(pci_devices=[pci("0000:02:00.0", "0x0300", "0x1a03", "0x2000")])
    with pytest.raises(ProbeUnavailable, match="no PCI accelerators"):
        run_pci(tmp_path, inv)
    with pytest.raises(ProbeUnavailable):
        run_pci(tmp_path, Inventory())


def test_pci_malformed_kfd_files_warn(tmp_path: Path) -> None:
    amd_kfd(tmp_path)
    base = tmp_path / "sys/class/kfd/kfd/topology/nodes"
    write(base / "2/properties", "drm_render_minor 136\nlocation_id banana\n")
    write(base / "1/mem_banks/0/properties", "size_in_bytes\n")
    write(base / "7/properties", "\x00\xff garbage\n")
    (base / "notanode").mkdir()
    report = run_pci(tmp_path, amd_host())
    g0, g1, _ = report.gpus
    assert g0.memory_bytes is None  # malformed bank ignored
    assert g0.xgmi_hive_id is not None  # the node itself is fine
    assert g0.xgmi_peers == []  # node 2 is unusable, so is the link to it
    assert g1.xgmi_hive_id is None
    assert sum("malformed KFD file" in w for w in report.warnings) == 3


def test_pci_duplicate_kfd_nodes_warn(tmp_path: Path) -> None:
    amd_kfd(tmp_path)
    kfd_node(tmp_path, 9, {"drm_render_minor": 200, "location_id": 0x0500, "domain": 0})
    report = run_pci(tmp_path, amd_host())
    assert any("both map to 0000:05:00.0" in w for w in report.warnings)
    assert report.gpus[0].memory_bytes == 206141652992


def test_gfx_name_and_classes() -> None:
    assert gfx_name(90402) == "gfx942"
    assert gfx_name(90010) == "gfx90a"
    assert gfx_name(110000) == "gfx1100"
    assert gfx_name(0) is None
    assert is_accelerator(pci("0000:01:00.0", "0x030200", "0x10de", "0x2330"))
    assert not is_accelerator(pci("0000:01:00.0", "0x0200", "0x15b3", "0x1021"))
    assert not is_accelerator(PciDevice(bus_id="0000:01:00.0", class_code="bogus"))
    assert not is_accelerator(PciDevice(bus_id="0000:01:00.0"))


KFD_KEYS = ["drm_render_minor", "location_id", "domain", "hive_id", "unique_id", "type", "node_to"]
garbage_line = st.one_of(
    st.text(max_size=40),
    st.builds(lambda k, v: f"{k} {v}", st.sampled_from(KFD_KEYS), st.integers(-(2**70), 2**70)),
)
garbage_file = st.one_of(
    st.lists(garbage_line, max_size=6).map("\n".join),
    st.binary(max_size=60).map(lambda b: b.decode("latin-1")),
)


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    files=st.dictionaries(
        st.sampled_from(
            [
                "1/properties",
                "2/properties",
                "1/mem_banks/0/properties",
                "1/io_links/0/properties",
                "2/p2p_links/0/properties",
                "3/properties",
            ]
        ),
        garbage_file,
        max_size=6,
    )
)
def test_pci_random_kfd_garbage_never_raises(files: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        amd_kfd(root)
        base = root / "sys/class/kfd/kfd/topology/nodes"
        for rel, text in files.items():
            path = base / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8", errors="surrogateescape")
        report = run_pci(root, amd_host())
        assert len(report.gpus) == 3
        for gpu in report.gpus:
            assert gpu.memory_bytes is None or gpu.memory_bytes > 0
            assert gpu.bus_id not in gpu.xgmi_peers


# --------------------------------------------------------------------------- rdma


def nic_host() -> Inventory:
    inv = Inventory()
    inv.pci_devices = [
        pci("0000:1a:00.0", "0x0207", "0x15b3", "0x1021", net=["ibp26s0"], rdma=["mlx5_0"]),
        pci(
            "0000:1a:00.2",
            "0x0207",
            "0x15b3",
            "0x101e",
            physfn="0000:1a:00.0",
            rdma=["mlx5_4"],
        ),
        pci("0000:3b:00.0", "0x0200", "0x8086", "0x159b"),
        pci("0000:5c:00.0", "0x0200", "0x15b3", "0x101d", net=["ens5f0np0"], rdma=["mlx5_1"]),
        pci("0000:00:03.0", "0x020000", "0x1af4", "0x1041", net=["eth0"]),
        pci("0000:9a:00.0", "0x0302", "0x10de", "0x2330"),
    ]
    inv.net_interfaces = [
        NetInterface("ibp26s0", bus_id="0000:1a:00.0", speed_mbps=400000),
        NetInterface("ens1f0", bus_id="0000:3b:00.0", speed_mbps=100000),
        NetInterface("ens1f0v", bus_id="0000:3b:00.0", speed_mbps=-1),
        NetInterface("ens5f0np0", bus_id="0000:5c:00.0", speed_mbps=None),
        NetInterface("eth0", bus_id="0000:00:03.0", speed_mbps=-1),
        NetInterface("lo"),
    ]
    inv.rdma_devices = [
        RdmaDevice(
            "mlx5_0",
            bus_id="0000:1a:00.0",
            node_guid="a088:c203:0047:1a2b",
            ports=[RdmaPort(1, rate_gbps=400.0, state="4: ACTIVE", link_layer="InfiniBand")],
        ),
        RdmaDevice(
            "mlx5_1",
            bus_id="0000:5c:00.0",
            node_guid="b0cf:0e03:00aa:0001",
            ports=[
                RdmaPort(2, rate_gbps=200.0, state="4: ACTIVE", link_layer="Ethernet"),
                RdmaPort(1, rate_gbps=10.0, state="1: DOWN", link_layer="Ethernet"),
            ],
        ),
        RdmaDevice(
            "mlx5_4",
            bus_id="0000:1a:00.2",
            ports=[RdmaPort(1, rate_gbps=None, state="1: DOWN", link_layer="InfiniBand")],
        ),
        RdmaDevice("irdma0", bus_id="0000:3b:00.0", ports=[]),
    ]
    return inv


def test_rdma_nics() -> None:
    report = RdmaProbe().probe(ProbeContext(root=Root(Path("/x")), host=nic_host()))
    nics = {n.bus_id: n for n in report.nics}
    assert list(nics) == [
        "0000:00:03.0",
        "0000:1a:00.0",
        "0000:1a:00.2",
        "0000:3b:00.0",
        "0000:5c:00.0",
    ]
    cx7 = nics["0000:1a:00.0"]
    assert (cx7.vendor, cx7.model, cx7.probe, cx7.is_vf) == (
        "mellanox",
        "ConnectX-7",
        "rdma",
        False,
    )
    assert (cx7.netdevs, cx7.rdma_devices) == (["ibp26s0"], ["mlx5_0"])
    assert (cx7.speed_mbps, cx7.rate_gbps, cx7.link_layer) == (400000, 400.0, "InfiniBand")
    assert cx7.node_guid == "a088:c203:0047:1a2b"

    vf = nics["0000:1a:00.2"]
    assert vf.is_vf and vf.model == "ConnectX VF" and vf.rdma_devices == ["mlx5_4"]
    assert (vf.rate_gbps, vf.link_layer, vf.node_guid) == (None, "InfiniBand", None)

    e810 = nics["0000:3b:00.0"]
    assert (e810.vendor, e810.model) == ("intel", "E810")
    assert e810.netdevs == ["ens1f0", "ens1f0v"]  # found through NetInterface.bus_id
    assert e810.rdma_devices == ["irdma0"]
    assert e810.speed_mbps == 100000 and e810.rate_gbps is None

    dx = nics["0000:5c:00.0"]
    assert (dx.model, dx.rate_gbps, dx.link_layer, dx.speed_mbps) == (
        "ConnectX-6 Dx",
        200.0,
        "Ethernet",
        None,
    )

    virtio = nics["0000:00:03.0"]
    assert (virtio.vendor, virtio.model, virtio.speed_mbps) == ("virtio", "virtio-net", None)
    assert report.detail == "5 NICs (4 with RDMA, 1 VF)"


def test_rdma_unavailable_without_network_functions() -> None:
    inv = Inventory(pci_devices=[pci("0000:9a:00.0", "0x0302", "0x10de", "0x2330")])
    with pytest.raises(ProbeUnavailable):
        RdmaProbe().probe(ProbeContext(root=Root(Path("/x")), host=inv))


def test_rdma_unknown_vendor_and_missing_ids() -> None:
    inv = Inventory(
        pci_devices=[
            pci("0000:01:00.0", "0x0280", "0xfeed", "0x0001"),
            PciDevice(bus_id="0000:02:00.0", class_code="0x0200"),
        ]
    )
    report = RdmaProbe().probe(ProbeContext(root=Root(Path("/x")), host=inv))
    assert [(n.vendor, n.model) for n in report.nics] == [("0xfeed", None), (None, None)]


# --------------------------------------------------------------------------- cpu

X86_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme de pse tsc msr pae mce lm avx512f

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: something else
"""

ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd4f
CPU revision\t: 0
"""


def cpu_host(n: int = 8) -> Inventory:
    inv = Inventory()
    inv.cpus = [Cpu(id=i, package=i // 4, core=i % 4, numa_node=i // 4) for i in range(n)]
    inv.numa_nodes = [NumaNode(0, cpus=[0, 1, 2, 3]), NumaNode(1, cpus=[4, 5, 6, 7])]
    return inv


def test_cpu_x86(tmp_path: Path) -> None:
    write(tmp_path / "proc/cpuinfo", X86_CPUINFO)
    write(tmp_path / "sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "3800000\n")
    write(tmp_path / "sys/devices/system/cpu/cpu5/cpufreq/cpuinfo_max_freq", "3900000\n")
    report = CpuProbe().probe(ProbeContext(root=Root(tmp_path), host=cpu_host()))
    assert report.host == {
        "cpu_vendor": "intel",
        "cpu_model": "Intel(R) Xeon(R) Platinum 8480+",
        "arch": "x86_64",
        "cpus_online": "8",
        "numa_nodes": "2",
        "sockets": "2",
        "cores": "8",
        "cpu_freq_max_mhz": "3900",
    }
    assert report.detail == "Intel(R) Xeon(R) Platinum 8480+, 2 sockets, 8 CPUs, 2 NUMA nodes"
    assert report.warnings == []


def test_cpu_arm(tmp_path: Path) -> None:
    write(tmp_path / "proc/cpuinfo", ARM_CPUINFO)
    report = CpuProbe().probe(ProbeContext(root=Root(tmp_path), host=cpu_host()))
    assert report.host["cpu_vendor"] == "arm"
    assert report.host["cpu_model"] == "Neoverse-V2"
    assert report.host["arch"] == "aarch64"
    assert "cpu_freq_max_mhz" not in report.host


POWER = "cpu\t\t: POWER9, altivec supported\nplatform\t: PowerNV\n"
KUNPENG = "CPU implementer : 0x48\nCPU architecture: 8\nCPU part : 0xd01\n"
EPYC = "vendor_id : AuthenticAMD\nmodel name : AMD EPYC 9654 96-Core Processor\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (POWER, ("ibm", "POWER9", "ppc64le")),
        ("vendor_id       : IBM/S390\n", ("ibm", None, "s390x")),
        (KUNPENG, ("hisilicon", "Kunpeng-920", "aarch64")),
        (EPYC, ("amd", "AMD EPYC 9654 96-Core Processor", "x86_64")),
        ("isa : rv64imafdc\nuarch : sifive,u74-mc\n", (None, "sifive,u74-mc", "riscv64")),
    ],
)
def test_cpu_other_platforms(
    tmp_path: Path, text: str, expected: tuple[str | None, str | None, str]
) -> None:
    write(tmp_path / "proc/cpuinfo", text)
    report = CpuProbe().probe(ProbeContext(root=Root(tmp_path), host=cpu_host()))
    got = (report.host.get("cpu_vendor"), report.host.get("cpu_model"), report.host.get("arch"))
    assert got == expected


def test_cpu_missing_cpuinfo_and_no_cpus(tmp_path: Path) -> None:
    report = CpuProbe().probe(ProbeContext(root=Root(tmp_path), host=cpu_host(2)))
    assert report.host["cpus_online"] == "2" and "cpu_model" not in report.host
    assert report.warnings == ["cpu: /proc/cpuinfo is not readable"]
    with pytest.raises(ProbeUnavailable, match="no CPUs"):
        CpuProbe().probe(ProbeContext(root=Root(tmp_path), host=Inventory()))


def test_cpu_live_uses_platform_and_guards_psutil(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import platform

    import psutil

    write(tmp_path / "proc/cpuinfo", X86_CPUINFO)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64-live")

    def boom() -> None:
        raise OSError("no cpufreq")

    monkeypatch.setattr(psutil, "cpu_freq", boom)
    report = CpuProbe().probe(ProbeContext(root=Root(tmp_path, live=True), host=cpu_host()))
    assert report.host["arch"] == "x86_64-live"
    assert "cpu_freq_max_mhz" not in report.host

    freq = SimpleNamespace(current=2000.0, min=0.0, max=3456.7)
    monkeypatch.setattr(psutil, "cpu_freq", lambda: freq)
    report = CpuProbe().probe(ProbeContext(root=Root(tmp_path, live=True), host=cpu_host()))
    assert report.host["cpu_freq_max_mhz"] == "3457"


def test_parse_cpuinfo_first_block_wins() -> None:
    info = parse_cpuinfo(X86_CPUINFO)
    assert info["model name"] == "Intel(R) Xeon(R) Platinum 8480+"


@settings(max_examples=examples(150), deadline=None)
@given(text=st.text(max_size=300))
def test_cpu_random_cpuinfo_never_raises(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write(root / "proc/cpuinfo", text)
        report = CpuProbe().probe(ProbeContext(root=Root(root), host=cpu_host()))
        assert all(isinstance(v, str) for v in report.host.values())
        assert report.host["cpus_online"] == "8"


def test_cpu_itanium(tmp_path: Path) -> None:
    write(tmp_path / "proc/cpuinfo", "processor : 0\nvendor : GenuineIntel\narch : IA-64\n")
    report = CpuProbe().probe(ProbeContext(root=Root(tmp_path), host=cpu_host()))
    assert (report.host["cpu_vendor"], report.host["arch"]) == ("intel", "ia64")
