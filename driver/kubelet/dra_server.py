"""The DRA service socket ``<plugins dir>/dra.sock``: node service v1 + v1beta1 and, when a
health feed is given, the health service. Start it before registration, so the service
answers by the time the kubelet dials the endpoint it was told about."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from driver.interfaces import HealthFeed
from driver.kubelet.health_service import HEALTH_SERVICE_VERSIONS, HealthService, add_health_service
from driver.kubelet.node_service import NODE_SERVICE_VERSIONS, ClaimState, add_node_service
from driver.kubelet.sockets import SocketServer, serve_unix
from normalize.snapshot import Snapshot

DRA_SOCKET = "dra.sock"


@dataclass
class DraServer:
    socket: SocketServer
    endpoint: str
    """Absolute socket path: ``PluginInfo.endpoint``."""
    supported_versions: tuple[str, ...]
    """What registration advertises: node service first, health only when served."""
    health: HealthService | None = None

    def stop(self, grace: float | None = 5.0) -> None:
        """Stop accepting calls, finish in-flight ones within ``grace``, remove dra.sock."""
        self.socket.stop(grace)


def start_dra_server(
    plugins_dir: str | os.PathLike[str],
    state: ClaimState,
    health_feed: HealthFeed | None = None,
    *,
    snapshot_fn: Callable[[], Snapshot | None] | None = None,
    max_workers: int = 16,
    health_resend_interval: float | None = None,
) -> DraServer:
    path = Path(plugins_dir).absolute() / DRA_SOCKET
    health = None
    if health_feed is not None:
        kwargs = (
            {} if health_resend_interval is None else {"resend_interval": health_resend_interval}
        )
        health = HealthService(health_feed, snapshot_fn, **kwargs)

    def register(server: grpc.Server) -> None:
        add_node_service(server, state)
        if health is not None:
            add_health_service(server, health)

    sock = serve_unix(path, register, max_workers=max_workers)
    if health is not None:
        sock.on_stop = health.close
    versions = NODE_SERVICE_VERSIONS + (HEALTH_SERVICE_VERSIONS if health is not None else ())
    return DraServer(socket=sock, endpoint=str(path), supported_versions=versions, health=health)
