"""The GPU vendor's own CDI devices (``nvidia.com/gpu``, ``amd.com/gpu``) on the host, as
the container runtime would resolve them: for a claim's answer (driver/kubelet/vendor_cdi.py
puts them first) and for ``toposlice doctor``.

toposlice's spec gives a container the GPU's device nodes, the topology environment and
the NCCL file, but not the driver's user space (``libcuda.so.<version>``,
``libnvidia-ml.so``, ``nvidia-smi``, ldcache hooks), which must match the host's kernel
module and so is not in images. The NVIDIA Container Toolkit (and the GPU Operator) keep
``/var/run/cdi/nvidia.yaml`` with every GPU as ``nvidia.com/gpu=GPU-<uuid>`` and
``nvidia.com/gpu=<NVML index>``; ``amd-ctk`` writes ``amd.com/gpu=<n>`` (device nodes
only). Naming that device first in the GPU's ``cdi_device_ids`` makes the runtime apply
the vendor's edits, then toposlice's (../shared/reference/cdi.md section 8).

The spec directories are read the way the runtime's CDI cache reads them (cdi.md section
1), so an id handed out here is one the runtime resolves: only ``*.json``/``*.yaml``
directly in each directory, strict parsing (an unknown field drops the whole file),
names and versions checked as the CDI library checks them, a later directory wins over an
earlier one, and one device defined twice in one directory is dropped from both files.
A vendor device that names a device node the host lacks, without type and numbers, would
make the runtime refuse the container; it is not used either. Parsed files are cached
and read again when their size, mtime or inode changes, so a prepare costs a directory
listing and a few ``stat`` calls. toposlice's own files (``k8s.<driver>-*``,
``<driver>-*``) are not read: they hold no vendor device and there is one per claim.

Where no usable vendor device exists for an NVIDIA GPU whose kernel driver is bound,
prepare still succeeds with toposlice's own edits, and :meth:`VendorCdi.gap` gives the one
line the daemon reports once per node (Event, gauge, ``/readyz``, log), never per claim.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from discovery import cdi_spec
from discovery.model import Gpu, Inventory

#: The logger keeps the name it had in driver/vendor_cdi.py (logger names are user-visible).
log = logging.getLogger("driver.vendor_cdi")

NVIDIA_KIND = "nvidia.com/gpu"
AMD_KIND = "amd.com/gpu"
DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
#: The PCI driver that, when bound to a GPU, means a vendor spec should exist for it.
#: Only NVIDIA's carries what a pod lacks without it (the driver's libraries); amd-ctk's
#: holds device nodes only, which toposlice's own spec names already, and ROCm's user
#: space comes from the image: an AMD GPU without its spec is no gap.
KERNEL_DRIVERS = {"nvidia": "nvidia"}
KIND_OF = {"nvidia": NVIDIA_KIND, "amd": AMD_KIND}
#: cdiVersion strings the CDI library (v1.1.0) accepts.
VERSIONS = (
    "0.1.0",
    "0.2.0",
    "0.3.0",
    "0.4.0",
    "0.5.0",
    "0.6.0",
    "0.7.0",
    "0.8.0",
    "1.0.0",
    "1.1.0",
)
_NODE_TYPES = ("", "b", "c", "u", "p")
_HOOK_NAMES = (
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
)
_SPEC_KEYS = {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}
_DEVICE_KEYS = {"name", "annotations", "containerEdits"}
_EDIT_KEYS = {
    "env",
    "deviceNodes",
    "hooks",
    "mounts",
    "intelRdt",
    "additionalGids",
    "netDevices",
}
_NODE_KEYS = {
    "path",
    "hostPath",
    "type",
    "major",
    "minor",
    "fileMode",
    "permissions",
    "uid",
    "gid",
}
_MOUNT_KEYS = {"hostPath", "containerPath", "options", "type"}
_HOOK_KEYS = {"hookName", "path", "args", "env", "timeout"}
_PERMISSIONS = re.compile(r"^[rwm]*$")
_UUID_PREFIX = "GPU-"
#: The first render minor of AMD GPUs (KFD numbers them from here in bus order).
AMD_RENDER_BASE = 128


class SpecError(ValueError):
    """A spec file the runtime would refuse as a whole."""


@dataclass(frozen=True)
class VendorDevice:
    """One resolvable vendor CDI device."""

    id: str
    """Fully qualified: ``nvidia.com/gpu=GPU-<uuid>``."""
    spec_path: str
    nodes: tuple[dict[str, Any], ...]
    """Every device node the runtime adds for this id: its own and its spec's top level."""

    @property
    def node_paths(self) -> frozenset[str]:
        return frozenset(str(n["path"]) for n in self.nodes)


