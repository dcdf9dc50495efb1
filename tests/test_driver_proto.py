"""The kubelet-facing protos: wire names and field numbers as upstream, stubs in sync."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf.descriptor import FieldDescriptor

from driver.plumbing.gen import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    drahealth_v1_pb2,
    drahealth_v1alpha1_pb2,
    pluginregistration_pb2,
)

REPO = Path(__file__).resolve().parent.parent

S, B, I64, MSG, ENUM = "string", "bool", "int64", "message", "enum"
REP, MAP, OPT = "repeated", "map", "optional"

# Transcribed from ../shared/reference/kubelet-plugin-api.md (sections 3-5):
# message -> [(field, number, type, label)]
REGISTRATION = {
    "PluginInfo": [
        ("type", 1, S, ""),
        ("name", 2, S, ""),
        ("endpoint", 3, S, ""),
        ("supported_versions", 4, S, REP),
    ],
    "RegistrationStatus": [("plugin_registered", 1, B, ""), ("error", 2, S, "")],
    "InfoRequest": [],
    "RegistrationStatusResponse": [],
}
DRA_V1BETA1 = {
    "NodePrepareResourcesRequest": [("claims", 1, MSG, REP)],
    "NodePrepareResourcesResponse": [("claims", 1, MSG, MAP)],
    "NodePrepareResourceResponse": [("devices", 1, MSG, REP), ("error", 2, S, "")],
    "Device": [
        ("request_names", 1, S, REP),
        ("pool_name", 2, S, ""),
        ("device_name", 3, S, ""),
        ("cdi_device_ids", 4, S, REP),
    ],
    "NodeUnprepareResourcesRequest": [("claims", 1, MSG, REP)],
    "NodeUnprepareResourcesResponse": [("claims", 1, MSG, MAP)],
    "NodeUnprepareResourceResponse": [("error", 1, S, "")],
    "Claim": [("namespace", 1, S, ""), ("uid", 2, S, ""), ("name", 3, S, "")],
}
DRA_V1 = {**DRA_V1BETA1, "Device": [*DRA_V1BETA1["Device"], ("share_id", 5, S, OPT)]}
HEALTH = {
    "NodeWatchResourcesRequest": [],
    "DeviceIdentifier": [("pool_name", 1, S, ""), ("device_name", 2, S, "")],
    "DeviceHealth": [
        ("device", 1, MSG, ""),
        ("health", 2, ENUM, ""),
        ("last_updated_time", 3, I64, ""),
        ("health_check_timeout_seconds", 4, I64, ""),
        ("message", 5, S, ""),
    ],
    "NodeWatchResourcesResponse": [("devices", 1, MSG, REP)],
}
# module, package, {service: [(method, request, response, server streaming)]}
SERVICES = [
    (
        pluginregistration_pb2,
        "pluginregistration",
        REGISTRATION,
        {
            "Registration": [
                ("GetInfo", "InfoRequest", "PluginInfo", False),
                (
                    "NotifyRegistrationStatus",
                    "RegistrationStatus",
                    "RegistrationStatusResponse",
                    False,
                ),
            ]
        },
    ),
    *[
        (
            mod,
            f"k8s.io.kubelet.pkg.apis.dra.{ver}",
            table,
            {
                "DRAPlugin": [
                    (
                        "NodePrepareResources",
                        "NodePrepareResourcesRequest",
                        "NodePrepareResourcesResponse",
                        False,
                    ),
                    (
                        "NodeUnprepareResources",
                        "NodeUnprepareResourcesRequest",
                        "NodeUnprepareResourcesResponse",
                        False,
                    ),
                ]
            },
        )
        for mod, ver, table in (
            (dra_v1_pb2, "v1", DRA_V1),
            (dra_v1beta1_pb2, "v1beta1", DRA_V1BETA1),
        )
    ],
    *[
        (
            mod,
            ver,
            HEALTH,
            {
                "DRAResourceHealth": [
                    (
                        "NodeWatchResources",
                        "NodeWatchResourcesRequest",
                        "NodeWatchResourcesResponse",
                        True,
                    )
                ]
            },
        )
        for mod, ver in ((drahealth_v1alpha1_pb2, "v1alpha1"), (drahealth_v1_pb2, "v1"))
    ],
]

_TYPES = {
    FieldDescriptor.TYPE_STRING: S,
    FieldDescriptor.TYPE_BOOL: B,
    FieldDescriptor.TYPE_INT64: I64,
    FieldDescriptor.TYPE_MESSAGE: MSG,
    FieldDescriptor.TYPE_ENUM: ENUM,
}


def _label(field: FieldDescriptor) -> str:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return MAP
    if field.is_repeated:
        return REP
    if field.has_presence and field.containing_oneof is not None:
        return OPT  # proto3 optional is a synthetic oneof
    return ""


@pytest.mark.parametrize("entry", SERVICES, ids=lambda e: e[1])
def test_messages_match_reference(entry: tuple) -> None:
    mod, package, messages, _ = entry
    assert mod.DESCRIPTOR.package == package
    assert set(mod.DESCRIPTOR.message_types_by_name) == set(messages)
    for name, fields in messages.items():
        desc = mod.DESCRIPTOR.message_types_by_name[name]
        got = [(f.name, f.number, _TYPES[f.type], _label(f)) for f in desc.fields]
        assert got == fields, name


@pytest.mark.parametrize("entry", SERVICES, ids=lambda e: e[1])
def test_services_match_reference(entry: tuple) -> None:
    mod, package, _, services = entry
    assert set(mod.DESCRIPTOR.services_by_name) == set(services)
    for svc_name, methods in services.items():
        svc = mod.DESCRIPTOR.services_by_name[svc_name]
        assert svc.full_name == f"{package}.{svc_name}"
        got = [
            (
                m.name,
                m.input_type.name,
                m.output_type.name,
                bool(m.server_streaming),
            )
            for m in svc.methods
        ]
        assert got == methods
        assert not any(m.client_streaming for m in svc.methods)


def test_health_enum_values() -> None:
    for mod in (drahealth_v1alpha1_pb2, drahealth_v1_pb2):
        enum = mod.DESCRIPTOR.enum_types_by_name["HealthStatus"]
        assert {v.name: v.number for v in enum.values} == {
            "UNKNOWN": 0,
            "HEALTHY": 1,
            "UNHEALTHY": 2,
        }


def test_full_method_paths() -> None:
    """The grpc stubs dial exactly the paths the kubelet uses."""
    src = (REPO / "driver" / "plumbing" / "gen" / "dra_v1_pb2_grpc.py").read_text()
    assert "'/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources'" in src
    src = (REPO / "driver" / "plumbing" / "gen" / "pluginregistration_pb2_grpc.py").read_text()
    assert "'/pluginregistration.Registration/GetInfo'" in src
    src = (REPO / "driver" / "plumbing" / "gen" / "drahealth_v1alpha1_pb2_grpc.py").read_text()
    assert "'/v1alpha1.DRAResourceHealth/NodeWatchResources'" in src


# Version stamps change with the installed grpcio-tools, not with the protos.
_STAMPS = [
    re.compile(r"^# Protobuf Python Version: .*$", re.MULTILINE),
    re.compile(r"^GRPC_GENERATED_VERSION = .*$", re.MULTILINE),
    re.compile(
        r"_runtime_version\.ValidateProtobufRuntimeVersion\(.*?\)", re.MULTILINE | re.DOTALL
    ),
]


def _unstamped(text: str) -> str:
    for pattern in _STAMPS:
        text = pattern.sub("<stamp>", text)
    return text


def _load_gen_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_protos", REPO / "hack" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_protos"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_committed_stubs_match_protos(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    gen = _load_gen_script()
    written = gen.generate(tmp_path)
    committed = sorted(p.name for p in (REPO / "driver" / "plumbing" / "gen").glob("*.py"))
    assert [p.name for p in written] == committed
    for path in written:
        fresh = _unstamped(path.read_text(encoding="utf-8"))
        old = _unstamped(
            (REPO / "driver" / "plumbing" / "gen" / path.name).read_text(encoding="utf-8")
        )
        assert fresh == old, (
            f"driver/plumbing/gen/{path.name} is stale: run python3 hack/gen_protos.py"
        )
