"""Hostile or broken sysfs: bounded parsing, never an exception, never a hang.

Trees are copies of a real hwloc dump and of a generated fake machine, damaged the ways
issue #9 lists (truncated, deleted, directories and loops for files, huge and negative
numbers, non-UTF-8, 1 MB lines, masks of -1, repeated ranges, ``inf`` speeds, bus-id
aliases). Discovery, slices and the graph must finish (CPU time well under a second) and
print strict JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from discovery.fake import fake_host
from discovery.readers import parse_cpulist, parse_cpumask, parse_link_speed
from discovery.root import Root
from normalize.graph import build_graph
from normalize.names import node_name
from normalize.slices import build_slices
from toposlice.discover import discover
from toposlice.output import inventory_table
from toposlice.render import graph_table

CASE = "32em64t-2n8c+dax+nvme+mic+dimms"

#: File names worth damaging (what the backends and probes parse).
PARSED = {
    "class", "vendor", "device", "numa_node", "local_cpus", "local_cpulist", "cpulist",
    "cpumap", "distance", "online", "physical_package_id", "core_id", "die_id",
    "thread_siblings_list", "thread_siblings", "core_cpus_list", "shared_cpu_list",
    "shared_cpu_map", "level", "size", "meminfo", "speed", "mtu", "rate", "state",
    "current_link_speed", "current_link_width", "max_link_speed", "max_link_width",
    "node_guid", "uevent", "sriov_totalvfs", "sriov_numvfs", "link_layer", "hostname",
    "cpuinfo", "cpuinfo_max_freq", "properties",
}  # fmt: skip

HOSTILE: list[bytes] = [
    b"",
    b"-1",
    b"-7\n",
    b"9" * 400,
    b"9" * 5000,
    b"1" + b"0" * 309,
    b"9223372036854775808",
    b"ffffffff" * 300,
    b"0-65536," * 2000,
    b"0-8191," * 9000,
    b"inf GT/s PCIe",
    b"nan GT/s",
    b"1e999 GT/s",
    b"1.2.3 Gb/sec (4X HDR)",
    b"9" * 400 + b" Gb/sec",
    b"MemTotal: " + b"9" * 400 + b" kB",
    b"MemTotal: " + b"9" * 5000 + b" kB",
    b"\xff\xfe\x00garbage",
    b"x" * (1 << 20),
    b"\xc2\xb2",  # superscript two: isdigit() but not int()
    b"PCI_CLASS=-1\nPCI_ID=ffffffff:ffffffff\nPCI_SUBSYS_ID=1:1\n",
]


DAMAGE = ["write", "write", "delete", "directory", "loop", "truncate"]


def _interesting(root: Path) -> list[str]:
    out = []
    for sub in ("sys", "proc", "etc"):
        for dirpath, dirnames, filenames in os.walk(root / sub):
            dirnames[:] = [d for d in dirnames if not d.startswith(("memory", "power"))]
            for name in filenames:
                full = os.path.join(dirpath, name)
                if name in PARSED and not os.path.islink(full):
                    out.append(os.path.relpath(full, root))
    return sorted(out)


@pytest.fixture(scope="module")
def trees(
    hwloc_roots: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Path, list[str]]]:
    """Pristine copies of a dump and of a fake GPU machine, and their parsed files."""
    base = tmp_path_factory.mktemp("hostile")
    out = {}
    dump = base / "dump"
    shutil.copytree(hwloc_roots[CASE], dump, symlinks=True)
    out["dump"] = (dump, _interesting(dump))
    with fake_host("cloud-vm-1gpu") as host:
        fake = base / "fake"
        shutil.copytree(host.root, fake, symlinks=True)
    out["fake"] = (fake, _interesting(fake))
    return out


def _damage(path: Path, how: str, payload: bytes) -> None:
    if how == "delete":
        path.unlink()
    elif how == "directory":
        path.unlink()
        path.mkdir()
    elif how == "loop":
        path.unlink()
        os.symlink(path.name, path)
    elif how == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(payload)


def _alias(root: Path) -> None:
    """A second ``bus/pci/devices`` entry for the first function, with an 8-digit domain."""
    pci = root / "sys/bus/pci/devices"
    first = sorted(os.listdir(pci))[0]
    alias = pci / ("0000" + first)
    if os.path.islink(pci / first) and not alias.exists():
        os.symlink(os.readlink(pci / first), alias)


def run_everything(root: Path) -> None:
    """Discovery, slices, graph and every rendering; strict JSON; bounded CPU time."""
    start = time.process_time()
    inv = discover(Root(root, live=False))
    slices = build_slices(inv, "node-a")
    graph = build_graph(inv)
    json.dumps(inv.to_dict(), allow_nan=False)
    json.dumps(slices, allow_nan=False)
    json.dumps(graph, allow_nan=False)
    inventory_table(inv)
    graph_table(graph)
    spent = time.process_time() - start
    assert spent < 1.0, f"{spent:.2f} s of CPU"
    for dev in inv.pci_devices:
        assert dev.numa_node is None or 0 <= dev.numa_node < 1024
        assert dev.link.current_width is None or 0 < dev.link.current_width <= 32
    assert len({d.bus_id for d in inv.pci_devices}) == len(inv.pci_devices)
    assert len({n.bus_id for n in inv.nics}) == len(inv.nics)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_damaged_trees_never_raise(
    data: st.DataObject,
    trees: dict[str, tuple[Path, list[str]]],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    pristine, files = trees[data.draw(st.sampled_from(sorted(trees)))]
    root = tmp_path_factory.mktemp("case") / "root"
    shutil.copytree(pristine, root, symlinks=True)
    picks = data.draw(st.lists(st.sampled_from(files), min_size=1, max_size=10, unique=True))
    for rel in picks:
        how = data.draw(
            st.sampled_from(["write", "write", "delete", "directory", "loop", "truncate"])
        )
        _damage(root / rel, how, data.draw(st.sampled_from(HOSTILE)))
    if data.draw(st.booleans()):
        _alias(root)
    try:
        run_everything(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- one per finding


def test_mask_of_minus_one_ends() -> None:
    assert parse_cpumask("-1") is None
    assert parse_cpumask("ffffffff," * 300) is None  # bits beyond the largest NR_CPUS
    assert parse_cpumask("00000000,00000003") == [0, 1]


def test_repeated_ranges_are_bounded() -> None:
    start = time.process_time()
    assert parse_cpulist("0-65536," * 2000) is None
    assert parse_cpulist("0-8191," * 9000) == list(range(8192))
    assert time.process_time() - start < 0.5


def test_link_speeds_are_finite() -> None:
    assert parse_link_speed("inf GT/s") is None
    assert parse_link_speed("nan GT/s") is None
    assert parse_link_speed("1e999 GT/s") is None
    assert parse_link_speed("16.0 GT/s PCIe") == 16.0


@pytest.mark.parametrize(
    ("rel", "content"),
    [
        ("sys/devices/system/node/node0/meminfo", b"Node 0 MemTotal: " + b"9" * 400 + b" kB\n"),
        ("sys/devices/system/node/node0/meminfo", b"Node 0 MemTotal: " + b"9" * 5000 + b" kB\n"),
    ],
    ids=["400-digits", "5000-digits"],
)
def test_huge_memory_is_dropped_with_a_warning(
    trees: dict[str, tuple[Path, list[str]]], tmp_path: Path, rel: str, content: bytes
) -> None:
    root = tmp_path / "root"
    shutil.copytree(trees["dump"][0], root, symlinks=True)
    (root / rel).write_bytes(content)
    run_everything(root)
    inv = discover(Root(root, live=False))
    assert inv.numa(0) is not None and inv.numa(0).memory_bytes is None  # type: ignore[union-attr]
    assert any("MemTotal" in w for w in inv.warnings)


def _first_function(root: Path, pred: str) -> Path:
    pci = root / "sys/bus/pci/devices"
    for entry in sorted(os.listdir(pci)):
        if (pci / entry / pred).exists():
            return (pci / entry).resolve()
    raise AssertionError(f"no function with {pred}")


def test_hostile_pci_numbers(trees: dict[str, tuple[Path, list[str]]], tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(trees["fake"][0], root, symlinks=True)
    func = _first_function(root, "current_link_width")
    (func / "current_link_width").write_text("1" + "0" * 309)
    (func / "numa_node").write_text(str(2**63))
    (func / "current_link_speed").write_text("inf GT/s PCIe")
    run_everything(root)


def test_rdma_rates(trees: dict[str, tuple[Path, list[str]]], tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(trees["dump"][0], root, symlinks=True)
    rates = sorted((root / "sys/class/infiniband").glob("*/ports/*/rate"))
    assert rates, "the dump has RDMA ports"
    rates[0].write_text("1.2.3 Gb/sec (4X HDR)")
    if len(rates) > 1:
        rates[1].write_text("9" * 400 + " Gb/sec (4X HDR)")
    run_everything(root)
    inv = discover(Root(root, live=False))
    assert any("malformed rate" in w for w in inv.warnings)


def test_bus_id_alias_is_one_device(
    trees: dict[str, tuple[Path, list[str]]], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    shutil.copytree(trees["dump"][0], root, symlinks=True)
    before = discover(Root(root, live=False))
    _alias(root)
    after = discover(Root(root, live=False))
    assert [d.bus_id for d in after.pci_devices] == [d.bus_id for d in before.pci_devices]
    assert [n.bus_id for n in after.nics] == [n.bus_id for n in before.nics]
    assert any("alias" in w for w in after.warnings)


def test_host_name_becomes_a_valid_node_name() -> None:
    assert node_name("GPU-Node-01") == "gpu-node-01"
    with pytest.raises(ValueError, match="--node-name"):
        node_name("gpu_node!")