@dataclass(frozen=True)
class Found:
    """A GPU's vendor device, or why there is none (``problem``; empty: none expected)."""

    device: VendorDevice | None = None
    problem: str = ""


@dataclass(frozen=True)
class Gap:
    missing: int
    """GPUs with a bound kernel driver and no usable vendor CDI device."""
    message: str
    """One line; empty when nothing is missing."""


@dataclass
class _Spec:
    path: str
    priority: int
    kind: str
    devices: dict[str, dict[str, Any]]
    """Unqualified name -> the device's containerEdits."""
    common: dict[str, Any]


@dataclass
class _Registry:
    """What the runtime would resolve: qualified id -> (spec, device name)."""

    devices: dict[str, tuple[_Spec, str]] = field(default_factory=dict)
    kinds: dict[str, list[_Spec]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    """Spec path -> why the runtime would skip it (or drop devices of it)."""


# ---- parsing and validation (container-device-interface pkg/cdi/spec.go, validate) ------


def _check_keys(obj: Any, allowed: set[str], where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise SpecError(f"{where}: want a mapping, got {type(obj).__name__}")
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise SpecError(f"{where}: unknown field {unknown[0]!r}")
    return obj


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{where}: want a list of strings")
    return value


def _check_edits(edits: Any, where: str) -> dict[str, Any]:
    edits = _check_keys(edits, _EDIT_KEYS, where)
    for env in _strings(edits.get("env"), f"{where}.env"):
        if "=" not in env or env.startswith("="):
            raise SpecError(f"{where}.env: invalid environment variable {env!r}")
    nodes = edits.get("deviceNodes") or []
    if not isinstance(nodes, list):
        raise SpecError(f"{where}.deviceNodes: want a list")
    for node in nodes:
        node = _check_keys(node, _NODE_KEYS, f"{where}.deviceNodes[]")
        if not isinstance(node.get("path"), str) or not node["path"]:
            raise SpecError(f"{where}.deviceNodes[]: invalid (empty) device path")
        if node.get("type", "") not in _NODE_TYPES:
            raise SpecError(f"{where}: device {node['path']!r}: invalid type {node['type']!r}")
        for key in ("major", "minor", "fileMode", "uid", "gid"):
            if key in node and not isinstance(node[key], int):
                raise SpecError(f"{where}: device {node['path']!r}: {key} is not an integer")
        if not _PERMISSIONS.match(str(node.get("permissions", ""))):
            raise SpecError(f"{where}: device {node['path']!r}: invalid permissions")
    mounts = edits.get("mounts") or []
    if not isinstance(mounts, list):
        raise SpecError(f"{where}.mounts: want a list")
    for mount in mounts:
        mount = _check_keys(mount, _MOUNT_KEYS, f"{where}.mounts[]")
        if not mount.get("hostPath") or not mount.get("containerPath"):
            raise SpecError(f"{where}.mounts[]: invalid mount, empty host or container path")
        _strings(mount.get("options"), f"{where}.mounts[].options")
    hooks = edits.get("hooks") or []
    if not isinstance(hooks, list):
        raise SpecError(f"{where}.hooks: want a list")
    for hook in hooks:
        hook = _check_keys(hook, _HOOK_KEYS, f"{where}.hooks[]")
        if hook.get("hookName") not in _HOOK_NAMES:
            raise SpecError(f"{where}.hooks[]: invalid hook name {hook.get('hookName')!r}")
        if not hook.get("path"):
            raise SpecError(f"{where}.hooks[]: invalid hook, empty path")
        _strings(hook.get("args"), f"{where}.hooks[].args")
        _strings(hook.get("env"), f"{where}.hooks[].env")
    return edits


def parse_spec(raw: bytes, path: str) -> tuple[str, dict[str, dict[str, Any]], dict[str, Any]]:
    """(kind, device name -> edits, top-level edits) of one spec file, checked as the CDI
    library checks it when loading; :class:`SpecError` names the first problem."""
    try:
        if path.endswith(".json"):
            doc = json.loads(raw)
        else:
            import yaml

            loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
            doc = yaml.load(raw, Loader=loader)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SpecError(f"not valid JSON: {exc}") from None
    except Exception as exc:  # yaml.YAMLError, without importing yaml at module load
        raise SpecError(f"not valid YAML: {' '.join(str(exc).split())}") from None
    spec = _check_keys(doc, _SPEC_KEYS, "spec")
    version = spec.get("cdiVersion")
    if version not in VERSIONS:
        raise SpecError(f"invalid cdiVersion {version!r}")
    kind = spec.get("kind")
    if not isinstance(kind, str):
        raise SpecError("missing kind")
    try:
        cdi_spec.check_kind(kind)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        raise SpecError("invalid spec, no devices")
    names: dict[str, dict[str, Any]] = {}
    for dev in devices:
        dev = _check_keys(dev, _DEVICE_KEYS, "devices[]")
        name = dev.get("name")
        if not isinstance(name, str):
            raise SpecError(f"device name {name!r} is not a string")
        try:
            cdi_spec.check_device_name(name)
        except ValueError as exc:
            raise SpecError(str(exc)) from None
        if name in names:
            raise SpecError(f"duplicate device {name!r}")
        edits = _check_edits(dev.get("containerEdits"), f"device {name!r}")
        if not any(edits.values()):
            raise SpecError(f"invalid device {name!r}, empty device edits")
        names[name] = edits
    common = _check_edits(spec.get("containerEdits") or {}, "containerEdits")
    needed = cdi_spec.min_version(spec)
    if _version(version) < _version(needed):
        raise SpecError(f"the spec version must be at least v{needed}, it is v{version}")
    return kind, names, common


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


# ---- the registry of the spec directories ----------------------------------------------


def spec_dirs(given: Sequence[str] | None, cdi_root: str) -> tuple[str, ...]:
    """The directories to read, lowest priority first: ``given`` (default /etc/cdi,
    /var/run/cdi), then ``cdi_root`` unless already there. A repeated directory keeps its
    first place."""
    dirs: list[str] = []
    for d in [*(DEFAULT_SPEC_DIRS if given is None else given), cdi_root]:
        d = os.path.abspath(d)
        if d not in dirs:
            dirs.append(d)
    return tuple(dirs)


class VendorCdi:
    """The vendor devices of the spec directories (thread-safe: prepares run concurrently);
    the kubelet plugin's :class:`driver.kubelet.vendor_cdi.VendorCdi` adds ``attach``."""

    def __init__(
        self,
        dirs: Sequence[str],
        dev_root: str | os.PathLike[str],
        *,
        own_prefixes: Sequence[str] = (),
    ) -> None:
        self.dirs = tuple(dirs)
        self.dev_root = Path(dev_root)
        """Host device nodes are looked up under ``<dev_root>/dev``."""
        self.own_prefixes = tuple(own_prefixes)
        self._lock = threading.Lock()
        self._files: dict[str, tuple[tuple[int, int, int], _Spec | str]] = {}
        """path -> (size, mtime_ns, inode), parsed spec or its error."""
        self._signature: tuple[tuple[str, int, int, int], ...] | None = None
        self._registry = _Registry()

    # -- reading ----------------------------------------------------------------------

    def registry(self) -> _Registry:
        """The current registry: rebuilt when a spec file came, went or changed."""
        entries: list[tuple[str, int, int, int, int]] = []
        for priority, directory in enumerate(self.dirs):
            try:
                with os.scandir(directory) as it:
                    for e in it:
                        name = e.name
                        if not name.endswith((".json", ".yaml")) or name.startswith(
                            self.own_prefixes
                        ):
                            continue
                        try:
                            st = e.stat()
                        except OSError:
                            continue
                        if not e.is_file():
                            continue
                        entries.append((e.path, priority, st.st_size, st.st_mtime_ns, st.st_ino))
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                continue
        entries.sort(key=lambda x: (x[1], x[0]))
        signature = tuple((p, s, m, i) for p, _, s, m, i in entries)
        with self._lock:
            if signature == self._signature:
                return self._registry
            files: dict[str, tuple[tuple[int, int, int], _Spec | str]] = {}
            for path, priority, size, mtime, ino in entries:
                stamp = (size, mtime, ino)
                old = self._files.get(path)
                if old is not None and old[0] == stamp:
                    parsed = old[1]
                    if isinstance(parsed, _Spec):
                        parsed.priority = priority
                else:
                    parsed = self._read(path, priority)
                files[path] = (stamp, parsed)
            self._files = files
            self._registry = _build_registry((p, f) for p, (_, f) in files.items())
            self._signature = signature
            return self._registry

    @staticmethod
    def _read(path: str, priority: int) -> _Spec | str:
        try:
            raw = Path(path).read_bytes()
            kind, devices, common = parse_spec(raw, path)
        except OSError as exc:
            return f"cannot read: {exc.strerror or exc}"
        except SpecError as exc:
            log.warning("CDI spec %s is invalid (the runtime skips it too): %s", path, exc)
            return str(exc)
        return _Spec(path, priority, kind, devices, common)

    def resolves(self, cdi_id: str) -> bool:
        return cdi_id in self.registry().devices

    # -- lookup -----------------------------------------------------------------------

    def find(self, inv: Inventory, gpu: Gpu, reg: _Registry | None = None) -> Found:
        """The GPU's vendor device. NVIDIA: ``GPU-<uuid>``, else the NVML index when the
        spec names no UUIDs (``--device-name-strategy index``) and that device's node is
        this GPU's ``/dev/nvidia<minor>``. AMD: the device whose nodes include this GPU's
        ``/dev/dri/renderD<minor>`` (``amd-ctk`` names them by its own enumeration)."""
        kind = KIND_OF.get(gpu.vendor)
        if kind is None:
            return Found()
        reg = self.registry() if reg is None else reg
        specs = reg.kinds.get(kind, [])
        if not specs:
            where = ", ".join(self.dirs) or "no directory"
            return Found(problem=f"no {kind} spec in {where}")
        if gpu.vendor == "nvidia":
            return self._find_nvidia(reg, kind, gpu)
        return self._find_amd(reg, kind, inv, gpu)

    def _find_nvidia(self, reg: _Registry, kind: str, gpu: Gpu) -> Found:
        uuid = gpu.uuid or ""
        if uuid and not uuid.startswith(_UUID_PREFIX):
            uuid = _UUID_PREFIX + uuid
        if uuid:
            hit = reg.devices.get(cdi_spec.qualified(kind, uuid))
            if hit is not None:
                return self._usable(kind, *hit)
        names = [n for spec in reg.kinds[kind] for n in spec.devices]
        if any(n.startswith(_UUID_PREFIX) for n in names):
            return Found(problem=f"the {kind} spec is stale (it lists other GPUs' UUIDs)")
        if gpu.index is None:
            return Found(problem=f"the {kind} spec names no UUIDs and the GPU has no NVML index")
        hit = reg.devices.get(cdi_spec.qualified(kind, str(gpu.index)))
        if hit is None:
            return Found(problem=f"the {kind} spec is stale (no device for the NVML index)")
        spec, name = hit
        if gpu.minor is not None:
            mine = f"/dev/nvidia{gpu.minor}"
            paths = {n["path"] for n in spec.devices[name].get("deviceNodes") or []}
            if mine not in paths:
                return Found(problem=f"the {kind} spec is stale (its index names another GPU)")
        return self._usable(kind, spec, name)

    def _find_amd(self, reg: _Registry, kind: str, inv: Inventory, gpu: Gpu) -> Found:
        render = f"/dev/dri/renderD{amd_render_minor(inv, gpu)}"
        for spec in reg.kinds[kind]:
            for name, edits in spec.devices.items():
                if name == "all":
                    continue
                if any(n["path"] == render for n in edits.get("deviceNodes") or []):
                    qualified = cdi_spec.qualified(kind, name)
                    if reg.devices.get(qualified, (None, ""))[0] is spec:
                        return self._usable(kind, spec, name)
        return Found(problem=f"the {kind} spec is stale (no device with the GPU's render node)")

    def _usable(self, kind: str, spec: _Spec, name: str) -> Found:
        nodes = [
            *(spec.common.get("deviceNodes") or []),
            *(spec.devices[name].get("deviceNodes") or []),
        ]
        qualified = cdi_spec.qualified(kind, name)
        for node in nodes:
            if self._host_lacks(node):
                return Found(
                    problem=f"the {kind} spec names {node.get('hostPath') or node['path']}, "
                    "which the host lacks (the runtime would refuse the container)"
                )
        return Found(device=VendorDevice(qualified, spec.path, tuple(nodes)))

    def _host_lacks(self, node: Mapping[str, Any]) -> bool:
        """A node without type and numbers is stat'ed by the runtime on the host: missing,
        the container is refused. Only host paths under /dev can be checked (the plugin
        sees the host's /dev at ``<root>/dev``); others are taken as present."""
        kind = node.get("type") or ""
        if kind == "p" or (kind and node.get("major")):
            return False
        host = str(node.get("hostPath") or node["path"])
        if not host.startswith("/dev/"):
            return False
        return not os.path.lexists(self.dev_root / host.lstrip("/"))

    # -- the node's gap ----------------------------------------------------------------

    def gap(self, inv: Inventory) -> Gap:
        """GPUs whose kernel driver is bound but that have no usable vendor device, and one
        line saying so (grouped by cause)."""
        causes: dict[str, list[str]] = {}
        total = 0
        reg = self.registry()
        for gpu in inv.gpus:
            want = KERNEL_DRIVERS.get(gpu.vendor)
            pci = inv.pci(gpu.bus_id)
            if want is None or pci is None or pci.driver != want:
                continue
            total += 1
            found = self.find(inv, gpu, reg)
            if found.device is None:
                causes.setdefault(found.problem, []).append(gpu.bus_id)
        missing = sum(len(v) for v in causes.values())
        if not missing:
            return Gap(0, "")
        why = "; ".join(
            f"{problem} ({len(buses)} GPU(s): {', '.join(buses[:3])}"
            f"{', ...' if len(buses) > 3 else ''})"
            for problem, buses in sorted(causes.items())
        )
        return Gap(
            missing,
            f"no vendor CDI device for {missing} of {total} GPU(s) with a loaded kernel "
            f"driver: {why}; their pods get toposlice's device nodes, environment and NCCL "
            "file but not the driver's libraries (CUDA fails at cuInit): install the NVIDIA "
            "Container Toolkit or the GPU Operator (they keep nvidia.com/gpu in "
            "/var/run/cdi), see docs/deploy.md",
        )

    def errors(self) -> dict[str, str]:
        """Spec files the runtime would skip, or whose devices it would drop, and why."""
        return dict(self.registry().errors)


def amd_render_minor(inv: Inventory, gpu: Gpu) -> int:
    """``Gpu.minor`` when a probe set it; else KFD's numbering (render minors from 128 in
    bus order of the AMD GPUs)."""
    if gpu.minor is not None:
        return gpu.minor
    amd = sorted(g.bus_id for g in inv.gpus if g.vendor == "amd")
    return AMD_RENDER_BASE + amd.index(gpu.bus_id)


def _build_registry(specs: Iterable[tuple[str, _Spec | str]]) -> _Registry:
    """Devices by qualified name, as the CDI cache's refresh resolves them (files in
    priority order, then by path)."""
    reg = _Registry()
    conflicts: set[str] = set()
    for path, spec in specs:
        if not isinstance(spec, _Spec):
            reg.errors[path] = spec
            continue
        for name in spec.devices:
            qualified = cdi_spec.qualified(spec.kind, name)
            old = reg.devices.get(qualified)
            if old is not None and old[0].priority == spec.priority:
                conflicts.add(qualified)
                for path in (spec.path, old[0].path):
                    reg.errors[path] = f"conflicting device {qualified} in {old[0].path}"
            reg.devices[qualified] = (spec, name)
    for qualified in conflicts:
        del reg.devices[qualified]
    for spec, _ in reg.devices.values():
        kinds = reg.kinds.setdefault(spec.kind, [])
        if spec not in kinds:
            kinds.append(spec)
    return reg
