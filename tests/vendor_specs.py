"""Stand-in vendor CDI specs, laid out the way the vendors' generators write them
(../shared/reference/cdi.md sections 8.1, 8.3 and 8.7), for a fake machine's GPUs.

- :func:`nvidia_ctk_spec`: ``nvidia-ctk cdi generate`` in nvml mode: every GPU twice (its
  NVML index and ``GPU-<uuid>``), plus ``all``; the GPU node per device, the control nodes,
  the driver's library mounts and ``NVIDIA_VISIBLE_DEVICES=void`` at the top level; no
  hooks (their binary would have to exist on the host). Device nodes are listed by path
  (and ``hostPath`` when they live under another dev root), as the toolkit lists them:
  the runtime stats the host node.
- :func:`amd_ctk_spec`: ``amd-ctk cdi generate``: ``amd.com/gpu=<n>`` and ``all``, device
  nodes only, fully specified.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from discovery.model import Inventory
from discovery.vendor_cdi import amd_render_minor

CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
LIB_DIR = "/usr/lib/x86_64-linux-gnu"
LIBCUDA = "libcuda.so.999.99.99"


def _node(path: str, dev_root: str | None) -> dict[str, Any]:
    if dev_root is None:
        return {"path": path}
    return {"path": path, "hostPath": dev_root.rstrip("/") + path}


def nvidia_ctk_spec(
    inv: Inventory,
    *,
    names: tuple[str, ...] = ("index", "uuid"),
    dev_root: str | None = None,
    lib_host_path: str | None = None,
    control_nodes: tuple[str, ...] = CONTROL_NODES,
) -> dict[str, Any]:
    """The spec for the inventory's NVIDIA GPUs. ``dev_root``: host directory holding the
    device nodes (made with mknod there) instead of /dev; ``lib_host_path``: the host file
    mounted at ``<LIB_DIR>/libcuda.so.<version>``."""
    devices: list[dict[str, Any]] = []
    every: list[dict[str, Any]] = []
    for gpu in sorted(inv.gpus, key=lambda g: (g.index is None, g.index, g.bus_id)):
        if gpu.vendor != "nvidia" or gpu.minor is None:
            continue
        node = _node(f"/dev/nvidia{gpu.minor}", dev_root)
        every.append(node)
        edits = {"deviceNodes": [node]}
        if "index" in names and gpu.index is not None:
            devices.append({"name": str(gpu.index), "containerEdits": edits})
        if "uuid" in names and gpu.uuid:
            devices.append({"name": gpu.uuid, "containerEdits": edits})
    devices.append({"name": "all", "containerEdits": {"deviceNodes": every}})
    lib = lib_host_path or f"{LIB_DIR}/{LIBCUDA}"
    return {
        # Device names "0", "1", ... start with a digit: 0.5.0 (also for hostPath).
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void", f"NVIDIA_CTK_LIBCUDA_DIR={LIB_DIR}"],
            "deviceNodes": [_node(p, dev_root) for p in control_nodes],
            "mounts": [
                {
                    "hostPath": lib,
                    "containerPath": f"{LIB_DIR}/{LIBCUDA}",
                    "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
                }
            ],
        },
    }


def amd_ctk_spec(inv: Inventory) -> dict[str, Any]:
    """``amd.com/gpu`` in enumeration (bus) order, each with its render node and /dev/kfd."""
    devices: list[dict[str, Any]] = []
    amd = sorted((g for g in inv.gpus if g.vendor == "amd"), key=lambda g: g.bus_id)
    for n, gpu in enumerate(amd):
        minor = amd_render_minor(inv, gpu)
        nodes = [
            {"path": f"/dev/dri/renderD{minor}", "type": "c", "major": 226, "minor": minor},
            {"path": "/dev/kfd", "type": "c", "major": 511, "minor": 0},
        ]
        for node in nodes:
            node.update({"fileMode": 0o20666, "permissions": "rw", "uid": 0, "gid": 44})
        devices.append({"name": str(n), "containerEdits": {"deviceNodes": nodes}})
    every = [n for d in devices for n in d["containerEdits"]["deviceNodes"]]
    devices.append({"name": "all", "containerEdits": {"deviceNodes": every}})
    return {"cdiVersion": "0.6.0", "kind": "amd.com/gpu", "devices": devices}


def write(path: Path, spec: dict[str, Any]) -> Path:
    """YAML (``.yaml``, nvidia-ctk's default) or JSON (``.json``), by the file's name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".json":
        path.write_text(json.dumps(spec, indent=2) + "\n")
    else:
        path.write_text(yaml.safe_dump(spec, sort_keys=True))
    return path
