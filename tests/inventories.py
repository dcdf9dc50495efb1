"""Small synthetic inventories shared by the normalize tests (DGX-, GB200- and AMD-like).

A support module, not a test module: tests import the builders from here."""

from __future__ import annotations

import os
from pathlib import Path

from discovery.model import (
    CacheGroup,
    Cpu,
    Fabric,
    Gpu,
    Inventory,
    Nic,
    NumaNode,
    NvLink,
    NvSwitch,
    PciDevice,
    PciLink,
)

GEN5_X16 = PciLink(current_speed_gts=32.0, current_width=16, max_speed_gts=32.0, max_width=16)
GEN4_X16 = PciLink(current_speed_gts=16.0, current_width=16, max_speed_gts=16.0, max_width=16)


def _cpus(inv: Inventory, per_node: int, nodes: list[tuple[int, int]], smt: bool = True) -> None:
    """``nodes`` = [(numa id, package)]; cores per node ``per_node``; 2 threads per core."""
    cid = 0
    cache_index = 0
    for numa, pkg in nodes:
        node_cpus = []
        l3_cpus: dict[int, list[int]] = {}
        for core in range(per_node):
            threads = [cid, cid + 1] if smt else [cid]
            for t in threads:
                l3 = cache_index + core // 4
                inv.cpus.append(
                    Cpu(
                        id=t,
                        package=pkg,
                        core=core + numa * 100,
                        numa_node=numa,
                        siblings=threads,
                        l3=l3,
                    )
                )
                l3_cpus.setdefault(l3, []).append(t)
                node_cpus.append(t)
            cid += len(threads)
        for l3 in sorted(l3_cpus):
            inv.caches.append(CacheGroup(level=3, cpus=l3_cpus[l3], id=l3, size_bytes=32 << 20))
        cache_index += len(l3_cpus)
        node = inv.numa(numa)
        assert node is not None
        node.cpus = node_cpus


def _chain(
    inv: Inventory,
    root: str,
    bridges: list[str],
    numa: int | None,
) -> None:
    for i, br in enumerate(bridges):
        if inv.pci(br) is None:
            inv.pci_devices.append(
                PciDevice(
                    bus_id=br,
                    class_code="0x0604",
                    vendor="0x1000",
                    numa_node=numa,
                    pcie_root=root,
                    upstream_bridges=bridges[:i],
                    is_bridge=True,
                    link=GEN5_X16,
                )
            )


def dgx() -> Inventory:
    """2 sockets, 8 H100 on NVSwitch, 8 CX-7 NICs: each GPU/NIC pair under one PCIe switch."""
    inv = Inventory(
        hostname="dgx-01", host={"cpu_model": "Intel Xeon 8480C", "cpu_vendor": "intel"}
    )
    inv.numa_nodes = [
        NumaNode(id=0, distances={0: 10, 1: 21}, memory_bytes=1 << 40, package=0),
        NumaNode(id=1, distances={0: 21, 1: 10}, memory_bytes=1 << 40, package=1),
    ]
    _cpus(inv, 8, [(0, 0), (1, 1)])
    buses = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB]
    for i, bus in enumerate(buses):
        numa = 0 if i < 4 else 1
        root = f"pci0000:{bus - 1:02x}"
        rp = f"0000:{bus - 1:02x}:01.0"
        up = f"0000:{bus:02x}:00.0"
        down_gpu = f"0000:{bus + 1:02x}:00.0"
        down_nic = f"0000:{bus + 1:02x}:01.0"
        _chain(inv, root, [rp, up, down_gpu, down_nic][:3], numa)
        _chain(inv, root, [rp, up, down_nic], numa)
        gpu_bdf = f"0000:{bus + 2:02x}:00.0"
        nic_bdf = f"0000:{bus + 3:02x}:00.0"
        local = [c.id for c in inv.cpus if c.numa_node == numa]
        inv.pci_devices.append(
            PciDevice(
                bus_id=gpu_bdf,
                class_code="0x0302",
                vendor="0x10de",
                device="0x2330",
                numa_node=numa,
                local_cpus=local,
                pcie_root=root,
                upstream_bridges=[rp, up, down_gpu],
                link=GEN5_X16,
                driver="nvidia",
            )
        )
        inv.pci_devices.append(
            PciDevice(
                bus_id=nic_bdf,
                class_code="0x0207",
                vendor="0x15b3",
                numa_node=numa,
                local_cpus=local,
                pcie_root=root,
                upstream_bridges=[rp, up, down_nic],
                link=GEN5_X16,
                driver="mlx5_core",
                net=[f"ibp{bus + 3}s0"],
                rdma=[f"mlx5_{i}"],
            )
        )
        inv.gpus.append(
            Gpu(
                bus_id=gpu_bdf,
                vendor="nvidia",
                probe="nvidia",
                index=i,
                uuid=f"GPU-{i:08x}-1111-2222-3333-444455556666",
                model="NVIDIA H100 80GB HBM3",
                memory_bytes=80 << 30,
                minor=i,
                compute_capability="9.0",
                architecture="hopper",
                driver_version="550.54.15",
                mig_mode=False,
                nvlinks=[
                    NvLink(
                        link=k,
                        version="4.0",
                        remote_bus_id=f"0000:0{k % 4 + 5}:00.0",
                        remote_type="switch",
                    )
                    for k in range(18)
                ],
                fabric=Fabric(
                    cluster_uuid="00000000-0000-0000-0000-000000000000",
                    clique_id=0,
                    state="completed",
                ),
            )
        )
        inv.nics.append(
            Nic(
                bus_id=nic_bdf,
                probe="rdma",
                vendor="0x15b3",
                model="MT2910 Family [ConnectX-7]",
                netdevs=[f"ibp{bus + 3}s0"],
                rdma_devices=[f"mlx5_{i}"],
                rate_gbps=400.0,
                link_layer="InfiniBand",
                node_guid=f"b83f:d203:00{i:02x}:0001",
            )
        )
    inv.nvswitches = [NvSwitch(bus_id=f"0000:0{k + 5}:00.0", probe="nvidia") for k in range(4)]
    for k in range(4):
        inv.pci_devices.append(
            PciDevice(
                bus_id=f"0000:0{k + 5}:00.0",
                class_code="0x0680",
                vendor="0x10de",
                numa_node=0,
                pcie_root="pci0000:00",
                upstream_bridges=["0000:00:01.0"],
                link=GEN4_X16,
            )
        )
    _chain(inv, "pci0000:00", ["0000:00:01.0"], 0)
    return inv


