"""``toposlice gather``: the archive replays the inventory exactly and holds only what
discovery reads; serials are pseudonymised by default; extraction is safe."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from pathlib import Path
from typing import Any

import pytest

from discovery.fake import fake_host, list_machines, load_machine
from discovery.fake.nvml import FakeNvml
from discovery.gather import REDACTED_FIELDS, compare_inventories, gather
from discovery.readlog import record_reads
from discovery.replay import extract_gathered, gathered_nvml
from tests.conftest import hwloc_cases
from toposlice.cli import main
from toposlice.cmd_gather import gather_source
from toposlice.discover import discover
from toposlice.replay import discover_gathered

_META = {"toposlice-gather.json", "nvml.json"}


def _run(root: str, nvml: Any) -> Any:
    return discover(root, nvml=nvml, live=False)


def _gather(root: str, archive: str, **kwargs: Any) -> Any:
    result = gather(root, _run, **kwargs)
    Path(archive).write_bytes(result.data)
    return result


def _plain(inv: Any) -> dict[str, Any]:
    data: dict[str, Any] = inv.to_dict()
    data.pop("source")
    return data


def _members(archive: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(archive) as tf:
        return {m.name: m for m in tf.getmembers()}


@pytest.mark.parametrize("name", list_machines())
def test_fake_machine_replays_exactly(name: str, tmp_path: Path) -> None:
    archive = tmp_path / f"{name}.tar.gz"
    with fake_host(name) as host:
        nvml = host.nvml
        result = _gather(
            str(host.root),
            str(archive),
            include_serials=True,
            nvml=(lambda: nvml) if nvml is not None else None,
        )
        expected = _plain(discover(str(host.root), nvml=host.nvml))
    assert result.nvml == (nvml is not None)
    assert _plain(discover_gathered(str(archive))) == expected
    # The same archive extracted by hand replays through --root DIR (nvml.json beside sys/).
    with tarfile.open(archive) as tf:
        tf.extractall(tmp_path / "x", filter="data")
    by_root = discover(str(tmp_path / "x"), nvml=gathered_nvml(str(tmp_path / "x")))
    assert _plain(by_root) == expected


def test_this_machine_replays_exactly(tmp_path: Path) -> None:
    archive = tmp_path / "host.tar.gz"
    result, live = gather_source("/", None, str(archive), include_serials=True)
    assert live is not None and result.files > 0
    assert _plain(discover_gathered(str(archive))) == _plain(live)


@pytest.mark.parametrize("case", hwloc_cases())
def test_hwloc_dump_replays_exactly(
    case: str, hwloc_roots: dict[str, Path], tmp_path: Path
) -> None:
    root = str(hwloc_roots[case])
    archive = tmp_path / "dump.tar.gz"
    _gather(root, str(archive), include_serials=True)
    assert _plain(discover_gathered(str(archive))) == _plain(discover(root))


def test_archive_holds_only_what_discovery_reads(tmp_path: Path) -> None:
    archive = tmp_path / "dgx.tar.gz"
    with fake_host("dgx-h100") as host:
        nvml = host.nvml
        _gather(str(host.root), str(archive), nvml=lambda: nvml)
        generated = {
            os.path.relpath(os.path.join(d, f), host.root)
            for d, _, files in os.walk(host.root)
            for f in files
        }
    members = _members(archive)
    files = {n for n, m in members.items() if m.isfile()} - _META
    # The generated tree has files discovery never opens (enable, revision, ifindex,
    # carrier, gid_attrs/types, ...): none of them is archived.
    assert len(files) < len(generated)
    names = {n.rsplit("/", 1)[-1] for n in files}
    assert not names & {"enable", "revision", "ifindex", "carrier", "hca_type", "phys_state"}
    assert members["sys/bus/pci/devices/0000:1b:00.0"].issym()
    assert members["sys/class/net/ibp24s0"].issym()
    # Replaying the archive reads every file in it (bar the empty names of listed dirs).
    with extract_gathered(str(archive)) as root:
        with record_reads(root) as log:
            discover(root, nvml=gathered_nvml(root), live=False)
        read = {
            os.path.relpath(os.path.realpath(os.path.join(root, p)), root) for p in log.contents
        }
        listed = {
            os.path.relpath(os.path.realpath(os.path.join(root, p)), root) for p in log.listed
        }
        for name in files - read:
            assert members[name].size == 0 and os.path.dirname(name) in listed, name


def test_serials_are_pseudonymised_by_default(tmp_path: Path) -> None:
    archive = tmp_path / "dgx.tar.gz"
    spec = load_machine("dgx-h100")
    with fake_host(spec) as host:
        nvml = host.nvml
        result = _gather(str(host.root), str(archive), nvml=lambda: nvml)
        truth = discover(str(host.root), nvml=host.nvml)
    replay = discover_gathered(str(archive))
    assert result.redacted > 0
    assert compare_inventories(truth.to_dict(), replay.to_dict(), redacted=True) == []
    assert compare_inventories(truth.to_dict(), replay.to_dict()) != []
    with tarfile.open(archive) as tf:
        blob = b"".join(
            tf.extractfile(m).read()  # type: ignore[union-attr]
            for m in tf.getmembers()
            if m.isfile()
        ).decode()
    originals = [d.nvidia.uuid for d in spec.pci if d.nvidia is not None]
    originals += [n.address for d in spec.pci for n in d.net]
    originals += [r.node_guid for d in spec.pci for r in d.rdma]
    assert originals and not [o for o in originals if o in blob]
    # Same shapes, used consistently across the inventory.
    for gpu in replay.gpus:
        assert gpu.uuid is not None and re.match(
            r"^GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$", gpu.uuid
        )
    guids = {r.name: r.node_guid for r in replay.rdma_devices}
    for nic in replay.nics:
        if nic.rdma_devices:
            assert nic.node_guid == guids[nic.rdma_devices[0]]
    assert set(REDACTED_FIELDS) <= set(truth.to_dict())


def test_nvml_faults_and_absence_replay(tmp_path: Path) -> None:
    spec = load_machine("dgx-h100")
    errors: dict[str, int | str] = {"nvmlDeviceGetMigMode": "GPU_IS_LOST"}
    faulty = FakeNvml(spec, errors=errors)
    with fake_host(spec) as host:
        a = str(tmp_path / "a.tar.gz")
        _gather(str(host.root), a, include_serials=True, nvml=lambda: faulty)
        expected = _plain(discover(str(host.root), nvml=FakeNvml(spec, errors=errors)))

        def missing() -> Any:
            raise RuntimeError("pynvml (nvidia-ml-py) is not installed: no module")

        _gather(str(host.root), str(tmp_path / "b.tar.gz"), nvml=missing)
    replay = discover_gathered(str(tmp_path / "a.tar.gz"))
    assert _plain(replay) == expected
    assert any("GPU is lost" in w or "Gpu Is Lost" in w for w in replay.warnings)
    status = {p.name: p for p in discover_gathered(str(tmp_path / "b.tar.gz")).probes}
    assert status["nvidia"].state == "unavailable"
    assert status["nvidia"].detail == "pynvml (nvidia-ml-py) is not installed: no module"


def _tar(path: Path, members: list[tarfile.TarInfo]) -> None:
    with tarfile.open(path, "w:gz") as tf:
        for info in members:
            tf.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (("../evil", tarfile.REGTYPE, ""), "unsafe member name '../evil'"),
        (("/etc/evil", tarfile.REGTYPE, ""), "unsafe member name '/etc/evil'"),
        (("sys/x", tarfile.SYMTYPE, "/etc/passwd"), "symlink 'sys/x' points outside the archive"),
        (("sys/y", tarfile.SYMTYPE, "../../z"), "symlink 'sys/y' points outside the archive"),
        (("sys/dev", tarfile.CHRTYPE, ""), "'sys/dev' is not a file, directory or symlink"),
    ],
)
def test_extraction_refuses_unsafe_members(
    member: tuple[str, bytes, str], message: str, tmp_path: Path
) -> None:
    name, kind, link = member
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = 1 if kind == tarfile.REGTYPE else 0
    archive = tmp_path / "bad.tar.gz"
    _tar(archive, [info])
    with pytest.raises(ValueError, match=re.escape(message)), extract_gathered(str(archive)):
        pass


def test_cli_gather_then_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    archive = tmp_path / "vm.tar.gz"
    assert main(["gather", "--fake", "cloud-vm-1gpu", "--output-file", str(archive)]) == 0
    out = capsys.readouterr().out
    assert "NVML answers" in out and "the replay gives the host's inventory" in out
    assert main(["discover", "--gathered", str(archive), "-o", "json"]) == 0
    replayed = json.loads(capsys.readouterr().out)
    assert main(["discover", "--fake", "cloud-vm-1gpu", "-o", "json"]) == 0
    direct = json.loads(capsys.readouterr().out)
    assert replayed["source"] == {"gathered": str(archive)}
    assert compare_inventories(direct, replayed, redacted=True) == []
    assert main(["discover", "--gathered", str(tmp_path / "missing.tar.gz")]) == 2
    assert "missing.tar.gz" in capsys.readouterr().err


def test_archive_is_deterministic(tmp_path: Path) -> None:
    with fake_host("cpu-2s") as host:
        for name in ("a", "b"):
            _gather(str(host.root), str(tmp_path / f"{name}.tar.gz"), include_serials=True)
    assert (tmp_path / "a.tar.gz").read_bytes() == (tmp_path / "b.tar.gz").read_bytes()
