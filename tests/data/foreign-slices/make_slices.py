"""Writes the foreign ResourceSlices of the fake ``dgx-h100`` node (run from the repo root:
``python3 tests/data/foreign-slices/make_slices.py``). The facts are typed in below as a
driver would read them from the machine; the planted defects are listed in README.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

NODE = "dgx-h100"
HERE = Path(__file__).parent
STD = "resource.kubernetes.io"

GPUS = [  # index, bus id, uuid, pcie root
    (0, "0000:1b:00.0", "GPU-759efa20-ea92-06af-efa2-0c387bc896e2", "pci0000:15"),
    (1, "0000:43:00.0", "GPU-8754596c-c492-bd66-2cd0-7b8acc8773d6", "pci0000:3d"),
    (2, "0000:52:00.0", "GPU-5689b689-8961-2253-444d-e9db13085231", "pci0000:4c"),
    (3, "0000:61:00.0", "GPU-8bf046c6-a5e4-f709-925c-8b9707847f11", "pci0000:5b"),
    (4, "0000:9d:00.0", "GPU-3324c4d3-f80f-5ebf-e895-0933f4ab46e1", "pci0000:97"),
    (5, "0000:c3:00.0", "GPU-8476b00d-c8f0-2640-90df-eb424e8ba7f7", "pci0000:bd"),
    (6, "0000:d1:00.0", "GPU-250f5077-c685-6b86-0ad6-2dba6520aa66", "pci0000:cb"),
    (7, "0000:df:00.0", "GPU-054b39a5-c826-39d1-dcbb-ef231e696f28", "pci0000:d9"),
]
NICS = [  # bus id, netdev, rdma, pcie root, numa
    ("0000:18:00.0", "ibp24s0", "mlx5_0", "pci0000:15", 0),
    ("0000:29:00.0", "enp41s0f0np0", "mlx5_1", "pci0000:28", 0),
    ("0000:29:00.1", "enp41s0f1np1", "mlx5_2", "pci0000:28", 0),
    ("0000:40:00.0", "ibp64s0", "mlx5_3", "pci0000:3d", 0),
    ("0000:4f:00.0", "ibp79s0", "mlx5_4", "pci0000:4c", 0),
    ("0000:5e:00.0", "ibp94s0", "mlx5_5", "pci0000:5b", 0),
    ("0000:9a:00.0", "ibp154s0", "mlx5_6", "pci0000:97", 1),
    ("0000:aa:00.0", "enp170s0f0np0", "mlx5_7", "pci0000:a9", 1),
    ("0000:aa:00.1", "enp170s0f1np1", "mlx5_8", "pci0000:a9", 1),
    ("0000:c0:00.0", "ibp192s0", "mlx5_9", "pci0000:bd", 1),
    ("0000:ce:00.0", "ibp206s0", "mlx5_10", "pci0000:cb", 1),
    ("0000:dc:00.0", "ibp220s0", "mlx5_11", "pci0000:d9", 1),
]
NODE0_ROOTS = ["pci0000:00", "pci0000:15", "pci0000:28", "pci0000:3d", "pci0000:4c", "pci0000:5b"]
NODE1_ROOTS = ["pci0000:97", "pci0000:a9", "pci0000:bd", "pci0000:cb", "pci0000:d9"]


def s(v: str) -> dict[str, Any]:
    return {"string": v}


def i(v: int) -> dict[str, Any]:
    return {"int": v}


def rslice(
    driver: str, index: int, devices: list[dict[str, Any]], generation: int = 1, count: int = 1
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{NODE}-{driver}-{generation}-{index}"},
        "spec": {
            "driver": driver,
            "pool": {"name": NODE, "generation": generation, "resourceSliceCount": count},
            "nodeName": NODE,
            "devices": devices,
        },
    }


def nvidia() -> list[dict[str, Any]]:
    """Shaped like the NVIDIA GPU driver's full-GPU devices (gpu.nvidia.com)."""
    devices = []
    for index, bus, uuid, root in GPUS:
        attrs: dict[str, Any] = {
            "type": s("gpu"),
            "uuid": s(uuid),
            "minor": i(index),
            "index": i(index),
            "productName": s("NVIDIA H100 80GB HBM3"),
            "brand": s("Nvidia"),
            "architecture": s("Hopper"),
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "550.90.7"},
            "cudaDriverVersion": {"version": "12.4.0"},
            f"{STD}/pciBusID": s(bus),
            f"{STD}/pcieRoot": s(root),
        }
        if index == 2:  # defect: GPU1's root
            attrs[f"{STD}/pcieRoot"] = s("pci0000:3d")
        if index == 4:  # defect: NVML's spelling of the bus id
            attrs[f"{STD}/pciBusID"] = s("00000000:9D:00.0")
        if index == 5:  # defect: neither bus id nor root (matched by UUID)
            del attrs[f"{STD}/pciBusID"], attrs[f"{STD}/pcieRoot"]
        if index == 6:  # defect: bus id without root
            del attrs[f"{STD}/pcieRoot"]
        if index == 7:  # defect: driver-scoped look-alike of numaNode
            attrs["numa"] = i(1)
        devices.append(
            {"name": f"gpu-{index}", "attributes": attrs, "capacity": {"memory": {"value": "80Gi"}}}
        )
    return [rslice("gpu.nvidia.com", 0, devices)]


