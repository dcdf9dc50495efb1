"""A generated fake machine with many SR-IOV VFs, for scaling tests and bench/vfs.py.

Written as machine YAML (docs/fake-hardware.md) and loaded through the fake builder's own
loader, so it exercises the same path as a shipped machine: ``gpus`` GPUs and ``pfs``
ConnectX-7 physical functions, each under its own root port, each PF with ``vfs_per_pf``
VFs (with their RDMA devices and netdevs) on the PF's bus.
"""

from __future__ import annotations

from discovery.fake import MachineSpec, load_yaml

HEADER = """name: {name}
hostname: {name}
cpu:
  model: Generated CPU
  vendor: GenuineIntel
  arch: x86_64
  sockets: 2
  cores_per_socket: 16
  threads_per_core: 2
  numbering: linear
  l1d_kb: 48
  l2_kb: 2048
  l3_kb: 65536
device_types:
  root_port:
    {{class: 0x060400, vendor: 0x8086, device: 0x352a, driver: pcieport, link_speed: 32.0}}
  gpu: {{class: 0x030200, vendor: 0x10de, device: 0x2330, driver: nvidia, link_speed: 32.0}}
  cx7:
    class: 0x020700
    vendor: 0x15b3
    device: 0x1021
    driver: mlx5_core
    link_speed: 32.0
    link_width: 16
    sriov_totalvfs: 127
    net_defaults: {{type: 32, mtu: 4092, speed: 400000}}
    rdma_defaults: {{rate: "400 Gb/sec (4X NDR)"}}
  cx7_vf:
    class: 0x020700
    vendor: 0x15b3
    device: 0x101e
    driver: mlx5_core
    net_defaults: {{type: 32, mtu: 4092, speed: 400000}}
    rdma_defaults: {{rate: "400 Gb/sec (4X NDR)"}}
pci:
"""


def vf_machine_yaml(gpus: int, pfs: int, vfs_per_pf: int, name: str = "vf-scale") -> str:
    if not 0 <= vfs_per_pf <= 127:
        raise ValueError("vfs_per_pf: 0..127 (one bus per PF)")
    lines = [HEADER.format(name=name)]
    bus = 0x10
    for g in range(gpus):
        numa = g * 2 // max(gpus, 1)
        rp = f"0000:{bus:02x}:01.0"
        lines.append(f'  - {{bdf: "{rp}", type: root_port, numa_node: {numa}}}')
        lines.append(f'  - {{bdf: "0000:{bus + 1:02x}:00.0", type: gpu, parent: "{rp}"}}')
        bus += 2
    rdma = 0
    for p in range(pfs):
        numa = p * 2 // max(pfs, 1)
        rp = f"0000:{bus:02x}:01.0"
        pf_bus = bus + 1
        pf = f"0000:{pf_bus:02x}:00.0"
        lines.append(f'  - {{bdf: "{rp}", type: root_port, numa_node: {numa}}}')
        lines.append(
            f'  - {{bdf: "{pf}", type: cx7, parent: "{rp}", sriov_numvfs: {vfs_per_pf}, '
            f"net: [ibp{pf_bus}s0], rdma: [mlx5_{rdma}]}}"
        )
        rdma += 1
        for i in range(vfs_per_pf):
            n = i + 1
            vf = f"0000:{pf_bus:02x}:{n // 8:02x}.{n % 8}"
            lines.append(
                f'  - {{bdf: "{vf}", type: cx7_vf, parent: "{rp}", physfn: "{pf}", '
                f"net: [ibp{pf_bus}s0v{i}], rdma: [mlx5_{rdma}]}}"
            )
            rdma += 1
        bus += 2
    return "\n".join(lines) + "\n"


def vf_machine(gpus: int, pfs: int, vfs_per_pf: int) -> MachineSpec:
    return load_yaml(vf_machine_yaml(gpus, pfs, vfs_per_pf), source="<vf_machine>")
