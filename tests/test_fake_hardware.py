"""Tests of the fake-hardware package: YAML machines -> sysfs trees + fake pynvml."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from discovery.fake import (
    FakeHost,
    FakeNvml,
    MachineSpec,
    NVMLError,
    build_sysfs,
    fake_host,
    list_machines,
    load_machine,
    load_yaml,
    machine_path,
    make_nvml,
)
from discovery.fake.sysfs_builder import cpumask
from discovery.readers import format_cpulist, normalize_bdf, parse_cpulist, parse_cpumask

SHIPPED = ["cloud-vm-1gpu", "cpu-2s", "dgx-h100", "gb200-nvl72-tray", "mi300x-8", "pcie-8gpu"]


def _read(path: Path) -> str:
    return path.read_text().strip()


def _pci_path(root: Path, bdf: str) -> tuple[str, list[str]]:
    """(pcie root, functions between root and device) from the bus/pci/devices symlink,
    the way Kubernetes derives pcieRoot."""
    link = root / "sys" / "bus" / "pci" / "devices" / bdf
    target = os.readlink(link)
    assert not os.path.isabs(target)
    parts = os.path.normpath(os.path.join("bus/pci/devices", target)).split("/")
    assert parts[0] == "devices" and parts[-1] == bdf, parts
    return parts[1], parts[2:-1]


@pytest.fixture
def tree_dir() -> Iterator[Path]:
    """A scratch directory on tmpfs when available (trees are thousands of tiny files)."""
    shm = "/dev/shm"
    parent = shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None
    path = Path(tempfile.mkdtemp(prefix="toposlice-test-", dir=parent))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def dgx() -> Iterator[FakeHost]:
    with fake_host("dgx-h100") as host:
        yield host


@pytest.fixture(scope="module")
def gb200() -> Iterator[FakeHost]:
    with fake_host("gb200-nvl72-tray") as host:
        yield host


# --------------------------------------------------------------------------- machines


def test_list_machines() -> None:
    assert list_machines() == SHIPPED
    for name in SHIPPED:
        assert machine_path(name).is_file()
    with pytest.raises(ValueError, match="unknown fake machine 'nope'"):
        machine_path("nope")


@pytest.mark.parametrize("name", SHIPPED)
def test_machine_files_document_their_source(name: str) -> None:
    text = machine_path(name).read_text()
    assert text.startswith(f"# {name}:")
    header = text.split("\nname:", 1)[0]
    assert "Source:" in header and "ssum" in header  # "Assumptions" / "assumed"
    assert "real-machines.md" in header or "ASSUMED machine" in header


@pytest.mark.parametrize("name", SHIPPED)
def test_machine_builds_and_links_are_the_tree(name: str, tree_dir: Path) -> None:
    spec = load_machine(name)
    build_sysfs(spec, tree_dir)
    sys_dir = tree_dir / "sys"
    assert _read(tree_dir / "etc" / "hostname") == spec.name
    cpuinfo = (tree_dir / "proc" / "cpuinfo").read_text()
    assert cpuinfo.count("model name") == spec.cpu.count
    assert parse_cpulist(_read(sys_dir / "devices/system/cpu/online")) == list(
        range(spec.cpu.count)
    )

    entries = sorted(os.listdir(sys_dir / "bus/pci/devices"))
    assert entries == sorted(d.bdf for d in spec.pci)
    for dev in spec.pci:
        root, bridges = _pci_path(tree_dir, dev.bdf)
        # The directory nesting is the PCIe tree: the components are the bridges.
        assert bridges == [a.bdf for a in spec.ancestors(dev.bdf)]
        assert root == spec.pcie_root(dev.bdf)
        for b in bridges:
            assert _read(sys_dir / "bus/pci/devices" / b / "class").startswith("0x0604")
        fn = sys_dir / "bus/pci/devices" / dev.bdf
        assert fn.resolve().is_dir()
        assert _read(fn / "class") == f"0x{dev.class_code:06x}"
        assert _read(fn / "vendor") == f"0x{dev.vendor:04x}"
        assert int(_read(fn / "numa_node")) == dev.numa_node
        local = parse_cpulist(_read(fn / "local_cpulist"))
        assert parse_cpumask(_read(fn / "local_cpus")) == local
        if dev.numa_node >= 0:
            node = next(n for n in spec.numa_nodes if n.id == dev.numa_node)
            assert local == list(node.cpus)
        else:
            assert local == list(range(spec.cpu.count))
        if dev.driver:
            drv = fn / "driver"
            assert os.path.basename(os.readlink(drv)) == dev.driver
            assert drv.resolve() == (sys_dir / "bus/pci/drivers" / dev.driver).resolve()
        for net in dev.net:
            link = sys_dir / "class/net" / net.name
            assert link.resolve() == (fn / "net" / net.name).resolve()
            assert _read(link / "address") == net.address
        for rdma in dev.rdma:
            link = sys_dir / "class/infiniband" / rdma.name
            assert link.resolve() == (fn / "infiniband" / rdma.name).resolve()
            assert _read(link / "ports/1/state") == "4: ACTIVE"
    assert (sys_dir / "class/net/lo").resolve() == (sys_dir / "devices/virtual/net/lo").resolve()


@pytest.mark.parametrize("name", SHIPPED)
def test_numa_and_cpu_files(name: str, tree_dir: Path) -> None:
    spec = load_machine(name)
    build_sysfs(spec, tree_dir)
    base = tree_dir / "sys/devices/system/node"
    ids = [n.id for n in spec.numa_nodes]
    assert parse_cpulist(_read(base / "online")) == ids
    assert parse_cpulist(_read(base / "has_cpu")) == [n.id for n in spec.numa_nodes if n.cpus]
    for i, node in enumerate(spec.numa_nodes):
        ndir = base / f"node{node.id}"
        assert parse_cpulist(_read(ndir / "cpulist")) == list(node.cpus)
        assert parse_cpumask(_read(ndir / "cpumap")) == list(node.cpus)
        row = [int(x) for x in _read(ndir / "distance").split()]
        assert len(row) == len(ids) and row[i] == 10
        assert f"Node {node.id} MemTotal:" in _read(ndir / "meminfo")
    for node in spec.numa_nodes:
        for cpu in node.cpus[:3]:
            topo = tree_dir / f"sys/devices/system/cpu/cpu{cpu}/topology"
            assert int(_read(topo / "physical_package_id")) == node.socket
            assert cpu in (parse_cpulist(_read(topo / "core_cpus_list")) or [])
            l3 = tree_dir / f"sys/devices/system/cpu/cpu{cpu}/cache/index3"
            assert _read(l3 / "level") == "3"
            shared = parse_cpulist(_read(l3 / "shared_cpu_list")) or []
            assert cpu in shared and set(shared) <= set(node.cpus)


def test_dgx_h100_layout(dgx: FakeHost) -> None:
    root = dgx.root
    sys_dir = root / "sys"
    assert _read(sys_dir / "devices/system/node/node0/cpulist") == "0-55,112-167"
    assert _read(sys_dir / "devices/system/node/node1/cpulist") == "56-111,168-223"
    assert _read(sys_dir / "devices/system/node/node0/distance") == "10 21"
    assert _read(sys_dir / "devices/system/cpu/cpu0/topology/core_cpus_list") == "0,112"
    gpus = ["1b", "43", "52", "61", "9d", "c3", "d1", "df"]
    nics = ["18", "40", "4f", "5e", "9a", "c0", "ce", "dc"]
    roots = set()
    for i, (g, n) in enumerate(zip(gpus, nics, strict=True)):
        gbdf, nbdf = f"0000:{g}:00.0", f"0000:{n}:00.0"
        groot, gbr = _pci_path(root, gbdf)
        nroot, nbr = _pci_path(root, nbdf)
        assert groot == nroot == f"pci0000:{int(n, 16) - 3:02x}"
        roots.add(groot)
        assert len(gbr) == 5 and len(nbr) == 3 and gbr[:2] == nbr[:2]
        numa = 0 if i < 4 else 1
        assert _read(sys_dir / "bus/pci/devices" / gbdf / "numa_node") == str(numa)
        assert _read(sys_dir / "bus/pci/devices" / nbdf / "numa_node") == str(numa)
        assert _read(sys_dir / "bus/pci/devices" / gbdf / "class") == "0x030200"
        assert _read(sys_dir / "bus/pci/devices" / gbdf / "device") == "0x2330"
        assert _read(sys_dir / "bus/pci/devices" / gbdf / "current_link_speed") == "32.0 GT/s PCIe"
        assert (sys_dir / f"class/net/ibp{int(n, 16)}s0").is_dir()
    assert len(roots) == 8
    switches = [f"0000:0{b}:00.0" for b in "5678"]
    sroots = {_pci_path(root, s)[0] for s in switches}
    assert len(sroots) == 1
    for s in switches:
        fn = sys_dir / "bus/pci/devices" / s
        assert (_read(fn / "class"), _read(fn / "vendor"), _read(fn / "device")) == (
            "0x068000",
            "0x10de",
            "0x22a3",
        )
    rate = _read(sys_dir / "class/infiniband/mlx5_0/ports/1/rate")
    assert rate == "400 Gb/sec (4X NDR)"
    # Storage NIC functions .0/.1 share one device (PIX).
    assert _pci_path(root, "0000:29:00.0") == _pci_path(root, "0000:29:00.1")


def test_gb200_numa_and_domains(gb200: FakeHost) -> None:
    base = gb200.root / "sys/devices/system/node"
    assert _read(base / "online") == "0-33"
    assert _read(base / "has_cpu") == "0-1"
    assert _read(base / "has_memory") == "0-2,10,18,26"
    assert _read(base / "node2/cpulist") == ""
    assert "188416" not in _read(base / "node2/meminfo")  # kB, not MB
    assert f"{188416 * 1024} kB" in _read(base / "node2/meminfo")
    assert len(_read(base / "node0/distance").split()) == 34
    for bdf, root, numa in [
        ("0008:01:00.0", "pci0008:00", "0"),
        ("0009:01:00.0", "pci0009:00", "0"),
        ("0018:01:00.0", "pci0018:00", "1"),
        ("0019:01:00.0", "pci0019:00", "1"),
        ("0000:03:00.0", "pci0000:00", "0"),
        ("0016:03:00.1", "pci0016:00", "1"),
    ]:
        assert _pci_path(gb200.root, bdf)[0] == root
        assert _read(gb200.root / "sys/bus/pci/devices" / bdf / "numa_node") == numa
    assert _read(gb200.root / "proc/cpuinfo").count("processor") == 144


def test_cloud_vm_flat_bus_and_no_numa(tree_dir: Path) -> None:
    spec = load_machine("cloud-vm-1gpu")
    build_sysfs(spec, tree_dir)
    for dev in spec.pci:
        root, bridges = _pci_path(tree_dir, dev.bdf)
        assert (root, bridges) == ("pci0000:00", [])
        fn = tree_dir / "sys/bus/pci/devices" / dev.bdf
        assert _read(fn / "numa_node") == "-1"
        assert _read(fn / "local_cpulist") == "0-15"
    assert os.path.basename(os.readlink(tree_dir / "sys/class/net/ens5")) == "ens5"
    assert not (tree_dir / "sys/class/net/ens5/speed").exists()


def test_mi300x_kfd_topology(tree_dir: Path) -> None:
    spec = load_machine("mi300x-8")
    assert make_nvml(spec) is None
    build_sysfs(spec, tree_dir)
    nodes = tree_dir / "sys/class/kfd/kfd/topology/nodes"
    props: dict[int, dict[str, int]] = {}
    for entry in sorted(os.listdir(nodes), key=int):
        lines = _read(nodes / entry / "properties").splitlines()
        props[int(entry)] = {k: int(v) for k, v in (line.split() for line in lines)}
    cpu_nodes = [n for n, p in props.items() if p["drm_render_minor"] == 0]
    gpu_nodes = [n for n, p in props.items() if p["drm_render_minor"] >= 128]
    assert cpu_nodes == [0, 1] and gpu_nodes == list(range(2, 10))
    buses = []
    for n in gpu_nodes:
        p = props[n]
        loc = p["location_id"]
        bdf = f"{p['domain']:04x}:{loc >> 8:02x}:{(loc >> 3) & 0x1F:02x}.{loc & 7:x}"
        buses.append(bdf)
        assert p["vendor_id"] == 0x1002 and p["device_id"] == 0x74A1
        assert p["hive_id"] == props[gpu_nodes[0]]["hive_id"] != 0
        bank = _read(nodes / str(n) / "mem_banks/0/properties")
        assert bank == f"size_in_bytes {192 << 30}"
        links = []
        for m in sorted(os.listdir(nodes / str(n) / "io_links"), key=int):
            text = _read(nodes / str(n) / "io_links" / m / "properties").splitlines()
            links.append({k: int(v) for k, v in (line.split() for line in text)})
        xgmi = [lk for lk in links if lk["type"] == 11]
        pcie = [lk for lk in links if lk["type"] == 2]
        assert sorted(lk["node_to"] for lk in xgmi) == [g for g in gpu_nodes if g != n]
        assert all(lk["weight"] == 15 and lk["max_bandwidth"] == 50000 for lk in xgmi)
        sysfs_numa = int(_read(tree_dir / "sys/bus/pci/devices" / bdf / "numa_node"))
        assert [(lk["node_to"], lk["weight"]) for lk in pcie] == [(sysfs_numa, 20)]
        assert (
            tree_dir / "sys/bus/pci/devices" / bdf / "drm" / f"renderD{p['drm_render_minor']}"
        ).is_dir()
    assert buses == [f"0000:{b}:00.0" for b in ["0c", "22", "38", "5c", "9f", "af", "bf", "df"]]
    assert [_read(tree_dir / "sys/bus/pci/devices" / b / "numa_node") for b in buses] == list(
        "00001111"
    )


def test_sriov_links(tree_dir: Path) -> None:
    build_sysfs(load_machine("cpu-2s"), tree_dir)
    pf = tree_dir / "sys/bus/pci/devices/0000:31:00.0"
    assert _read(pf / "sriov_totalvfs") == "64" and _read(pf / "sriov_numvfs") == "2"
    assert os.path.basename(os.readlink(pf / "virtfn0")) == "0000:31:01.0"
    assert os.path.basename(os.readlink(pf / "virtfn1")) == "0000:31:01.1"
    vf = tree_dir / "sys/bus/pci/devices/0000:31:01.0"
    assert (vf / "physfn").resolve() == pf.resolve()
    roce = tree_dir / "sys/class/infiniband/mlx5_0/ports/1"
    assert _read(roce / "link_layer") == "Ethernet"
    assert _read(roce / "gid_attrs/ndevs/0") == "enp152s0f0np0"


def _snapshot(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out[rel] = "-> " + os.readlink(p)
            elif os.path.isfile(p):
                out[rel] = Path(p).read_text()
    return out


def test_deterministic(tree_dir: Path) -> None:
    spec = load_machine("dgx-h100")
    build_sysfs(spec, tree_dir / "a")
    build_sysfs(load_machine("dgx-h100"), tree_dir / "b")
    assert _snapshot(tree_dir / "a") == _snapshot(tree_dir / "b")
    with pytest.raises(FileExistsError):
        build_sysfs(spec, tree_dir / "a")


def test_generation_is_fast() -> None:
    spec = load_machine("dgx-h100")
    start = time.perf_counter()
    with fake_host(spec):  # tmpfs when available, as the fixtures use it
        elapsed = time.perf_counter() - start
    # ~0.2 s on an idle machine's tmpfs; the bound only catches pathological slowdowns.
    assert elapsed < 10.0


def test_fake_host_removes_tree() -> None:
    with fake_host("cpu-2s") as host:
        root = host.root
        assert (root / "sys/bus/pci/devices").is_dir()
        assert host.nvml is None and host.spec.name == "cpu-2s"
    assert not root.exists()


@given(st.sets(st.integers(min_value=0, max_value=300)))
def test_cpulist_and_mask_round_trip(cpus: set[int]) -> None:
    assert parse_cpulist(format_cpulist(cpus)) == sorted(cpus)
    mask = cpumask(cpus, 301)
    assert len(mask.split(",")) == 10
    assert parse_cpumask(mask) == sorted(cpus)


# --------------------------------------------------------------------------- fake NVML


def _nvml(spec: MachineSpec, **kw: Any) -> FakeNvml:
    nvml = FakeNvml(spec, **kw)
    nvml.nvmlInit()
    return nvml


def test_nvml_bus_ids_match_sysfs(dgx: FakeHost) -> None:
    nvml = dgx.nvml
    assert nvml is not None
    nvml.nvmlInit()
    try:
        assert nvml.nvmlDeviceGetCount() == 8
        sysfs = dgx.root / "sys/bus/pci/devices"
        seen = []
        for i in range(8):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            pci = nvml.nvmlDeviceGetPciInfo(h)
            assert isinstance(pci.busId, bytes) and isinstance(pci.busIdLegacy, bytes)
            assert pci.busId.decode().startswith("00000000:")
            assert pci.busId.decode() == pci.busId.decode().upper()
            bdf = normalize_bdf(pci.busId.decode())
            assert bdf is not None and normalize_bdf(pci.busIdLegacy.decode()) == bdf
            fn = sysfs / bdf
            assert fn.is_symlink()
            assert pci.pciDeviceId == (int(_read(fn / "device"), 16) << 16) | int(
                _read(fn / "vendor"), 16
            )
            assert (pci.domain, pci.bus, pci.device) == (0, int(bdf[5:7], 16), 0)
            assert nvml.nvmlDeviceGetHandleByPciBusId(bdf) == h
            assert nvml.nvmlDeviceGetHandleByPciBusId(pci.busId) == h
            uuid = nvml.nvmlDeviceGetUUID(h)
            assert uuid.startswith("GPU-") and len(uuid) == 40
            assert nvml.nvmlDeviceGetMinorNumber(h) == i
            assert nvml.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
            assert nvml.nvmlDeviceGetCudaComputeCapability(h) == (9, 0)
            assert nvml.nvmlDeviceGetArchitecture(h) == nvml.NVML_DEVICE_ARCH_HOPPER
            assert nvml.nvmlDeviceGetMigMode(h) == [0, 0]
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            assert mem.total == 81559 << 20 and mem.used + mem.free == mem.total
            with pytest.raises(NVMLError) as exc:
                nvml.nvmlDeviceGetNumaNodeId(h)
            assert exc.value.value == nvml.NVML_ERROR_NOT_SUPPORTED
            seen.append(bdf)
        assert seen == sorted(seen)  # NVML index order = bus order
        assert (
            len({nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(8)}) == 8
        )
        with pytest.raises(NVMLError) as exc:
            nvml.nvmlDeviceGetHandleByPciBusId("0000:18:00.0")  # a NIC
        assert exc.value.value == nvml.NVML_ERROR_NOT_FOUND
        with pytest.raises(NVMLError):
            nvml.nvmlDeviceGetHandleByIndex(8)
    finally:
        nvml.nvmlShutdown()


def _links(nvml: FakeNvml, h: Any) -> list[tuple[int, int, str, int]]:
    out = []
    link = 0
    while True:
        try:
            state = nvml.nvmlDeviceGetNvLinkState(h, link)
        except NVMLError as exc:
            assert exc.value in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT)
            break
        remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId.decode()
        out.append(
            (
                state,
                nvml.nvmlDeviceGetNvLinkVersion(h, link),
                normalize_bdf(remote) or "",
                nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, link),
            )
        )
        link += 1
        assert link <= 18
    return out


def test_nvlink_iteration_dgx(dgx: FakeHost) -> None:
    nvml = dgx.nvml
    assert nvml is not None
    nvml.nvmlInit()
    for i in range(8):
        links = _links(nvml, nvml.nvmlDeviceGetHandleByIndex(i))
        assert len(links) == 18
        assert all(s == 1 and v == 6 and t == 2 for s, v, _, t in links)
        remotes = [r for _, _, r, _ in links]
        assert sorted({remotes.count(r) for r in set(remotes)}) == [4, 5]
        for r in set(remotes):
            assert _read(dgx.root / "sys/bus/pci/devices" / r / "class") == "0x068000"
    nvml.nvmlShutdown()


def test_gb200_nvml(gb200: FakeHost) -> None:
    nvml = gb200.nvml
    assert nvml is not None
    nvml.nvmlInit()
    uuids = set()
    for i, numa in enumerate([2, 10, 18, 26]):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        assert nvml.nvmlDeviceGetNumaNodeId(h) == numa
        links = _links(nvml, h)
        assert len(links) == 18 and all(v == 7 and t == 2 for _, v, _, t in links)
        for _, _, remote, _ in links:
            assert not (gb200.root / "sys/bus/pci/devices" / remote).exists()
        # pynvml's struct through ctypes.byref
        import pynvml

        info = pynvml.c_nvmlGpuFabricInfo_v3_t()
        assert nvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info)) == 0
        assert info.state == nvml.NVML_GPU_FABRIC_STATE_COMPLETED
        assert info.cliqueId == 32766 and info.status == 0 and info.healthSummary == 1
        uuids.add(bytes(info.clusterUuid))
        # any plain object
        plain = type("Info", (), {})()
        nvml.nvmlDeviceGetGpuFabricInfoV(h, plain)
        assert plain.clusterUuid == bytes(info.clusterUuid) and plain.cliqueId == 32766
    assert len(uuids) == 1 and set(uuids.pop()) != {0}
    pci = nvml.nvmlDeviceGetPciInfo(nvml.nvmlDeviceGetHandleByIndex(2))
    assert pci.busId == b"00000018:01:00.0" and pci.domain == 0x18
    nvml.nvmlShutdown()


def test_cloud_vm_nvml_without_nvlink_or_fabric() -> None:
    spec = load_machine("cloud-vm-1gpu")
    nvml = make_nvml(spec)
    assert nvml is not None
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetPciInfo(h).busId == b"00000000:00:1E.0"
    with pytest.raises(NVMLError) as exc:
        nvml.nvmlDeviceGetNvLinkState(h, 0)
    assert exc.value.value == nvml.NVML_ERROR_NOT_SUPPORTED
    assert isinstance(exc.value, nvml.NVMLError_NotSupported)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuFabricInfoV(h, object())
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMigMode(h)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetNvLinkState(h, 18)
    dgx_fabric = _nvml(load_machine("dgx-h100"))
    with pytest.raises(nvml.NVMLError) as exc:
        dgx_fabric.nvmlDeviceGetGpuFabricInfoV(dgx_fabric.nvmlDeviceGetHandleByIndex(0), object())
    assert exc.value.value == 3


def test_nvml_init_errors() -> None:
    spec = load_machine("dgx-h100")
    nvml = FakeNvml(spec)
    with pytest.raises(NVMLError) as exc:
        nvml.nvmlDeviceGetCount()
    assert exc.value.value == nvml.NVML_ERROR_UNINITIALIZED
    failing = make_nvml(spec, fail_init=True)
    assert failing is not None
    with pytest.raises(NVMLError) as exc:
        failing.nvmlInit()
    assert exc.value.value == failing.NVML_ERROR_LIBRARY_NOT_FOUND == 12
    assert isinstance(exc.value, failing.NVMLError_LibraryNotFound)
    assert make_nvml(load_machine("cpu-2s")) is None


TINY = """
name: tiny
cpu: {model: Test CPU, sockets: 1, cores_per_socket: 2, threads_per_core: 2}
nvml:
  nvml_errors: {nvmlDeviceGetMigMode: NOT_SUPPORTED}
