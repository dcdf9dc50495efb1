"""NvidiaProbe against small in-test pynvml fakes (no GPU, no NVML library needed)."""

from __future__ import annotations

import ctypes
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from discovery.model import Inventory, PciDevice
from discovery.root import Root
from plugins.base import ProbeContext, ProbeReport, ProbeUnavailable
from plugins.nvidia import MAX_NVLINKS, NvidiaProbe
from plugins.pci_accel import PciAcceleratorProbe
from plugins.registry import apply_reports, run_probes
from tests.conftest import examples

NOT_SUPPORTED = 3
INVALID_ARGUMENT = 2
GPU_IS_LOST = 15
UNKNOWN = 999
CLUSTER = uuid.UUID("1b2c3d4e-5f60-4718-893a-abcdef012345")


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"fake NVML error {value}")
        self.value = value


@dataclass
class FakeLink:
    state: int = 1
    version: int = 6
    remote_bus: str = "00000000:00:00.0"
    remote_type: int = 0


@dataclass
class FakeGpu:
    bus: str
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    minor: int = 0
    memory: int = 85899345920
    cc: tuple[int, int] = (9, 0)
    arch: int = 9
    mig: tuple[int, int] = (0, 0)
    numa: int | None = None
    links: list[FakeLink] = field(default_factory=list)
    fabric: dict[str, Any] | None = None


