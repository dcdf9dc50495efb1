"""NVIDIA GPUs, NVLinks and GPU fabric through NVML (``pynvml``), plus NVSwitches from sysfs.

``pynvml`` is imported inside :meth:`NvidiaProbe.probe`, only where it is used;
``ctx.nvml`` replaces it with a pynvml-compatible fake module (fake hardware). Every NVML
call that feeds an optional fact is guarded: an error leaves the field None and adds at
most one warning per GPU and fact kind.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any, Literal, cast

from discovery.bandwidth import NVLINK_LINK_GBPS
from discovery.model import Fabric, Gpu, NvLink, NvSwitch
from discovery.nvml_codes import (
    ARCHITECTURES,
    FABRIC_HEALTH,
    FABRIC_INFO_V2,
    FABRIC_INFO_V3,
    FABRIC_STATES,
    NVLINK_DEVICE_TYPES,
    NVLINK_VERSIONS,
    NVML_ERROR_CODES,
)
from discovery.pci_ids import class_code, parse_id
from discovery.readers import normalize_bdf
from discovery.words import plural
from plugins.base import ProbeContext, ProbeReport, ProbeUnavailable

__all__ = ["NVLINK_BANDWIDTH_GBPS", "NVLINK_VERSIONS", "NvidiaProbe"]

NVIDIA_VENDOR = 0x10DE

NVLINK_BANDWIDTH_GBPS = NVLINK_LINK_GBPS
RemoteType = Literal["gpu", "switch", "npu", "unknown"]
NVSWITCH_MODELS: dict[int, str] = {0x22A3: "NVSwitch (H100 gen)", 0x1AF1: "A100 NVSwitch"}

#: The driver root the chart's driver-root mode mounts (the NVIDIA DRA driver's name).
DRIVER_ROOT_ENV = "NVIDIA_DRIVER_ROOT"
NVML_LIBRARY = "libnvidia-ml.so.1"
MAX_NVLINKS = 36  # pynvml's NVML_NVLINK_MAX_LINKS; the C header says 18 -- stop at errors.

_NOT_SUPPORTED = NVML_ERROR_CODES["NOT_SUPPORTED"]
_INVALID_ARGUMENT = NVML_ERROR_CODES["INVALID_ARGUMENT"]
_FUNCTION_NOT_FOUND = NVML_ERROR_CODES["FUNCTION_NOT_FOUND"]
_VERSION_MISMATCH = NVML_ERROR_CODES["ARGUMENT_VERSION_MISMATCH"]


class _Missing(Exception):
    """The NVML module lacks a function (old pynvml or an incomplete fake)."""

    value = _FUNCTION_NOT_FOUND


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        value = bytes(value).split(b"\x00", 1)[0].decode("utf-8", "replace")
    text = str(value).strip()
    return text or None


def _bus_id(pci: Any) -> str | None:
    raw = _text(getattr(pci, "busId", None)) or _text(getattr(pci, "busIdLegacy", None))
    return normalize_bdf(raw) if raw else None


def _uuid_text(raw: Any) -> str | None:
    """16 raw bytes (bytes, ctypes array, int list) or a UUID string -> 8-4-4-4-12 lower-case."""
    import uuid  # deferred: only NVML hosts pay for it

    if raw is None:
        return None
    if isinstance(raw, str):
        try:
            return str(uuid.UUID(raw))
        except ValueError:
            return None
    try:
        data = bytes(raw) if isinstance(raw, bytes | bytearray) else bytes(list(raw))
    except (TypeError, ValueError):
        return None
    if len(data) != 16:
        return None
    return str(uuid.UUID(bytes=data))


class _FabricOut:
    """Plain stand-in for the fabric-info struct when the module has no ctypes struct.

    A fake module may fill either the object itself or ``ref._obj`` (what a real
    ``ctypes.byref`` result exposes): both land here.
    """

    def __init__(self) -> None:
        self.version = FABRIC_INFO_V3
        self.clusterUuid: Any = bytes(16)
        self.status = 0
        self.cliqueId = 0
        self.state = 0
        self.healthMask = 0
        self.healthSummary: int | None = None

    @property
    def _obj(self) -> _FabricOut:
        return self


class _Session:
    """One probe run: the NVML module, its error class and the warnings already given."""

    def __init__(self, nvml: Any, report: ProbeReport) -> None:
        self.nvml = nvml
        err = getattr(nvml, "NVMLError", None)
        self.error: type[BaseException] = (
            err if isinstance(err, type) and issubclass(err, BaseException) else Exception
        )
        self.report = report
        self._warned: set[tuple[str, str]] = set()

    def call(self, name: str, *args: Any) -> Any:
        fn: Callable[..., Any] | None = getattr(self.nvml, name, None)
        if not callable(fn):
            raise _Missing(f"{name} not available")
        return fn(*args)

    def code(self, exc: BaseException) -> int | None:
        value = getattr(exc, "value", None)
        return value if isinstance(value, int) else None

    def describe(self, exc: BaseException) -> str:
        try:
            text = str(exc)
        except Exception:
            text = ""
        code = self.code(exc)
        text = text or type(exc).__name__
        return f"{text} (NVML {code})" if code is not None and str(code) not in text else text

    def note(self, gpu: str, kind: str, message: str) -> None:
        """Add a warning unless this GPU already has one for this fact kind."""
        if (gpu, kind) in self._warned:
            return
        self._warned.add((gpu, kind))
        self.report.warnings.append(f"nvidia: GPU {gpu}: {message}")

    def warn(self, gpu: str, kind: str, exc: BaseException) -> None:
        self.note(gpu, kind, f"{kind} unavailable: {self.describe(exc)}")

    def optional(self, gpu: str, kind: str, name: str, *args: Any, quiet: bool = True) -> Any:
        """Result of an NVML call, or None: NOT_SUPPORTED silently (when ``quiet``),
        anything else with one warning per GPU and fact kind."""
        try:
            return self.call(name, *args)
        except _Missing:
            return None
        except Exception as exc:
            if not (quiet and self.code(exc) == _NOT_SUPPORTED):
                self.warn(gpu, kind, exc)
            return None


def _load_nvml(ctx: ProbeContext) -> Any:
    if ctx.nvml is not None:
        # A replayed NVML (``toposlice gather``) can say why the gathered host had none.
        reason = getattr(ctx.nvml, "toposlice_unavailable", None)
        if isinstance(reason, str) and reason:
            raise ProbeUnavailable(reason)
        return ctx.nvml
    if not ctx.live:
        raise ProbeUnavailable("NVML is only used on the live host (no fake NVML given)")
    try:
        module = importlib.import_module("pynvml")
    except ImportError as exc:
        raise ProbeUnavailable(f"pynvml (nvidia-ml-py) is not installed: {exc}") from None
    except Exception as exc:
        raise ProbeUnavailable(f"pynvml cannot be imported: {exc}") from None
    preload_from_driver_root()
    return module


def preload_from_driver_root() -> str | None:
    """With ``$NVIDIA_DRIVER_ROOT`` set (the chart's driver-root mode), load the driver's
    ``libnvidia-ml.so.1`` from that tree before pynvml asks for it by name: the dynamic
    loader then hands pynvml the library already loaded under that soname, and the
    plugin's image needs no copy of a library that must match the host's kernel module.
    The path loaded, or None when the variable is unset."""
    root = os.environ.get(DRIVER_ROOT_ENV, "")
    if not root:
        return None
    import ctypes

    from discovery.driver_root import LIB_DIRS, find_library

    path = find_library(root, NVML_LIBRARY)
    if path is None:
        raise ProbeUnavailable(
            f"${DRIVER_ROOT_ENV}={root}: no {NVML_LIBRARY} in {', '.join(LIB_DIRS)} under it"
        )
    try:
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise ProbeUnavailable(f"{path}: cannot be loaded: {exc}") from None
    return str(path)


def _nvidia_pci_gpus(ctx: ProbeContext) -> bool | None:
    """Whether sysfs shows a display/3D device that is (or may be) NVIDIA's; None when
    sysfs shows no PCI devices at all (nothing to rule NVML out with)."""
    if not ctx.host.pci_devices:
        return None
    for dev in ctx.host.pci_devices:
        cls = class_code(dev)
        vendor = parse_id(dev.vendor)
        if cls is not None and cls >> 8 == 0x03 and vendor in (NVIDIA_VENDOR, None):
            return True
    return False


def _nvswitches(ctx: ProbeContext) -> list[NvSwitch]:
    out: dict[str, NvSwitch] = {}
    for dev in ctx.host.pci_devices:
        if parse_id(dev.vendor) != NVIDIA_VENDOR or class_code(dev) != 0x0680:
            continue
        device = parse_id(dev.device)
        model = NVSWITCH_MODELS.get(device) if device is not None else None
        out[dev.bus_id] = NvSwitch(bus_id=dev.bus_id, probe="nvidia", model=model)
    return sorted(out.values(), key=lambda s: s.bus_id)


def _nvlinks(s: _Session, gpu: str, handle: Any) -> list[NvLink]:
    links: list[NvLink] = []
    for link in range(MAX_NVLINKS):
        try:
            state = s.call("nvmlDeviceGetNvLinkState", handle, link)
        except _Missing:
            break
        except Exception as exc:
            # NOT_SUPPORTED / INVALID_ARGUMENT mark the end of the links (or no NVLink).
            if s.code(exc) not in (_NOT_SUPPORTED, _INVALID_ARGUMENT):
                s.warn(gpu, "nvlink", exc)
            break
        if state != 1:
            continue
        nv = NvLink(link=link)
        enum = s.optional(gpu, "nvlink", "nvmlDeviceGetNvLinkVersion", handle, link, quiet=False)
        if isinstance(enum, int):
            nv.version = NVLINK_VERSIONS.get(enum)
            nv.bandwidth_gbps = NVLINK_BANDWIDTH_GBPS.get(nv.version or "")
        remote = s.optional(
            gpu, "nvlink", "nvmlDeviceGetNvLinkRemotePciInfo", handle, link, quiet=False
        )
        if remote is not None:
            nv.remote_bus_id = _bus_id(remote)
        rtype = s.optional(gpu, "nvlink", "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        if isinstance(rtype, int):
            nv.remote_type = cast(RemoteType, NVLINK_DEVICE_TYPES.get(rtype, "unknown"))
        links.append(nv)
    return links


def _fabric_attempts(nvml: Any) -> list[tuple[str, Any]]:
    """(function, struct factory) pairs to try, newest first."""
    attempts: list[tuple[str, Any]] = []
    for struct_name in ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfoV_t"):
        struct = getattr(nvml, struct_name, None)
        if struct is not None:
            attempts.append(("nvmlDeviceGetGpuFabricInfoV", struct))
    if not attempts:
        attempts.append(("nvmlDeviceGetGpuFabricInfoV", None))
    attempts.append(("nvmlDeviceGetGpuFabricInfo", getattr(nvml, "c_nvmlGpuFabricInfo_t", None)))
    return attempts


def _fabric_arg(struct: Any, version: int) -> tuple[Any, Any]:
    """(object NVML fills, argument to pass)."""
    import ctypes  # deferred: only NVML hosts pay for it

    obj: Any
    if isinstance(struct, type) and issubclass(struct, ctypes.Structure):
        obj = struct()
        names = [f[0] for f in getattr(struct, "_fields_", [])]
        if "version" in names and not getattr(obj, "version", 0):
            obj.version = version
        return obj, ctypes.byref(obj)
    if callable(struct):
        obj = struct()
        return obj, obj
    obj = _FabricOut()
    return obj, obj


def _fabric(s: _Session, gpu: str, handle: Any) -> Fabric | None:
    for fn_name, struct in _fabric_attempts(s.nvml):
        if not callable(getattr(s.nvml, fn_name, None)):
            continue
        version = FABRIC_INFO_V2 if "_v2" in getattr(struct, "__name__", "") else FABRIC_INFO_V3
        try:
            obj, arg = _fabric_arg(struct, version)
            returned = s.call(fn_name, handle, arg)
        except Exception as exc:
            code = s.code(exc)
            if code in (_FUNCTION_NOT_FOUND, _VERSION_MISMATCH) or isinstance(exc, _Missing):
                continue
            if code != _NOT_SUPPORTED:
                s.warn(gpu, "fabric", exc)
            return None
        if returned is not None and hasattr(returned, "state"):
            obj = returned  # a fake that returns the struct instead of filling it
        return _fabric_from(s, gpu, obj)
    return None


def _fabric_from(s: _Session, gpu: str, obj: Any) -> Fabric | None:
    state = getattr(obj, "state", None)
    if not isinstance(state, int):
        return None
    fabric = Fabric(
        cluster_uuid=_uuid_text(getattr(obj, "clusterUuid", None)),
        state=FABRIC_STATES[state] if 0 <= state < len(FABRIC_STATES) else "unknown",
    )
    clique = getattr(obj, "cliqueId", None)
    if isinstance(clique, int):
        fabric.clique_id = clique
    health = getattr(obj, "healthSummary", None)
    if isinstance(health, int) and 0 <= health < len(FABRIC_HEALTH):
        fabric.health = FABRIC_HEALTH[health]
    status = getattr(obj, "status", 0)
    fabric.status = status if isinstance(status, int) else None
    if fabric.state == "completed" and isinstance(status, int) and status != 0:
        s.note(gpu, "fabric", f"fabric registration completed with NVML status {status}")
    return fabric


def _gpu(s: _Session, index: int, driver: str | None) -> Gpu | None:
    label = f"#{index}"
    try:
        handle = s.call("nvmlDeviceGetHandleByIndex", index)
        pci = s.call("nvmlDeviceGetPciInfo", handle)
    except Exception as exc:
        s.warn(label, "identity", exc)
        return None
    bus_id = _bus_id(pci)
    if bus_id is None:
        s.report.warnings.append(f"nvidia: GPU {label}: unusable PCI bus id, skipped")
        return None
    gpu = Gpu(bus_id=bus_id, vendor="nvidia", probe="nvidia", index=index, driver_version=driver)
    gpu.uuid = _text(s.optional(bus_id, "uuid", "nvmlDeviceGetUUID", handle, quiet=False))
    gpu.model = _text(s.optional(bus_id, "name", "nvmlDeviceGetName", handle, quiet=False))
    minor = s.optional(bus_id, "minor", "nvmlDeviceGetMinorNumber", handle)
    gpu.minor = minor if isinstance(minor, int) and minor >= 0 else None
    mem = s.optional(bus_id, "memory", "nvmlDeviceGetMemoryInfo", handle, quiet=False)
    total = getattr(mem, "total", None)
    gpu.memory_bytes = total if isinstance(total, int) and total > 0 else None
    cc = s.optional(bus_id, "compute capability", "nvmlDeviceGetCudaComputeCapability", handle)
    if isinstance(cc, tuple | list) and len(cc) == 2 and all(isinstance(v, int) for v in cc):
        gpu.compute_capability = f"{cc[0]}.{cc[1]}"
    arch = s.optional(bus_id, "architecture", "nvmlDeviceGetArchitecture", handle)
    if isinstance(arch, int):
        gpu.architecture = ARCHITECTURES.get(arch)
    mig = s.optional(bus_id, "mig mode", "nvmlDeviceGetMigMode", handle)
    if isinstance(mig, tuple | list) and mig and isinstance(mig[0], int):
        gpu.mig_mode = mig[0] == 1
    numa = s.optional(bus_id, "numa node", "nvmlDeviceGetNumaNodeId", handle)
    gpu.memory_numa_node = numa if isinstance(numa, int) and numa >= 0 else None
    gpu.nvlinks = _nvlinks(s, bus_id, handle)
    gpu.fabric = _fabric(s, bus_id, handle)
    return gpu


class NvidiaProbe:
    name = "nvidia"

    def probe(self, ctx: ProbeContext) -> ProbeReport:
        if _nvidia_pci_gpus(ctx) is False:
            raise ProbeUnavailable("no NVIDIA GPU on the PCI bus")
        nvml = _load_nvml(ctx)
        report = ProbeReport()
        s = _Session(nvml, report)
        try:
            s.call("nvmlInit")
        except Exception as exc:
            raise ProbeUnavailable(f"NVML initialisation failed: {s.describe(exc)}") from None
        try:
            try:
                count = s.call("nvmlDeviceGetCount")
            except Exception as exc:
                raise ProbeUnavailable(f"NVML cannot count GPUs: {s.describe(exc)}") from None
            if not isinstance(count, int) or count <= 0:
                raise ProbeUnavailable("NVML reports no GPUs")
            driver = _text(s.optional("system", "driver version", "nvmlSystemGetDriverVersion"))
            gpus: dict[str, Gpu] = {}
            for index in range(count):
                gpu = _gpu(s, index, driver)
                if gpu is not None and gpu.bus_id not in gpus:
                    gpus[gpu.bus_id] = gpu
        finally:
            try:
                s.call("nvmlShutdown")
            except Exception:
                pass
        report.gpus = sorted(gpus.values(), key=lambda g: g.bus_id)
        report.nvswitches = _nvswitches(ctx)
        parts = [plural(len(report.gpus), "GPU")]
        if report.nvswitches:
            parts.append(plural(len(report.nvswitches), "NVSwitch", "NVSwitches"))
        parts.append(f"driver {driver or 'unknown'}")
        report.detail = ", ".join(parts)
        return report
