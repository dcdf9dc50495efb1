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
from collections.abc import Mapping
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
from tests.conftest import examples
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
    hwloc_roots: Mapping[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Path, list[str]]]:
    """The pristine trees (a dump: the session's shared extraction, never written; a copy
    of a generated fake GPU machine) and their parsed files."""
    base = tmp_path_factory.mktemp("hostile")
    out = {}
    dump = hwloc_roots[CASE]
    out["dump"] = (dump, _interesting(dump))
    with fake_host("cloud-vm-1gpu") as host:
        fake = base / "fake"
        shutil.copytree(host.root, fake, symlinks=True)
    out["fake"] = (fake, _interesting(fake))
    return out


class Workbench:
    """A working copy of each pristine tree that examples damage and :meth:`restore` puts
    back file by file from the pristine copy (copying a 9,000-file dump per example
    cost most of the test's time). Files are hard links to the pristine ones until
    damaged: :meth:`damage` gives the file its own copy first. ``restore`` checks that
    every damaged file is whole again."""

    def __init__(self, pristine: dict[str, tuple[Path, list[str]]], base: Path) -> None:
        self.pristine = {name: tree for name, (tree, _) in pristine.items()}
        self.work = {}
        for name, tree in self.pristine.items():
            self.work[name] = base / name
            shutil.copytree(tree, self.work[name], symlinks=True, copy_function=os.link)
        self.touched: list[tuple[str, str]] = []
        self.created: list[Path] = []

    def damage(self, name: str, rel: str, how: str, payload: bytes) -> None:
        self.touched.append((name, rel))
        path = self.work[name] / rel
        if path.is_file() and not path.is_symlink():
            # Unshare the hard link, so that writing and truncating leave the pristine alone.
            own = path.with_name(f".{path.name}.own")
            shutil.copy2(path, own)
            os.replace(own, path)
        _damage(path, how, payload)

    def alias(self, name: str) -> None:
        created = _alias(self.work[name])
        if created is not None:
            self.created.append(created)

    def restore(self) -> None:
        for path in self.created:
            path.unlink()
        for name, rel in self.touched:
            path, original = self.work[name] / rel, self.pristine[name] / rel
            if path.is_symlink() or path.is_file():
                path.unlink()
            elif path.is_dir():
                shutil.rmtree(path)
            shutil.copy2(original, path, follow_symlinks=False)
            assert path.read_bytes() == original.read_bytes(), rel
        self.touched, self.created = [], []


@pytest.fixture(scope="module")
def workbench(
    trees: dict[str, tuple[Path, list[str]]], tmp_path_factory: pytest.TempPathFactory
) -> Workbench:
    return Workbench(trees, tmp_path_factory.mktemp("workbench"))


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


def _alias(root: Path) -> Path | None:
    """A second ``bus/pci/devices`` entry for the first function, with an 8-digit domain;
    returns the entry it made."""
    pci = root / "sys/bus/pci/devices"
    first = sorted(os.listdir(pci))[0]
    alias = pci / ("0000" + first)
    if os.path.islink(pci / first) and not os.path.lexists(alias):
        os.symlink(os.readlink(pci / first), alias)
        return alias
    return None


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
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_damaged_trees_never_raise(
    data: st.DataObject,
    trees: dict[str, tuple[Path, list[str]]],
    workbench: Workbench,
) -> None:
    name = data.draw(st.sampled_from(sorted(trees)))
    files = trees[name][1]
    picks = data.draw(st.lists(st.sampled_from(files), min_size=1, max_size=10, unique=True))
    try:
        for rel in picks:
            how = data.draw(st.sampled_from(DAMAGE))
            workbench.damage(name, rel, how, data.draw(st.sampled_from(HOSTILE)))
        if data.draw(st.booleans()):
            workbench.alias(name)
        run_everything(workbench.work[name])
    finally:
        workbench.restore()


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
    workbench: Workbench, rel: str, content: bytes
) -> None:
    root = workbench.work["dump"]
    try:
        workbench.damage("dump", rel, "write", content)
        run_everything(root)
        inv = discover(Root(root, live=False))
    finally:
        workbench.restore()
    assert inv.numa(0) is not None and inv.numa(0).memory_bytes is None  # type: ignore[union-attr]
    assert any("MemTotal" in w for w in inv.warnings)


def _first_function(root: Path, pred: str) -> Path:
    pci = root / "sys/bus/pci/devices"
    for entry in sorted(os.listdir(pci)):
        if (pci / entry / pred).exists():
            return (pci / entry).resolve().relative_to(root.resolve())
    raise AssertionError(f"no function with {pred}")


def test_hostile_pci_numbers(workbench: Workbench) -> None:
    func = _first_function(workbench.work["fake"], "current_link_width")
    try:
        workbench.damage("fake", f"{func}/current_link_width", "write", b"1" + b"0" * 309)
        workbench.damage("fake", f"{func}/numa_node", "write", str(2**63).encode())
        workbench.damage("fake", f"{func}/current_link_speed", "write", b"inf GT/s PCIe")
        run_everything(workbench.work["fake"])
    finally:
        workbench.restore()


def test_rdma_rates(workbench: Workbench) -> None:
    root = workbench.work["dump"]
    rates = sorted((root / "sys/class/infiniband").glob("*/ports/*/rate"))
    assert rates, "the dump has RDMA ports"
    try:
        workbench.damage("dump", str(rates[0].relative_to(root)), "write", b"1.2.3 Gb/sec (4X HDR)")
        if len(rates) > 1:
            rate = b"9" * 400 + b" Gb/sec (4X HDR)"
            workbench.damage("dump", str(rates[1].relative_to(root)), "write", rate)
        run_everything(root)
        inv = discover(Root(root, live=False))
    finally:
        workbench.restore()
    assert any("malformed rate" in w for w in inv.warnings)


def test_bus_id_alias_is_one_device(workbench: Workbench) -> None:
    root = workbench.work["dump"]
    before = discover(Root(root, live=False))
    try:
        workbench.alias("dump")
        after = discover(Root(root, live=False))
    finally:
        workbench.restore()
    assert [d.bus_id for d in after.pci_devices] == [d.bus_id for d in before.pci_devices]
    assert [n.bus_id for n in after.nics] == [n.bus_id for n in before.nics]
    assert any("alias" in w for w in after.warnings)


def test_host_name_becomes_a_valid_node_name() -> None:
    assert node_name("GPU-Node-01") == "gpu-node-01"
    with pytest.raises(ValueError, match="--node-name"):
        node_name("gpu_node!")