def gb200() -> Inventory:
    """2 Grace sockets, 4 B200 GPUs whose memory is its own NUMA node, multi-node NVLink."""
    inv = Inventory(
        hostname="gb200-rack1-tray3", host={"cpu_model": "Neoverse-V2", "arch": "aarch64"}
    )
    inv.numa_nodes = [
        NumaNode(
            id=0,
            distances={0: 10, 1: 40, 2: 80, 3: 80, 4: 120, 5: 120},
            package=0,
            memory_bytes=480 << 30,
        ),
        NumaNode(
            id=1,
            distances={0: 40, 1: 10, 2: 120, 3: 120, 4: 80, 5: 80},
            package=1,
            memory_bytes=480 << 30,
        ),
    ]
    gpu_buses = ["0008:01:00.0", "0009:01:00.0", "0018:01:00.0", "0019:01:00.0"]
    for k, bus in enumerate(gpu_buses):
        inv.numa_nodes.append(
            NumaNode(
                id=2 + k,
                distances={2 + k: 10, 0: 80 if k < 2 else 120, 1: 120 if k < 2 else 80},
                package=0 if k < 2 else 1,
                memory_only=True,
                gpu_bus_id=bus,
                memory_bytes=184 << 30,
            )
        )
    _cpus(inv, 4, [(0, 0), (1, 1)], smt=False)
    for k, bus in enumerate(gpu_buses):
        domain = bus.split(":")[0]
        root = f"pci{domain}:00"
        rp = f"{domain}:00:00.0"
        numa = 0 if k < 2 else 1
        _chain(inv, root, [rp], numa)
        inv.pci_devices.append(
            PciDevice(
                bus_id=bus,
                class_code="0x0302",
                vendor="0x10de",
                numa_node=numa,
                pcie_root=root,
                upstream_bridges=[rp],
                link=GEN5_X16,
            )
        )
        inv.gpus.append(
            Gpu(
                bus_id=bus,
                vendor="nvidia",
                probe="nvidia",
                index=k,
                uuid=f"GPU-b200{k:04x}-aaaa-bbbb-cccc-ddddeeeeffff",
                model="NVIDIA GB200",
                memory_bytes=189471719424,
                memory_numa_node=2 + k,
                compute_capability="10.0",
                driver_version="570.124.06",
                nvlinks=[NvLink(link=i, version="5.0", remote_type="switch") for i in range(18)],
                fabric=Fabric(
                    cluster_uuid="7f1e0a4c-2b3d-4e5f-8a9b-0c1d2e3f4a5b",
                    clique_id=32766,
                    state="completed",
                    health="healthy",
                ),
            )
        )
    for k, (bus, numa) in enumerate(
        [("0000:03:00.0", 0), ("0002:03:00.0", 0), ("0010:03:00.0", 1), ("0012:03:00.0", 1)]
    ):
        domain = bus.split(":")[0]
        root = f"pci{domain}:00"
        rp = f"{domain}:00:00.0"
        _chain(inv, root, [rp], numa)
        inv.pci_devices.append(
            PciDevice(
                bus_id=bus,
                class_code="0x0200",
                numa_node=numa,
                pcie_root=root,
                upstream_bridges=[rp],
                link=GEN5_X16,
            )
        )
        inv.nics.append(
            Nic(
                bus_id=bus,
                probe="rdma",
                netdevs=[f"enP{k}s3"],
                rdma_devices=[f"mlx5_{k}"],
                speed_mbps=400000,
                link_layer="Ethernet",
            )
        )
    # A device on an Intel-VMD-style 5-digit domain with unknown NUMA node.
    inv.pci_devices.append(
        PciDevice(
            bus_id="10000:01:00.0", class_code="0x0200", numa_node=None, pcie_root="pci10000:00"
        )
    )
    inv.nics.append(Nic(bus_id="10000:01:00.0", probe="rdma", netdevs=["eth9"]))
    return inv


