from __future__ import annotations

from discovery.model import Gpu, Inventory, Nic, NvLink, PciDevice
from normalize.relations import relation_matrix
from tests.inventories import amd, dgx, gb200
from toposlice.render import format_topo


def test_dgx_matrix() -> None:
    m = relation_matrix(dgx())
    assert m.labels[:2] == ["GPU0", "GPU1"] and m.labels[8] == "NIC0"
    assert m.relation("GPU0", "GPU0") == "X"
    assert m.relation("GPU0", "GPU7") == "NV18"
    assert m.relation("GPU0", "NIC0") == "PIX"
    assert m.relation("GPU0", "NIC1") == "NODE"
    assert m.relation("GPU0", "NIC4") == "SYS"
    assert m.relation("NIC4", "NIC5") == "NODE"
    assert m.legend["NIC3"] == "mlx5_3"
    for i in range(len(m.labels)):
        for j in range(len(m.labels)):
            assert m.matrix[i][j] == m.matrix[j][i]


def test_amd_xgmi() -> None:
    m = relation_matrix(amd())
    assert m.relation("GPU0", "GPU5") == "XGMI"
    assert all(v in {"X", "XGMI"} for row in m.matrix for v in row)


def test_gb200_memory_numa_identity_and_domains() -> None:
    m = relation_matrix(gb200())
    assert m.relation("GPU0", "GPU3") == "NV18"
    # GPU NUMA identity is its memory node (2), the NIC's is 0: SYS.
    assert m.relation("GPU0", "NIC1") == "SYS"
    # Same NUMA node 0, different PCI domains (0000 vs 0002): SYS.
    assert m.relation("NIC1", "NIC2") == "SYS"
    # Unknown NUMA (VMD-style device): SYS.
    assert m.relation("NIC0", "NIC1") == "SYS"
    assert m.gpu_numa_id[:4] == [2, 3, 4, 5]


def _pci(inv: Inventory, bus: str, root: str | None, chain: list[str], numa: int | None) -> None:
    inv.pci_devices.append(
        PciDevice(bus_id=bus, pcie_root=root, upstream_bridges=chain, numa_node=numa)
    )


def _pcie_case(chain_a: list[str], chain_b: list[str], root_b: str = "pci0000:00") -> str:
    inv = Inventory()
    _pci(inv, "0000:0a:00.0", "pci0000:00", chain_a, 0)
    _pci(inv, "0000:0b:00.0", root_b, chain_b, 0)
    inv.gpus = [Gpu(bus_id="0000:0a:00.0", vendor="nvidia", probe="x")]
    inv.nics = [Nic(bus_id="0000:0b:00.0", probe="x")]
    return relation_matrix(inv, "all").relation("GPU0", "NIC0")


def test_pcie_classes() -> None:
    rp, up, dn1, dn2 = "0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:02:01.0"
    assert _pcie_case([rp, up, dn1], [rp, up, dn2]) == "PIX"
    assert _pcie_case([rp], [rp]) == "PIX"
    assert _pcie_case([rp, up, dn1, "0000:03:00.0", "0000:04:00.0"], [rp, up, dn2]) == "PXB"
    assert _pcie_case([rp, up, dn1], [rp]) == "PXB"
    assert _pcie_case([rp], ["0000:00:02.0"]) == "PHB"
    assert _pcie_case([], []) == "PHB"
    assert _pcie_case([rp], [rp], root_b="pci0000:80") == "NODE"


def test_pcie_sys_on_numa_difference_and_unknown_root() -> None:
    inv = Inventory()
    _pci(inv, "0000:0a:00.0", None, [], 0)
    _pci(inv, "0000:0b:00.0", None, [], 0)
    _pci(inv, "0000:0c:00.0", "pci0000:0c", [], 1)
    inv.nics = [Nic(bus_id=b, probe="x") for b in ("0000:0a:00.0", "0000:0b:00.0", "0000:0c:00.0")]
    m = relation_matrix(inv, "all")
    assert m.relation("NIC0", "NIC1") == "NODE"  # unknown roots, same NUMA and domain
    assert m.relation("NIC0", "NIC2") == "SYS"


