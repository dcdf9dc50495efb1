"""Fake hardware: realistic sysfs trees and a fake ``pynvml`` from YAML machine files.

Used by ``--fake NAME`` and by the test suite so that everything runs on machines
without GPUs. A machine is a YAML file (format: docs/fake-hardware.md); the shipped
ones live in ``discovery/fake/machines/``::

    with fake_host("dgx-h100") as host:
        inventory, _ = discover_host(str(host.root))
        probe_ctx = ProbeContext(root=host.root, host=inventory, nvml=host.nvml)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from discovery.fake.loader import load_file as load_file
    from discovery.fake.loader import load_yaml, parse_machine
    from discovery.fake.nvml import FakeNvml, NVMLError
    from discovery.fake.spec import MachineSpec
    from discovery.fake.sysfs_builder import build_sysfs

__all__ = [
    "MACHINES_DIR",
    "FakeHost",
    "FakeNvml",
    "MachineSpec",
    "NVMLError",
    "build_sysfs",
    "fake_host",
    "list_machines",
    "load_machine",
    "load_yaml",
    "machine_path",
    "make_nvml",
    "parse_machine",
    "scratch_dir",
]

#: Names re-exported from the submodules, imported on first use: a ``--fake`` run whose
#: tree is cached (discovery/fake/cache.py) needs neither the YAML loader nor the builder.
_LAZY = {
    "FakeNvml": "discovery.fake.nvml",
    "NVMLError": "discovery.fake.nvml",
    "MachineSpec": "discovery.fake.spec",
    "build_sysfs": "discovery.fake.sysfs_builder",
    "load_file": "discovery.fake.loader",
    "load_yaml": "discovery.fake.loader",
    "parse_machine": "discovery.fake.loader",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


MACHINES_DIR = Path(__file__).resolve().parent / "machines"


def list_machines() -> list[str]:
    """Names of the shipped machines, sorted."""
    return sorted(p.stem for p in MACHINES_DIR.glob("*.yaml"))


def machine_path(name: str) -> Path:
    """Path of a shipped machine's YAML file; ValueError for an unknown name."""
    path = MACHINES_DIR / f"{name}.yaml"
    if "/" in name or not path.is_file():
        raise ValueError(
            f"unknown fake machine {name!r} (shipped: {', '.join(list_machines())}; "
            "or give a path to a .yaml file)"
        )
    return path


def load_machine(name_or_path: str) -> MachineSpec:
    """Load a shipped machine by name, or any machine file by path."""
    candidate = Path(name_or_path)
    if name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path:
        if not candidate.is_file():
            raise ValueError(f"fake machine file {name_or_path!r} does not exist")
        return _load_file(candidate)
    return _load_file(machine_path(name_or_path))


def _load_file(path: Path) -> MachineSpec:
    from discovery.fake.loader import load_file

    return load_file(path)


def make_nvml(spec: MachineSpec, fail_init: bool = False) -> FakeNvml | None:
    """A fake pynvml for the machine's NVIDIA GPUs; None when it has none."""
    if not spec.nvidia_gpus():
        return None
    from discovery.fake.nvml import FakeNvml

    return FakeNvml(spec, fail_init=fail_init)


@dataclass
class FakeHost:
    root: Path
    """Filesystem root holding ``sys/``, ``proc/cpuinfo`` and ``etc/hostname``."""
    nvml: FakeNvml | None
    spec: MachineSpec


def scratch_dir() -> str | None:
    """``$TOPOSLICE_FAKE_TMPDIR``, else ``/dev/shm`` when writable (the trees are
    thousands of tiny files: several times faster on tmpfs), else the system default."""
    env = os.environ.get("TOPOSLICE_FAKE_TMPDIR")
    if env:
        return env
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return None


@contextmanager
def fake_host(
    name_or_path: str | MachineSpec, tmp_dir: str | os.PathLike[str] | None = None
) -> Iterator[FakeHost]:
    """Generate the machine's tree in a temporary directory, removed on exit."""
    from discovery.fake.sysfs_builder import build_sysfs

    spec = load_machine(name_or_path) if isinstance(name_or_path, str) else name_or_path
    parent = os.fspath(tmp_dir) if tmp_dir is not None else scratch_dir()
    tmp = Path(tempfile.mkdtemp(prefix=f"toposlice-fake-{spec.name}-", dir=parent))
    try:
        build_sysfs(spec, tmp)
        yield FakeHost(root=tmp, nvml=make_nvml(spec), spec=spec)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
