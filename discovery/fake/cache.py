"""Generated fake trees kept between runs, so that ``--fake NAME`` costs no tree build.

Building a machine's tree (thousands of small files) and deleting it again took most of
a cold ``toposlice discover --fake``. Trees are deterministic, so each is built once and
kept under the cache folder, keyed by a hash of the machine file's bytes and of the
generator's own source, never by where the file lives: every clone of the project, and
every copy of a machine file, shares one entry. An entry is complete or absent (built in
a temporary folder, renamed into place). The parsed machine is kept beside the tree
(pickled), so a hit needs neither the YAML parser nor the loader.

The folder is bounded: after each build the least recently used entries (a hit touches
its entry) are removed until the entries total at most ``$TOPOSLICE_FAKE_CACHE_MAX_MB``
(default 256 MB, of a RAM-backed tmpfs); an entry used in the last minute is kept even
over the bound, since a running process may still read it.

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

__all__ = [
    "CACHE_ENV",
    "MAX_MB_ENV",
    "SHM",
    "cache_dir",
    "cached_host",
    "machine_key",
    "max_bytes",
]

CACHE_ENV = "TOPOSLICE_FAKE_CACHE"
MAX_MB_ENV = "TOPOSLICE_FAKE_CACHE_MAX_MB"
DEFAULT_MAX_MB = 256
_SIZE = "size"
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


def _entry_name(path: Path) -> str:
    """``<stem>-<content key>``: the stem only makes the folder readable; the key alone
    decides (two copies of one file, in two clones, share the entry)."""
    stem = "".join(c if c.isalnum() or c in "._-" else "_" for c in path.stem)[:64]
    return f"{stem}-{machine_key(path)}"


def max_bytes() -> int:
    """The bound on the cache's entries: ``$TOPOSLICE_FAKE_CACHE_MAX_MB`` megabytes (default
    256; a value that is no number >= 0 gives the default)."""
    text = os.environ.get(MAX_MB_ENV, "").strip()
    try:
        mb = float(text) if text else DEFAULT_MAX_MB
    except ValueError:
        mb = DEFAULT_MAX_MB
    if not mb >= 0 or mb == float("inf"):
        mb = DEFAULT_MAX_MB
    return int(mb * 1_000_000)


def _tree_bytes(root: Path) -> int:
    """Space the tree takes (allocated blocks: on tmpfs every tiny file holds a page)."""
    total = 0
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            total += st.st_blocks * 512 if st.st_blocks else st.st_size
    return total


def _entry_bytes(entry: Path) -> int:
    """An entry's size as recorded at build time (measured, for an entry without one)."""
    try:
        return int((entry / _SIZE).read_text(encoding="ascii"))
    except (OSError, ValueError):
        return _tree_bytes(entry)


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
        (tmp / _SIZE).write_text(str(_tree_bytes(tmp)), encoding="ascii")
        try:
            os.rename(tmp, entry)
        except OSError:
            if not entry.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # a concurrent build won
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(cache, keep=entry)
    return spec


#: An entry used this recently (seconds) is never removed: a process may be reading it.
IN_USE_FOR = 60.0
#: A temporary build folder this old was left by a killed build.
ABANDONED_AFTER = 3600.0


def prune(cache: Path, keep: Path | None = None, limit: int | None = None) -> None:
    """Remove the least recently used entries until the rest total at most ``limit``
    bytes (default :func:`max_bytes`); ``keep`` and entries used in the last
    :data:`IN_USE_FOR` seconds stay. Leftover temporary folders of killed builds go too."""
    limit = max_bytes() if limit is None else limit
    now = time.time()
    entries: list[tuple[float, int, Path]] = []
    for other in cache.iterdir():
        try:
            st = other.stat()
        except OSError:
            continue
        if other.name.startswith((".tmp-", ".trash-")):
            if now - st.st_mtime > ABANDONED_AFTER:
                shutil.rmtree(other, ignore_errors=True)
            continue
        if other.is_dir():
            entries.append((st.st_mtime, _entry_bytes(other), other))
    total = sum(size for _, size, _ in entries)
    for used, size, other in sorted(entries, key=lambda e: e[0]):
        if total <= limit:
            break
        if other == keep or now - used < IN_USE_FOR:
            continue
        trash = cache / f".trash-{other.name}"
        try:
            os.rename(other, trash)
        except OSError:
            continue
        shutil.rmtree(trash, ignore_errors=True)
        total -= size


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
        entry = cache / _entry_name(path)
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
        os.utime(entry)  # recently used: the last to go (see prune)
    except OSError:
        pass
    yield FakeHost(root=entry / _TREE, nvml=make_nvml(spec), spec=spec)