def amd() -> Inventory:
    """2 sockets, 8 MI300X in one xGMI hive, each GPU on its own root."""
    inv = Inventory(hostname="mi300x-07", host={"cpu_model": "AMD EPYC 9654", "cpu_vendor": "amd"})
    inv.numa_nodes = [
        NumaNode(id=0, distances={0: 10, 1: 32}, package=0),
        NumaNode(id=1, distances={0: 32, 1: 10}, package=1),
    ]
    _cpus(inv, 4, [(0, 0), (1, 1)])
    buses = [f"0000:{b:02x}:00.0" for b in (0x05, 0x15, 0x65, 0x75, 0x85, 0x95, 0xE5, 0xF5)]
    for k, bus in enumerate(buses):
        numa = 0 if k < 4 else 1
        root = f"pci0000:{int(bus[5:7], 16) - 5:02x}"
        rp = f"0000:{int(bus[5:7], 16) - 5:02x}:01.1"
        up = f"0000:{int(bus[5:7], 16) - 4:02x}:00.0"
        dn = f"0000:{int(bus[5:7], 16) - 3:02x}:00.0"
        _chain(inv, root, [rp, up, dn], numa)
        inv.pci_devices.append(
            PciDevice(
                bus_id=bus,
                class_code="0x1200",
                vendor="0x1002",
                numa_node=numa,
                pcie_root=root,
                upstream_bridges=[rp, up, dn],
                link=GEN5_X16,
            )
        )
        inv.gpus.append(
            Gpu(
                bus_id=bus,
                vendor="amd",
                probe="amdsmi",
                index=k,
                model="AMD Instinct MI300X OAM "
                + "with a deliberately very long marketing name attached",
                memory_bytes=192 << 30,
                xgmi_hive_id="0x1f2e3d4c5b6a7988",
                xgmi_peers=[b for b in buses if b != bus],
            )
        )
    return inv


def snc() -> Inventory:
    """2 sockets x 2 sub-NUMA clusters: list form [n, same-socket neighbour]."""
    inv = Inventory(hostname="snc")
    d = {
        0: {0: 10, 1: 12, 2: 21, 3: 21},
        1: {0: 12, 1: 10, 2: 21, 3: 21},
        2: {0: 21, 1: 21, 2: 10, 3: 12},
        3: {0: 21, 1: 21, 2: 12, 3: 10},
    }
    inv.numa_nodes = [NumaNode(id=n, distances=d[n], package=n // 2) for n in range(4)]
    _cpus(inv, 2, [(0, 0), (1, 0), (2, 1), (3, 1)])
    inv.pci_devices.append(
        PciDevice(
            bus_id="0000:b1:00.0",
            numa_node=3,
            pcie_root="pci0000:b0",
            upstream_bridges=["0000:b0:01.0"],
        )
    )
    inv.nics.append(Nic(bus_id="0000:b1:00.0", probe="rdma", netdevs=["eth0"]))
    return inv


#: Root complexes the many-roots machine adds to dgx-h100's NUMA node 0 (which has 6).
EXTRA_ROOTS = 20


def many_roots_machine(dest_dir: str | os.PathLike[str]) -> Path:
    """dgx-h100 with EXTRA_ROOTS more root complexes (bare root ports) on NUMA node 0, written
    as a machine file in ``dest_dir`` for ``--fake FILE``: 26 roots, more than
    ``pcieRoots``…``pcieRoots4`` hold, so ``cpu-numa0`` is one attribute not published in full
    (the built-in machines have none)."""
    import yaml

    from discovery.fake import MACHINES_DIR

    doc = yaml.safe_load((MACHINES_DIR / "dgx-h100.yaml").read_text())  # host name kept
    doc["pci"] += [
        {"bdf": f"0000:{0xE0 + i:02x}:01.0", "type": "root_port", "numa_node": 0}
        for i in range(EXTRA_ROOTS)
    ]
    out = Path(dest_dir) / "dgx-h100-many-roots.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out
