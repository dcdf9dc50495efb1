"""Record which files, directories and symlinks one discovery run reads under a root.

``toposlice gather`` must archive exactly what discovery reads -- no more (no secrets,
no unrelated sysfs) and no less (a replay must give the same inventory). Keeping a
hand-written list of paths in step with discovery is how such tools drift; instead
the gather runs discovery once with ``os.open``/``os.read``/``os.listdir``/
``os.readlink`` and ``open`` wrapped, and keeps the bytes discovery actually got.

Only paths under the root and below :data:`RECORDED_PREFIXES` are recorded, so the
interpreter's own imports and caches never end up in an archive. The wrapping is
process-wide while the context is open: use it from one thread (the CLI does).
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RECORDED_PREFIXES", "ReadLog", "record_reads"]

#: Root-relative prefixes discovery reads (sysfs, procfs, the hostname, udev's database).
RECORDED_PREFIXES: tuple[str, ...] = ("sys/", "proc/", "etc/hostname", "run/udev/data/")


@dataclass
class ReadLog:
    """What one discovery run read, as root-relative paths (``sys/bus/pci/devices``)."""

    root: str
    contents: dict[str, bytes] = field(default_factory=dict)
    """Files whose reads succeeded -> the bytes discovery got (possibly a prefix)."""
    attempted: set[str] = field(default_factory=set)
    """Files discovery tried to open (also the ones that failed: their directories matter)."""
    listed: set[str] = field(default_factory=set)
    """Directories whose entry *names* discovery used (``os.listdir`` of a path)."""
    opened_dirs: set[str] = field(default_factory=set)
    """Directories opened (``DirReader``) or listed only to gate reads (``listdir(fd)``)."""
    links: set[str] = field(default_factory=set)
    """Symlinks whose target discovery read (``os.readlink``)."""

    def rel(self, path: Any, dir_path: str | None = None) -> str | None:
        """Root-relative form of ``path`` when it is recorded, else None."""
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str):
            return None
        if dir_path is not None and not os.path.isabs(path):
            path = os.path.join(dir_path, path)
        full = os.path.normpath(os.path.join(self.root, path))
        rel = os.path.relpath(full, self.root)
        if rel == "." or rel.startswith(".."):
            return None
        if not (rel + "/").startswith(RECORDED_PREFIXES) and not rel.startswith(RECORDED_PREFIXES):
            return None
        return rel


class _RecordingFile:
    """``open(..., "rb")`` result that remembers the bytes handed out."""

    def __init__(self, fh: Any, log: ReadLog, rel: str) -> None:
        self._fh = fh
        self._log = log
        self._rel = rel
        self._got: bytearray | None = None

    def read(self, *args: Any) -> Any:
        data = self._fh.read(*args)
        if self._got is None:
            self._got = bytearray()
        self._got += data if isinstance(data, bytes) else str(data).encode()
        return data

    def close(self) -> None:
        if self._got is not None:
            self._log.contents[self._rel] = bytes(self._got)
            self._got = None
        self._fh.close()

    def __enter__(self) -> _RecordingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)


@contextmanager
def record_reads(root: str) -> Iterator[ReadLog]:
    """Wrap the ``os`` read functions while the block runs; yields the growing log."""
    log = ReadLog(root=os.path.abspath(root))
    real_open, real_read, real_close = os.open, os.read, os.close
    real_listdir, real_readlink, real_builtin_open = os.listdir, os.readlink, builtins.open
    file_fds: dict[int, str] = {}
    got: dict[int, bytearray] = {}
    dir_fds: dict[int, str] = {}

    def _dir_of(dir_fd: int | None) -> str | None:
        return dir_fds.get(dir_fd) if dir_fd is not None else None

    def rec_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        base = _dir_of(dir_fd)
        rel = log.rel(path, os.path.join(log.root, base) if base is not None else None)
        if rel is not None and not flags & os.O_DIRECTORY:
            log.attempted.add(rel)
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        if rel is not None:
            if flags & os.O_DIRECTORY:
                log.opened_dirs.add(rel)
                dir_fds[fd] = rel
            else:
                file_fds[fd] = rel
        return fd

    def rec_read(fd: int, n: int) -> bytes:
        data = real_read(fd, n)
        if fd in file_fds:
            got.setdefault(fd, bytearray()).extend(data)
        return data

    def rec_close(fd: int) -> None:
        rel = file_fds.pop(fd, None)
        buf = got.pop(fd, None)
        if rel is not None and buf is not None:
            # Each open is one read of the file: the last one's bytes are kept.
            log.contents[rel] = bytes(buf)
        dir_fds.pop(fd, None)
        real_close(fd)

    def rec_listdir(path: Any = ".") -> list[str]:
        if isinstance(path, int):
            names = real_listdir(path)
            # A listing through a directory fd only gates reads (``DirReader``).
            return names
        rel = log.rel(path)
        names = real_listdir(path)
        if rel is not None:
            log.listed.add(rel)
        return names

    def rec_readlink(path: Any, *, dir_fd: int | None = None) -> Any:
        base = _dir_of(dir_fd)
        rel = log.rel(path, os.path.join(log.root, base) if base is not None else None)
        target = real_readlink(path, dir_fd=dir_fd)
        if rel is not None:
            log.links.add(rel)
        return target

    def rec_builtin_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        rel = log.rel(file) if not isinstance(file, int) else None
        if rel is not None and "r" in mode and not any(c in mode for c in "wax+"):
            log.attempted.add(rel)
            return _RecordingFile(real_builtin_open(file, mode, *args, **kwargs), log, rel)
        return real_builtin_open(file, mode, *args, **kwargs)

    os.open, os.read, os.close = rec_open, rec_read, rec_close
    os.listdir, os.readlink = rec_listdir, rec_readlink  # type: ignore[assignment]
    builtins.open = rec_builtin_open
    try:
        yield log
    finally:
        os.open, os.read, os.close = real_open, real_read, real_close
        os.listdir, os.readlink = real_listdir, real_readlink
        builtins.open = real_builtin_open