class FakeNvml:
    """Builds a pynvml-like namespace; ``fail`` maps function name -> NVML error code."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        fail: dict[str, int] | None = None,
        driver: str | bytes = "550.54.15",
        endless_links: bool = False,
    ) -> None:
        self.gpus = gpus
        self.fail = dict(fail or {})
        self.driver = driver
        self.endless_links = endless_links
        self.calls: list[str] = []

    def _check(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise FakeNVMLError(self.fail[name])

    def _gpu(self, handle: Any) -> FakeGpu:
        return self.gpus[handle]

    def _link(self, handle: int, link: int) -> FakeLink:
        gpu = self._gpu(handle)
        if self.endless_links:
            return FakeLink(remote_bus="00000000:05:00.0", remote_type=2)
        if not gpu.links:
            raise FakeNVMLError(NOT_SUPPORTED)
        if link >= len(gpu.links):
            raise FakeNVMLError(INVALID_ARGUMENT)
        return gpu.links[link]

    def module(self) -> SimpleNamespace:
        m = SimpleNamespace(NVMLError=FakeNVMLError, NVML_NVLINK_MAX_LINKS=36)

        def fn(name: str, body: Any) -> None:
            def wrapper(*args: Any) -> Any:
                self._check(name)
                return body(*args)

            setattr(m, name, wrapper)

        fn("nvmlInit", lambda: None)
        fn("nvmlShutdown", lambda: None)
        fn("nvmlDeviceGetCount", lambda: len(self.gpus))
        fn("nvmlSystemGetDriverVersion", lambda: self.driver)
        fn("nvmlDeviceGetHandleByIndex", lambda i: i)
        fn(
            "nvmlDeviceGetPciInfo",
            lambda h: SimpleNamespace(busId=self._gpu(h).bus.encode(), domain=0),
        )
        fn("nvmlDeviceGetUUID", lambda h: self._gpu(h).uuid)
        fn("nvmlDeviceGetName", lambda h: self._gpu(h).name.encode())
        fn("nvmlDeviceGetMinorNumber", lambda h: self._gpu(h).minor)
        fn(
            "nvmlDeviceGetMemoryInfo",
            lambda h: SimpleNamespace(total=self._gpu(h).memory, free=0, used=0),
        )
        fn("nvmlDeviceGetCudaComputeCapability", lambda h: self._gpu(h).cc)
        fn("nvmlDeviceGetArchitecture", lambda h: self._gpu(h).arch)
        fn("nvmlDeviceGetMigMode", lambda h: list(self._gpu(h).mig))

        def numa(h: int) -> int:
            value = self._gpu(h).numa
            if value is None:
                raise FakeNVMLError(NOT_SUPPORTED)
            return value

        fn("nvmlDeviceGetNumaNodeId", numa)
        fn("nvmlDeviceGetNvLinkState", lambda h, link: self._link(h, link).state)
        fn("nvmlDeviceGetNvLinkVersion", lambda h, link: self._link(h, link).version)
        fn(
            "nvmlDeviceGetNvLinkRemotePciInfo",
            lambda h, link: SimpleNamespace(busId=self._link(h, link).remote_bus.encode()),
        )
        fn("nvmlDeviceGetNvLinkRemoteDeviceType", lambda h, link: self._link(h, link).remote_type)

        def fabric(h: int, ref: Any) -> int:
            info = self._gpu(h).fabric
            if info is None:
                raise FakeNVMLError(NOT_SUPPORTED)
            target = getattr(ref, "_obj", ref)
            for key, value in info.items():
                setattr(target, key, value)
            return 0

        fn("nvmlDeviceGetGpuFabricInfoV", fabric)
        return m


def fabric_info(state: int = 3, clique: int = 7, health: int = 1) -> dict[str, Any]:
    return {
        "clusterUuid": CLUSTER.bytes,
        "status": 0,
        "cliqueId": clique,
        "state": state,
        "healthSummary": health,
    }


def two_gpus() -> list[FakeGpu]:
    return [
        FakeGpu(
            bus="00000000:1B:00.0",
            uuid="GPU-11111111-2222-3333-4444-555555555555",
            minor=0,
            links=[
                FakeLink(version=6, remote_bus="00000000:05:00.0", remote_type=2),
                FakeLink(version=6, remote_bus="00000000:43:00.0", remote_type=0),
                FakeLink(state=0),
                FakeLink(version=7, remote_bus="00000000:99:00.0", remote_type=0xFF),
            ],
            fabric=fabric_info(),
        ),
        FakeGpu(
            bus="00000000:43:00.0",
            uuid="GPU-66666666-7777-8888-9999-000000000000",
            minor=1,
            mig=(1, 1),
            numa=2,
            links=[FakeLink(version=6, remote_bus="00000000:1B:00.0", remote_type=0)],
            fabric=fabric_info(),
        ),
    ]


def host(with_nvidia: bool = True) -> Inventory:
    inv = Inventory()
    inv.pci_devices = [
        PciDevice(bus_id="0000:02:00.0", class_code="0x0300", vendor="0x1a03", device="0x2000"),
        PciDevice(bus_id="0000:05:00.0", class_code="0x0680", vendor="0x10de", device="0x22a3"),
        PciDevice(bus_id="0000:06:00.0", class_code="0x0680", vendor="0x10de", device="0x9999"),
    ]
    if with_nvidia:
        inv.pci_devices += [
            PciDevice(bus_id="0000:1b:00.0", class_code="0x0302", vendor="0x10de", device="0x2330"),
            PciDevice(bus_id="0000:43:00.0", class_code="0x0302", vendor="0x10de", device="0x2330"),
        ]
    return inv


def run(nvml: Any, inv: Inventory | None = None) -> ProbeReport:
    ctx = ProbeContext(root=Root(Path("/nonexistent")), host=inv or host(), nvml=nvml)
    return NvidiaProbe().probe(ctx)


def test_two_gpus_with_nvlink_and_fabric() -> None:
    fake = FakeNvml(two_gpus())
    report = run(fake.module())

    assert report.warnings == []
    assert [g.bus_id for g in report.gpus] == ["0000:1b:00.0", "0000:43:00.0"]
    g0, g1 = report.gpus
    assert (g0.vendor, g0.probe, g0.index) == ("nvidia", "nvidia", 0)
    assert g0.uuid == "GPU-11111111-2222-3333-4444-555555555555"
    assert g0.model == "NVIDIA H100 80GB HBM3"
    assert g0.minor == 0 and g1.minor == 1
    assert g0.memory_bytes == 85899345920
    assert g0.compute_capability == "9.0"
    assert g0.architecture == "hopper"
    assert g0.driver_version == "550.54.15"
    assert g0.mig_mode is False and g1.mig_mode is True
    assert g0.memory_numa_node is None and g1.memory_numa_node == 2

    assert [link.link for link in g0.nvlinks] == [0, 1, 3]
    sw, peer, odd = g0.nvlinks
    assert (sw.remote_type, sw.remote_bus_id, sw.version, sw.bandwidth_gbps) == (
        "switch",
        "0000:05:00.0",
        "4.0",
        25.0,
    )
    assert (peer.remote_type, peer.remote_bus_id) == ("gpu", "0000:43:00.0")
    assert (odd.remote_type, odd.version, odd.bandwidth_gbps) == ("unknown", "5.0", 50.0)
    assert g1.nvlinks[0].remote_bus_id == "0000:1b:00.0"

    assert g0.fabric is not None
    assert g0.fabric.state == "completed"
    assert g0.fabric.cluster_uuid == str(CLUSTER)
    assert g0.fabric.clique_id == 7
    assert g0.fabric.health == "healthy"
    assert g0.fabric.clique == f"{CLUSTER}.7"

    assert [(s.bus_id, s.model, s.probe) for s in report.nvswitches] == [
        ("0000:05:00.0", "NVSwitch (H100 gen)", "nvidia"),
        ("0000:06:00.0", None, "nvidia"),
    ]
    assert report.detail == "2 GPUs, 2 NVSwitches, driver 550.54.15"
    assert fake.calls.count("nvmlInit") == 1
    assert fake.calls.count("nvmlShutdown") == 1


def test_optional_errors_give_partial_gpus_and_one_warning_per_kind() -> None:
    fail = {
        "nvmlDeviceGetMemoryInfo": UNKNOWN,
        "nvmlDeviceGetNumaNodeId": GPU_IS_LOST,
        "nvmlDeviceGetGpuFabricInfoV": UNKNOWN,
        "nvmlDeviceGetNvLinkRemotePciInfo": UNKNOWN,
        "nvmlDeviceGetMigMode": NOT_SUPPORTED,
    }
    fake = FakeNvml(two_gpus(), fail=fail)
    report = run(fake.module())

    assert len(report.gpus) == 2
    for gpu in report.gpus:
        assert gpu.memory_bytes is None
        assert gpu.memory_numa_node is None
        assert gpu.fabric is None
        assert gpu.mig_mode is None
        assert gpu.uuid is not None and gpu.compute_capability == "9.0"
        assert gpu.nvlinks and all(link.remote_bus_id is None for link in gpu.nvlinks)
        assert all(link.version == "4.0" or link.version == "5.0" for link in gpu.nvlinks)
        mine = [w for w in report.warnings if gpu.bus_id in w]
        kinds = sorted(w.split(": ")[2].split(" unavailable")[0] for w in mine)
        assert kinds == ["fabric", "memory", "numa node", "nvlink"]
    # NOT_SUPPORTED MIG is normal, not worth a warning
    assert not any("mig" in w for w in report.warnings)
    assert fake.calls.count("nvmlShutdown") == 1


def test_nvlink_state_error_stops_links_with_warning() -> None:
    fake = FakeNvml(two_gpus(), fail={"nvmlDeviceGetNvLinkState": UNKNOWN})
    report = run(fake.module())
    assert all(g.nvlinks == [] for g in report.gpus)
    assert sum("nvlink unavailable" in w for w in report.warnings) == 2


def test_no_nvlink_and_no_fabric_is_silent() -> None:
    gpus = [FakeGpu(bus="0000:1B:00.0", uuid="GPU-a")]
    report = run(FakeNvml(gpus).module())
    assert report.warnings == []
    assert report.gpus[0].nvlinks == [] and report.gpus[0].fabric is None


def test_nvlink_iteration_is_capped() -> None:
    gpus = [FakeGpu(bus="00000000:1B:00.0", uuid="GPU-a")]
    report = run(FakeNvml(gpus, endless_links=True).module())
    assert len(report.gpus[0].nvlinks) == MAX_NVLINKS == 36


def test_init_failure_is_unavailable() -> None:
    fake = FakeNvml(two_gpus(), fail={"nvmlInit": 9})
    with pytest.raises(ProbeUnavailable, match="NVML initialisation failed: fake NVML error 9"):
        run(fake.module())
    assert "nvmlShutdown" not in fake.calls


def test_count_failure_is_unavailable_and_shuts_down() -> None:
    fake = FakeNvml(two_gpus(), fail={"nvmlDeviceGetCount": UNKNOWN})
    with pytest.raises(ProbeUnavailable, match="cannot count"):
        run(fake.module())
    assert fake.calls[-1] == "nvmlShutdown"


def test_zero_gpus_is_unavailable() -> None:
    fake = FakeNvml([])
    with pytest.raises(ProbeUnavailable, match="no GPUs"):
        run(fake.module())
    assert fake.calls[-1] == "nvmlShutdown"


def test_missing_pynvml_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    ctx = ProbeContext(root=Root(Path("/"), live=True), host=host())
    with pytest.raises(ProbeUnavailable, match="pynvml"):
        NvidiaProbe().probe(ctx)


def test_replayed_tree_without_nvml_is_unavailable(tmp_path: Path) -> None:
    ctx = ProbeContext(root=Root(tmp_path / "dump", live=False), host=host())
    with pytest.raises(ProbeUnavailable, match="live host"):
        NvidiaProbe().probe(ctx)


def test_no_nvidia_pci_device_skips_nvml() -> None:
    fake = FakeNvml(two_gpus())
    with pytest.raises(ProbeUnavailable, match="no NVIDIA GPU"):
        run(fake.module(), host(with_nvidia=False))
    assert fake.calls == []


def test_handle_failure_skips_only_that_gpu() -> None:
    fake = FakeNvml(two_gpus())
    module = fake.module()
    real = module.nvmlDeviceGetHandleByIndex

    def flaky(index: int) -> Any:
        if index == 0:
            raise FakeNVMLError(GPU_IS_LOST)
        return real(index)

    module.nvmlDeviceGetHandleByIndex = flaky
    report = run(module)
    assert [g.bus_id for g in report.gpus] == ["0000:43:00.0"]
    assert any("#0" in w and "identity" in w for w in report.warnings)


def test_bytes_driver_version_and_missing_functions() -> None:
    fake = FakeNvml(two_gpus(), driver=b"535.104.05\x00")
    module = fake.module()
    del module.nvmlDeviceGetArchitecture
    del module.nvmlDeviceGetGpuFabricInfoV
    report = run(module)
    assert report.gpus[0].driver_version == "535.104.05"
    assert report.gpus[0].architecture is None
    assert report.gpus[0].fabric is None
    assert report.warnings == []


def test_fabric_states_and_zero_cluster() -> None:
    gpus = two_gpus()
    gpus[0].fabric = {"clusterUuid": bytes(16), "state": 0, "cliqueId": 0, "status": 0}
    gpus[1].fabric = fabric_info(state=2)
    report = run(FakeNvml(gpus).module())
    f0, f1 = report.gpus[0].fabric, report.gpus[1].fabric
    assert f0 is not None and f0.state == "not_supported" and f0.clique is None
    assert f0.cluster_uuid == "00000000-0000-0000-0000-000000000000"
    assert f1 is not None and f1.state == "in_progress" and f1.clique is None


def test_fabric_completed_with_bad_status_warns() -> None:
    gpus = two_gpus()
    assert gpus[0].fabric is not None
    gpus[0].fabric["status"] = 9
    report = run(FakeNvml(gpus).module())
    assert any("fabric registration completed with NVML status 9" in w for w in report.warnings)
    fabric = report.gpus[0].fabric
    assert fabric is not None and fabric.state == "completed" and fabric.status == 9
    assert fabric.clique is None, "a failed registration must not publish a clique"


def test_fabric_with_real_ctypes_struct() -> None:
    """A module exposing pynvml's ctypes struct gets ``ctypes.byref`` and fills ``_obj``."""
    pynvml = pytest.importorskip("pynvml")
    fake = FakeNvml(two_gpus())
    module = fake.module()
    module.c_nvmlGpuFabricInfo_v3_t = pynvml.c_nvmlGpuFabricInfo_v3_t
    seen: list[int] = []

    def fill(handle: int, ref: Any) -> int:
        obj = ref._obj
        seen.append(obj.version)
        obj.clusterUuid = (ctypes.c_uint8 * 16)(*CLUSTER.bytes)
        obj.state = 3
        obj.cliqueId = 32766
        obj.status = 0
        obj.healthSummary = 3
        return 0

    module.nvmlDeviceGetGpuFabricInfoV = fill
    report = run(module)
    assert seen == [0x3000028, 0x3000028]
    fab = report.gpus[0].fabric
    assert fab is not None
    assert fab.clique == f"{CLUSTER}.32766"
    assert fab.health == "limited_capacity"


