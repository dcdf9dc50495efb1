"""hack/hwloc_fixtures.py: the shipped dumps first, ``../shared`` only adds cases; each
case extracted once per folder, even by concurrent processes; and the suite's own set-up
(xdist turned on for the whole default suite only)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

import hack.hwloc_fixtures as fx
from tests import conftest

SHIPPED = fx.hwloc_cases(fx.HWLOC)


def _shared_with_extra(root: Path) -> Path:
    """A shared folder holding one shipped case again and one case of its own."""
    folder = root / "fixtures" / "hwloc"
    folder.mkdir(parents=True)
    (folder / "cases.txt").write_text(f"# extras\n{SHIPPED[0]}\nextra-case HWLOC_X=1\nno-tarball\n")
    shutil.copy(fx.HWLOC / f"{SHIPPED[0]}.tar.bz2", folder / f"{SHIPPED[0]}.tar.bz2")
    with tarfile.open(folder / "extra-case.tar.bz2", "w:bz2") as tf:
        top = root / "src" / "extra-case" / "sys" / "devices" / "system" / "node"
        top.mkdir(parents=True)
        (top / "online").write_text("0\n")
        tf.add(root / "src" / "extra-case", arcname="extra-case")
    (folder / "extra-case.json").write_text('{"case": "extra-case"}')
    return folder


def test_shipped_set_is_complete() -> None:
    assert len(SHIPPED) == 8 and "nvidiagpunumanodes" in SHIPPED
    for case in SHIPPED:
        assert (fx.HWLOC / f"{case}.tar.bz2").is_file() and (fx.HWLOC / f"{case}.json").is_file()
    assert fx.case_env("nvidiagpunumanodes", fx.HWLOC) == {"HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES": "1"}


def test_shared_only_adds_cases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = _shared_with_extra(tmp_path / "shared")
    monkeypatch.setattr(fx, "SHARED_HWLOC", shared)
    assert fx.hwloc_cases() == [*SHIPPED, "extra-case"], "shipped first, no duplicate"
    assert fx.extra_cases() == ["extra-case"]
    assert fx.case_file(SHIPPED[0], ".tar.bz2").parent == fx.HWLOC
    assert fx.case_file("extra-case", ".json").parent == shared
    assert fx.case_env("extra-case") == {"HWLOC_X": "1"}
    root = fx.extract_case("extra-case", tmp_path / "out")
    assert (root / "sys/devices/system/node/online").read_text() == "0\n"
    # No shared folder at all: exactly the shipped set.
    monkeypatch.setattr(fx, "SHARED_HWLOC", tmp_path / "nowhere")
    assert fx.hwloc_cases() == SHIPPED and fx.extra_cases() == []


def test_each_case_is_extracted_once_per_folder(tmp_path: Path) -> None:
    case = "16amd64-8n2c"  # the smallest dump
    code = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
        "from hack.hwloc_fixtures import ExtractedCases;"
        "print(ExtractedCases(Path(sys.argv[2]))[sys.argv[3]])"
    )
    repo = str(fx.REPO)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, repo, str(tmp_path), case],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    roots = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    (root,) = roots
    assert Path(root) == tmp_path / case / case and (Path(root) / "sys").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [case]
    mapping = fx.ExtractedCases(tmp_path)
    assert list(mapping) == fx.hwloc_cases() and len(mapping) == len(fx.hwloc_cases())
    assert mapping[case] == Path(root)
    with pytest.raises(KeyError):
        mapping["no-such-case"]


def _config(source: str, **options: object) -> SimpleNamespace:
    option = dict(
        numprocesses=None,
        dist="no",
        tx=None,
        markexpr="",
        usepdb=False,
        collectonly=False,
    )
    option.update(options)
    return SimpleNamespace(
        option=SimpleNamespace(**option),
        args_source=getattr(pytest.Config.ArgsSource, source),
        pluginmanager=SimpleNamespace(hasplugin=lambda name: options.get("xdist", True)),
    )


@pytest.mark.parametrize(
    ("source", "options", "workers"),
    [
        ("TESTPATHS", {}, "auto"),
        ("ARGS", {}, None),  # paths named: as asked
        ("TESTPATHS", {"markexpr": "e2e"}, None),  # a tier
        ("TESTPATHS", {"numprocesses": 0}, 0),  # -n 0
        ("TESTPATHS", {"xdist": False}, None),  # -p no:xdist
        ("TESTPATHS", {"collectonly": True}, None),
        ("TESTPATHS", {"usepdb": True}, None),
    ],
)
def test_whole_default_suite_runs_on_every_core(
    source: str, options: dict[str, object], workers: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    config = _config(source, **options)
    conftest.pytest_cmdline_main(config)  # type: ignore[arg-type]
    assert config.option.numprocesses == workers
    assert config.option.dist == ("worksteal" if workers == "auto" else "no")
