"""Kubelet plugin registration: ``pluginregistration.Registration`` on
``<registrar dir>/<driver name>-reg.sock``.

The kubelet finds the socket by inotify, calls ``GetInfo`` (1 s timeout; newer kubelets
poll it every 10 s and unregister after two failures, so it answers from memory and never
blocks), then ``NotifyRegistrationStatus``. The outcome is kept for ``/readyz``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from driver.kubelet.sockets import SocketServer, serve_unix
from driver.plumbing.gen import pluginregistration_pb2, pluginregistration_pb2_grpc

log = logging.getLogger("driver.registration")

PLUGIN_TYPE = "DRAPlugin"


def registration_socket(registrar_dir: str | os.PathLike[str], driver_name: str) -> Path:
    return Path(registrar_dir).absolute() / f"{driver_name}-reg.sock"


class Registrar(pluginregistration_pb2_grpc.RegistrationServicer):
    """The servicer and the registration outcome it recorded."""

    def __init__(self, driver_name: str, endpoint: str, supported_versions: Sequence[str]) -> None:
        if not supported_versions:
            raise ValueError("supported_versions must not be empty")
        self._info = pluginregistration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=driver_name,
            endpoint=endpoint,
            supported_versions=list(supported_versions),
        )
        self._cond = threading.Condition()
        self.registered = False
        self.error = ""
        self.notifications = 0
        self.socket: SocketServer | None = None

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._info

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self._cond:
            self.registered = bool(request.plugin_registered)
            self.error = "" if self.registered else (request.error or "rejected by kubelet")
            self.notifications += 1
            self._cond.notify_all()
        if self.registered:
            log.info("registered with the kubelet")
        else:
            log.error("kubelet rejected the plugin: %s", self.error)
        return pluginregistration_pb2.RegistrationStatusResponse()

    def wait_registered(self, timeout: float | None = None) -> bool:
        """Block until the kubelet reported success (True) or ``timeout`` passed."""
        with self._cond:
            return self._cond.wait_for(lambda: self.registered, timeout)

    def stop(self, grace: float | None = 1.0) -> None:
        """Remove the registration socket: the kubelet deregisters the plugin."""
        if self.socket is not None:
            self.socket.stop(grace)


def start_registration(
    registrar_dir: str | os.PathLike[str],
    driver_name: str,
    endpoint: str,
    supported_versions: Sequence[str],
) -> Registrar:
    registrar = Registrar(driver_name, endpoint, supported_versions)
    path = registration_socket(registrar_dir, driver_name)
    registrar.socket = serve_unix(
        path,
        lambda server: pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(
            registrar, server
        ),
        max_workers=4,
    )
    return registrar