def test_fabric_version_mismatch_falls_back_to_legacy_call() -> None:
    fake = FakeNvml(two_gpus(), fail={"nvmlDeviceGetGpuFabricInfoV": 25})
    module = fake.module()

    def legacy(handle: int, ref: Any) -> None:
        ref.state = 1
        ref.clusterUuid = list(CLUSTER.bytes)

    module.nvmlDeviceGetGpuFabricInfo = legacy
    report = run(module)
    fab = report.gpus[0].fabric
    assert fab is not None and fab.state == "not_started" and fab.cluster_uuid == str(CLUSTER)
    assert report.warnings == []


def test_merge_with_pci_probe_prefers_nvml_facts() -> None:
    ctx = ProbeContext(
        root=Root(Path("/nonexistent")), host=host(), nvml=FakeNvml(two_gpus()).module()
    )
    probes: list[tuple[str, Any]] = [("nvidia", NvidiaProbe()), ("pci", PciAcceleratorProbe())]
    statuses, reports = run_probes(ctx, probes)
    assert [s.state for s in statuses] == ["ok", "ok"]
    inv = ctx.host
    apply_reports(inv, statuses, reports)
    assert [g.bus_id for g in inv.gpus] == ["0000:1b:00.0", "0000:43:00.0"]
    assert all(g.probe == "nvidia" and g.uuid and g.uuid.startswith("GPU-") for g in inv.gpus)


