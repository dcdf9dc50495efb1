"""The DRA node service, v1 and v1beta1 with one handler: protobuf in, :class:`DriverState`
out. The two API versions have the same messages (v1 adds ``Device.share_id``), so one
class serves both, filling the response type of the version that was called.

Per-claim problems are per-claim ``error`` strings; a gRPC error status would make the
kubelet drop the whole response, so none is ever returned for them.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any, Protocol

import grpc

from driver.kubelet.checkpoint import PreparedDevice
from driver.kubelet.state import ClaimRef, PrepareResult
from driver.plumbing.gen import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc

log = logging.getLogger("driver.node_service")

#: Registration strings, preferred first (the kubelet takes the first it knows).
NODE_SERVICE_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


class ClaimState(Protocol):
    """What the handlers need from :class:`driver.kubelet.state.DriverState`."""

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]: ...

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]: ...


def _refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]


class NodeService:
    """One handler for both API versions; ``pb`` is the called version's message module."""

    def __init__(self, state: ClaimState) -> None:
        self.state = state

    def prepare(self, request: Any, pb: ModuleType) -> Any:
        refs = _refs(request)
        resp = pb.NodePrepareResourcesResponse()
        if not refs:
            return resp  # liveness probes send an empty request
        results = self.state.prepare(refs)
        for ref in refs:
            result = results.get(ref.uid) or PrepareResult(error="no result")
            entry = resp.claims[ref.uid]
            if result.error:
                entry.error = result.error
                continue
            for dev in result.devices:
                entry.devices.append(_device(pb, dev))
        return resp

    def unprepare(self, request: Any, pb: ModuleType) -> Any:
        refs = _refs(request)
        resp = pb.NodeUnprepareResourcesResponse()
        if not refs:
            return resp
        errors = self.state.unprepare(refs)
        for ref in refs:
            entry = resp.claims[ref.uid]  # touching the key records an empty success
            err = errors.get(ref.uid, "")
            if err:
                entry.error = err
        return resp


def _device(pb: ModuleType, dev: PreparedDevice) -> Any:
    out = pb.Device(
        request_names=list(dev.request_names),
        pool_name=dev.pool,
        device_name=dev.device,
        cdi_device_ids=list(dev.cdi_ids),
    )
    if dev.share_id is not None and pb is dra_v1_pb2:
        out.share_id = dev.share_id
    return out


class _Servicer:
    """The DRAPlugin servicer of one API version (the generated servicer bases only raise
    UNIMPLEMENTED; the registration helpers look the two methods up by name)."""

    def __init__(self, service: NodeService, pb: ModuleType) -> None:
        self.service = service
        self.pb = pb

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self.service.prepare(request, self.pb)

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self.service.unprepare(request, self.pb)


def add_node_service(server: grpc.Server, state: ClaimState) -> NodeService:
    """Register the v1 and v1beta1 DRAPlugin services, both backed by ``state``."""
    service = NodeService(state)
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(_Servicer(service, dra_v1_pb2), server)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
        _Servicer(service, dra_v1beta1_pb2), server
    )
    return service
