"""Generated fake trees kept between runs, so that ``--fake NAME`` costs no tree build.

Building a machine's tree (thousands of small files) and deleting it again took most of
a cold ``toposlice discover --fake``. Trees are deterministic, so each is built once and
kept under the cache folder, keyed by a hash of the machine file's bytes and of the
generator's own source: an edited machine file or generator gives a new entry, and the
file's entries under an older key are removed once unused for ten minutes. An entry is complete or
absent (built in a temporary folder, renamed into place). The parsed machine is kept
beside the tree (pickled), so a hit needs neither the YAML parser nor the loader.

Callers only read the tree. ``$TOPOSLICE_FAKE_CACHE`` names the folder (``off``: no
cache, a fresh tree each time as :func:`discovery.fake.fake_host` makes); the default
is on a tmpfs of this user's when there is one (:func:`cache_dir`). When the folder
cannot be written, the tree is built in a temporary folder and removed after use.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from discovery.fake import FakeHost
    from discovery.fake.spec import MachineSpec

__all__ = ["CACHE_ENV", "SHM", "cache_dir", "cached_host", "machine_key"]

CACHE_ENV = "TOPOSLICE_FAKE_CACHE"
_HERE = Path(__file__).resolve().parent
_SPEC = "machine.pickle"
_TREE = "root"


def cache_dir() -> Path | None:
    """The cache folder: ``$TOPOSLICE_FAKE_CACHE`` (None when ``off`` or empty), else a
    tmpfs of this user's (``$XDG_RUNTIME_DIR``, else a private ``/dev/shm`` folder:
    trees are thousands of tiny files, an order of magnitude faster to write there
    than on a disk), else ``$XDG_CACHE_HOME`` (``~/.cache``)."""
    env = os.environ.get(CACHE_ENV)
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "no") else Path(env)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "toposlice" / "fake"
    private = _private_shm()
    if private is not None:
        return private / "fake"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "toposlice" / "fake"


#: The shared tmpfs that :func:`_private_shm` makes a folder of this user's in.
SHM = "/dev/shm"


def _private_shm() -> Path | None:
    """``/dev/shm/toposlice-<uid>``, made mode 0700; None when there is no writable
    ``/dev/shm`` or the folder is not a directory of this user's that only it can write
    (someone else's folder could plant a pickle there)."""
    if not os.path.isdir(SHM) or not os.access(SHM, os.W_OK | os.X_OK):
        return None
    path = os.path.join(SHM, f"toposlice-{os.geteuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return None
    return Path(path)


def _generator_digest() -> bytes:
    """The generator's source (every module of this package and the two it borrows from)
    and the Python version: what, besides the machine file, decides the tree and the
    pickled spec."""
    h = hashlib.sha256(f"{sys.version_info[:2]}/{pickle.HIGHEST_PROTOCOL}".encode())
    outside = [_HERE.parent / "readers.py", _HERE.parent / "nvml_codes.py"]  # used by the builder
    for path in [*sorted(_HERE.glob("*.py")), *outside]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.digest()


def machine_key(path: Path) -> str:
    """The cache key of a machine file: its bytes and the generator's source."""
    h = hashlib.sha256(_generator_digest())
    h.update(path.read_bytes())
    return h.hexdigest()[:24]


def _machine_file(name_or_path: str) -> Path:
    from discovery.fake import machine_path

    if name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path:
        path = Path(name_or_path)
        if not path.is_file():
            raise ValueError(f"fake machine file {name_or_path!r} does not exist")
        return path
    return machine_path(name_or_path)


def _entry_prefix(path: Path) -> str:
    """``<stem>-<hash of the file's absolute path>-``: one file's entries share it, two
    files of the same name do not (they never remove each other's trees)."""
    stem = "".join(c if c.isalnum() or c in "._-" else "_" for c in path.stem)[:64]
    where = hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:8]
    return f"{stem}-{where}-"


def _load_entry(entry: Path) -> MachineSpec | None:
    try:
        with open(entry / _SPEC, "rb") as fh:
            spec = pickle.load(fh)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None
    from discovery.fake.spec import MachineSpec

    return spec if isinstance(spec, MachineSpec) and (entry / _TREE).is_dir() else None


def _build_entry(cache: Path, entry: Path, path: Path) -> MachineSpec:
    """Build the tree and the pickled spec in a temporary folder beside ``entry`` and
    rename it into place; another process that got there first wins."""
    from discovery.fake.loader import load_file
    from discovery.fake.sysfs_builder import build_sysfs

    spec = load_file(path)  # ValueError for a bad file: nothing is written then
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=cache))
    try:
        build_sysfs(spec, tmp / _TREE)
        with open(tmp / _SPEC, "wb") as fh:
            pickle.dump(spec, fh, protocol=pickle.HIGHEST_PROTOCOL)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.rename(tmp, entry)
        except OSError:
            if not entry.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # a concurrent build won
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _prune(cache, entry, _entry_prefix(path))
    return spec


#: An entry of an older version of a file is removed once unused this long (seconds):
#: a process that started on it before the file changed is done with it by then.
STALE_AFTER = 600.0


def _prune(cache: Path, keep: Path, prefix: str) -> None:
    """Remove the same file's entries under other keys (an older file or generator) that
    no run has used for :data:`STALE_AFTER` (a hit touches its entry)."""
    now = time.time()
    for other in cache.iterdir():
        if other == keep or not other.name.startswith(prefix):
            continue
        try:
            if now - other.stat().st_mtime < STALE_AFTER:
                continue
            trash = cache / f".trash-{other.name}"
            os.rename(other, trash)
        except OSError:
            continue
        shutil.rmtree(trash, ignore_errors=True)


@contextmanager
def cached_host(name_or_path: str) -> Iterator[FakeHost]:
    """The fake machine ``name_or_path`` (a shipped name or a YAML file) as a read-only
    :class:`~discovery.fake.FakeHost`: its cached tree, built on first use; a temporary
    tree removed on exit when the cache is off or cannot be written."""
    from discovery.fake import FakeHost, fake_host, make_nvml

    path = _machine_file(name_or_path)
    cache = cache_dir()
    spec = None
    if cache is not None:
        entry = cache / (_entry_prefix(path) + machine_key(path))
        spec = _load_entry(entry)
        if spec is None:
            if entry.exists():  # damaged or from another Python: rebuilt
                shutil.rmtree(entry, ignore_errors=True)
            try:
                spec = _build_entry(cache, entry, path)
            except OSError:
                spec = None  # read-only or full: a temporary tree below
    if spec is None:
        with fake_host(str(path)) as host:
            yield host
        return
    try:
        os.utime(entry)  # in use: not stale (see _prune)
    except OSError:
        pass
    yield FakeHost(root=entry / _TREE, nvml=make_nvml(spec), spec=spec)