FUNCTIONS = [
    "nvmlInit",
    "nvmlShutdown",
    "nvmlDeviceGetCount",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkVersion",
    "nvmlDeviceGetNvLinkRemotePciInfo",
    "nvmlDeviceGetNvLinkRemoteDeviceType",
    "nvmlDeviceGetGpuFabricInfoV",
]
CODES = st.sampled_from([1, 2, 3, 4, 9, 12, 13, 15, 25, 999])


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fail=st.dictionaries(st.sampled_from(FUNCTIONS), CODES, max_size=8))
def test_random_nvml_errors_never_escape(fail: dict[str, int]) -> None:
    fake = FakeNvml(two_gpus(), fail=fail)
    try:
        report = run(fake.module())
    except ProbeUnavailable as exc:
        assert str(exc)
        assert any(k in fail for k in ("nvmlInit", "nvmlDeviceGetCount"))
    else:
        assert isinstance(report, ProbeReport)
        if not {"nvmlDeviceGetHandleByIndex", "nvmlDeviceGetPciInfo"} & set(fail):
            assert len(report.gpus) == 2
        # one warning per GPU and kind at most
        assert len(report.warnings) == len(set(report.warnings))
    if "nvmlInit" not in fail:
        assert fake.calls.count("nvmlShutdown") == 1
    else:
        assert "nvmlShutdown" not in fake.calls