def test_locality_numa_used_when_kernel_unknown() -> None:
    inv = Inventory()
    inv.pci_devices = [
        PciDevice(bus_id="0000:0a:00.0", pcie_root="pci0000:0a", locality_numa_node=0),
        PciDevice(bus_id="0000:0b:00.0", pcie_root="pci0000:0b", locality_numa_node=0),
    ]
    inv.nics = [Nic(bus_id="0000:0a:00.0", probe="x"), Nic(bus_id="0000:0b:00.0", probe="x")]
    assert relation_matrix(inv, "all").relation("NIC0", "NIC1") == "NODE"


def test_direct_nvlinks_and_switch_min() -> None:
    a, b, c = "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"
    inv = Inventory()
    inv.gpus = [
        Gpu(
            bus_id=a,
            vendor="nvidia",
            probe="x",
            index=0,
            nvlinks=[
                NvLink(link=i, remote_bus_id="00000000:02:00.0", remote_type="gpu")
                for i in range(4)
            ]
            + [NvLink(link=9, remote_type="switch")] * 2,
        ),
        Gpu(
            bus_id=b,
            vendor="nvidia",
            probe="x",
            index=1,
            nvlinks=[NvLink(link=i, remote_bus_id=a, remote_type="gpu") for i in range(4)],
        ),
        Gpu(
            bus_id=c,
            vendor="nvidia",
            probe="x",
            index=2,
            nvlinks=[NvLink(link=0, remote_type="switch")] * 6,
        ),
    ]
    m = relation_matrix(inv)
    assert m.relation("GPU0", "GPU1") == "NV4"  # NVML-style upper-case remote id normalised
    assert m.relation("GPU0", "GPU2") == "NV2"  # min(2, 6) switch links
    assert m.relation("GPU1", "GPU2") != "NV0" and not m.relation("GPU1", "GPU2").startswith("NV")


def test_label_order() -> None:
    inv = Inventory()
    inv.gpus = [
        Gpu(bus_id="0000:02:00.0", vendor="nvidia", probe="x", index=0),
        Gpu(bus_id="0000:01:00.0", vendor="nvidia", probe="x", index=1),
    ]
    inv.nics = [
        Nic(bus_id="0000:05:00.0", probe="x", rdma_devices=["mlx5_10"]),
        Nic(bus_id="0000:06:00.0", probe="x", rdma_devices=["mlx5_2"]),
        Nic(bus_id="0000:04:00.0", probe="x", netdevs=["eth0"]),
    ]
    m = relation_matrix(inv, "all")
    assert m.bus_ids[:2] == ["0000:02:00.0", "0000:01:00.0"]
    assert m.legend == {"NIC0": "eth0", "NIC1": "mlx5_2", "NIC2": "mlx5_10"}
    inv.gpus[0].index = None  # not all set: bus id order
    assert relation_matrix(inv).bus_ids[:2] == ["0000:01:00.0", "0000:02:00.0"]


def test_format_topo() -> None:
    text = format_topo(relation_matrix(dgx()))
    lines = text.splitlines()
    assert lines[0].split("\t")[1:3] == ["GPU0", "GPU1"]
    assert lines[0].endswith("CPU Affinity\tNUMA Affinity\tGPU NUMA ID")
    assert lines[1].split("\t")[:3] == ["GPU0", " X ", "NV18"]
    assert lines[1].split("\t")[-3:] == ["0-15", "0", "N/A"]
    assert "NIC Legend:" in text and "  NIC0: mlx5_0" in text
    plain = format_topo(relation_matrix(dgx()), affinity=False)
    assert "CPU Affinity" not in plain


def test_matrix_lists_rdma_physical_functions_as_nvidia_smi() -> None:
    """nvidia-smi lists RDMA devices: an onboard Ethernet port (no RDMA) and SR-IOV VFs do
    not shift the NIC labels; ``all`` lists every network function."""
    inv = Inventory()
    inv.gpus = [Gpu(bus_id="0000:01:00.0", vendor="nvidia", probe="x")]
    inv.nics = [
        Nic(bus_id="0000:04:00.0", probe="x", netdevs=["eno1"]),
        Nic(bus_id="0000:05:00.0", probe="x", rdma_devices=["mlx5_0"]),
        Nic(bus_id="0000:05:00.2", probe="x", rdma_devices=["mlx5_2"], is_vf=True),
        Nic(bus_id="0000:06:00.0", probe="x", rdma_devices=["mlx5_1"]),
    ]
    m = relation_matrix(inv)
    assert m.labels == ["GPU0", "NIC0", "NIC1"]
    assert m.legend == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    assert len(relation_matrix(inv, "all").labels) == 5