pci:
  - {bdf: "0000:00:01.0", class: 0x060400, vendor: 0x8086, device: 0x1234, numa_node: 0}
  - bdf: "0000:01:00.0"
    parent: "0000:00:01.0"
    class: 0x030200
    vendor: 0x10de
    device: 0x2330
    nvidia:
      name: Test GPU
      memory_mib: 1024
      nvml_errors: {nvmlDeviceGetUUID: GPU_IS_LOST, nvmlDeviceGetName: 999}
  - bdf: "0000:01:00.1"
    parent: "0000:00:01.0"
    class: 0x030200
    vendor: 0x10de
    device: 0x2330
    nvidia: {name: Test GPU, memory_mib: 1024}
"""


def test_fault_injection_from_yaml() -> None:
    spec = load_yaml(TINY)
    assert spec.pcie_root("0000:01:00.0") == "pci0000:00"
    nvml = _nvml(spec)
    h0 = nvml.nvmlDeviceGetHandleByIndex(0)
    h1 = nvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(NVMLError) as exc:
        nvml.nvmlDeviceGetUUID(h0)
    assert exc.value.value == 15 and type(exc.value).__name__ == "NVMLError_GpuIsLost"
    with pytest.raises(NVMLError) as exc:
        nvml.nvmlDeviceGetName(h0)
    assert exc.value.value == 999
    assert nvml.nvmlDeviceGetUUID(h1).startswith("GPU-")  # per-GPU fault stays on GPU 0
    for h in (h0, h1):  # machine-wide fault
        with pytest.raises(nvml.NVMLError_NotSupported):
            nvml.nvmlDeviceGetMigMode(h)
    # errors= adds machine-wide faults at construction
    lost = _nvml(spec, errors={"nvmlDeviceGetCount": "DRIVER_NOT_LOADED"})
    with pytest.raises(NVMLError) as exc:
        lost.nvmlDeviceGetCount()
    assert exc.value.value == 9
    assert "nvmlDeviceGetCount" in lost.calls


_SECOND_GPU = (
    'parent: "0000:00:01.0"\n    class: 0x030200\n    vendor: 0x10de\n'
    "    device: 0x2330\n    nvidia: {"
)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("threads_per_core: 2}", "threads_per_core: 2, turbo: 1}"), "cpu: unknown key 'turbo'"),
        (('"0000:01:00.1"', '"0000:01:0g.1"'), "bad PCI bus id '0000:01:0g.1'"),
        (("memory_mib: 1024}", "}"), "missing required key 'memory_mib'"),
        (("vendor: 0x8086, ", ""), "missing required key 'vendor'"),
        (("numa_node: 0}", "numa_node: 3}"), "numa_node 3 does not exist"),
        (("nvmlDeviceGetMigMode", "nvmlDeviceGetFoo"), "unknown NVML function 'nvmlDeviceGetFoo'"),
        (("GPU_IS_LOST", "ON_FIRE"), "unknown NVML error code 'ON_FIRE'"),
        (
            (_SECOND_GPU, _SECOND_GPU.replace("00:01.0", "00:02.0")),
            "parent 0000:00:02.0 is not a device of this file",
        ),
        (('- bdf: "0000:01:00.1"', '- type: gpu\n    bdf: "0000:01:00.1"'), "unknown device type"),
        (
            ("name: Test GPU, memory_mib", "name: Test GPU, colour: red, memory_mib"),
            "pci[2] (0000:01:00.1): nvidia: unknown key 'colour'",
        ),
        (("class: 0x060400, vendor", "class: 0x060400, colour: 1, vendor"), "(0000:00:01.0)"),
    ],
)
def test_bad_yaml_names_the_problem(edit: tuple[str, str], message: str) -> None:
    old, new = edit
    assert old in TINY
    with pytest.raises(ValueError, match=re.escape(message)) as exc:
        load_yaml(TINY.replace(old, new, 1), source="bad.yaml")
    assert str(exc.value).startswith("bad.yaml")


def test_bad_yaml_structure() -> None:
    with pytest.raises(ValueError, match="not valid YAML"):
        load_yaml("name: [unclosed")
    with pytest.raises(ValueError, match="want a mapping"):
        load_yaml("- 1\n- 2\n")
    with pytest.raises(ValueError, match="duplicate PCI bus id"):
        load_yaml(TINY.replace('"0000:01:00.1"', '"0000:01:00.0"'))
    with pytest.raises(ValueError, match="belong to no node"):
        load_yaml(TINY.replace("nvml:\n", 'numa: {nodes: [{id: 0, cpus: "0-1"}]}\nnvml:\n'))
    with pytest.raises(ValueError, match="does not exist"):
        load_machine("/nonexistent/machine.yaml")


# The relation matrices the fake GPU machines must reproduce are checked against the real
# graph code in tests/test_fake_matches_captures.py.


def test_discovery_reads_the_fake_tree(dgx: FakeHost) -> None:
    host_mod = pytest.importorskip("discovery.host")
    inv, _warnings = host_mod.discover_host(str(dgx.root), live=False)
    assert inv.hostname == "dgx-h100"
    assert [n.id for n in inv.numa_nodes] == [0, 1]
    assert len(inv.cpus) == 224
    by_bus = {d.bus_id: d for d in inv.pci_devices}
    for dev in dgx.spec.pci:
        got = by_bus[dev.bdf]
        assert got.pcie_root == dgx.spec.pcie_root(dev.bdf)
        assert got.upstream_bridges == [a.bdf for a in dgx.spec.ancestors(dev.bdf)]
    assert {r.name: r.bus_id for r in inv.rdma_devices}["mlx5_0"] == "0000:18:00.0"
