"""The files other DRA drivers read from a fake machine's tree bind-mounted over /sys:
PCI root affinity and SMT state (dra-driver-cpu), modalias and hugepages (dranet),
``resource`` (the NVIDIA GPU plugin); and ``toposlice machines tree``, which writes the
tree for them (docs/fake-hardware.md, "Running another driver on a fake machine")."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from discovery.fake import build_sysfs, load_machine
from discovery.readers import parse_cpulist, parse_cpumask
from toposlice.cli import main

MACHINES = ["dgx-h100", "cpu-2s", "mi300x-8", "cloud-vm-1gpu", "gb200-nvl72-tray"]
MODALIAS = re.compile(
    r"^pci:v([0-9A-F]{8})d([0-9A-F]{8})sv([0-9A-F]{8})sd([0-9A-F]{8})"
    r"bc([0-9A-F]{2})sc([0-9A-F]{2})i([0-9A-F]{2})$"
)
ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")


@pytest.fixture(scope="module", params=MACHINES)
def sysdir(request: pytest.FixtureRequest) -> Iterator[Path]:
    shm = "/dev/shm"
    parent = shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None
    root = Path(tempfile.mkdtemp(prefix="toposlice-peer-", dir=parent))
    build_sysfs(load_machine(request.param), root)
    yield root / "sys"
    shutil.rmtree(root, ignore_errors=True)


def _read(path: Path) -> str:
    return path.read_text().strip()


def _cpus(text: str) -> set[int]:
    cpus = parse_cpulist(text)
    assert cpus is not None, text
    return set(cpus)


def _functions(sysdir: Path) -> list[Path]:
    return [p.resolve() for p in sorted((sysdir / "bus" / "pci" / "devices").iterdir())]


def test_every_pci_root_has_its_numa_nodes_cpus(sysdir: Path) -> None:
    online = _cpus(_read(sysdir / "devices/system/cpu/online"))
    nr_cpus = max(online) + 1
    roots = [p for p in sorted((sysdir / "devices").iterdir()) if ROOT.match(p.name)]
    assert roots
    for root in roots:
        bus = root / "pci_bus" / root.name[3:]
        affinity = _cpus(_read(bus / "cpulistaffinity"))
        mask = parse_cpumask(_read(bus / "cpuaffinity"))
        assert mask is not None and set(mask) == affinity, root.name
        nodes = {
            int(_read(Path(folder) / "numa_node"))
            for folder, _, files in os.walk(root)
            if "numa_node" in files
        } - {-1}
        assert len(nodes) <= 1, (root.name, nodes)  # the shipped machines: one node per root
        if nodes:
            node = sysdir / "devices/system/node" / f"node{nodes.pop()}"
            expected = _cpus(_read(node / "cpulist")) or online
        else:
            expected = online
        assert affinity == expected, root.name
        assert len(_read(bus / "cpuaffinity").split(",")) == (nr_cpus + 31) // 32


def test_smt_control_says_whether_cores_have_siblings(sysdir: Path) -> None:
    siblings = False
    for cpu in (sysdir / "devices/system/cpu").glob("cpu[0-9]*"):
        if len(_cpus(_read(cpu / "topology" / "thread_siblings_list"))) > 1:
            siblings = True
    smt = sysdir / "devices/system/cpu/smt"
    assert _read(smt / "control") == ("on" if siblings else "notsupported")
    assert _read(smt / "active") == ("1" if siblings else "0")


def test_modalias_parses_back_to_the_functions_ids(sysdir: Path) -> None:
    functions = _functions(sysdir)
    assert functions
    for fn in functions:
        m = MODALIAS.match(_read(fn / "modalias"))
        assert m, fn
        vendor, device, sub_vendor, sub_device = (int(g, 16) for g in m.groups()[:4])
        for name, value in (
            ("vendor", vendor),
            ("device", device),
            ("subsystem_vendor", sub_vendor),
            ("subsystem_device", sub_device),
        ):
            want = int(_read(fn / name), 16) if (fn / name).exists() else 0
            assert value == want, (fn.name, name)
        base, sub, prog = (int(g, 16) for g in m.groups()[4:])
        assert (base << 16 | sub << 8 | prog) == int(_read(fn / "class"), 16), fn.name


def test_every_numa_node_has_a_hugepages_dir(sysdir: Path) -> None:
    nodes = list((sysdir / "devices/system/node").glob("node[0-9]*"))
    assert nodes
    for node in nodes:
        assert (node / "hugepages").is_dir()


def test_resource_files(sysdir: Path) -> None:
    taken: list[tuple[int, int]] = []
    for fn in _functions(sysdir):
        lines = _read(fn / "resource").splitlines()
        bridge = _read(fn / "class").startswith("0x0604")
        assert len(lines) == (17 if bridge else 13), fn.name
        for line in lines:
            start, end, flags = (int(v, 16) for v in line.split())
            assert all(re.fullmatch(r"0x[0-9a-f]{16}", v) for v in line.split()), line
            if flags:
                size = end - start + 1
                assert size & (size - 1) == 0 and start % size == 0, line  # aligned
                taken.append((start, end))
            else:
                assert start == end == 0, line
        gpu = _read(fn / "class").startswith("0x03") and _read(fn / "vendor") == "0x10de"
        if gpu:
            bar0 = [int(v, 16) for v in lines[0].split()]
            bar1 = [int(v, 16) for v in lines[1].split()]
            bar3 = [int(v, 16) for v in lines[3].split()]
            assert bar0[1] - bar0[0] + 1 == 16 << 20
            assert bar1[1] - bar1[0] + 1 >= 16 << 30 and bar1[2] == 0x14220C
            assert bar3[1] - bar3[0] + 1 == 32 << 20
    taken.sort()
    assert all(a[1] < b[0] for a, b in itertools.pairwise(taken)), "BARs overlap"


def test_dgx_h100_gpus_have_the_nvidia_bars() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        build_sysfs(load_machine("dgx-h100"), Path(tmp))
        gpus = [
            fn
            for fn in _functions(Path(tmp) / "sys")
            if _read(fn / "vendor") == "0x10de" and _read(fn / "class").startswith("0x03")
        ]
        assert len(gpus) == 8
        for fn in gpus:
            sizes = []
            for line in _read(fn / "resource").splitlines():
                start, end, _ = (int(v, 16) for v in line.split())
                sizes.append(end - start + 1 if end else 0)
            assert sizes == [16 << 20, 128 << 30, 0, 32 << 20] + [0] * 9


# --------------------------------------------------------------------------- the CLI


def test_cli_writes_a_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    to = tmp_path / "fake"
    assert main(["machines", "tree", "cpu-2s", "--to", str(to)]) == 0
    out = capsys.readouterr()
    assert out.out.split() == [str(to / "etc"), str(to / "proc"), str(to / "sys")]
    assert "mount --bind" in out.err and "unshare -m" in out.err
    sysdir = to / "sys"
    assert _read(sysdir / "devices/system/cpu/smt/control") == "on"
    assert (sysdir / "devices/pci0000:00/pci_bus/0000:00/cpulistaffinity").is_file()
    assert (to / "proc" / "cpuinfo").is_file()
    assert not [p for p in to.iterdir() if p.name.startswith(".")]  # no scratch left


def test_cli_takes_a_machine_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from discovery.fake import machine_path

    machine = tmp_path / "node.yaml"
    machine.write_bytes(machine_path("cloud-vm-1gpu").read_bytes())
    assert main(["machines", "tree", str(machine), "--to", str(tmp_path / "t")]) == 0
    capsys.readouterr()
    assert (tmp_path / "t" / "sys" / "bus" / "pci" / "devices").is_dir()


def test_cli_refuses_a_non_empty_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "keep.txt").write_text("mine\n")
    assert main(["machines", "tree", "cpu-2s", "--to", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("toposlice: error: --to ") and "not empty" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
    # --force writes the tree beside what is there, and replaces an older tree
    assert main(["machines", "tree", "cpu-2s", "--to", str(tmp_path), "--force"]) == 0
    assert main(["machines", "tree", "mi300x-8", "--to", str(tmp_path), "--force"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["etc", "keep.txt", "proc", "sys"]
    assert (tmp_path / "sys" / "class" / "kfd").is_dir()  # mi300x-8's, not cpu-2s's


def test_cli_unknown_machine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    to = tmp_path / "fake"
    assert main(["machines", "tree", "no-such-machine", "--to", str(to)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("toposlice: error: unknown fake machine 'no-such-machine'")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not to.exists()


def test_cli_refuses_the_root_filesystem(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["machines", "tree", "cpu-2s", "--to", "/", "--force"]) == 2
    assert "root filesystem" in capsys.readouterr().err


def test_cli_needs_to(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["machines", "tree", "cpu-2s"])
    assert exc.value.code == 2
    assert "--to" in capsys.readouterr().err
