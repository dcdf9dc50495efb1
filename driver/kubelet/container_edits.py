"""What a container needs for each kind of toposlice device: CDI ``containerEdits``.

Per device: the device nodes of that kind (NVIDIA ``/dev/nvidia<minor>`` plus the shared
control nodes, AMD ``/dev/kfd`` + ``/dev/dri/renderD<minor>``, RDMA NICs
``/dev/infiniband/uverbs<N>`` + ``rdma_cm``) and one ``TOPOSLICE_DEVICE_<NAME>`` variable
(so no device's edits are ever empty). Per claim (the spec's top-level edits, applied once):
the topology as environment -- bus ids, GPU UUIDs, ``NCCL_IB_HCA`` from the NICs' RDMA
names, and ``NCCL_TOPO_FILE`` with the topology file bind-mounted read-only.

Device nodes are listed by path only: the runtime's CDI library stats the host node at
container creation to fill type and numbers (cdi.md section 3.1), and refuses the whole
container when one is missing. So a spec names only the nodes that exist on the node
(:func:`drop_missing_nodes`); the others are listed in the spec's annotation
``toposlice.dev/omitted-device-nodes``. Fake devices (``--fake``) have none: their specs
carry only environment and the NCCL topology mount, and their pods start.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from discovery.model import Gpu, Inventory, Nic
from discovery.vendor_cdi import amd_render_minor
from driver.kubelet.cdi import ContainerEdits

NVIDIA_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
AMD_KFD = "/dev/kfd"
RDMA_CM = "/dev/infiniband/rdma_cm"
NCCL_TOPO_CONTAINER_PATH = "/var/run/toposlice/nccl-topo.xml"
_TRAILING_NUMBER = re.compile(r"(\d+)$")
#: Spec annotation listing the device nodes left out because the node lacks them.
OMITTED_NODES_ANNOTATION = "toposlice.dev/omitted-device-nodes"


@dataclass
class ClaimDevices:
    """The inventory objects behind the DRA devices of one claim, in response order."""

    gpus: list[tuple[str, Gpu]] = field(default_factory=list)
    nics: list[tuple[str, Nic]] = field(default_factory=list)
    cpus: list[tuple[str, str]] = field(default_factory=list)
    """(device name, cpu list text)"""


def env_name(device_name: str) -> str:
    return "TOPOSLICE_DEVICE_" + re.sub(r"[^A-Z0-9]", "_", device_name.upper())


def _nodes(paths: list[str]) -> list[dict[str, Any]]:
    return [{"path": p, "permissions": "rw"} for p in paths]


def uverbs_index(inv: Inventory, rdma_name: str) -> int:
    """The inventory has no uverbs number: the kernel hands them out in registration order,
    which is the ``mlx5_<N>`` number for unrenamed devices, else the name order."""
    m = _TRAILING_NUMBER.search(rdma_name)
    if m and rdma_name.startswith(("mlx5_", "mlx4_", "bnxt_re", "irdma", "efa_", "ionic_")):
        return int(m.group(1))
    names = sorted(r.name for r in inv.rdma_devices)
    return names.index(rdma_name) if rdma_name in names else 0


def gpu_edits(inv: Inventory, name: str, gpu: Gpu) -> ContainerEdits:
    nodes: list[str] = []
    if gpu.vendor == "nvidia":
        if gpu.minor is not None:
            nodes.append(f"/dev/nvidia{gpu.minor}")
        nodes.extend(NVIDIA_CONTROL_NODES)
    elif gpu.vendor == "amd":
        nodes += [AMD_KFD, f"/dev/dri/renderD{amd_render_minor(inv, gpu)}"]
    edits: ContainerEdits = {"env": [f"{env_name(name)}={gpu.bus_id}"]}
    if nodes:
        edits["deviceNodes"] = _nodes(nodes)
    return edits


def nic_edits(inv: Inventory, name: str, nic: Nic) -> ContainerEdits:
    nodes = [f"/dev/infiniband/uverbs{uverbs_index(inv, r)}" for r in nic.rdma_devices]
    if nodes:
        nodes.append(RDMA_CM)
    edits: ContainerEdits = {"env": [f"{env_name(name)}={nic.bus_id}"]}
    if nodes:
        edits["deviceNodes"] = _nodes(nodes)
    return edits


def drop_missing_nodes(
    edits: dict[str, ContainerEdits], exists: Callable[[str], bool]
) -> list[str]:
    """Remove from ``edits`` (in place) every device node for which ``exists(path)`` is
    false; the sorted paths removed. A device's edits keep its environment variable, so
    they never become empty."""
    omitted: set[str] = set()
    for device in edits.values():
        nodes = device.get("deviceNodes")
        if not nodes:
            continue
        kept = [n for n in nodes if exists(n["path"])]
        omitted.update(n["path"] for n in nodes if n not in kept)
        if kept:
            device["deviceNodes"] = kept
        else:
            del device["deviceNodes"]
    return sorted(omitted)


def cpu_edits(name: str, cpu_list: str) -> ContainerEdits:
    return {"env": [f"{env_name(name)}={cpu_list}"]}


def claim_edits(
    claim_uid: str, devices: ClaimDevices, topo_host_path: str | None
) -> ContainerEdits:
    """Environment describing the whole claim; mounted NCCL topology when it has GPUs/NICs."""
    env = [f"TOPOSLICE_CLAIM_UID={claim_uid}"]
    names = [n for n, _ in devices.gpus] + [n for n, _ in devices.nics]
    names += [n for n, _ in devices.cpus]
    env.append(f"TOPOSLICE_DEVICES={','.join(names)}")
    bus_ids = [g.bus_id for _, g in devices.gpus] + [n.bus_id for _, n in devices.nics]
    if bus_ids:
        env.append(f"TOPOSLICE_PCI_BUS_IDS={','.join(bus_ids)}")
    if devices.gpus:
        env.append(f"TOPOSLICE_GPU_BUS_IDS={','.join(g.bus_id for _, g in devices.gpus)}")
    uuids = [g.uuid for _, g in devices.gpus if g.uuid]
    if uuids:
        env.append(f"TOPOSLICE_GPU_UUIDS={','.join(uuids)}")
    nvidia = [g.uuid for _, g in devices.gpus if g.vendor == "nvidia" and g.uuid]
    if nvidia:
        env.append(f"NVIDIA_VISIBLE_DEVICES={','.join(nvidia)}")
    rdma = [r for _, n in devices.nics for r in n.rdma_devices]
    if rdma:
        # A leading "=" makes NCCL match names exactly (plain "mlx5_1" would also
        # select mlx5_10..mlx5_19 by prefix).
        env.append(f"NCCL_IB_HCA=={','.join(rdma)}")
    netdevs = [d for _, n in devices.nics for d in n.netdevs]
    if netdevs:
        env.append(f"TOPOSLICE_NETDEVS={','.join(netdevs)}")
    if devices.cpus:
        env.append(f"TOPOSLICE_CPU_LISTS={';'.join(c for _, c in devices.cpus)}")
    edits: ContainerEdits = {"env": env}
    if topo_host_path is not None:
        env.append(f"NCCL_TOPO_FILE={NCCL_TOPO_CONTAINER_PATH}")
        edits["mounts"] = [
            {
                "hostPath": topo_host_path,
                "containerPath": NCCL_TOPO_CONTAINER_PATH,
                "options": ["ro", "nosuid", "nodev", "bind"],
            }
        ]
    return edits