@settings(max_examples=examples(100), deadline=None)
@given(
    name=st.one_of(st.text(max_size=20), st.binary(max_size=20), st.none(), st.integers()),
    bus=st.text(max_size=24),
    cc=st.one_of(st.tuples(st.integers(), st.integers()), st.none(), st.text(max_size=3)),
    mig=st.one_of(st.lists(st.integers(), max_size=3), st.none()),
    state=st.one_of(st.integers(-5, 10), st.none(), st.text(max_size=2)),
    cluster=st.one_of(st.binary(max_size=20), st.text(max_size=40), st.none()),
)
def test_odd_nvml_values_never_raise(
    name: Any, bus: str, cc: Any, mig: Any, state: Any, cluster: Any
) -> None:
    fake = FakeNvml(two_gpus())
    module = fake.module()
    module.nvmlDeviceGetName = lambda h: name
    module.nvmlDeviceGetPciInfo = lambda h: SimpleNamespace(busId=bus.encode())
    module.nvmlDeviceGetCudaComputeCapability = lambda h: cc
    module.nvmlDeviceGetMigMode = lambda h: mig

    def fabric(h: int, ref: Any) -> None:
        ref.state = state
        ref.clusterUuid = cluster

    module.nvmlDeviceGetGpuFabricInfoV = fabric
    report = run(module)
    assert len(report.gpus) <= 1  # both GPUs get the same (or no) bus id


