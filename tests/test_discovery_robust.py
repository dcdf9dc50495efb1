"""Malformed or missing sysfs files give warnings and a partial inventory, never a traceback."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from discovery.host import discover_host
from discovery.readers import normalize_bdf, parse_cpulist, parse_cpumask, parse_link_speed
from tests.conftest import examples, link_copy
from toposlice.discover import discover

CASE = "32em64t-2n8c+dax+nvme+mic+dimms"


def test_parse_cpulist() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("0-1\x00\x00") == [0, 1]
    assert parse_cpulist("") == []
    assert parse_cpulist("3-1") is None
    assert parse_cpulist("a-b") is None
    assert parse_cpulist(None) is None


def test_parse_cpumask() -> None:
    assert parse_cpumask("00000000,00000101") == [0, 8]
    assert parse_cpumask("ff,00000000") == list(range(32, 40))
    assert parse_cpumask("zz") is None


def test_normalize_bdf() -> None:
    assert normalize_bdf("00000000:1B:00.0") == "0000:1b:00.0"
    assert normalize_bdf("0000:3b:00.1") == "0000:3b:00.1"
    assert normalize_bdf("10000:00:04.0") == "10000:00:04.0"
    assert normalize_bdf("1B:00.0") == "0000:1b:00.0"
    assert normalize_bdf("garbage") is None
    assert normalize_bdf("0000:1ff:00.0") is None


def test_parse_link_speed() -> None:
    assert parse_link_speed("16.0 GT/s PCIe") == 16.0
    assert parse_link_speed("8 GT/s") == 8.0
    assert parse_link_speed("Unknown") is None


def test_missing_root_is_empty_with_warning(tmp_path: Path) -> None:
    inv, warn = discover_host(str(tmp_path / "nope"), live=False)
    assert inv.pci_devices == []
    assert [n.id for n in inv.numa_nodes] == [0]
    assert any("no sysfs" in w for w in warn.result())


def test_full_discover_on_dump_reports_probes(hwloc_roots: dict[str, Path]) -> None:
    inv = discover(str(hwloc_roots[CASE]))
    states = {p.name: p.state for p in inv.probes}
    # A replayed dump has no NVML: the probe says so, the others go on.
    assert states["nvidia"] == "unavailable"
    assert states["rdma"] == "ok"
    assert {n.bus_id for n in inv.nics} >= {"0000:02:00.0", "0000:82:00.0"}


@pytest.fixture(scope="module")
def damaged_tree(
    hwloc_roots: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[str]]:
    """A private copy of a real dump and the list of its interesting files."""
    dest = link_copy(hwloc_roots[CASE], tmp_path_factory.mktemp("damaged") / "root")
    files = []
    for sub in ("sys/devices", "sys/class/net", "sys/class/infiniband"):
        for dirpath, dirnames, filenames in os.walk(dest / sub):
            dirnames[:] = [d for d in dirnames if not d.startswith(("memory", "power"))]
            for name in filenames:
                if name in {
                    "class",
                    "vendor",
                    "device",
                    "numa_node",
                    "local_cpus",
                    "local_cpulist",
                    "cpulist",
                    "cpumap",
                    "distance",
                    "online",
                    "physical_package_id",
                    "core_id",
                    "thread_siblings_list",
                    "shared_cpu_list",
                    "level",
                    "meminfo",
                    "speed",
                    "rate",
                    "current_link_speed",
                    "max_link_width",
                    "node_guid",
                    "uevent",
                }:
                    full = os.path.join(dirpath, name)
                    if not os.path.islink(full):
                        files.append(os.path.relpath(full, dest))
    files.sort()
    return dest, files


GARBAGE = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"",
            b"-1",
            b"-7",
            b"0x",
            b"99999999999999999999",
            b"1-0",
            b"\x00\x00",
            b"0-4294967295",
            b"ffffffff,ffffffff",
            b"nan",
            b"\xff\xfe",
        ]
    ),
)


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_corrupted_files_never_crash(
    data: st.DataObject, damaged_tree: tuple[Path, list[str]]
) -> None:
    root, files = damaged_tree
    picks = data.draw(st.lists(st.sampled_from(files), min_size=1, max_size=8, unique=True))
    saved: dict[str, bytes] = {}
    removed: list[str] = []
    try:
        for rel in picks:
            path = root / rel
            saved[rel] = path.read_bytes()
            path.unlink()  # a hard link to the shared dump: never write through it
            if data.draw(st.booleans()):
                path.write_bytes(data.draw(GARBAGE))
            else:
                removed.append(rel)
        inv = discover(str(root), probes=["pci", "rdma", "cpu", "nvidia"])
        assert inv.numa_nodes, "always at least one NUMA node"
        assert all(p.state in ("ok", "unavailable") for p in inv.probes), inv.probes
        for dev in inv.pci_devices:
            assert dev.numa_node is None or dev.numa_node >= 0
    finally:
        for rel, content in saved.items():
            (root / rel).write_bytes(content)


def test_broken_symlinks_and_dirs_in_place_of_files(
    tmp_path: Path, hwloc_roots: dict[str, Path]
) -> None:
    root = link_copy(hwloc_roots[CASE], tmp_path / "root")
    pci = root / "sys/bus/pci/devices"
    first = sorted(os.listdir(pci))[0]
    # A dangling link, a loop, a directory where a file should be, a stray entry.
    os.unlink(pci / first)
    os.symlink("../../../devices/pci0000:00/does-not-exist", pci / first)
    os.symlink("loop", pci / "loop")
    target = root / "sys/devices/system/node/node0/cpulist"
    target.unlink()
    target.mkdir()
    inv, warn = discover_host(str(root), live=False)
    assert any(d.bus_id == first for d in inv.pci_devices)
    assert any("unexpected entry" in w for w in warn.result())
    assert inv.numa(0) is not None


def test_nvml_init_failure_keeps_sysfs_gpus() -> None:
    from discovery.fake import load_machine, make_nvml

    spec = load_machine("dgx-h100")
    inv = discover(fake="dgx-h100", nvml=make_nvml(spec, fail_init=True))
    states = {p.name: p for p in inv.probes}
    assert states["nvidia"].state == "unavailable"
    assert "nvmlInit" in states["nvidia"].detail or "NVML" in states["nvidia"].detail
    # The generic PCI probe still reports the eight GPUs, without NVML facts.
    assert len(inv.gpus) == 8 and all(g.uuid is None and not g.nvlinks for g in inv.gpus)


@pytest.mark.parametrize(
    "fn",
    [
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetGpuFabricInfoV",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetPciInfo",
    ],
)
def test_nvml_call_failures_give_partial_inventory(fn: str) -> None:
    from discovery.fake import FakeNvml, load_machine

    spec = load_machine("gb200-nvl72-tray")
    inv = discover(fake="gb200-nvl72-tray", nvml=FakeNvml(spec, errors={fn: "UNKNOWN"}))
    states = {p.name: p.state for p in inv.probes}
    assert states["nvidia"] in ("ok", "unavailable")
    assert len(inv.gpus) == 4, "sysfs still shows every GPU"
    assert inv.warnings, f"a failing {fn} must be reported"


def test_dump_without_symlinks_rebuilds_chains_from_config(
    tmp_path: Path, hwloc_roots: dict[str, Path]
) -> None:
    """Old dumps have plain directories in bus/pci/devices: no pcieRoot, same bridges."""
    src = hwloc_roots[CASE]
    want, _ = discover_host(str(src), live=False)
    root = link_copy(src, tmp_path / "root")
    pci = root / "sys/bus/pci/devices"
    for entry in os.listdir(pci):
        target = os.path.realpath(pci / entry)
        os.unlink(pci / entry)
        shutil.copytree(
            target, pci / entry, symlinks=True, ignore=_only_files, copy_function=os.link
        )
    got, _ = discover_host(str(root), live=False)
    assert [d.bus_id for d in got.pci_devices] == [d.bus_id for d in want.pci_devices]
    assert all(d.pcie_root is None for d in got.pci_devices)
    chains = {d.bus_id: d.upstream_bridges for d in got.pci_devices}
    expected = {d.bus_id: d.upstream_bridges for d in want.pci_devices}
    # 0000:00:11.0 is a bridge with an invalid [00-00] bus range: it stays out of chains.
    assert chains == expected


def _only_files(directory: str, names: list[str]) -> list[str]:
    return [n for n in names if os.path.isdir(os.path.join(directory, n))]


def test_platform_rooted_host_bridge_gives_chain_but_no_pcie_root(tmp_path: Path) -> None:
    """Arm SoCs register the host bridge below a platform device: no k8s pcieRoot."""
    sys_dir = tmp_path / "sys"
    fn = sys_dir / "devices/platform/soc/1c00000.pcie/pci0000:00/0000:00:00.0/0000:01:00.0"
    fn.mkdir(parents=True)
    (fn / "class").write_text("0x020000\n")
    (fn.parent / "class").write_text("0x060400\n")
    links = sys_dir / "bus/pci/devices"
    links.mkdir(parents=True)
    for bdf, target in (("0000:01:00.0", fn), ("0000:00:00.0", fn.parent)):
        os.symlink(os.path.relpath(target, links), links / bdf)
    inv, _ = discover_host(str(tmp_path), live=False)
    dev = inv.pci("0000:01:00.0")
    assert dev is not None and dev.class_code == "0x0200"
    assert dev.pcie_root is None
    assert dev.upstream_bridges == ["0000:00:00.0"]
