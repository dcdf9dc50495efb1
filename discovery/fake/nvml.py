"""A fake of the ``pynvml`` module (nvidia-ml-py 13.x) for a :class:`MachineSpec`.

Only what a discovery probe needs is implemented, with pynvml's names, argument
conventions and return types: bus ids as NVML-formatted ``bytes``, ``NVMLError``
carrying the return code in ``.value`` (and mapping to per-code subclasses the way
pynvml does), fabric info written into a caller-provided struct passed through
``ctypes.byref``. Faults can be injected per function, per GPU or machine-wide.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from discovery.fake.spec import (
    NVML_FUNCTIONS,
    FabricSpec,
    MachineSpec,
    NvidiaGpuSpec,
    PciDeviceSpec,
)
from discovery.nvml_codes import (
    FABRIC_INFO_V2,
    FABRIC_INFO_V3,
    NVLINK_VERSION_ENUM,
    NVML_ERROR_CODES,
    nvml_error_name,
)

__all__ = ["FakeMemoryInfo", "FakeNvml", "FakeNvmlDevice", "FakePciInfo", "NVMLError"]


class NVMLError(Exception):
    """pynvml-style error: ``NVMLError(code)``; ``.value`` is the NVML return code.

    Like pynvml, constructing the base class returns the per-code subclass
    (``NVMLError(3)`` is an ``NVMLError_NotSupported``), so both
    ``except nvml.NVMLError`` and ``except nvml.NVMLError_NotSupported`` work.
    """

    _by_code: ClassVar[dict[int, type[NVMLError]]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._by_code.get(value, NVMLError)
        obj = Exception.__new__(cls, value)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        name = nvml_error_name(self.value)
        return name.replace("_", " ").title() if name else f"Unknown Error (code {self.value})"


def _camel(name: str) -> str:
    return "".join(p.capitalize() for p in name.lower().split("_"))


_ERROR_CLASSES: dict[str, type[NVMLError]] = {}
for _name, _code in NVML_ERROR_CODES.items():
    _cls = type(f"NVMLError_{_camel(_name)}", (NVMLError,), {})
    NVMLError._by_code[_code] = _cls
    _ERROR_CLASSES[f"NVMLError_{_camel(_name)}"] = _cls

NVMLError_NotSupported = _ERROR_CLASSES["NVMLError_NotSupported"]
NVMLError_InvalidArgument = _ERROR_CLASSES["NVMLError_InvalidArgument"]
NVMLError_Uninitialized = _ERROR_CLASSES["NVMLError_Uninitialized"]
NVMLError_LibraryNotFound = _ERROR_CLASSES["NVMLError_LibraryNotFound"]
NVMLError_NotFound = _ERROR_CLASSES["NVMLError_NotFound"]


class c_nvmlGpuFabricInfo_t(ctypes.Structure):
    """Same layout as pynvml's legacy (v1) fabric-info struct."""

    _fields_: ClassVar[list[tuple[str, Any]]] = [
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_uint),
    ]


class c_nvmlGpuFabricInfo_v2_t(ctypes.Structure):
    _fields_: ClassVar[list[tuple[str, Any]]] = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_uint),
        ("healthMask", ctypes.c_uint),
    ]


class c_nvmlGpuFabricInfo_v3_t(ctypes.Structure):
    _fields_: ClassVar[list[tuple[str, Any]]] = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_uint),
        ("healthMask", ctypes.c_uint),
        ("healthSummary", ctypes.c_ubyte),
    ]


@dataclass
class FakePciInfo:
    """Field names and types of pynvml's ``c_nvmlPciInfo_t`` (v3)."""

    busIdLegacy: bytes
    domain: int
    bus: int
    device: int
    pciDeviceId: int
    pciSubSystemId: int
    busId: bytes


@dataclass
class FakeMemoryInfo:
    total: int
    free: int
    used: int


@dataclass(frozen=True)
class FakeNvmlDevice:
    """An opaque device handle (pynvml hands out ``c_nvmlDevice_t`` pointers)."""

    index: int
    bdf: str


