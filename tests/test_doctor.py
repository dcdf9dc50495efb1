"""``toposlice doctor`` and the cross-driver report on the foreign slices of ``dgx-h100``
(tests/data/foreign-slices/README.md lists the planted defects)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from driver.publisher.observe import load_slice_files, registered_drivers
from normalize.crossdriver import normalization_report, registered_driver
from normalize.options import NormalizeOptions
from normalize.slices import build_slices
from tests.exporter_view import FOREIGN_SLICE_FILES, foreign_api, snapshot_of
from tests.kubeapi import KubeAPIServer
from toposlice.cli import main

FILES = FOREIGN_SLICE_FILES
ON_NODE = "gpu.nvidia.com,dra.net,dra.cpu"
PCIE = "resource.kubernetes.io/pcieRoot"
BUS = "resource.kubernetes.io/pciBusID"
NUMA = "resource.kubernetes.io/numaNode"
NUMA_LIST = NormalizeOptions(numa_list=True)

GPU_BUS = ["1b", "43", "52", "61", "9d", "c3", "d1", "df"]
EXPECTED_VERTEX = {
    **{("gpu.nvidia.com", f"gpu-{i}"): f"gpu:0000:{b}:00.0" for i, b in enumerate(GPU_BUS)},
    ("dra.net", "ibp24s0"): "nic:0000:18:00.0",
    ("dra.net", "enp41s0f0np0"): "nic:0000:29:00.0",
    ("dra.net", "enp41s0f1np1"): "nic:0000:29:00.1",
    ("dra.net", "ibp64s0"): "nic:0000:40:00.0",
    ("dra.net", "ibp79s0"): "nic:0000:4f:00.0",
    ("dra.net", "ibp94s0"): "nic:0000:5e:00.0",
    ("dra.net", "ibp154s0"): "nic:0000:9a:00.0",
    ("dra.net", "enp170s0f0np0"): "nic:0000:aa:00.0",
    ("dra.net", "enp170s0f1np1"): "nic:0000:aa:00.1",
    ("dra.net", "rdma-mlx5-9"): "nic:0000:c0:00.0",
    ("dra.net", "ibp206s0"): "nic:0000:ce:00.0",
    ("dra.net", "ibp220s0"): "nic:0000:dc:00.0",
    ("dra.cpu", "cpudevnuma000"): "cpu_group:cpu-numa0",
    ("dra.cpu", "cpudevnuma001"): "cpu_group:cpu-numa1",
    ("sriovnetwork.example.com", "vf-0"): None,
}
EXPECTED_BY = {
    ("gpu.nvidia.com", "gpu-5"): "uuid",
    ("dra.net", "enp170s0f0np0"): "netdev",
    ("dra.net", "rdma-mlx5-9"): "rdma",
    ("dra.cpu", "cpudevnuma000"): "name",
}
PLANTED = {
    ("gpu.nvidia.com", "gpu-2", "disagrees-with-hardware", PCIE),
    ("gpu.nvidia.com", "gpu-4", "invalid-standard-value", BUS),
    ("gpu.nvidia.com", "gpu-5", "missing-standard-attribute", BUS),
    ("gpu.nvidia.com", "gpu-5", "missing-standard-attribute", PCIE),
    ("gpu.nvidia.com", "gpu-6", "pciBusID-without-pcieRoot", PCIE),
    ("gpu.nvidia.com", "gpu-7", "look-alike-attribute", "gpu.nvidia.com/numa"),
    ("gpu.nvidia.com", "gpu-0", "missing-standard-attribute", NUMA),
    ("dra.net", "ibp79s0", "disagrees-with-hardware", NUMA),
    ("dra.cpu", None, "dialect", "dra.net/numaNode"),
    ("dra.net", None, "dialect", "dra.net/numaNode"),
    ("dra.net", "enp170s0f0np0", "missing-standard-attribute", BUS),
    ("dra.net", "rdma-mlx5-9", "missing-standard-attribute", BUS),
    (
        "dra.cpu",
        "cpudevnuma000",
        "cpu-pcieRoot-wider-than-pinned",
        PCIE,
    ),
    ("dra.cpu", None, "scalar-vs-list", PCIE),
    ("gpu.nvidia.com", None, "scalar-vs-list", PCIE),
    ("sriovnetwork.example.com", None, "driver-not-on-node", None),
    ("sriovnetwork.example.com", "vf-0", "unmatched-device", None),
}
# Correct values that must not be flagged (an alias beside the standard name included).
NOT_FLAGGED = {
    ("dra.net", "enp41s0f0np0", "look-alike-attribute"),
    ("dra.net", "ibp24s0", "look-alike-attribute"),
    ("gpu.nvidia.com", "gpu-1", "disagrees-with-hardware"),
    ("dra.net", "ibp64s0", "disagrees-with-hardware"),
    ("dra.cpu", "cpudevnuma001", "cpu-pcieRoot-wider-than-pinned"),
}

#: What the observe report of the planted slices says of their devices and drivers
#: (``/v1/normalization`` of ``serve --observe``): 23 devices, all matched but the VF
#: of the SR-IOV driver that is not on this node.
OBSERVED_SUMMARY = {"devices": 23, "matched": 22}
OBSERVED_ON_NODE = {
    "dra.cpu": True,
    "dra.net": True,
    "gpu.nvidia.com": True,
    "sriovnetwork.example.com": False,
}


def assert_observed_planted(norm: dict) -> None:
    """The observe report of the planted slices counts and places them as they are."""
    summary = {k: norm["summary"][k] for k in OBSERVED_SUMMARY}
    assert summary == OBSERVED_SUMMARY
    assert {d["driver"]: d["on_node"] for d in norm["drivers"]} == OBSERVED_ON_NODE


def keys(report: dict) -> set[tuple]:
    return {
        (f["driver"], f.get("device"), f["check"], f.get("attribute")) for f in report["findings"]
    }


def run_doctor(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict]:
    rc = main(["doctor", "--fake", "dgx-h100", "-o", "json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_doctor_on_slice_files_flags_every_planted_defect(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [a for f in FILES for a in ("--slices", f)]
    rc, report = run_doctor(capsys, *args, "--drivers", ON_NODE)
    assert rc == 1
    found = keys(report)
    assert PLANTED <= found, PLANTED - found
    short = {(d, dev, c) for d, dev, c, _a in found}
    assert not NOT_FLAGGED & short
    assert ("gpu.nvidia.com", "gpu-6", "missing-standard-attribute", PCIE) not in found
    got = {(d["driver"], d["device"]): d["vertex"] for d in report["devices"]}
    assert got == EXPECTED_VERTEX  # generation-1 leftovers (dra.net gone-0) are ignored
    by = {(d["driver"], d["device"]): d.get("matched_by") for d in report["devices"]}
    for key, how in EXPECTED_BY.items():
        assert by[key] == how, key
    drivers = {d["driver"]: d for d in report["drivers"]}
    assert drivers["sriovnetwork.example.com"]["on_node"] is False
    assert drivers["dra.net"]["on_node"] is True and drivers["dra.net"]["matched"] == 12
    text_rc = main(["doctor", "--fake", "dgx-h100", *args, "--drivers", ON_NODE])
    table = capsys.readouterr().out
    assert text_rc == 1 and "pciBusID-without-pcieRoot" in table and "NO" in table


def test_doctor_is_quiet_on_clean_slices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = snapshot_of("dgx-h100")
    own = tmp_path / "own.yaml"
    own.write_text(yaml.safe_dump_all(build_slices(snap.inventory, "dgx-h100")))
    rc, report = run_doctor(capsys, "--slices", str(own), "--drivers", "toposlice.dev")
    assert report["findings"] == [] and rc == 0
    assert report["summary"]["matched"] == report["summary"]["devices"] == 22
    # The list form (CPU pcieRoot lists next to GPU/NIC scalars) is one driver's own mix.
    listed = tmp_path / "listed.yaml"
    listed.write_text(yaml.safe_dump_all(build_slices(snap.inventory, "dgx-h100", NUMA_LIST)))
    rc, report = run_doctor(capsys, "--slices", str(listed), "--numa-list")
    assert report["findings"] == [] and rc == 0
    # Only the NVIDIA slice: warnings and errors; --fail-on error still fails on errors.
    nvidia = next(f for f in FILES if f.endswith("/nvidia-gpu.yaml"))
    rc, report = run_doctor(capsys, "--slices", nvidia, "--fail-on", "error")
    assert rc == 1 and report["summary"]["errors"] == 3


def test_doctor_needs_a_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--fake", "dgx-h100"]) == 2
    assert "--kubeconfig or --slices" in capsys.readouterr().err


@pytest.fixture
def api() -> Iterator[KubeAPIServer]:
    with foreign_api() as server:
        yield server


def test_doctor_from_a_kubeconfig_and_plugin_registry(
    api: KubeAPIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    registry = tmp_path / "plugins_registry"
    registry.mkdir()
    for name in (
        "gpu.nvidia.com-reg.sock",
        "dra.net-reg.sock",
        "dra.cpu-3f1c2a7e-1b2c-4d5e-8f90-123456789abc-reg.sock",
    ):
        (registry / name).touch()
    rc, report = run_doctor(
        capsys, "--kubeconfig", str(kubeconfig), "--plugins-registry", str(registry)
    )
    assert rc == 1
    assert PLANTED <= keys(report)
    assert {(d["driver"], d["device"]): d["vertex"] for d in report["devices"]} == EXPECTED_VERTEX
    assert api.count("list", "resourceslices") >= 1


def test_registered_driver_names() -> None:
    assert registered_driver("gpu.nvidia.com-reg.sock") == "gpu.nvidia.com"
    assert registered_driver("dra.cpu-3f1c2a7e-1b2c-4d5e-8f90-123456789abc-reg.sock") == "dra.cpu"
    assert registered_driver("dra-AbCdEfGhIjKlMnOp-reg.sock") is None  # hashed: ask GetInfo
    assert registered_driver(".hidden-reg.sock") is None
    assert registered_drivers("/nonexistent/dir") is None


def test_report_on_another_node_sees_nothing() -> None:
    snap = snapshot_of("dgx-h100")
    report = normalization_report(snap, load_slice_files(FILES), node="other-node")
    assert report.matches == [] and report.findings == []


def test_hashed_registration_socket_is_asked_its_name() -> None:
    # pytest's tmp paths (longer under xdist) can exceed the 107-byte AF_UNIX limit.
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ts-") as short:
        _registration_socket_is_asked(Path(short))


def _registration_socket_is_asked(tmp_path: Path) -> None:
    from concurrent import futures

    import grpc

    from driver.plumbing.gen import pluginregistration_pb2 as pb
    from driver.plumbing.gen import pluginregistration_pb2_grpc as pb_grpc

    class Registration(pb_grpc.RegistrationServicer):
        def GetInfo(self, request: pb.InfoRequest, context: grpc.ServicerContext) -> pb.PluginInfo:
            return pb.PluginInfo(type="DRAPlugin", name="gpu.nvidia.com", endpoint="/x.sock")

    registry = tmp_path / "reg"
    registry.mkdir()
    sock = registry / "dra-Zm9vYmFyYmF6cXV4-reg.sock"
    server = grpc.server(futures.ThreadPoolExecutor(1))
    pb_grpc.add_RegistrationServicer_to_server(Registration(), server)
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:
        (registry / "dra.net-reg.sock").touch()
        (registry / "dra-deadbeefdeadbeef-reg.sock").touch()  # nobody listening: skipped
        assert registered_drivers(registry) == {"gpu.nvidia.com", "dra.net"}
    finally:
        server.stop(0)


def test_doctor_reports_gpus_without_a_vendor_cdi_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The node's vendor CDI gap (discovery/vendor_cdi.py), one warning per GPU whose kernel
    driver is bound; a spec file the runtime would skip is named too."""
    from tests import vendor_specs

    snap = snapshot_of("dgx-h100")
    own = tmp_path / "own.yaml"
    own.write_text(yaml.safe_dump_all(build_slices(snap.inventory, "dgx-h100")))
    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir()
    base = ["--slices", str(own), "--drivers", "toposlice.dev", "--cdi-spec-dirs", str(cdi_dir)]
    rc, report = run_doctor(capsys, *base)
    found = [f for f in report["findings"] if f["check"] == "vendor-cdi-missing"]
    assert rc == 1 and len(found) == 8 == len(report["findings"])
    assert {f["device"] for f in found} == {g.bus_id for g in snap.inventory.gpus}
    assert all(f["driver"] == "nvidia.com/gpu" for f in found)
    assert "no nvidia.com/gpu spec in" in found[0]["message"]
    spec = vendor_specs.nvidia_ctk_spec(snap.inventory, dev_root="/run/nvidia/driver")
    vendor_specs.write(cdi_dir / "nvidia.yaml", spec)
    (cdi_dir / "broken.json").write_text('{"cdiVersion": "0.5.0"}')
    rc, report = run_doctor(capsys, *base)
    (only,) = report["findings"]
    assert rc == 1 and "broken.json: skipped: missing kind" in only["message"]
    (cdi_dir / "broken.json").unlink()
    rc, report = run_doctor(capsys, *base)
    assert rc == 0 and report["findings"] == []
    # Off for fake machines unless asked for.
    rc, report = run_doctor(capsys, "--slices", str(own), "--drivers", "toposlice.dev")
    assert rc == 0