def dranet() -> list[dict[str, Any]]:
    """Shaped like dranet's devices (dra.net): one per network interface."""
    devices = []
    for bus, netdev, rdma, root, numa in NICS:
        attrs: dict[str, Any] = {
            "dra.net/ifName": s(netdev),
            "dra.net/pciVendor": s("Mellanox Technologies"),
            "dra.net/type": s("device"),
            "dra.net/rdma": {"bool": True},
            "dra.net/virtual": {"bool": False},
            "dra.net/numaNode": i(numa),
            f"{STD}/pciBusID": s(bus),
            f"{STD}/pcieRoot": s(root),
            f"{STD}/numaNode": i(numa),
        }
        name = netdev
        if rdma == "mlx5_4":  # defect: wrong standard numaNode
            attrs[f"{STD}/numaNode"] = i(1)
        if rdma == "mlx5_1":  # defect: look-alike of pciBusID
            attrs["dra.net/pciAddress"] = s(bus)
        if rdma == "mlx5_7":  # no bus id: matched by netdev; pciBusID missing
            del attrs[f"{STD}/pciBusID"]
        if rdma == "mlx5_9":  # RDMA-only device: matched by RDMA name
            name = "rdma-mlx5-9"
            for key in ("dra.net/ifName", f"{STD}/pciBusID"):
                del attrs[key]
            attrs["dra.net/rdmaDevice"] = s(rdma)
        devices.append({"name": name, "attributes": attrs})
    old = rslice("dra.net", 0, [{"name": "gone-0", "attributes": {"dra.net/ifName": s("eth9")}}])
    return [rslice("dra.net", 0, devices, generation=2), old]


def dra_cpu() -> list[dict[str, Any]]:
    """dra-driver-cpu's grouped mode as the real driver published it (recorded/, see the
    README), with one planted defect: a NUMA-1 root in NUMA node 0's pcieRoot list."""
    with open(HERE / "recorded" / "dra-cpu-grouped.yaml", encoding="utf-8") as fh:
        slices = [d for d in yaml.safe_load_all(fh) if d]
    for dev in slices[0]["spec"]["devices"]:
        if dev["name"] == "cpudevnuma000":
            dev["attributes"][f"{STD}/pcieRoot"]["strings"].append("pci0000:97")
    return slices


def stale() -> list[dict[str, Any]]:
    """A driver that was uninstalled but whose slice is still there."""
    dev = {"name": "vf-0", "attributes": {f"{STD}/pciBusID": s("0000:18:00.2")}}
    return [rslice("sriovnetwork.example.com", 0, [dev])]


def main() -> None:
    for name, objs in (
        ("nvidia-gpu", nvidia()),
        ("dranet", dranet()),
        ("dra-cpu", dra_cpu()),
        ("stale-driver", stale()),
    ):
        with open(HERE / f"{name}.yaml", "w", encoding="utf-8") as fh:
            fh.write(f"# Generated by make_slices.py: {name} slices of node {NODE}.\n")
            yaml.safe_dump_all(objs, fh, sort_keys=False)


if __name__ == "__main__":
    main()
