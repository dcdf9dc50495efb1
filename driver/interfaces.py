"""Contracts between the driver's parts, so each file can be built and tested on its own.

The daemon (``driver/daemon.py``) wires concrete implementations together:

- the node service (``driver/kubelet/node_service.py``) prepares claims through a
  :class:`ClaimReader` and reads device health from a :class:`HealthFeed`;
- the health monitor (``driver/health/monitor.py``) is the ``HealthFeed`` and tells the publisher
  which devices to taint;
- the HTTP server (``driver/exporter/http_server.py``) serves ``/healthz``, ``/readyz``, the
  exporter endpoints and ``/metrics`` from a :class:`ExporterView`.

Everything here is a plain Protocol or frozen dataclass: no I/O, no imports of the parts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from normalize.snapshot import Snapshot

HealthStatus = Literal["Healthy", "Unhealthy", "Unknown"]


class ClaimNotFound(LookupError):
    """The API server has no ResourceClaim of that namespace/name (or its UID differs)."""


class ClaimReader(Protocol):
    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The ResourceClaim in API JSON form (``metadata``, ``spec``, ``status``).

        Raises :class:`ClaimNotFound` when it does not exist; other errors (API server down)
        raise anything else and are reported per claim by the caller.
        """
        ...


@dataclass(frozen=True)
class DeviceHealth:
    """Health of one device of this driver's pool, as the health service streams it."""

    pool: str
    device: str
    status: HealthStatus
    reason: str = ""
    """Why, for people: ``XID 79``, ``carrier down``, ``behind failed PCIe switch 0000:19:00.0``."""
    fatal: bool = False
    """Fatal conditions taint ``NoExecute`` (evict), others ``NoSchedule``."""


class HealthFeed(Protocol):
    def current(self) -> list[DeviceHealth]:
        """Health of every device of the pool now (unknown devices: ``Unknown``)."""
        ...

    def wait_change(self, version: int, timeout: float) -> int:
        """Block until the health version differs from ``version`` or ``timeout`` seconds
        pass; return the current version. Streams call it in a loop and resend."""
        ...


@dataclass(frozen=True)
class DriverStatus:
    """What ``/readyz`` and the metrics report about the daemon's parts."""

    registered: bool = False
    publisher_synced: bool = False
    last_error: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)


class ExporterView(Protocol):
    """What the HTTP exporter reads; the daemon (or ``toposlice serve``) implements it."""

    def snapshot(self) -> Snapshot | None:
        """The newest snapshot, or None before the first discovery finished."""
        ...

    def status(self) -> DriverStatus: ...

    def allocated(self) -> Mapping[str, str]:
        """DRA device name -> claim UID for devices prepared on this node."""
        ...

    def health(self) -> list[DeviceHealth]: ...
