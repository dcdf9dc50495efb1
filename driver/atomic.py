"""Crash-safe file writes: a reader (container runtime, the next driver start) sees either
the old file or the new one, never half of one, even after kill -9 or power loss."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

TEMP_SUFFIX = ".tmp"


def temp_prefix(final_name: str) -> str:
    """Temp files start with a dot and end in ``.tmp``: CDI scanners read only ``*.json`` /
    ``*.yaml`` and the kubelet ignores dot files, so a leftover temp is never picked up."""
    return f".{final_name}."


def write_atomic(path: Path, data: bytes, mode: int = 0o644, *, sync: bool = True) -> None:
    """temp file in the same directory + fsync + rename + fsync of the directory.

    ``sync=False`` keeps the rename (readers and a kill -9 still see whole files only) but
    skips the fsyncs, for state that a reboot invalidates anyway."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = _mkstemp(directory, path.name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            if sync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        remove_quiet(Path(tmp))
        raise
    if sync:
        fsync_dir(directory)


def _mkstemp(directory: Path, name: str) -> tuple[int, str]:
    import tempfile

    return tempfile.mkstemp(dir=directory, prefix=temp_prefix(name), suffix=TEMP_SUFFIX)


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
