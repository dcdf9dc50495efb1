"""``--fake`` trees kept between runs (discovery/fake/cache.py): the same inventory as a
fresh tree, no rebuild on a hit, a new entry for an edited machine file, damaged or
unwritable caches survived."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import discovery.fake.cache as fake_cache
import discovery.fake.sysfs_builder as builder
from discovery.fake import machine_path, scratch_dir
from discovery.fake.cache import CACHE_ENV, cache_dir, cached_host
from toposlice.discover import discover


@pytest.fixture
def shm(tmp_path: Path) -> Iterator[Path]:
    """A temporary folder on tmpfs when there is one (where the default cache lives)."""
    folder = Path(tempfile.mkdtemp(prefix="toposlice-test-", dir=scratch_dir()))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def cache(shm: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(shm / "cache"))
    monkeypatch.setenv("TOPOSLICE_FAKE_TMPDIR", str(shm / "scratch"))
    (shm / "scratch").mkdir()
    return shm / "cache"


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The roots build_sysfs was called for."""
    calls: list[Path] = []
    real = builder.build_sysfs

    def counting(spec: Any, root: Path) -> None:
        calls.append(Path(root))
        real(spec, root)

    monkeypatch.setattr(builder, "build_sysfs", counting)
    return calls


def _entries(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def test_a_hit_rebuilds_nothing_and_gives_the_fresh_trees_inventory(
    cache: Path, builds: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = discover(fake="cloud-vm-1gpu").to_dict()
    (entry,) = _entries(cache)
    assert len(builds) == 1 and entry.startswith("cloud-vm-1gpu-")
    assert first["gpus"] and first["gpus"][0]["uuid"], "the fake NVML answered"
    second = discover(fake="cloud-vm-1gpu").to_dict()
    assert len(builds) == 1, "the second run used the cached tree"
    assert second == first
    monkeypatch.setenv(CACHE_ENV, "off")
    fresh = discover(fake="cloud-vm-1gpu").to_dict()
    assert len(builds) == 2 and fresh == first
    assert _entries(cache) == [entry], "cache off neither reads nor writes the cache"


def test_cache_off_leaves_nothing(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, "off")
    assert cache_dir() is None
    discover(fake="cloud-vm-1gpu")
    assert not cache.exists()
    assert os.listdir(os.environ["TOPOSLICE_FAKE_TMPDIR"]) == []


def test_default_folder_is_a_private_tmpfs_else_the_user_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    (tmp_path / "run").mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    assert cache_dir() == tmp_path / "run" / "toposlice" / "fake"

    monkeypatch.delenv("XDG_RUNTIME_DIR")
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(fake_cache, "SHM", str(shm))
    private = shm / f"toposlice-{os.geteuid()}"
    assert cache_dir() == private / "fake"
    assert private.stat().st_mode & 0o777 == 0o700

    private.chmod(0o777)  # anyone could have planted entries: not used
    assert cache_dir() == tmp_path / "xdg-cache" / "toposlice" / "fake"
    private.rmdir()
    private.symlink_to(tmp_path / "run")  # a link, even to a folder of ours: not used
    assert cache_dir() == tmp_path / "xdg-cache" / "toposlice" / "fake"
    monkeypatch.setattr(fake_cache, "SHM", str(tmp_path / "no-shm"))
    assert cache_dir() == tmp_path / "xdg-cache" / "toposlice" / "fake"


def test_an_edited_machine_file_gets_a_new_entry_and_copies_share_one(
    cache: Path, tmp_path: Path
) -> None:
    machine = tmp_path / "mine.yaml"
    text = machine_path("cloud-vm-1gpu").read_text(encoding="utf-8")
    machine.write_text(text + "hostname: first\n", encoding="utf-8")
    assert discover(fake=str(machine)).hostname == "first"
    (first,) = _entries(cache)
    machine.write_text(text + "hostname: second\n", encoding="utf-8")
    assert discover(fake=str(machine)).hostname == "second"
    assert first in _entries(cache) and len(_entries(cache)) == 2
    # The same bytes elsewhere (another clone, a copy): the entry is keyed by content.
    other = tmp_path / "elsewhere" / "mine.yaml"
    other.parent.mkdir()
    other.write_text(text + "hostname: second\n", encoding="utf-8")
    assert discover(fake=str(other)).hostname == "second"
    assert len(_entries(cache)) == 2 and all(e.startswith("mine-") for e in _entries(cache))


def _run_discover(fake: str, env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "toposlice", "discover", "--fake", fake, "-o", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def _entry_sizes(cache: Path) -> dict[str, int]:
    return {e.name: int((e / "size").read_text()) for e in cache.iterdir() if e.is_dir()}


def test_the_cache_is_bounded_by_size_least_recently_used_first(
    cache: Path, tmp_path: Path
) -> None:
    """Commands in new processes, from two checkouts' copies of the machine files, under a
    bound of about two entries: the entries never exceed it once old ones may go, the
    least recently used goes first, and a checkout's path never makes an entry of its own."""
    env = {**os.environ, CACHE_ENV: str(cache)}
    clone_a, clone_b = tmp_path / "clone-a", tmp_path / "clone-b"
    for clone in (clone_a, clone_b):
        clone.mkdir()
        for name in ("cloud-vm-1gpu", "cpu-2s"):
            shutil.copy(machine_path(name), clone / f"{name}.yaml")
    vm_text = machine_path("cloud-vm-1gpu").read_text(encoding="utf-8")
    (clone_b / "vm-2.yaml").write_text(vm_text + "hostname: vm-2\n", encoding="utf-8")
    _run_discover(str(clone_a / "cloud-vm-1gpu.yaml"), env)
    _run_discover(str(clone_b / "cloud-vm-1gpu.yaml"), env)
    assert len(_entries(cache)) == 1, "two clones, one entry"
    _run_discover(str(clone_a / "cpu-2s.yaml"), env)
    sizes = _entry_sizes(cache)
    assert len(sizes) == 2 and all(n > 0 for n in sizes.values())
    # Mark both used long ago, the VM first; the bound holds these two and no third.
    vm = next(n for n in sizes if n.startswith("cloud-vm-1gpu-"))
    cpu = next(n for n in sizes if n.startswith("cpu-2s-"))
    os.utime(cache / vm, (1_000_000_000, 1_000_000_000))
    os.utime(cache / cpu, (1_000_000_100, 1_000_000_100))
    bound = sum(sizes.values()) + 1000
    env[fake_cache.MAX_MB_ENV] = str(bound / 1_000_000)
    _run_discover(str(clone_b / "vm-2.yaml"), env)
    after = _entry_sizes(cache)
    assert vm not in after, "the least recently used entry went first"
    assert cpu in after and any(n.startswith("vm-2-") for n in after)
    assert sum(after.values()) <= bound
    # A bound below one entry keeps just the one in use.
    os.utime(cache / cpu, (1_000_000_000, 1_000_000_000))
    env[fake_cache.MAX_MB_ENV] = "0"
    _run_discover(str(clone_a / "cloud-vm-1gpu.yaml"), env)
    assert [n.split("-")[0] for n in _entries(cache)] == ["cloud", "vm"]
    assert fake_cache.max_bytes() == 256_000_000


def test_a_damaged_entry_is_rebuilt(cache: Path, builds: list[Path]) -> None:
    discover(fake="cloud-vm-1gpu")
    (entry,) = cache.iterdir()
    (entry / "machine.pickle").write_bytes(b"not a pickle")
    inv = discover(fake="cloud-vm-1gpu")
    assert len(builds) == 2 and inv.numa_nodes
    shutil.rmtree(entry / "root")
    assert discover(fake="cloud-vm-1gpu").to_dict() == inv.to_dict()
    assert len(builds) == 3


def test_an_unwritable_cache_falls_back_to_a_temporary_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "cache"))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TOPOSLICE_FAKE_TMPDIR", str(scratch))
    with cached_host("cloud-vm-1gpu") as host:
        assert (host.root / "sys/devices/system/cpu").is_dir()
        assert host.root.parent == scratch
    assert os.listdir(scratch) == [], "the temporary tree is removed"


def test_bad_machines_still_give_one_line_errors(cache: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown fake machine 'nope'"):
        discover(fake="nope")
    with pytest.raises(ValueError, match="does not exist"):
        discover(fake=str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        discover(fake=str(bad))
    assert _entries(cache) == [], "nothing is cached for a bad file"


def test_concurrent_first_runs_agree(cache: Path) -> None:
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: discover(fake="cloud-vm-1gpu").to_dict(), range(4)))
    assert all(r == results[0] for r in results)
    assert len(_entries(cache)) == 1, "one entry; the losers' temporary trees are gone"
