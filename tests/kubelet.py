"""The kubelet's side of a DRA plugin, for end-to-end tests and ``bench/driver.py``:
watch the registration directory, register the plugin as the kubelet's plugin manager
does, then prepare / unprepare claims and read the health stream over the unix sockets."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from driver.plumbing.gen import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    drahealth_v1alpha1_pb2,
    drahealth_v1alpha1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

NODE_SERVICES = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}


@dataclass
class Registered:
    info: Any
    version: str
    """The node-service string the kubelet picked (first known one, plugin's order)."""


def run_argv(
    base: Path,
    kubeconfig: Path,
    node: str,
    *extra: str,
    machine: str = "dgx-h100",
    cdi_root: Path | None = None,
) -> list[str]:
    """``toposlice run`` on a fake machine with every kubelet path under ``base``."""
    return [
        sys.executable,
        "-m",
        "toposlice",
        "run",
        "--fake",
        machine,
        "--node-name",
        node,
        "--kubeconfig",
        str(kubeconfig),
        "--kubelet-registrar-directory-path",
        str(base / "reg"),
        "--kubelet-plugins-directory-path",
        str(base / "plug"),
        "--cdi-root",
        str(cdi_root or base / "cdi"),
        "--state-dir",
        str(base / "state"),
        *extra,
    ]


def wait_for(cond: Callable[[], object], timeout: float = 20.0) -> bool:
    """Poll ``cond`` until it is true or ``timeout`` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return bool(cond())


def wait_for_socket(path: Path, timeout: float, poll: float = 0.002) -> float:
    """Seconds until ``path`` exists (the kubelet learns of it through inotify)."""
    start = time.monotonic()
    while not path.exists():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(poll)
    return time.monotonic() - start


def register_retrying(reg_socket: Path, within: float) -> Registered:
    """:func:`register`, retried while the socket refuses (a stale file left by a killed
    instance, not replaced yet): the kubelet's plugin manager retries the same way."""
    deadline = time.monotonic() + within
    while True:
        try:
            return register(reg_socket)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def register(reg_socket: Path, timeout: float = 1.0) -> Registered:
    """GetInfo (1 s, as the kubelet), pick the version, NotifyRegistrationStatus(true)."""
    with grpc.insecure_channel(f"unix://{reg_socket}") as ch:
        stub = pluginregistration_pb2_grpc.RegistrationStub(ch)
        info = stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=timeout)
        if info.type != "DRAPlugin":
            raise RuntimeError(f"not a DRA plugin: {info.type!r}")
        version = next((v for v in info.supported_versions if v in NODE_SERVICES), None)
        if version is None:
            stub.NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(
                    plugin_registered=False, error="no supported version"
                ),
                timeout=timeout,
            )
            raise RuntimeError(f"no known version in {list(info.supported_versions)}")
        stub.NotifyRegistrationStatus(
            pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=timeout
        )
        return Registered(info, version)


class NodeClient:
    """One open connection to ``dra.sock`` speaking one node-service version."""

    def __init__(self, endpoint: str, version: str = "v1.DRAPlugin") -> None:
        self.pb, grpc_mod = NODE_SERVICES[version]
        self.channel = grpc.insecure_channel(f"unix://{endpoint}")
        self.stub = grpc_mod.DRAPluginStub(self.channel)

    def claims(self, refs: list[tuple[str, str, str]]) -> list[Any]:
        return [self.pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in refs]

    def prepare(self, refs: list[tuple[str, str, str]], timeout: float = 45) -> Any:
        req = self.pb.NodePrepareResourcesRequest(claims=self.claims(refs))
        return self.stub.NodePrepareResources(req, timeout=timeout)

    def unprepare(self, refs: list[tuple[str, str, str]], timeout: float = 45) -> Any:
        req = self.pb.NodeUnprepareResourcesRequest(claims=self.claims(refs))
        return self.stub.NodeUnprepareResources(req, timeout=timeout)

    def health(self, timeout: float = 30) -> Any:
        stub = drahealth_v1alpha1_pb2_grpc.DRAResourceHealthStub(self.channel)
        return stub.NodeWatchResources(
            drahealth_v1alpha1_pb2.NodeWatchResourcesRequest(), timeout=timeout
        )

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def allocated_claim(
    name: str,
    devices: list[str],
    *,
    pool: str,
    driver: str,
    namespace: str = "default",
    request: str = "req",
) -> dict[str, Any]:
    """A ResourceClaim as the scheduler leaves it: allocated, reserved for a pod."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": request, "exactly": {"deviceClassName": "x"}}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": request, "driver": driver, "pool": pool, "device": d}
                        for d in devices
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "pod-" + name, "uid": "pod-uid-" + name}],
        },
    }
