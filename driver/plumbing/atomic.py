"""Crash-safe file writes: a reader (container runtime, the next driver start) sees either
the old file or the new one, never half of one, even after kill -9 or power loss."""

from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path

TEMP_SUFFIX = ".tmp"


def temp_prefix(final_name: str) -> str:
    """Temp files start with a dot and end in ``.tmp``: CDI scanners read only ``*.json`` /
    ``*.yaml`` and the kubelet ignores dot files, so a leftover temp is never picked up."""
    return f".{final_name}."


def write_atomic(
    path: Path, data: bytes, mode: int = 0o644, *, sync: bool = True, sync_dir: bool | None = None
) -> None:
    """temp file in the same directory + fsync + rename + fsync of the directory.

    ``sync=False`` keeps the rename (readers and a kill -9 still see whole files only) but
    skips the fsyncs, for state that a reboot invalidates anyway. ``sync_dir`` (default:
    ``sync``) is the directory's fsync alone, which makes the rename itself survive power
    loss; ``sync=True, sync_dir=False`` is temp + fsync + rename.

    Plain ``os`` calls, no ``tempfile``/file objects: the driver writes two or three files
    per prepared claim, and their Python overhead was a visible part of prepare latency."""
    directory = path.parent
    fd, tmp = _create_temp(directory, path.name)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        remove_quiet(Path(tmp))
        raise
    if sync if sync_dir is None else sync_dir:
        fsync_dir(directory)


_temp_ids = itertools.count()


def _create_temp(directory: Path, name: str) -> tuple[int, str]:
    """An exclusively created, private temp file: ``.<name>.<pid>-<n>.tmp``. The pid and a
    per-process counter make names unique among live writers; ``O_EXCL`` skips one left
    by an earlier process with the same pid."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    for attempt in range(2):
        if attempt:
            directory.mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            tmp = os.path.join(
                directory, f"{temp_prefix(name)}{os.getpid()}-{next(_temp_ids)}{TEMP_SUFFIX}"
            )
            try:
                return os.open(tmp, flags, 0o600), tmp
            except FileExistsError:
                continue
            except FileNotFoundError:
                if attempt:
                    raise
                break  # the directory is missing: create it once, then retry
    raise FileExistsError(f"no free temp file name for {directory / name}")


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink in ``directory`` durable."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def remove_quiet(path: Path) -> bool:
    """Unlink; True if something was removed. A missing file is not an error."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
