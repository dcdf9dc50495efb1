"""NVML XID events as health events, from an injected pynvml-compatible module.

The daemon is handed the module (``pynvml`` on a GPU host; nothing in fake mode) by the
command line, so ``driver/`` never imports NVML or a probe. One event set for all GPUs;
``poll`` waits on it in short slices so the daemon can stop promptly.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from discovery.nvml_codes import NVML_ERROR_CODES
from discovery.readers import normalize_bdf
from driver.health.monitor import HealthEvent, xid_event

log = logging.getLogger("toposlice.health")

#: ``nvmlEventTypeXidCriticalError`` in the NVML header.
EVENT_XID_CRITICAL = 0x0000000000000008
_TIMEOUT = NVML_ERROR_CODES["TIMEOUT"]


class NvmlXidSource:
    """An :class:`~driver.health.monitor.EventSource` over NVML's XID critical-error events."""

    def __init__(self, nvml: Any, bus_ids: Sequence[str]) -> None:
        self.nvml = nvml
        nvml.nvmlInit()
        self.event_set = nvml.nvmlEventSetCreate()
        self.watched: list[str] = []
        event_type = getattr(nvml, "nvmlEventTypeXidCriticalError", EVENT_XID_CRITICAL)
        for bus_id in bus_ids:
            try:
                handle = nvml.nvmlDeviceGetHandleByPciBusId(bus_id)
                nvml.nvmlDeviceRegisterEvents(handle, event_type, self.event_set)
            except nvml.NVMLError as exc:
                log.warning("no XID events for GPU %s: %s", bus_id, exc)
                continue
            self.watched.append(bus_id)

    def poll(self, timeout: float) -> list[HealthEvent]:
        try:
            data = self.nvml.nvmlEventSetWait_v2(self.event_set, max(1, int(timeout * 1000)))
        except self.nvml.NVMLError as exc:
            if getattr(exc, "value", None) != _TIMEOUT:
                log.warning("waiting for NVML events failed: %s", exc)
            return []
        try:
            pci = self.nvml.nvmlDeviceGetPciInfo(data.device)
            raw = pci.busId
            bus = normalize_bdf(raw.decode() if isinstance(raw, bytes) else str(raw))
            if bus is None:
                raise ValueError(f"bad bus id {raw!r}")
        except (self.nvml.NVMLError, ValueError, AttributeError) as exc:
            log.warning("XID %s on a GPU NVML cannot name: %s", data.eventData, exc)
            return []
        event = xid_event(f"gpu:{bus}", int(data.eventData))
        return [] if event is None else [event]

    def close(self) -> None:
        try:
            self.nvml.nvmlEventSetFree(self.event_set)
        except Exception:  # shutting down: nothing left to do about it
            log.debug("nvmlEventSetFree failed", exc_info=True)