def test_display_device_without_vendor_id_still_tries_nvml() -> None:
    inv = host(with_nvidia=False)
    inv.pci_devices.append(PciDevice(bus_id="0000:1b:00.0", class_code="0x0302"))
    report = run(FakeNvml(two_gpus()).module(), inv)
    assert len(report.gpus) == 2


_STUB_NVML = """
int nvmlInit_v2(void) { return 0; }
int nvmlInitWithFlags(unsigned int flags) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *count) { *count = 3; return 0; }
"""


def test_nvml_is_loaded_from_the_driver_root(tmp_path: Path) -> None:
    """The chart's driver-root mode: ``$NVIDIA_DRIVER_ROOT`` holds the host's driver
    (its ``libnvidia-ml.so.1`` an absolute symlink inside that tree, as installers make
    it); pynvml, asking the loader for the bare soname, gets that library. A stand-in
    library built here answers three GPUs."""
    import shutil
    import subprocess

    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler to build the stand-in NVML library")
    root = tmp_path / "driver-root"
    lib_dir = root / "usr/lib/x86_64-linux-gnu"
    lib_dir.mkdir(parents=True)
    src = tmp_path / "nvml.c"
    src.write_text(_STUB_NVML)
    real = lib_dir / "libnvidia-ml.so.999.99.99"
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(real), str(src)],
        check=True,
    )
    (lib_dir / "libnvidia-ml.so.1").symlink_to("/usr/lib/x86_64-linux-gnu/" + real.name)
    code = (
        "import pynvml\n"
        "from plugins.nvidia import preload_from_driver_root\n"
        "print(preload_from_driver_root())\n"
        "pynvml.nvmlInit()\n"
        "print(pynvml.nvmlDeviceGetCount())\n"
    )
    env = {**__import__("os").environ, "NVIDIA_DRIVER_ROOT": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == [str(real), "3"]
    env["NVIDIA_DRIVER_ROOT"] = str(tmp_path / "empty")
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "no libnvidia-ml.so.1 in usr/lib/x86_64-linux-gnu" in bad.stderr
