"""The dra-health service (v1alpha1, and v1 for kubelets >= 1.37): ``NodeWatchResources``.

The kubelet opens one stream per plugin and keeps it open. Every message carries the
*complete* device list; the kubelet stamps each device with the receive time and marks it
``Unknown`` when it is not re-sent within its timeout (30 s by default), so the stream
re-sends on every health change and on a heartbeat well inside that window.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import grpc

from driver.interfaces import DeviceHealth, HealthFeed
from driver.plumbing.gen import (
    drahealth_v1_pb2,
    drahealth_v1_pb2_grpc,
    drahealth_v1alpha1_pb2,
    drahealth_v1alpha1_pb2_grpc,
)
from normalize.snapshot import Snapshot

#: Registration strings; the gRPC service name *is* the registration string here.
HEALTH_SERVICE_VERSIONS = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
RESEND_INTERVAL_S = 10.0
"""Heartbeat; a third of the kubelet's default 30 s staleness timeout."""
MAX_MESSAGE = 1024
_POLL_S = 0.5


def _message(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


class HealthService:
    def __init__(
        self,
        feed: HealthFeed,
        snapshot_fn: Callable[[], Snapshot | None] | None = None,
        *,
        resend_interval: float = RESEND_INTERVAL_S,
    ) -> None:
        self.feed = feed
        self.snapshot_fn = snapshot_fn
        self.resend_interval = resend_interval
        self._closed = threading.Event()

    def close(self) -> None:
        """Let open streams end (server shutdown)."""
        self._closed.set()

    def devices(self) -> list[DeviceHealth]:
        """The feed's list, completed with ``Unknown`` for pool devices it does not name."""
        items = list(self.feed.current())
        snap = self.snapshot_fn() if self.snapshot_fn is not None else None
        if snap is not None:
            named = {(h.pool, h.device) for h in items}
            for dev in snap.devices:
                if (snap.pool, dev["name"]) not in named:
                    items.append(DeviceHealth(pool=snap.pool, device=dev["name"], status="Unknown"))
        return items

    def response(self, pb: ModuleType) -> Any:
        now = int(time.time())
        status = {"Healthy": pb.HEALTHY, "Unhealthy": pb.UNHEALTHY, "Unknown": pb.UNKNOWN}
        resp = pb.NodeWatchResourcesResponse()
        for h in self.devices():
            resp.devices.append(
                pb.DeviceHealth(
                    device=pb.DeviceIdentifier(pool_name=h.pool, device_name=h.device),
                    health=status.get(h.status, pb.UNKNOWN),
                    last_updated_time=now,
                    message=_message(h.reason),
                )
            )
        return resp

    def watch(self, context: grpc.ServicerContext, pb: ModuleType) -> Iterator[Any]:
        version = self.feed.wait_change(-1, 0.0)
        while context.is_active() and not self._closed.is_set():
            yield self.response(pb)
            deadline = time.monotonic() + self.resend_interval
            while context.is_active() and not self._closed.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                new = self.feed.wait_change(version, min(_POLL_S, left))
                if new != version:
                    version = new
                    break


class _Servicer:
    def __init__(self, service: HealthService, pb: ModuleType) -> None:
        self.service = service
        self.pb = pb

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        return self.service.watch(context, self.pb)


def add_health_service(server: grpc.Server, service: HealthService) -> None:
    drahealth_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
        _Servicer(service, drahealth_v1alpha1_pb2), server
    )
    drahealth_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
        _Servicer(service, drahealth_v1_pb2), server
    )