def _pci_info(bdf: str, dev: PciDeviceSpec | None) -> FakePciInfo:
    dom_s, bus_s, rest = bdf.split(":")
    slot_s = rest.split(".")[0]
    dom, bus, slot = int(dom_s, 16), int(bus_s, 16), int(slot_s, 16)
    # NVML prints the function as 0 whatever it is.
    dev_id = sub_id = 0
    if dev is not None:
        dev_id = ((dev.device or 0) << 16) | (dev.vendor or 0)
        sub_id = ((dev.subsystem_device or 0) << 16) | (dev.subsystem_vendor or 0)
    return FakePciInfo(
        busIdLegacy=f"{dom & 0xFFFF:04X}:{bus:02X}:{slot:02X}.0".encode(),
        domain=dom,
        bus=bus,
        device=slot,
        pciDeviceId=dev_id,
        pciSubSystemId=sub_id,
        busId=f"{dom:08X}:{bus:02X}:{slot:02X}.0".encode(),
    )


class FakeNvml:
    """Drop-in for the ``pynvml`` module over one machine's NVIDIA GPUs.

    ``errors`` adds (or overrides) machine-wide injected faults: pynvml function name
    -> NVML return code (int) or its name (``"GPU_IS_LOST"``). ``fail_init`` makes
    ``nvmlInit`` raise ``NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)`` as on a host
    without the driver.
    """

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_NotFound = NVMLError_NotFound

    NVML_SUCCESS = 0
    NVML_ERROR_UNINITIALIZED = NVML_ERROR_CODES["UNINITIALIZED"]
    NVML_ERROR_INVALID_ARGUMENT = NVML_ERROR_CODES["INVALID_ARGUMENT"]
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_CODES["NOT_SUPPORTED"]
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_CODES["NO_PERMISSION"]
    NVML_ERROR_NOT_FOUND = NVML_ERROR_CODES["NOT_FOUND"]
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_CODES["LIBRARY_NOT_FOUND"]
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_CODES["GPU_IS_LOST"]
    NVML_ERROR_UNKNOWN = NVML_ERROR_CODES["UNKNOWN"]
    NVML_DEVICE_ARCH_AMPERE = 7
    NVML_DEVICE_ARCH_ADA = 8
    NVML_DEVICE_ARCH_HOPPER = 9
    NVML_DEVICE_ARCH_BLACKWELL = 10
    NVML_DEVICE_ARCH_UNKNOWN = 0xFFFFFFFF
    NVML_FEATURE_DISABLED = 0
    NVML_FEATURE_ENABLED = 1
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_NVLINK_MAX_LINKS = 18
    NVML_NVLINK_VERSION_INVALID = 0
    NVML_NVLINK_VERSION_1_0 = 1
    NVML_NVLINK_VERSION_2_0 = 2
    NVML_NVLINK_VERSION_2_2 = 3
    NVML_NVLINK_VERSION_3_0 = 4
    NVML_NVLINK_VERSION_3_1 = 5
    NVML_NVLINK_VERSION_4_0 = 6
    NVML_NVLINK_VERSION_5_0 = 7
    NVML_NVLINK_DEVICE_TYPE_GPU = 0
    NVML_NVLINK_DEVICE_TYPE_IBMNPU = 1
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
    NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF
    NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
    NVML_GPU_FABRIC_STATE_NOT_STARTED = 1
    NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2
    NVML_GPU_FABRIC_STATE_COMPLETED = 3
    NVML_GPU_FABRIC_UUID_LEN = 16
    NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED = 0
    NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY = 1
    NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY = 2
    NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY = 3
    nvmlGpuFabricInfo_v2 = FABRIC_INFO_V2
    nvmlGpuFabricInfo_v3 = FABRIC_INFO_V3
    c_nvmlGpuFabricInfo_t = c_nvmlGpuFabricInfo_t
    c_nvmlGpuFabricInfo_v2_t = c_nvmlGpuFabricInfo_v2_t
    c_nvmlGpuFabricInfo_v3_t = c_nvmlGpuFabricInfo_v3_t
    c_nvmlGpuFabricInfoV_t = c_nvmlGpuFabricInfo_v2_t  # pynvml aliases V to v2

    def __init__(
        self,
        spec: MachineSpec,
        fail_init: bool = False,
        errors: Mapping[str, int | str] | None = None,
    ) -> None:
        self.spec = spec
        self.fail_init = fail_init
        self._gpus = spec.nvidia_gpus()
        self._init_count = 0
        self._errors: dict[str, int] = dict(spec.nvml.nvml_errors if spec.nvml else {})
        for fn, code in (errors or {}).items():
            if fn not in NVML_FUNCTIONS:
                raise ValueError(f"unknown NVML function {fn!r}")
            if isinstance(code, str):
                code = NVML_ERROR_CODES[code.upper().removeprefix("NVML_ERROR_")]
            self._errors[fn] = code
        self.calls: list[str] = []
        """Every pynvml function called, in order (for tests)."""

    # ------------------------------------------------------------------ internals

    def _enter(self, fn: str, handle: FakeNvmlDevice | None = None, init: bool = True) -> None:
        self.calls.append(fn)
        if init and self._init_count == 0:
            raise NVMLError(self.NVML_ERROR_UNINITIALIZED)
        code = self._errors.get(fn)
        if code is None and handle is not None:
            code = self._nv(handle).nvml_errors.get(fn)
        if code is not None:
            raise NVMLError(code)

    def _gpu(self, handle: Any) -> PciDeviceSpec:
        if not isinstance(handle, FakeNvmlDevice) or not 0 <= handle.index < len(self._gpus):
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        dev = self._gpus[handle.index]
        if dev.bdf != handle.bdf:
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return dev

    def _nv(self, handle: Any) -> NvidiaGpuSpec:
        nv = self._gpu(handle).nvidia
        assert nv is not None
        return nv

    def _link(self, handle: FakeNvmlDevice, link: int) -> Any:
        if not isinstance(link, int) or link < 0 or link >= self.NVML_NVLINK_MAX_LINKS:
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        links = self._nv(handle).nvlinks
        if link >= len(links):
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return links[link]

    # ------------------------------------------------------------------ system

    def nvmlInit(self) -> None:
        self._enter("nvmlInit", init=False)
        if self.fail_init:
            raise NVMLError(self.NVML_ERROR_LIBRARY_NOT_FOUND)
        self._init_count += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.spec.nvml.driver_version if self.spec.nvml else ""

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self._gpus)

    # ------------------------------------------------------------------ handles

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeNvmlDevice:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not isinstance(index, int) or not 0 <= index < len(self._gpus):
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return FakeNvmlDevice(index, self._gpus[index].bdf)

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str | bytes) -> FakeNvmlDevice:
        self._enter("nvmlDeviceGetHandleByPciBusId")
        from discovery.fake.loader import parse_bdf  # the YAML loader: only when asked

        text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
        try:
            if isinstance(text, str) and text.count(":") == 1:
                text = "0:" + text
            bdf = parse_bdf(text, "bus id")
        except ValueError:
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT) from None
        # NVML ignores the function number (it prints it as 0).
        for i, dev in enumerate(self._gpus):
            if dev.bdf[:-1] == bdf[:-1]:
                return FakeNvmlDevice(i, dev.bdf)
        raise NVMLError(self.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> FakeNvmlDevice:
        self._enter("nvmlDeviceGetHandleByUUID")
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i, dev in enumerate(self._gpus):
            assert dev.nvidia is not None
            if dev.nvidia.uuid == text:
                return FakeNvmlDevice(i, dev.bdf)
        raise NVMLError(self.NVML_ERROR_NOT_FOUND)

    # ------------------------------------------------------------------ device facts

    def nvmlDeviceGetUUID(self, handle: FakeNvmlDevice) -> str:
        self._enter("nvmlDeviceGetUUID", handle)
        return self._nv(handle).uuid

    def nvmlDeviceGetName(self, handle: FakeNvmlDevice) -> str:
        self._enter("nvmlDeviceGetName", handle)
        return self._nv(handle).name

    def nvmlDeviceGetMinorNumber(self, handle: FakeNvmlDevice) -> int:
        self._enter("nvmlDeviceGetMinorNumber", handle)
        return self._nv(handle).minor

    def nvmlDeviceGetPciInfo(self, handle: FakeNvmlDevice) -> FakePciInfo:
        self._enter("nvmlDeviceGetPciInfo", handle)
        dev = self._gpu(handle)
        return _pci_info(dev.bdf, dev)

    def nvmlDeviceGetMemoryInfo(
        self, handle: FakeNvmlDevice, version: Any = None
    ) -> FakeMemoryInfo:
        self._enter("nvmlDeviceGetMemoryInfo", handle)
        g = self._nv(handle)
        return FakeMemoryInfo(
            total=g.memory_bytes,
            free=g.memory_bytes - g.memory_used_bytes,
            used=g.memory_used_bytes,
        )

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeNvmlDevice) -> tuple[int, int]:
        self._enter("nvmlDeviceGetCudaComputeCapability", handle)
        return self._nv(handle).compute_capability

    def nvmlDeviceGetArchitecture(self, handle: FakeNvmlDevice) -> int:
        """``nvmlDeviceArchitecture_t`` derived from the compute capability."""
        self._enter("nvmlDeviceGetArchitecture", handle)
        return _architecture(self._nv(handle).compute_capability)

    def nvmlDeviceGetNumaNodeId(self, handle: FakeNvmlDevice) -> int:
        self._enter("nvmlDeviceGetNumaNodeId", handle)
        node = self._nv(handle).numa_memory_node
        if node is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return node

    def nvmlDeviceGetMigMode(self, handle: FakeNvmlDevice) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", handle)
        mig = self._nv(handle).mig_mode
        if mig is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return [mig[0], mig[1]]

    # ------------------------------------------------------------------ NVLink

    def nvmlDeviceGetNvLinkState(self, handle: FakeNvmlDevice, link: int) -> int:
        self._enter("nvmlDeviceGetNvLinkState", handle)
        spec = self._link(handle, link)
        return self.NVML_FEATURE_ENABLED if spec.active else self.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkVersion(self, handle: FakeNvmlDevice, link: int) -> int:
        self._enter("nvmlDeviceGetNvLinkVersion", handle)
        self._link(handle, link)
        version = self._nv(handle).nvlink_version
        return NVLINK_VERSION_ENUM[version] if version else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: FakeNvmlDevice, link: int) -> FakePciInfo:
        self._enter("nvmlDeviceGetNvLinkRemotePciInfo", handle)
        spec = self._link(handle, link)
        info = _pci_info(spec.remote, self.spec.device(spec.remote))
        info.pciSubSystemId = 0  # NVML does not fill it for remote info
        return info

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: FakeNvmlDevice, link: int) -> int:
        self._enter("nvmlDeviceGetNvLinkRemoteDeviceType", handle)
        spec = self._link(handle, link)
        if spec.remote_type == "gpu":
            return self.NVML_NVLINK_DEVICE_TYPE_GPU
        return self.NVML_NVLINK_DEVICE_TYPE_SWITCH

    # ------------------------------------------------------------------ fabric

    def nvmlDeviceGetGpuFabricInfoV(self, handle: FakeNvmlDevice, info: Any) -> int:
        """Fill ``info`` (``ctypes.byref(struct)`` or any object) like NVML does."""
        self._enter("nvmlDeviceGetGpuFabricInfoV", handle)
        self._fill_fabric(handle, info, with_health=True)
        return self.NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfo(self, handle: FakeNvmlDevice, info: Any) -> int:
        """Legacy v1 form (no health fields)."""
        self._enter("nvmlDeviceGetGpuFabricInfo", handle)
        self._fill_fabric(handle, info, with_health=False)
        return self.NVML_SUCCESS

    def _fill_fabric(self, handle: FakeNvmlDevice, info: Any, with_health: bool) -> None:
        fabric: FabricSpec | None = self._nv(handle).fabric
        if fabric is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        target = getattr(info, "_obj", info)
        values: dict[str, Any] = {
            "cliqueId": fabric.clique_id,
            "state": fabric.state,
            "status": fabric.status,
        }
        if with_health:
            values["healthMask"] = fabric.health_mask
            values["healthSummary"] = fabric.health_summary
        if isinstance(target, ctypes.Structure):
            # Only the fields the caller's struct version has (v2 has no healthSummary).
            names = {f[0] for f in type(target)._fields_}
            values = {k: v for k, v in values.items() if k in names}
        _set_uuid(target, fabric.cluster_uuid)
        for key, value in values.items():
            setattr(target, key, value)


def _architecture(cc: tuple[int, int]) -> int:
    major, minor = cc
    if major >= 10:
        return 10  # Blackwell (10.x datacenter, 12.x consumer)
    if major == 9:
        return 9  # Hopper
    if major == 8:
        return 8 if minor == 9 else 7  # Ada / Ampere
    if major == 7:
        return 6 if minor == 5 else 5  # Turing / Volta
    return {6: 4, 5: 3, 3: 2}.get(major, 0xFFFFFFFF)


def _set_uuid(target: Any, value: bytes) -> None:
    current = getattr(target, "clusterUuid", None)
    if isinstance(current, ctypes.Array):
        # A ctypes struct field (c_ubyte * 16 or c_char * 16): write in place.
        ctypes.memmove(ctypes.addressof(current), value, min(len(value), ctypes.sizeof(current)))
        return
    target.clusterUuid = value
