"""A profile for NVIDIA's mock NVML library (NVIDIA/k8s-test-infra ``pkg/gpu/mocknvml``)
made from a fake machine.

The mock is what NVIDIA's DRA GPU driver runs on in its GPU-less CI: a ``libnvidia-ml.so.1``
that answers from a YAML profile (``MOCK_NVML_CONFIG``). Run beside toposlice on the same
fake tree, the plugin and toposlice must describe the same GPUs: the bus ids (the plugin
reads ``pcieRoot`` and ``numaNode`` from ``/sys/bus/pci/devices/<bus id>``, so they must be
functions of the tree), the UUIDs, the memory, the driver and CUDA versions, the model.
Those come from the machine; the rest of the profile (power, clocks, ECC, ...) is left to
the mock's defaults, which is what the plugin reads as "nothing to report".

Upstream's profiles give the bus ids in NVML's upper case and the devices in NVML index
order (bus order); the writer does the same. ``toposlice machines mock-nvml NAME`` prints it.
"""

from __future__ import annotations

import uuid
from typing import Any

import yaml

from discovery.fake.spec import MachineSpec, NvmlSpec, PciDeviceSpec

#: Profile format version the mock reads (its configs' ``version:``).
PROFILE_VERSION = "1.0"
#: go-nvml's mock keeps one reserved slice of memory at idle; upstream profiles use 1 GiB.
RESERVED_BYTES = 1 << 30
#: ``nvmlGpuFabricState_t`` -> the mock's ``fabric.state`` word.
FABRIC_STATES = {1: "not_started", 2: "in_progress", 3: "completed"}


def architecture(cc: tuple[int, int]) -> str:
    """The mock's ``architecture`` word for a compute capability (NVML's families)."""
    major, minor = cc
    if major >= 10:
        return "blackwell"
    if major == 9:
        return "hopper"
    if major == 8:
        return "ada" if minor == 9 else "ampere"
    if major == 7:
        return "turing" if minor == 5 else "volta"
    return {6: "pascal", 5: "maxwell", 3: "kepler"}.get(major, "unknown")


def _cuda(nvml: NvmlSpec) -> tuple[int, int]:
    """NVML's CUDA driver version integer (13000) as (major, minor)."""
    v = nvml.cuda_driver_version
    return v // 1000, (v % 1000) // 10


def _memory(total: int, used: int) -> dict[str, int]:
    reserved = min(RESERVED_BYTES, max(total - used, 0))
    return {
        "total_bytes": total,
        "reserved_bytes": reserved,
        "free_bytes": max(total - used - reserved, 0),
        "used_bytes": used,
    }


def _identity(dev: PciDeviceSpec) -> dict[str, Any]:
    """What NVML says of the GPU itself: name, family, memory, PCI ids."""
    nv = dev.nvidia
    assert nv is not None
    out: dict[str, Any] = {
        "name": nv.name,
        "brand": "nvidia",
        "architecture": architecture(nv.compute_capability),
        "compute_capability": {
            "major": nv.compute_capability[0],
            "minor": nv.compute_capability[1],
        },
        "memory": _memory(nv.memory_bytes, nv.memory_used_bytes),
    }
    if dev.vendor is not None and dev.device is not None:
        pci: dict[str, int] = {"device_id": dev.device << 16 | dev.vendor}
        if dev.subsystem_vendor is not None and dev.subsystem_device is not None:
            pci["subsystem_id"] = dev.subsystem_device << 16 | dev.subsystem_vendor
        out["pci"] = pci
    mig = "enabled" if nv.mig_mode and nv.mig_mode[0] else "disabled"
    out["mig"] = {"mode_current": mig, "mode_pending": mig}
    return out


def mock_nvml_profile(spec: MachineSpec) -> dict[str, Any]:
    """The profile as a mapping (``mock_nvml_yaml`` writes it). ValueError for a machine
    without NVIDIA GPUs: the mock would then invent eight A100s."""
    gpus = spec.nvidia_gpus()
    if not gpus or spec.nvml is None:
        raise ValueError(f"{spec.name}: no NVIDIA GPUs, so no mock NVML profile")
    major, minor = _cuda(spec.nvml)
    defaults = _identity(gpus[0])
    fabric = spec.nvml.fabric
    if fabric is not None and fabric.state in FABRIC_STATES:
        # GB200 / NVSwitch machines: the fabric manager's answer the driver reads.
        defaults["fabric"] = {
            "cluster_uuid": str(uuid.UUID(bytes=bytes(fabric.cluster_uuid[:16]).ljust(16, b"\0"))),
            "clique_id": fabric.clique_id,
            "state": FABRIC_STATES[fabric.state],
        }
    defaults["persistence_mode"] = "enabled"
    defaults["compute_mode"] = "default"
    devices: list[dict[str, Any]] = []
    for index, dev in enumerate(gpus):
        nv = dev.nvidia
        assert nv is not None
        entry: dict[str, Any] = {
            "index": index,
            "uuid": nv.uuid,
            "serial": f"{index:013d}",
            "pci": {"bus_id": dev.bdf.upper()},
            "minor_number": nv.minor,
        }
        # A machine of mixed GPUs: the fields that differ from the defaults, per device.
        for key, value in _identity(dev).items():
            if value != defaults[key]:
                entry[key] = value
        devices.append(entry)
    return {
        "version": PROFILE_VERSION,
        "system": {
            "driver_version": spec.nvml.driver_version,
            "nvml_version": f"{major}.{spec.nvml.driver_version}",
            "cuda_version": f"{major}.{minor}",
            "cuda_version_major": major,
            "cuda_version_minor": minor,
        },
        "device_defaults": defaults,
        "devices": devices,
    }


def mock_nvml_yaml(spec: MachineSpec) -> str:
    head = (
        f"# Mock NVML profile (NVIDIA/k8s-test-infra pkg/gpu/mocknvml, MOCK_NVML_CONFIG) for\n"
        f"# toposlice's fake machine {spec.name}: its GPUs' bus ids (NVML index = bus order),\n"
        f"# UUIDs, model, memory and driver version; written by `toposlice machines mock-nvml`.\n"
    )
    return head + yaml.safe_dump(mock_nvml_profile(spec), sort_keys=False)
