"""The one small interface every vendor probe implements.

A probe turns vendor knowledge (NVML, sysfs attributes of one vendor's devices, KFD)
into devices of the inventory. Probes never raise on missing hardware or libraries:
they raise :class:`ProbeUnavailable`, and the registry records them as unavailable
so the others go on. Any other exception is caught by the registry and recorded as
an error with a warning -- a broken probe must never take the daemon down.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from discovery.model import Gpu, Inventory, Nic, NvSwitch
from discovery.root import Root


class ProbeUnavailable(Exception):
    """The probe's library or hardware is not present on this host."""


@dataclass
class ProbeContext:
    root: Root
    """The filesystem root the backends read (``root.sys``, ``root.proc``; ``root.live``
    says whether host libraries may be used)."""
    host: Inventory
    """What sysfs discovery already found (PCI tree, NUMA, CPUs, net, RDMA)."""
    nvml: Any | None = None
    """A pynvml-compatible module to use instead of importing ``pynvml`` (fake hardware)."""

    @property
    def live(self) -> bool:
        """True when ``root`` is the running host (libraries may be used)."""
        return self.root.live


@dataclass
class ProbeReport:
    gpus: list[Gpu] = field(default_factory=list)
    nics: list[Nic] = field(default_factory=list)
    nvswitches: list[NvSwitch] = field(default_factory=list)
    host: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    detail: str = ""


@runtime_checkable
class Probe(Protocol):
    name: str

    def probe(self, ctx: ProbeContext) -> ProbeReport: ...
